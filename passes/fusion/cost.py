"""Cost model: bytes moved, flops, arithmetic intensity, on-chip fit, and whether fusing pays.

Figures are *modeled* (never measured on the device): an unfused op reads its operands and
writes its result to memory (HBM); a fused region reads its inputs once and writes its outputs
once, keeping every intermediate on chip. Targets (figures from :mod:`hlofuse.core.chips`, the same
descriptions tiling reads; the chip in force, by default h100 and v5e):

* gpu — e.g. H100: HBM 3.35 TB/s, f32 67 TFLOP/s, bf16 989 TFLOP/s, 227 KiB shared memory per
  block (A100: 2.04 TB/s, 19.5 / 312 TFLOP/s, 163 KiB), ~5 µs launch overhead.
* tpu — e.g. v5e: HBM 0.82 TB/s, bf16 197 TFLOP/s (f32 matmuls modeled at a third: multi-pass
  bf16 on the MXU), 16 MiB scoped VMEM (v4 16 MiB, v6e 32 MiB), (8,128) tiles.
* cpu — XLA:CPU already fuses elementwise chains, reduction epilogues and library-calls its
  dots. A Pallas kernel in interpret mode with whole-array blocks (one grid step) lowers to a
  one-trip loop that XLA removes, leaving the same ops it would have fused anyway: measured
  identical HLO and timings within noise (see :data:`CPU_RULES`). More than one grid step
  turns into a real while loop that copies every operand each step (6.5x-200x slower,
  measured), so on cpu a region becomes a kernel only as a single grid step.

Every region the fusion passes find gets a :class:`RegionCost` (bytes before/after,
intermediate bytes kept on chip, flops, arithmetic intensity, per-block working set) and a
:class:`Decision` from :func:`decide` (with the reason, ``"cost model: ..."``, when it is left
to XLA). Multi-consumer producers are rematerialized or materialized by :func:`remat_choice`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import threading

from hlofuse.core import ir as hir
from hlofuse.core.ops import OpClass, rule_for
from hlofuse.kernels.support import is_splat_constant
from hlofuse.core.target import Target


@dataclasses.dataclass(frozen=True)
class TargetModel:
    name: str
    hbm_bytes_per_s: float
    flops_per_s: float            # f32
    launch_s: float
    on_chip_bytes: int            # fast memory one kernel instance can use (smem per SM / scoped VMEM)
    flops_per_s_lowp: float = 0.0  # bf16/f16 (0: same as f32)

    def flops_rate(self, dtype: str) -> float:
        return self.flops_per_s_lowp if dtype in ("bf16", "f16") and self.flops_per_s_lowp else self.flops_per_s


CPU_MODEL = TargetModel("cpu", 50e9, 200e9, 1e-6, 32 * 1024 * 1024)


def model_for(target: Target | str) -> TargetModel:
    """The cost model of ``target``: the figures of its chip (:mod:`hlofuse.core.chips`)."""
    target = Target.of(target)
    if target.is_cpu:
        return CPU_MODEL
    c = target.chip
    return TargetModel(c.name, c.hbm_bytes_per_s, c.flops_per_s, c.launch_s, c.on_chip_bytes,
                       c.flops_per_s_lowp)


@dataclasses.dataclass
class RegionCost:
    bytes_unfused: int            # every op on its own: reads operands, writes results
    bytes_fused: int              # one kernel: reads region inputs once, writes outputs once
    flops: int
    kernels_unfused: int          # ops that would each be a kernel launch when unfused
    intermediate_bytes: int = 0   # values made and consumed inside the region (kept on chip)
    dtype: str = "f32"            # dominant compute dtype (for the flop rate)
    working_set_bytes: int = 0    # on-chip bytes one kernel instance needs (set once blocks are known)

    @property
    def arithmetic_intensity(self) -> float:
        return self.flops / self.bytes_fused if self.bytes_fused else 0.0

    @property
    def bytes_saved(self) -> int:
        return self.bytes_unfused - self.bytes_fused

    def seconds(self, model: TargetModel, fused: bool) -> float:
        b = self.bytes_fused if fused else self.bytes_unfused
        n = 1 if fused else self.kernels_unfused
        return max(b / model.hbm_bytes_per_s, self.flops / model.flops_rate(self.dtype)) + n * model.launch_s

    def fits_on_chip(self, model: TargetModel) -> bool:
        return self.working_set_bytes <= model.on_chip_bytes

    def as_extra(self, model: TargetModel) -> dict:
        """The numbers the report shows for the region (``Region.extra``)."""
        return {
            "arithmetic_intensity": round(self.arithmetic_intensity, 3),
            "intermediate_bytes": self.intermediate_bytes,
            "working_set_bytes": self.working_set_bytes,
            "fits_on_chip": self.fits_on_chip(model),
            "modeled_us_unfused": round(self.seconds(model, False) * 1e6, 3),
            "modeled_us_fused": round(self.seconds(model, True) * 1e6, 3),
            "dtype": self.dtype,
        }


def _nbytes(v) -> int:
    info = hir.tensor_type_info(v.type)
    return info.nbytes if info else 0


def op_flops(op) -> int:
    """Modeled flops of one op: 2*K per dot output element, 2*(window*Cin) per convolution
    output element, one per reduced element, else the rule table's per-element figure."""
    rule = rule_for(op.name)
    if rule.cls is OpClass.DOT:
        out = hir.tensor_type_info(op.results[0].type)
        lhs = hir.tensor_type_info(op.operands[0].type)
        if out is None or lhs is None:
            return 0
        from jaxlib.mlir.dialects import stablehlo
        try:
            dn = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
            k = math.prod(lhs.shape[d] for d in dn.lhs_contracting_dimensions)
        except (KeyError, ValueError):  # stablehlo.dot: contracting the last lhs dim
            k = lhs.shape[-1] if lhs.shape else 1
        return 2 * out.size * k
    if rule.cls is OpClass.CONVOLUTION:
        out = hir.tensor_type_info(op.results[0].type)
        ker = hir.tensor_type_info(op.operands[1].type)
        if out is None or ker is None:
            return 0
        from jaxlib.mlir.dialects import stablehlo
        try:
            dn = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
            per_out = ker.size // max(ker.shape[dn.kernel_output_feature_dimension], 1)
        except (KeyError, ValueError):   # no readable dimension numbers: every kernel element
            per_out = ker.size
        return 2 * out.size * per_out
    if rule.cls is OpClass.REDUCTION:
        src = hir.tensor_type_info(op.operands[0].type)
        return src.size if src else 0
    total = 0
    for r in op.results:
        info = hir.tensor_type_info(r.type)
        total += rule.flops * (info.size if info else 0)
    return total


def _read_bytes(v) -> int:
    """Bytes an unfused consumer reads for operand ``v``: a broadcast (of a bias, a scalar, a
    per-row value) is read at its source size -- every compiler fuses broadcasts into their
    consumers -- and a splat constant costs nothing."""
    seen = 0
    while True:
        op = hir.defining_op(v)
        if op is None or seen > 16:
            return _nbytes(v)
        if op.name == "stablehlo.constant":
            return 0 if is_splat_constant(op) else _nbytes(v)
        if op.name != "stablehlo.broadcast_in_dim":
            return _nbytes(v)
        v = op.operands[0]
        seen += 1


def region_cost(members: list, inputs: list, outputs: list) -> RegionCost:
    """Modeled cost of running ``members`` unfused vs as one kernel with this boundary.

    Unfused: every compute op is its own kernel, reading its operands and writing its results
    (broadcasts and constants fold into their consumers, see :func:`_read_bytes`). Fused: the
    region's inputs are read once and its outputs written once (inputs that only feed
    broadcasts are read at their own size), intermediates stay on chip.
    """
    unfused = 0
    flops = 0
    kernels = 0
    mset = set(members)
    inter = 0
    dtypes: dict = {}
    out_set = set(outputs)
    for op in members:
        rule = rule_for(op.name)
        if rule.cls in (OpClass.CONSTANT, OpClass.BROADCAST):
            continue
        kernels += 1
        unfused += sum(_read_bytes(v) for v in op.operands) + sum(_nbytes(r) for r in op.results)
        f = op_flops(op)
        flops += f
        for r in op.results:
            info = hir.tensor_type_info(r.type)
            if info is not None:
                dtypes[info.dtype] = dtypes.get(info.dtype, 0) + f
            if r not in out_set and any(_user_op(u) in mset for u in r.uses):
                inter += _nbytes(r)
    fused = sum(_nbytes(v) for v in inputs) + sum(_nbytes(v) for v in outputs)
    dtype = max(dtypes, key=dtypes.get) if dtypes else "f32"
    return RegionCost(unfused, fused, flops, max(kernels, 1), inter, dtype)


def _user_op(use):
    owner = use.owner
    return getattr(owner, "operation", owner)


def fusion_pays(cost: RegionCost, target: Target) -> bool:
    """Does running the region as one kernel beat running its ops one by one on ``target``?"""
    model = model_for(target)
    return cost.seconds(model, fused=True) <= cost.seconds(model, fused=False)


# ---------------------------------------------------------------------------------------------
# Decisions per fusion kind and target
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Decision:
    fuse: bool
    reason: str | None = None     # "cost model: ..." when not fused


# CPU: what was measured (bench/fusion_engine.py; 2-core shared x86 host, jax 0.10.2, XLA
# executables only, alternating A/B rounds, median of per-round ratios; an A/A run of two
# identical executables on this host spreads 0.93x-1.03x, so differences inside that band are
# noise). The deciding evidence is structural: with one grid step XLA removes the interpret
# loop and compiles the same (dtype, opcode, fusion kind) multiset as for the unfused program
# (checked for every case below and for BERT/GPT-2/ResNet). kind -> (kernelize?, why).
CPU_RULES = {
    "reduction": (True, "one grid step: XLA:CPU compiles the same fusions as without the kernel "
                        "(layernorm 0.98x, softmax 0.99x vs jax.jit)"),
    "matmul_epilogue": (True, "one grid step: XLA:CPU keeps its library dot and fuses the epilogue "
                              "as without the kernel; the dot keeps its own result type on cpu "
                              "(dot+bias+gelu f32 0.97x, bf16 1.04x); int8 dots run as exact bf16 "
                              "K-chunk dots (bench.int8_cpu: 0.6-0.94x of XLA's int8 dot; int8 MLP "
                              "0.73-0.83x, int8 GPT-2 block 0.69-0.75x of jax.jit, python -m bench)"),
    "horizontal": (True, "one grid step: XLA:CPU sees the same dots (Q/K/V projections 0.97x)"),
    # Measured on the zoo's BatchNorm convnets (python -m bench --zoo): with and without their
    # 19-88 elementwise kernels XLA:CPU compiles the same number and kinds of fusions (the
    # kernel is inlined and re-fused); the kernels' 2-D block views only reshape them, and in
    # linen_resnet_train that cost 18 MB more bytes accessed (649 vs 631 MB, XLA's cost
    # analysis) plus lowering time on the first call. Nothing to win, so XLA keeps them.
    "elementwise": (False, "XLA:CPU fuses the same elementwise loop itself (a whole-array kernel "
                           "is inlined and re-fused: same fusions, measured on BatchNorm convnets); "
                           "the kernel would only add reshapes and lowering time"),
}


#: environment variable: "1" builds cpu elementwise kernels although the cpu rule leaves those
#: loops to XLA (the test suite sets it: elementwise regions are its smallest kernels for testing
#: kernelize, verification and the jit front end; the tests of the rule itself unset it)
CPU_ELEMENTWISE_ENV = "HLOFUSE_CPU_ELEMENTWISE_KERNELS"


def cpu_elementwise_kernels(option: bool) -> bool:
    """Build elementwise kernels on cpu anyway? The pass option, or :data:`CPU_ELEMENTWISE_ENV`."""
    from hlofuse.core import config
    return bool(option) or config.get(CPU_ELEMENTWISE_ENV)


# ---------------------------------------------------------------------------------------------
# The learned part: per-kind constants fitted from measurements on the device in use
# ---------------------------------------------------------------------------------------------

#: bounds of the fitted constants: a kind's log-ratio offset within +-log(20), the slope on
#: the modeled fused/unfused log-ratio within [0, 1] (a kernel never gets slower because the
#: model says fusing saves more)
OFFSET_BOUND = math.log(20.0)
SLOPE_BOUNDS = (0.0, 1.0)
#: ridge weight pulling every constant towards 0 (no evidence: kernel and XLA equal)
RIDGE = 1.0
#: a kind is judged by the fit only with this many measurements of it
MIN_RECORDS = 3
#: ... and not proposed when its kernels are predicted this much slower than XLA's code
LEARNED_MARGIN = 0.05
_EPS_US = 1e-3


def learned_key(kind: str, dtype: str | None) -> str | None:
    """What the learned model fits a constant per: the region kind and its dominant compute
    dtype (a bf16 matmul kernel beats XLA:CPU's bf16 path where an f32 one loses to its f32
    GEMM: one constant for both refused the winners). None for a record without its dtype
    (written before dtypes were kept: it does not say which constant it belongs to)."""
    if not dtype:
        return None
    return kind if dtype == "f32" else f"{kind}[{dtype}]"


@dataclasses.dataclass(frozen=True)
class LearnedModel:
    """Measured kernel/XLA time ratios of one device, fitted:
    ``log(kernel / XLA) = offset[kind] + slope * log(modeled fused us / modeled unfused us)``.
    """
    offsets: dict            # learned_key -> fitted offset (log ratio)
    slope: float
    counts: dict             # learned_key -> records it was fitted on
    residual: float = 0.0    # RMS of the log-ratio residuals

    def predict(self, kind: str, modeled_us_fused: float, modeled_us_unfused: float) -> float | None:
        """Predicted kernel/XLA time ratio for a region, None for a kind never measured."""
        if kind not in self.offsets:
            return None
        x = math.log(max(modeled_us_fused, _EPS_US) / max(modeled_us_unfused, _EPS_US))
        return math.exp(self.offsets[kind] + self.slope * x)


def fit(records, *, ridge: float = RIDGE) -> LearnedModel | None:
    """Least squares with a ridge (towards 0) and bounds on a few constants, from measurement
    records (``{'kind', 'ratio', 'modeled_us_fused', 'modeled_us_unfused', ...}``, ratio =
    measured kernel time / XLA time). Ratios are fitted in log space and clipped to
    [1/50, 50] so one disturbed measurement cannot dominate. None without usable records."""
    import numpy as np
    rows = []
    for r in records:
        try:
            ratio = float(r["ratio"])
            mf, mu = float(r.get("modeled_us_fused", 0)), float(r.get("modeled_us_unfused", 0))
            kind = learned_key(str(r["kind"]), r.get("dtype"))
        except (KeyError, TypeError, ValueError):
            continue
        if kind is None:
            continue
        if not (ratio > 0 and math.isfinite(ratio) and math.isfinite(mf) and math.isfinite(mu)):
            continue
        y = min(max(math.log(ratio), -math.log(50.0)), math.log(50.0))
        rows.append((kind, math.log(max(mf, _EPS_US) / max(mu, _EPS_US)), y))
    if not rows:
        return None
    kinds = sorted({k for k, _, _ in rows})
    col = {k: i for i, k in enumerate(kinds)}
    n = len(kinds) + 1
    a = np.zeros((len(rows) + n, n))
    b = np.zeros(len(rows) + n)
    for i, (k, x, y) in enumerate(rows):
        a[i, col[k]] = 1.0
        a[i, -1] = x
        b[i] = y
    a[len(rows):, :] = math.sqrt(ridge) * np.eye(n)
    sol = np.linalg.lstsq(a, b, rcond=None)[0]
    slope = float(min(max(sol[-1], SLOPE_BOUNDS[0]), SLOPE_BOUNDS[1]))
    # with the slope clipped, refit the offsets alone (each kind: ridge mean of its residuals)
    offsets, counts = {}, {}
    for k in kinds:
        res = [y - slope * x for kk, x, y in rows if kk == k]
        off = sum(res) / (len(res) + ridge)
        offsets[k] = float(min(max(off, -OFFSET_BOUND), OFFSET_BOUND))
        counts[k] = len(res)
    resid = math.sqrt(sum((y - offsets[k] - slope * x) ** 2 for k, x, y in rows) / len(rows))
    return LearnedModel(offsets, slope, counts, round(resid, 4))


_LEARNED = threading.local()


@contextlib.contextmanager
def learned_model(target_kind: str, model: LearnedModel | None):
    """Use ``model`` (fitted on this device's measurements) for ``target_kind`` while the
    block runs (this thread only): the front end sets it around a pass pipeline."""
    stack = getattr(_LEARNED, "models", None)
    if stack is None:
        stack = _LEARNED.models = {}
    old = stack.get(target_kind)
    stack[target_kind] = model
    try:
        yield
    finally:
        stack[target_kind] = old


def learned(target) -> LearnedModel | None:
    """The learned model in force for ``target`` (see :func:`learned_model`), or None."""
    stack = getattr(_LEARNED, "models", None) or {}
    return stack.get(Target.of(target).kind)


def predicted_ratio(features: dict, target) -> float | None:
    """The learned model's kernel/XLA ratio for a region's features (a measurement record
    without the ratio), or None when there is no model or the kind was never measured."""
    m = learned(target)
    if m is None:
        return None
    key = learned_key(features.get("kind", ""), features.get("dtype", "f32"))
    return m.predict(key, float(features.get("modeled_us_fused", 0.0)),
                     float(features.get("modeled_us_unfused", 0.0)))


def _learned_refusal(kind: str, cost: RegionCost, target: Target, model: TargetModel):
    m = learned(target)
    key = learned_key(kind, cost.dtype)
    if m is None or m.counts.get(key, 0) < MIN_RECORDS:
        return None
    p = m.predict(key, cost.seconds(model, True) * 1e6, cost.seconds(model, False) * 1e6)
    if p is not None and p > 1.0 + LEARNED_MARGIN:
        return Decision(False, f"cost model: {cost.dtype} {kind} kernels predicted {p:.2f}x "
                               f"slower than XLA's code on this device (fitted on "
                               f"{m.counts[key]} measurements)")
    return None


def decide(kind: str, cost: RegionCost, target: str, *, grid_steps: int = 1,
           fused_ops: int = 1) -> Decision:
    """Fuse the region into one kernel on ``target``? With the reason when not.

    Args:
      kind: region kind ('reduction', 'matmul_epilogue', 'horizontal', 'elementwise').
      cost: the region's modeled cost (``working_set_bytes`` filled in when blocks are known).
      grid_steps: grid size of the kernel the family would emit for this target.
      fused_ops: ops fused around the anchor (0 for a bare dot).
    """
    target = Target.of(target)
    model = model_for(target)
    if kind == "matmul_epilogue" and fused_ops == 0:
        return Decision(False, "cost model: bare dot_general, nothing to fuse around it; XLA's "
                               "library GEMM is at least as fast")
    if target.is_cpu:
        ok, why = CPU_RULES.get(kind, (False, f"no measured CPU rule for '{kind}' regions"))
        if not ok:
            return Decision(False, f"cost model: {why}")
        if grid_steps > 1:
            return Decision(False, f"cost model: the cpu kernel would run {grid_steps} grid steps; "
                                   "interpret mode copies every operand per step (measured 6.5x+ "
                                   "slower), XLA fuses this region itself")
        return _learned_refusal(kind, cost, target, model) or Decision(True)
    if cost.working_set_bytes and not cost.fits_on_chip(model):
        return Decision(False, f"cost model: working set {cost.working_set_bytes} B per block exceeds "
                               f"the {model.on_chip_bytes} B on-chip budget of {target} ({model.name})")
    refused = _learned_refusal(kind, cost, target, model)
    if refused is not None:
        return refused
    t_f, t_u = cost.seconds(model, True), cost.seconds(model, False)
    if t_f > t_u:
        return Decision(False, f"cost model: fused kernel modeled slower on {target} "
                               f"({t_f * 1e6:.2f} us vs {t_u * 1e6:.2f} us unfused)")
    return Decision(True)


# ---------------------------------------------------------------------------------------------
# Rematerialization: a producer with consumers inside and outside a region
# ---------------------------------------------------------------------------------------------

# consumers that absorb a cheap producer themselves (XLA or a later fusion pass duplicates it
# into their fusion); a call (another kernel) or opaque op must read a materialized value.
_ABSORBING = {OpClass.ELEMENTWISE, OpClass.BROADCAST, OpClass.REDUCTION, OpClass.DOT}


def remat_choice(op, outside_users: list, target: str) -> tuple[str, str]:
    """Recompute ``op`` inside the region (and let outside users keep their own copy) or
    materialize it once as a region output?

    Modeled bytes, n = number of outside users:
      materialize: the region writes the value, each outside user reads it: ``out * (1 + n)``.
      recompute:   the region reads the op's inputs; when every outside user can absorb the op
                   (elementwise, broadcast, reduce, dot prologue) each reads the inputs instead:
                   ``in * (1 + n)``; otherwise the op still runs on its own: ``2*in + out*(1+n)``.
    Ties go to recompute (no extra buffer); recomputing must not cost more flop-time than the
    bytes it saves.
    Returns: ('recompute' | 'materialize', why).
    """
    model = model_for(target)
    n = len(outside_users)
    out_b = sum(_nbytes(r) for r in op.results)
    in_b = sum(_read_bytes(v) for v in op.operands)
    materialize = out_b * (1 + n)
    absorbing = all(rule_for(u.name).cls in _ABSORBING for u in outside_users)
    recompute = in_b * (1 + n) if absorbing else 2 * in_b + out_b * (1 + n)
    extra_flops = op_flops(op) * max(n, 1)
    flop_s = extra_flops / model.flops_per_s
    saved_s = (materialize - recompute) / model.hbm_bytes_per_s
    if recompute <= materialize and flop_s <= max(saved_s, 0) + model.launch_s:
        return "recompute", f"recompute: {recompute} B vs materialize {materialize} B"
    return "materialize", f"materialize: {materialize} B vs recompute {recompute} B"
