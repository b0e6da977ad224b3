"""``constant-fold``: evaluate constant subgraphs on the host and replace them by constants.

Rewrites: every op of a foldable kind whose operands are all constant-valued is evaluated on
the host — data movement, integer arithmetic and the float ops IEEE 754 rounds exactly with
numpy (:data:`DATA_EMITTERS`, :data:`EXACT_EMITTERS`), other arithmetic with its
:mod:`hlofuse.core.ops` jax emitter under ``jax.enable_x64`` on the CPU device — and the *frontier*
of each constant subgraph (constant-valued ops used by non-constant ops or returned) becomes
one ``stablehlo.constant``. The dead subgraph is erased.

Size policy (constants must not blow up): a result is materialized only when it is a splat,
or when it is at most ``max_bytes`` (option, default 1 MiB) *and* no larger than
the constant data it is computed from (plus 256 bytes). So ``W * 2`` or ``transpose(W)`` fold,
but ``broadcast_in_dim(bias)`` to an activation shape stays a broadcast of the (folded) bias;
when a frontier op is refused, its operands are folded instead. Intermediates larger than
4x the limit are not evaluated at all. Values generated from iotas alone (and splats: no dense
constant data) are materialized only up to ``GENERATED_MAX_BYTES`` (4 KiB): a causal mask
``iota >= iota`` is cheaper to compute where it is used than to load as a 1 MiB constant, and
folded into a dense constant it would hide its structure from ``fuse-attention`` (position
masks let the attention kernels skip whole key blocks; a dense mask argument does not).

Not folded: ops with side effects or regions, integer divide/remainder by zero, results whose
emitter gives another dtype or shape than the IR type, 64-bit or complex inputs the emitter
rejects (the op is simply left alone). Refused candidates are counted by reason in the
statistics (``refused[<reason>]``): a frontier op whose result is too large to materialize
(also counted in ``refused_size``), one whose evaluation failed (``eval_failed``), and an op
that combines a constant with a function argument (freezing that argument would fold it).
Preconditions: none (run after ``inline-calls``; frozen parameters make most of the work).
Invariant: results unchanged — the folded value is what XLA's CPU backend computes for the op
at run time; exact for data movement, integers and the IEEE-rounded float ops. Transcendental
ops (exp, log, tanh, rsqrt, ...) are within the ``kernel`` tolerance, not bit-exact, against
``jax.jit`` of the same program: XLA's own compile-time folding of them (its HLO evaluator,
the C library's functions) differs from its compiled CPU code by up to a few ulp (tanh of 256
constants: 151 differ, by at most 3 ulp), and a GPU/TPU run differs from both.
The module verifies; rerunning the pass changes nothing.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxlib.mlir import ir

from hlofuse.core import ir as hir
from hlofuse.core.ops import OpClass, emit_op, rule_for, splat_scalar
from hlofuse.core.pipeline import Pass
from hlofuse.core.report import Refusals
from hlofuse.passes import graph_util as gu
from hlofuse.passes.fusion.outline import program_blocks
from hlofuse.passes.generated import GENERATED_MAX_BYTES

DEFAULT_MAX_BYTES = 1 << 20
SMALL_BYTES = 256
SCALAR_BYTES = 16             # constant data this small is a scalar (a splat, or one broadcast)
# ops that create data from (almost) nothing: only their splat results are materialized
EXPANSION_OPS = {"stablehlo.broadcast_in_dim", "stablehlo.iota"}


def _result_shape(op) -> tuple:
    return tuple(ir.RankedTensorType(op.results[0].type).shape)


def _reshape(op, x):
    return np.reshape(x, _result_shape(op))


def _transpose(op, x):
    return np.transpose(x, gu.i64_array(op, "permutation"))


def _slice(op, x):
    return x[tuple(slice(a, b, c) for a, b, c in zip(gu.i64_array(op, "start_indices"),
                                                      gu.i64_array(op, "limit_indices"),
                                                      gu.i64_array(op, "strides")))]


def _reverse(op, x):
    return np.flip(x, tuple(gu.i64_array(op, "dimensions")))


def _concatenate(op, *xs):
    return np.concatenate(xs, ir.IntegerAttr(op.attributes["dimension"]).value)


def _pad(op, x, v):
    lo, hi, interior = (gu.i64_array(op, k) for k in
                        ("edge_padding_low", "edge_padding_high", "interior_padding"))
    inner = [n + max(n - 1, 0) * i for n, i in zip(x.shape, interior)]
    full = [max(a, 0) + m + max(b, 0) for a, m, b in zip(lo, inner, hi)]
    out = np.full(full, v, dtype=x.dtype)
    out[tuple(slice(max(a, 0), max(a, 0) + m, i + 1) for a, m, i in zip(lo, inner, interior))] = x
    return out[tuple(slice(-min(a, 0), n - (-min(b, 0))) for a, b, n in zip(lo, hi, full))]


def _iota(op):
    from hlofuse.core.ops import element_dtype
    shape = _result_shape(op)
    d = ir.IntegerAttr(op.attributes["iota_dimension"]).value
    ramp = np.arange(shape[d]).reshape([-1 if k == d else 1 for k in range(len(shape))])
    return np.broadcast_to(ramp, shape).astype(element_dtype(op.results[0].type))


def _broadcast_in_dim(op, x):
    dims = gu.i64_array(op, "broadcast_dimensions")
    shape = _result_shape(op)
    expanded = [1] * len(shape)
    for k, d in enumerate(dims):
        expanded[d] = x.shape[k]
    return np.broadcast_to(np.transpose(x, np.argsort(dims)).reshape(expanded), shape).copy()


# Pure data movement is evaluated with numpy (bit-exact, and no per-op XLA compilation); so is
# the arithmetic of EXACT_EMITTERS; the rest goes through the jax emitters of hlofuse.core.ops so it
# matches XLA's CPU semantics (subnormal flushing, conversions, transcendental approximations).
DATA_EMITTERS = {
    "stablehlo.reshape": _reshape,
    "stablehlo.transpose": _transpose,
    "stablehlo.slice": _slice,
    "stablehlo.reverse": _reverse,
    "stablehlo.concatenate": _concatenate,
    "stablehlo.pad": _pad,
    "stablehlo.iota": _iota,
    "stablehlo.broadcast_in_dim": _broadcast_in_dim,
}


def _kind(x) -> str:
    return np.asarray(x).dtype.kind


def _ints(*xs) -> bool:
    """Every value an integer (signed or unsigned) array: numpy wraps like XLA does."""
    return all(_kind(x) in "iu" for x in xs)


def _int_or_bool(*xs) -> bool:
    return all(_kind(x) in "iub" for x in xs)


def _floats(*xs) -> bool:
    """Every value an f32 array, or every one f64."""
    return len({np.asarray(x).dtype for x in xs}) == 1 and \
        np.asarray(xs[0]).dtype in (np.float32, np.float64)


def _compare_np(op, a, b):
    from hlofuse.core.ops import _attr_enum
    ctype = _attr_enum(op, "compare_type")
    signed = np.asarray(a).dtype.kind == "i"
    if _floats(a, b):
        if ctype not in (None, "FLOAT"):       # TOTALORDER orders NaNs and -0: not numpy's
            return None
    elif not _int_or_bool(a, b) or ctype not in (None, "SIGNED" if signed else "UNSIGNED"):
        return None
    fn = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
          "GT": np.greater, "GE": np.greater_equal}.get(_attr_enum(op, "comparison_direction"))
    return None if fn is None else fn(a, b)


def _saturate_to_int(x: np.ndarray, to: np.dtype) -> np.ndarray:
    """Float to integer as XLA converts (the same on every target and jax release): toward
    zero, out-of-range values and infinities saturate to the type's bounds, NaN gives 0.
    numpy's ``astype`` wraps around instead (and jax 0.12 converts numpy operands with it)."""
    info = np.iinfo(to)
    t = np.trunc(x.astype(np.float64))   # exact for every float type up to f64
    t = np.where(np.isnan(t), 0.0, t)
    hi = t >= float(info.max)   # a 64-bit max rounds up to 2^63 / 2^64: >= is the saturation
    lo = t <= float(info.min)
    inside = np.where(hi | lo, 0.0, t).astype(to)
    return np.where(hi, np.array(info.max, to), np.where(lo, np.array(info.min, to), inside))


def _convert_np(op, x):
    from hlofuse.core.ops import element_dtype
    to = np.dtype(element_dtype(op.results[0].type))
    x = np.asarray(x)
    if (x.dtype.kind == "f" or x.dtype.name.startswith(("bfloat16", "float8"))) \
            and to.kind in "iu":
        return _saturate_to_int(x, to)
    if _floats(x):
        if to in (np.float32, np.float64):
            return x.astype(to)   # exact, or one round-to-nearest-even step (f64 -> f32)
        return None
    if x.dtype.kind not in "iub":
        return None
    if to.kind in "iub":
        return x.astype(to)   # two's complement wrap-around / != 0, as XLA converts
    if to in (np.float32, np.float64) and x.dtype.itemsize <= 4:
        return x.astype(to)   # one round-to-nearest-even step (exact for f64), as XLA's
    return None


def _select_np(op, p, a, b):
    if np.asarray(p).dtype != np.bool_ or np.asarray(a).dtype != np.asarray(b).dtype:
        return None
    return np.where(p, a, b)   # picks elements bit for bit, whatever their dtype


def _int_op(fn, allow_bool=False, floats=False):
    """``fn`` on integer (and with ``allow_bool`` boolean) operands; with ``floats`` also on
    f32/f64 operands, for the ops IEEE 754 rounds correctly (or exactly), as XLA:CPU does."""
    def emit(op, *xs):
        ok = _int_or_bool(*xs) if allow_bool else _ints(*xs)
        return fn(*xs) if ok or (floats and _floats(*xs)) else None
    return emit


def _float_op(fn):
    def emit(op, *xs):
        return fn(*xs) if _floats(*xs) else None
    return emit


# Integer and boolean arithmetic is exact, and numpy computes it as XLA does (two's complement
# wrap-around, no flushing, no approximation), so it needs no per-op XLA compilation (each one
# costs ~10-50 ms of a first call: causal masks are iota/add/compare/select on integers).
# So are the f32/f64 ops IEEE 754 rounds correctly (+, -, *, /, sqrt) or exactly (negate, abs,
# floor, ceil, round-to-even, compares, widening, float -> int with XLA's saturation): numpy
# and XLA:CPU agreed bit for bit on 2^20 random operands each, with infinities, NaNs and signed zeros
# (an image resize's index arithmetic and an attention scale's sqrt took ~0.45 s of a UNet's
# first call through per-op XLA). Subnormals are the difference (XLA:CPU flushes them):
# _subnormal_risk refuses those ops first.
# An emitter returns None where its operands are outside that exact domain (bf16, f16,
# transcendentals); the op then goes through its jax emitter. Not here: integer
# divide/remainder (XLA truncates, numpy floors), shifts (numpy leaves shifts by the bit width
# or more undefined), float max/min (the sign of a zero result).
EXACT_EMITTERS = {
    "stablehlo.add": _int_op(np.add, floats=True),
    "stablehlo.subtract": _int_op(np.subtract, floats=True),
    "stablehlo.multiply": _int_op(np.multiply, floats=True),
    "stablehlo.divide": _float_op(np.divide),
    "stablehlo.sqrt": _float_op(np.sqrt),
    "stablehlo.floor": _float_op(np.floor),
    "stablehlo.ceil": _float_op(np.ceil),
    "stablehlo.round_nearest_even": _float_op(np.round),
    "stablehlo.negate": _int_op(np.negative, floats=True),
    "stablehlo.abs": _int_op(np.abs, floats=True),
    "stablehlo.sign": _int_op(np.sign),
    "stablehlo.maximum": _int_op(np.maximum, allow_bool=True),
    "stablehlo.minimum": _int_op(np.minimum, allow_bool=True),
    "stablehlo.clamp": _int_op(lambda lo, x, hi: np.minimum(np.maximum(x, lo), hi), allow_bool=True),
    "stablehlo.and": _int_op(np.bitwise_and, allow_bool=True),
    "stablehlo.or": _int_op(np.bitwise_or, allow_bool=True),
    "stablehlo.xor": _int_op(np.bitwise_xor, allow_bool=True),
    "stablehlo.not": _int_op(np.invert, allow_bool=True),
    "stablehlo.compare": _compare_np,
    "stablehlo.convert": _convert_np,
    "stablehlo.select": _select_np,
}


def _exact(op, args: list) -> np.ndarray | None:
    """``op`` on ``args`` with numpy when :data:`EXACT_EMITTERS` covers it exactly, else None."""
    emit = EXACT_EMITTERS.get(op.name)
    if emit is None:
        return None
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        out = emit(op, *[np.asarray(a) for a in args])
    return None if out is None else np.asarray(out)


def foldable(op) -> bool:
    """Is ``op`` of a kind this pass evaluates (no effects, no regions, static shapes)?"""
    if len(op.regions) or len(op.results) != 1:
        return False
    if op.name not in DATA_EMITTERS:
        rule = rule_for(op.name)
        if rule.emit is None or rule.cls not in (OpClass.ELEMENTWISE, OpClass.BROADCAST):
            return False
    return all(gu.info(v) is not None for v in list(op.operands) + list(op.results))


def _evaluate(op, args: list) -> np.ndarray:
    if op.name in DATA_EMITTERS:
        out = np.asarray(DATA_EMITTERS[op.name](op, *[np.asarray(a) for a in args]))
    elif (out := _exact(op, args)) is not None:
        pass
    else:
        import jax
        with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
            # device arrays, so XLA computes the op: jax 0.12 applies some lax functions to
            # numpy operands with numpy (convert_element_type wraps where XLA saturates)
            args = [jax.device_put(np.asarray(a)) for a in args]
            out = np.asarray(jax.device_get(emit_op(op, args)[0]))
    t = gu.info(op.results[0])
    if tuple(out.shape) != t.shape or out.dtype != hir.np_dtype(t.dtype):
        raise ValueError(f"emitter gave {out.dtype}{list(out.shape)} for {t.dtype}{list(t.shape)}")
    return out


def _constant_value(op) -> np.ndarray | None:
    """The value of a ``stablehlo.constant``; a splat is a read-only broadcast view of its one
    element (no memory at any shape: a 279-byte module can hold a 1 GiB splat, issue 11)."""
    try:
        s = splat_scalar(op)
    except (ValueError, TypeError):   # a splat element numpy cannot hold
        s = None
    if s is not None:
        return np.broadcast_to(s, gu.info(op.results[0]).shape)
    return gu.constant_array(op.results[0])


def _compact(x) -> np.ndarray:
    """``x``, or one element of it when it is a broadcast (all strides 0) view of a scalar, so
    value tests do not expand a splat to its full size."""
    x = np.asarray(x)
    return x.reshape(-1)[:1] if x.size > 1 and not any(x.strides) else x


def _unsafe_values(op, args: list) -> bool:
    if op.name in ("stablehlo.divide", "stablehlo.remainder"):
        d = _compact(args[1])
        if d.dtype.kind in "iub" and np.any(d == 0):
            return True  # integer division by zero: leave it to the target's semantics
    return False


def _has_subnormal(x) -> bool:
    import ml_dtypes
    x = _compact(x)
    if x.dtype.kind != "f" and x.dtype.name != "bfloat16":
        return False
    a = np.abs(x.astype(np.float64))
    return bool(np.any((a > 0) & (a < float(ml_dtypes.finfo(x.dtype).tiny))))


def _subnormal_risk(op, args: list) -> bool:
    """Would the CPU runtime (flush-to-zero, denormals-are-zero) give another value than XLA's
    own folding of the unoptimized program (IEEE subnormals)? True when a float operand is
    subnormal, or when the exact (float64) result of a float op is subnormal in its dtype.
    Such ops are left for XLA to fold (found by tests/test_fuzz.py: sign(-1e-40) folded to -0)."""
    if op.name in DATA_EMITTERS:
        return False  # numpy moves data bit-exactly
    if op.name in EXACT_EMITTERS and _int_or_bool(*args):
        return False  # integer/boolean operands: no float value can be subnormal
    if any(_has_subnormal(a) for a in args):
        return True
    if op.name == "stablehlo.select":
        return False  # it picks operand elements, none of which is subnormal
    t = gu.info(op.results[0])
    out_dt = hir.np_dtype(t.dtype)
    if out_dt.kind != "f" and out_dt.name != "bfloat16":
        return False
    if op.name in EXACT_EMITTERS and _floats(*args):
        # the float64 result with numpy: exact for f32 operands (+, -, *), correctly rounded
        # otherwise, so a subnormal f32 result shows
        wide = _exact(op, [np.asarray(a, np.float64) for a in args])
        if wide is not None:
            with np.errstate(over="ignore", invalid="ignore"):
                return _has_subnormal(wide.astype(out_dt))
    try:
        import jax
        wide = [np.asarray(a, np.float64) if (np.asarray(a).dtype.kind == "f" or np.asarray(a).dtype.name
                                              == "bfloat16") else np.asarray(a) for a in args]
        with jax.enable_x64(True), jax.default_device(jax.devices("cpu")[0]):
            exact = np.asarray(jax.device_get(emit_op(op, [jax.device_put(a) for a in wide])[0]),
                               np.float64)   # device arrays: XLA's semantics, as _evaluate
    except Exception:  # noqa: BLE001 - folding boundary: jax runs hlofuse's emitter; no float64 twin
        return False  # no float64 twin for this op: its inputs were checked above
    with np.errstate(over="ignore", invalid="ignore"):
        return _has_subnormal(exact.astype(out_dt))


def _xla_folding_traps(user, folder) -> bool:
    """Would ``user`` become an integer divide/remainder of two constants with a zero divisor?
    XLA's own constant folder traps on those (SIGFPE kills the process, jaxlib 0.10.2), while
    at run time x/0 is defined; e.g. div(clz(5), 0) runs, div(29, 0) does not compile.
    Found by tests/test_fuzz.py: folding clz(5) for another user made exactly that."""
    user = getattr(user, "operation", user)
    if user.name not in ("stablehlo.divide", "stablehlo.remainder") or len(user.operands) != 2:
        return False
    t = gu.info(user.results[0])
    if t is None or hir.np_dtype(t.dtype).kind not in "iu":
        return False
    prods = [hir.defining_op(v) for v in user.operands]
    if not all(folder.is_const(p) for p in prods):
        return False
    try:
        divisor = folder.value(prods[1])
    except Exception:  # noqa: BLE001 - folding boundary: the operand's own failure is recorded
        return True  # unknown value: be safe
    return bool(np.any(_compact(divisor) == 0))


class _Folder:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        # keyed by op address (hash(op) hashes contents, which change as uses are rewritten)
        self.const: dict = {}      # op -> bool  (constant-valued?)
        self.source: dict = {}     # op -> bytes of constant data it derives from
        self.values: dict = {}     # op -> np.ndarray
        self.generated: set = set()  # ops whose value derives from iotas and splats only
        self.failed: set = set()

    def analyze(self, blocks) -> list:
        ops = [op for b in blocks for op in hir.block_ops(b)]
        for op in ops:  # program order: operands are analyzed before users
            if op.name == "stablehlo.constant":
                self.const[gu.op_key(op)] = True
                nb = gu.info(op.results[0]).nbytes if gu.info(op.results[0]) else 0
                self.source[gu.op_key(op)] = hir.dtype_bytes(gu.info(op.results[0]).dtype) \
                    if gu.is_splat_const(op.results[0]) else nb
                continue
            if not foldable(op):
                continue
            prods = [hir.defining_op(v) for v in op.operands]
            if not all(p is not None and self.const.get(gu.op_key(p), False) for p in prods):
                continue
            if gu.info(op.results[0]).nbytes > 4 * self.max_bytes:
                continue
            self.const[gu.op_key(op)] = True
            keys = [gu.op_key(p) for p in prods]
            if op.name == "stablehlo.iota" or (keys and any(k in self.generated for k in keys) and all(
                    k in self.generated or self.source[k] <= SCALAR_BYTES for k in keys)):
                self.generated.add(gu.op_key(op))   # iotas, and scalars (splats) broadcast
            # an iota is generated data: count it as a constant of its own size
            self.source[gu.op_key(op)] = sum(self.source[k] for k in {gu.op_key(p) for p in prods}) \
                if prods else gu.info(op.results[0]).nbytes
        return ops

    def is_const(self, op) -> bool:
        return op is not None and self.const.get(gu.op_key(op), False)

    def value(self, op) -> np.ndarray:
        if gu.op_key(op) in self.values:
            return self.values[gu.op_key(op)]
        if op.name == "stablehlo.constant":
            v = _constant_value(op)
            if v is None:
                raise ValueError("unreadable constant")
        else:
            args = [self.value(hir.defining_op(x)) for x in op.operands]
            if _unsafe_values(op, args):
                raise ValueError("integer division by zero")
            if _subnormal_risk(op, args):
                raise ValueError("subnormal values: the CPU runtime that evaluates here flushes "
                                 "them to zero, XLA's own constant folding does not")
            v = _evaluate(op, args)
        self.values[gu.op_key(op)] = v
        return v

    def acceptable(self, op) -> bool:
        return self.refusal(op) is None

    def refusal(self, op) -> str | None:
        """Why ``op``'s value is not materialized (None: it is); ``""`` when it is already in
        canonical form (a boolean splat broadcast), which is no refusal to report."""
        t = gu.info(op.results[0])
        if t.size <= 1:
            return None
        if t.dtype == "i1" and op.name == "stablehlo.broadcast_in_dim" and \
                gu.is_op(op.operands[0], "stablehlo.constant") and gu.info(op.operands[0]).size == 1:
            return ""  # already the canonical form of a boolean splat (see _materialize)
        if gu.op_key(op) in self.generated and t.nbytes > GENERATED_MAX_BYTES and \
                op.name not in EXPANSION_OPS:
            return "generated from iotas, larger than GENERATED_MAX_BYTES"
        if op.name in EXPANSION_OPS or t.nbytes > self.max_bytes or \
                t.nbytes > self.source[gu.op_key(op)] + SMALL_BYTES:
            # only a splat result is worth it; decide without evaluating large values
            if op.name == "stablehlo.broadcast_in_dim" and (
                    gu.splat_value(op.operands[0]) is not None or gu.info(op.operands[0]).size == 1):
                return None
            if t.nbytes > self.max_bytes:
                return "result larger than max_bytes"
            if op.name in EXPANSION_OPS:
                return f"{op.name.split('.')[-1]} result is not a splat"
            return "result larger than the constants it is computed from"
        return None


def _materialize(val: np.ndarray, op) -> ir.Value:
    """A constant for ``val`` before ``op``. Boolean splats of rank > 0 are written as a
    broadcast of a rank-0 constant (the form JAX emits; fusion then passes the scalar to a
    kernel instead of cloning an i1 splat into it)."""
    t = op.results[0].type
    if val.dtype == np.bool_ and val.ndim and val.size > 1 and (val == val.flat[0]).all():
        scalar = gu.make_constant(val.reshape(-1)[:1].reshape(()),
                                  gu.tensor_type([], gu.element_type(op.results[0])), before=op)
        return gu.make_broadcast(scalar, [], t, before=op)
    return gu.make_constant(val, t, before=op)


def _eval_reason(e: Exception) -> str:
    """A short, aggregatable reason for a failed evaluation (the message of the ValueErrors
    :meth:`_Folder.value` raises; other errors by type only, their text varies per op)."""
    msg = str(e)
    if isinstance(e, ValueError) and msg.startswith(("integer division", "subnormal", "unreadable")):
        return "evaluation refused: " + msg.split(":")[0]
    if isinstance(e, ValueError) and msg.startswith("emitter gave"):
        return "evaluation refused: emitter gave another dtype or shape"
    return f"evaluation failed: {type(e).__name__}"


class ConstantFold(Pass):
    """See the module docstring."""
    name = "constant-fold"

    @dataclasses.dataclass(frozen=True)
    class Options:
        max_bytes: int = DEFAULT_MAX_BYTES  # largest folded result (bytes) a fold may create

    def run(self, module, ctx):
        max_bytes = self.options.max_bytes
        gu.reset_tracking()
        blocks = program_blocks(module)
        folder = _Folder(max_bytes)
        ops = folder.analyze(blocks)
        # frontier: constant-valued non-constant ops with a non-constant user
        targets: list = []
        chosen: set = set()
        refused = 0
        why = Refusals(self.name, outcome="not folded")

        def want(op):
            nonlocal refused
            if gu.op_key(op) in chosen or op.name == "stablehlo.constant":
                return
            reason = folder.refusal(op)
            if reason is None:
                chosen.add(gu.op_key(op))
                targets.append(op)
                return
            refused += 1
            if reason:
                why.add("constant subgraph", reason, hir.op_location(op))
            for v in op.operands:
                want(hir.defining_op(v))

        for op in ops:
            if op.name == "stablehlo.constant" or not folder.is_const(op):
                continue
            if any(not folder.is_const(u) for u in hir.users(op.results[0])):
                want(op)
        for op in ops:  # a constant meets a function argument: freezing it would fold the op
            if folder.is_const(op) or not foldable(op):
                continue
            prods = [hir.defining_op(v) for v in op.operands]
            if any(folder.is_const(p) for p in prods) and any(p is None for p in prods):
                why.add("constant subgraph", "operand is a function argument", hir.op_location(op))
        folded = failed = 0
        with module.context, ir.Location.unknown():
            for op in targets:   # (grows: a failed op's producers are tried in its place)
                try:
                    val = folder.value(op)
                except Exception as e:  # noqa: BLE001 - folding boundary: op left unfolded, reason recorded
                    failed += 1
                    why.add("constant subgraph", _eval_reason(e), hir.op_location(op))
                    # what it is computed from may still fold (reshape(c) under a negate of a
                    # subnormal c): folded now, not by the next run of the pipeline
                    for v in op.operands:
                        want(hir.defining_op(v))
                    continue
                new = _materialize(val, op)
                uses = [(u.owner, u.operand_number) for u in op.results[0].uses]
                if any(_xla_folding_traps(owner, folder) for owner, _ in uses):
                    for owner, k in uses:  # those users keep the unfolded op alive
                        if not _xla_folding_traps(owner, folder):
                            owner.operands[k] = new
                else:
                    op.results[0].replace_all_uses_with(new)
                folded += 1
            removed = gu.erase_dead_in(blocks)
        return {"folded": folded, "ops_removed": removed, "refused_size": refused,
                "eval_failed": failed, **why.stats()}
