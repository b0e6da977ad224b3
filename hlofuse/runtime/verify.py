"""Never a wrong number: check every kernel against the subgraph it replaced; roll back misfits.

``hlofuse.jit(..., check=True)`` and ``hlofuse optimize --verify`` call :func:`verify_module`
after the pipeline. For every kernelized region (``report.kernels``) it

1. builds one test module whose ``@main`` calls, side by side, the region's kernel function
   (``hlofuse_k<id>_main`` and its helpers, exactly as spliced) and the region's original
   outlined function (its text, kept by ``kernelize`` in the module:
   :mod:`hlofuse.passes.kernel_table`);
2. compiles it with XLA for the target and runs it on seeded random inputs in the region's
   dtypes, then on inputs salted with edge values (±inf, NaN, -0, subnormals, huge values,
   integer extremes), kept inside the domain where the region's ops agree across backends
   (:data:`hlofuse.runtime.testing.EDGE_DOMAIN`: no huge arguments for sin/cos/tan);
3. compares kernel and original output by output with :func:`hlofuse.runtime.testing.compare` and the
   tolerance table (the category follows the region kind: :data:`KIND_CATEGORY`);
4. rolls back every region that disagrees, fails to compile or fails to run: the call is
   re-pointed at the original function (marked ``hlofuse.xla`` so a later run leaves it alone),
   dead kernel functions are dropped, the report entry gets ``kernel=None`` and
   ``reason='verification failed: ...'``, and a :class:`~hlofuse.core.report.HlofuseWarning` names
   the region and its source line.

What counts: any disagreement on the random (realistic) inputs rolls back, unless the kernel
is, element by element, no farther than the original from the region's float64 twin (its own
text with every float type f64, run by XLA: :func:`run_wide`); then the two are roundings of
the same computation and the kernel is the better one (a bf16 sum accumulated in f32, where
XLA's bf16 accumulation lost the result to cancellation). On edge inputs,
only what does not depend on a backend's accuracy does: a NaN or infinity on one side only, an
integer or boolean result, a shape or dtype. Finite float results that differ only on edge
inputs (an extreme argument reduced differently by two correct backends) keep the kernel; the
verdict (``region.extra['verify']``) and a debug log line (logger ``hlofuse.runtime.verify``) say so.

When the target's device is not present (e.g. ``target='gpu'`` lowered on a CPU machine), the
spliced kernel cannot run here; the family's kernel is rebuilt in Pallas interpret mode for the
same target (same block specs and emitters) and checked on the CPU instead, both sides compiled
with every op rounded to its type (``hlofuse.runtime.execute.EXACT_PRECISION``: Triton and Mosaic round
as the kernel says, while XLA's default lets an f32 value skip its rounding to bf16 between two
ops); a region whose family cannot do that is reported as not verified
(``region.extra['verify']``) and kept.

Verification uses random inputs, not the caller's real ones (intermediate values do not exist
before the program runs): a kernel wrong only on values the trials never produce is not caught.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import re
import warnings
from typing import Callable, Sequence

import numpy as np

import jax
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import func as func_d

from hlofuse.core import ir as hir
from hlofuse.runtime.api import Optimized, count_main_ops, optimize
from hlofuse.runtime.execute import backend_for, run_module
from hlofuse.kernels import FAMILIES, lowering
from hlofuse.passes.kernel_table import kernel_funcs, original_func
from hlofuse.runtime.kernel_choice import rollback
from hlofuse.core.pipeline import PassFailure, is_config_error
from hlofuse.core.report import HlofuseWarning, Region, Report
from hlofuse.core.target import Target
from hlofuse.runtime.testing import (ALL_KERNELS, TOLERANCES, GraphSpec, assert_same, compare, edge_bound, edge_inputs,
                             random_inputs, tolerance)

__all__ = ["verify_module", "verify_regions", "unoptimized", "RegionCheck", "KIND_CATEGORY",
           "program_category",
           "check_graph"]

# region kind -> tolerance category (hlofuse.runtime.testing.TOLERANCES). Elementwise kernels compute
# the same ops in the same order; kinds that tile reductions or use online softmax reassociate.
KIND_CATEGORY = {"elementwise": "kernel"}
DEFAULT_CATEGORY = "reassociate"
TRIALS = ("random", "edge")
XLA_PREFIX = "hlofuse_verify_xla_"

log = logging.getLogger("hlofuse.runtime.verify")


@dataclasses.dataclass
class RegionCheck:
    """The verdict for one kernelized region."""
    region: int
    status: str          # 'ok' | 'rolled back' | 'not verified'
    detail: str = ""
    mode: str = "device"  # 'device' (the spliced kernel ran) | 'interpret' (rebuilt, CPU)


# ---------------------------------------------------------------------------------------------
# Building the side-by-side test module
# ---------------------------------------------------------------------------------------------

def _avals(types) -> list:
    out = []
    for t in types:
        info = hir.tensor_type_info(t)
        if info is None:
            raise NotImplementedError(f"dynamic or unranked type {t}")
        out.append(jax.ShapeDtypeStruct(info.shape, hir.np_dtype(info.dtype)))
    return out


def _side_by_side(optimized_module: ir.Module, regions: list[Region], originals: dict[int, str],
                  symbols: dict[int, str]):
    """A module whose @main runs each region's kernel and its original on separate inputs.

    Returns (module, [(region, n_inputs, n_outputs, in_types)]).
    """
    ctx = optimized_module.context
    test = hir.clone_module(optimized_module)
    layout = []
    with ctx, ir.Location.unknown():
        hir.safe_erase(hir.main_func(test))
        for r in regions:
            _, fn = original_func(originals[r.id], ctx)
            new = fn.operation.clone(ip=ir.InsertionPoint(test.body))
            ir.SymbolTable.set_symbol_name(new, f"{XLA_PREFIX}{r.id}")
            ir.SymbolTable.set_visibility(new, "private")
        table = ir.SymbolTable(test.operation)
        in_types, out_types = [], []
        for r in regions:
            ft = hir.function_type(table[symbols[r.id]])
            layout.append((r, len(ft.inputs), len(ft.results), list(ft.inputs)))
            in_types += list(ft.inputs)
            out_types += list(ft.results) * 2
        with ir.InsertionPoint(test.body):
            main = func_d.FuncOp("main", (in_types, out_types))
            entry = main.add_entry_block()
        with ir.InsertionPoint(entry):
            outs, pos = [], 0
            for r, n_in, n_out, _ in layout:
                args = list(entry.arguments)[pos:pos + n_in]
                pos += n_in
                ft = hir.function_type(table[symbols[r.id]])
                k = func_d.CallOp(list(ft.results), ir.FlatSymbolRefAttr.get(symbols[r.id]), args)
                x = func_d.CallOp(list(ft.results), ir.FlatSymbolRefAttr.get(f"{XLA_PREFIX}{r.id}"), args)
                outs += list(k.results) + list(x.results)
            func_d.ReturnOp(outs)
    hir.run_upstream_passes(test, "builtin.module(symbol-dce)")
    hir.verify(test)
    return test, layout


# ---------------------------------------------------------------------------------------------
# Checking
# ---------------------------------------------------------------------------------------------

def _inputs(types, trial: str, seed: int, region: Region | None = None,
            spec_of: Callable | None = None) -> list[np.ndarray]:
    """Drawn inputs of a region; ``spec_of()`` gives its kernel spec when its family makes
    drawn inputs consistent (a backward's forward output and statistics)."""
    avals = _avals(types)
    if trial == "random":
        xs = random_inputs(avals, seed)
    else:
        xs = edge_inputs(avals, seed, bound=edge_bound(region.ops) if region is not None else None)
    family = FAMILIES.get(region.kind) if region is not None else None
    if family is not None and family.consistent_inputs is not None and spec_of is not None:
        with jax.ensure_compile_time_eval():   # concrete values, even inside a trace
            xs = family.consistent_inputs(spec_of(), xs)
    return xs


def _spec_of(r: Region, originals: dict, ctx: ir.Context) -> Callable:
    """The kernel spec of region ``r`` from its original function (on demand, once)."""
    @functools.cache
    def get():
        _, fn = original_func(originals[r.id], ctx)
        return FAMILIES[r.kind].spec_from_func(fn)
    return get


def _category(r: Region, category: str | None) -> str:
    return category or r.extra.get("tolerance") or KIND_CATEGORY.get(r.kind, DEFAULT_CATEGORY)


# Passes whose rewrites outside any kernel change results by more than rounding in the same
# order, with the statistics that count their rewrites: BatchNorm's scale folded into the
# weights, a 1x1 convolution computed as a dot, a depthwise convolution as a sum of taps, a
# product over several dims as one over their flattened dims, bf16 products accumulated in f32,
# a dequant scale applied once to an int32 sum.
PASS_CATEGORY = {"batchnorm-fold": ("reassociate", ("folded", "folded_into_next")),
                 "conv1x1-to-dot": ("reassociate", ("conv1x1_as_dot",)),
                 "depthwise-conv-taps": ("reassociate", ("rewritten",)),
                 "dot-f32-accumulate": ("reassociate", ("widened",)),
                 "flatten-dot-dims": ("reassociate", ("flattened",)),
                 "quantize-matmul": ("quantize", ("rewrites",)),
                 "split-reduce": ("reassociate", ("split_float",))}


def program_category(report) -> str:
    """The tolerance category a whole optimized program is compared to the original in: the
    loosest (by its f32 tolerance) of ``kernel`` and the categories its kernels declare
    (:func:`_category`) and its numerics-changing passes' (:data:`PASS_CATEGORY`) that
    rewrote something. A single kernel's category is not enough for a program of many
    (a UNet's Winograd and attention kernels reassociate: its outputs differ from the
    original's by 4.6e-6 relative, past ``kernel``'s 2e-6)."""
    cats = {"kernel"} | {_category(r, None) for r in report.kernels}
    for rec in report.passes:
        cat, keys = PASS_CATEGORY.get(rec.name, (None, ()))
        if cat and any(rec.stats.get(k, 0) for k in keys):
            cats.add(cat)
    return max(sorted(cats), key=lambda c: TOLERANCES[c]["float32"][0])


#: the float types of a region that its float64 twin computes in f64
_FLOAT_TYPE = re.compile(r"(?<=[x<])(bf16|f16|f32)\b")
#: ops whose value depends on a float's width: no float64 twin
_WIDTH_BOUND = ("stablehlo.bitcast_convert", "stablehlo.reduce_precision")


def _is_float(dtype) -> bool:
    return dtype.kind == "f" or dtype.name == "bfloat16"


def run_wide(func_text: str, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The outputs of a region's original function (its text) with every float type made f64,
    compiled and run by XLA on ``inputs`` widened to f64: the region's ops before any rounding
    to 16 or 32 bits, and computed without hlofuse's emitters, so a yardstick that a wrong
    kernel cannot share. Raises for what has no such twin (an op that depends on a float's
    width, a constant written as raw bytes)."""
    if any(w in func_text for w in _WIDTH_BOUND):
        raise ValueError("the region depends on a float's width")
    ctx = hir.new_context()
    mod = _original_as_main(_FLOAT_TYPE.sub("f64", func_text), ctx)
    wide = [x.astype(np.float64) if _is_float(x.dtype) else x for x in map(np.asarray, inputs)]
    with jax.enable_x64(True):
        return run_module(mod, wide, target="cpu")


def _no_less_accurate(got, want, exact, category: str) -> bool:
    """Does the kernel (``got``) stay, element by element, within the original's (``want``)
    distance from the float64 values plus the ``category`` tolerance? Then both are roundings
    of the same computation and the kernel is the better one: a 16-bit sum accumulated in f32
    against XLA's bf16 accumulation, which cancellation leaves far from the exact sum. Integer
    and boolean outputs: :func:`_int_no_farther`; a NaN or infinity must be the same on both
    sides, unless the kernel holds the float64 value where the original overflowed to one.
    False when the float64 values cannot be computed."""
    try:
        exact = exact()
    except Exception as e:  # noqa: BLE001 - no yardstick: the comparison with want decides
        log.debug("no float64 evaluation: %s", _short(e))
        return False
    if len(exact) != len(got) or len(want) != len(got):
        return False
    for g, w, x in zip(got, want, exact):
        g, w, x = np.asarray(g), np.asarray(w), np.asarray(x)
        if g.shape != w.shape or g.shape != x.shape:
            return False
        if not _is_float(g.dtype):
            if not np.all(_int_no_farther(g, w, x.astype(g.dtype))):
                return False
            continue
        rtol, atol = tolerance(g.dtype, category)
        g64, w64, x64 = (a.astype(np.float64) for a in (g, w, x))
        fin = np.isfinite(g64) & np.isfinite(w64) & np.isfinite(x64)
        with np.errstate(invalid="ignore"):
            same = (g64 == w64) | (np.isnan(g64) & np.isnan(w64))
            near_x = (g64 == x64) | (np.isfinite(g64) & np.isfinite(x64) &
                                     (np.abs(g64 - x64) <= atol + rtol * np.abs(x64)))
        # the original is inf or NaN where the float64 value is no NaN, and the kernel holds
        # that value: an f32 intermediate overflowed in the original only (a product past
        # f32's range, which a fused multiply-add in the kernel's dot kept exact)
        kept = ~np.isfinite(w64) & ~np.isnan(x64) & near_x
        if not np.all(fin | same | kept):
            return False
        err_k = np.abs(g64[fin] - x64[fin])
        err_x = np.abs(w64[fin] - x64[fin])
        if np.any(err_k > err_x + atol + rtol * np.abs(x64[fin])):
            return False
    return True


def _int_no_farther(g: np.ndarray, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Integer or boolean outputs: the kernel's (``g``) equal to the original's (``w``) or the
    float64 evaluation's (``x``), or (integers up to 32 bits) no farther from ``x`` than the
    original: an f16 sum converted to int32, which the original's f16 accumulation lost to
    cancellation. Where the region computes on integers alone, ``x`` is ``w``: exact."""
    ok = (g == w) | (g == x)
    if g.dtype.kind in "iu" and g.dtype.itemsize <= 4:
        g, w, x = (a.astype(np.int64) for a in (g, w, x))
        ok |= np.abs(g - x) <= np.abs(w - x)
    return ok


class _Trials:
    """The verdict for one region, trial by trial (see the module docstring: what counts)."""

    def __init__(self, r: Region, category: str):
        self.r, self.category = r, category
        self.failed: str | None = None       # a disagreement that rolls back
        self.edge_only: str | None = None    # finite float differences on edge inputs only

    def add(self, trial: str, got, want, how: str = "", exact=None) -> None:
        """``exact``: None, or a callable giving the region's float64 values (its ops before
        any rounding, :func:`run_wide`) for these inputs."""
        if self.failed:
            return
        problems = compare(got, want, self.category)
        if not problems:
            return
        if exact is not None and _no_less_accurate(got, want, exact, self.category):
            log.debug("region %d (%s): kept; it differs from the original beyond the tolerance "
                      "but is no farther from the float64 values (%s)", self.r.id, self.r.kind,
                      "; ".join(problems[:2]))
            return
        if trial != "random":
            decisive = compare(got, want, self.category, finite_floats=False)
            if not decisive:
                if self.edge_only is None:
                    self.edge_only = f"{trial} inputs{how}: " + "; ".join(problems[:2])
                    log.debug("region %d (%s, at %s): kept; finite values differ on %s only "
                              "(backend accuracy at extreme arguments, not a wrong kernel): %s",
                              self.r.id, self.r.kind, ", ".join(self.r.locations[:3]) or "unknown location",
                              trial + " inputs", "; ".join(problems[:2]))
                return
            problems = decisive
        self.failed = f"{trial} inputs{how}: " + "; ".join(problems[:2])

    def verdict(self, n_trials: int, mode: str = "device", how: str = "") -> RegionCheck:
        if self.failed:
            return RegionCheck(self.r.id, "rolled back", self.failed, mode)
        detail = f"{n_trials} trial(s){how}"
        if self.edge_only:
            detail += f"; finite values differ on {self.edge_only} (kept: backend accuracy at extreme arguments)"
        return RegionCheck(self.r.id, "ok", detail, mode)


def _check_on_device(module: ir.Module, regions: list[Region], originals: dict, target: str,
                     seed: int, trials: Sequence[str], category: str | None) -> dict[int, RegionCheck]:
    """Run kernels and originals side by side on the target's device. One compile for all
    regions; when that fails, one per region to find the culprits."""
    verdicts: dict[int, RegionCheck] = {}

    def run_group(group: list[Region]) -> None:
        test, layout = _side_by_side(module, group, originals,
                                     {r: k.symbol for r, k in kernel_funcs(module).items()})
        checks = {r.id: _Trials(r, _category(r, category)) for r in group}
        specs = {r.id: _spec_of(r, originals, module.context) for r in group}
        for t, trial in enumerate(trials):
            per_region = [_inputs(types, trial, seed + 7919 * t + r.id, r, specs[r.id])
                          for r, _, _, types in layout]
            outs = run_module(test, [x for xs in per_region for x in xs], target=target)
            pos = 0
            for (r, _, n_out, _), ins in zip(layout, per_region):
                got, want = outs[pos:pos + n_out], outs[pos + n_out:pos + 2 * n_out]
                pos += 2 * n_out
                checks[r.id].add(trial, got, want,
                                 exact=lambda t=originals[r.id], ins=ins: run_wide(t, ins))
        for r in group:
            verdicts[r.id] = checks[r.id].verdict(len(trials))

    try:
        run_group(regions)
    except Exception as e:  # noqa: BLE001 - verification boundary: find the kernel that failed
        log.debug("side-by-side check of %d regions failed (%s); one region at a time",
                  len(regions), _short(e))
        verdicts.clear()
        for r in regions:
            try:
                run_group([r])
            except Exception as e:  # noqa: BLE001 - verification boundary: rolled back, verdict says why
                verdicts[r.id] = RegionCheck(r.id, "rolled back", f"kernel did not compile or run: {_short(e)}")
    return verdicts


def _check_interpret(regions: list[Region], originals: dict, target: str, seed: int,
                     trials: Sequence[str], category: str | None, ctx: ir.Context) -> dict[int, RegionCheck]:
    """The target is absent: rebuild each kernel in Pallas interpret mode for ``target`` (same
    blocks and emitters) and compare it on the CPU with the original function run by XLA."""
    verdicts = {}
    for r in regions:
        family = FAMILIES.get(r.kind)
        try:
            _, fn = original_func(originals[r.id], ctx)
            spec = family.spec_from_func(fn)
            kernel = family.build(spec, target, interpret=True)
        except Exception as e:  # noqa: BLE001 - verification boundary: not verified, verdict says why
            verdicts[r.id] = RegionCheck(r.id, "not verified", f"{target} device absent and no "
                                         f"interpret-mode rebuild ({_short(e)})", "interpret")
            continue
        ref_mod = _original_as_main(originals[r.id], ctx)
        types = list(hir.function_type(fn).inputs)
        try:
            # lowered, then run by XLA directly: we may be inside a JAX trace (grad, vmap), and
            # evaluating eagerly there would turn the kernel's literals into captured constants
            kernel_text = lowering.lower_to_text(kernel, _avals(types), "cpu")
            check = _Trials(r, _category(r, category))
            for t, trial in enumerate(trials):
                inputs = _inputs(types, trial, seed + 7919 * t + r.id, r, lambda: spec)
                # both compiled with every op rounded to its type, as Triton and Mosaic compute
                # the kernel: XLA's default (excess precision) fed a bf16 kernel's tan the
                # divide's unrounded f32 quotient, one ulp off near tan's poles, and a correct
                # kernel measured 2% off and was rolled back (tests/test_fuzz.py)
                want = run_module(ref_mod, inputs, target="cpu", exact=True)
                got = run_module(kernel_text, inputs, target="cpu", exact=True)
                check.add(trial, got, want, f" (interpret mode for {target})",
                          exact=lambda t=originals[r.id], inputs=inputs: run_wide(t, inputs))
                if check.failed:
                    break
            verdicts[r.id] = check.verdict(len(trials), "interpret", ", interpret mode")
        except Exception as e:  # noqa: BLE001 - verification boundary: rolled back, verdict says why
            verdicts[r.id] = RegionCheck(r.id, "rolled back", f"interpret-mode kernel failed: {_short(e)}",
                                         "interpret")
    return verdicts


def _original_as_main(text: str, ctx: ir.Context) -> ir.Module:
    m, fn = original_func(text, ctx)
    with ctx:
        ir.SymbolTable.set_symbol_name(fn.operation, "main")
        ir.SymbolTable.set_visibility(fn.operation, "public")
    return m


# ---------------------------------------------------------------------------------------------
# Rollback
# ---------------------------------------------------------------------------------------------

def verify_module(optimized, *, target: Target | str | None = None, seed: int = 0,
                  trials: Sequence[str] = TRIALS, category: str | None = None,
                  warn: bool = True) -> "Optimized":
    """Check every kernelized region of ``optimized`` (an :class:`hlofuse.Optimized`) against
    its original subgraph and roll back the ones that disagree. Mutates and returns it.

    Works from the optimized module and its report alone (no ``Exported`` needed), in the
    process that ran :func:`hlofuse.optimize`: ``kernelize`` keeps the original subgraphs in
    the module (:mod:`hlofuse.passes.kernel_table`).

    Args:
      optimized: the result of ``hlofuse.optimize``.
      target: defaults to ``optimized.report.target``.
      seed: base seed of the random inputs.
      trials: input sets to try, in order: 'random' (N(0,1) floats, small ints) and 'edge'
        (the same salted with ±inf, NaN, -0, subnormals, huge values, integer extremes, within
        :data:`hlofuse.runtime.testing.EDGE_DOMAIN`); see the module docstring for what rolls back.
      category: tolerance category for every region (default: by region kind).
      warn: emit a :class:`HlofuseWarning` per rolled-back region.

    Each checked region gets ``region.extra['verify']`` ('ok ...', 'rolled back: ...' or
    'not verified: ...'); a rolled-back region gets ``kernel=None`` and
    ``reason='verification failed: ...'``.
    """
    if category is not None and category not in TOLERANCES:
        raise ValueError(f"verify_module(category={category!r}): expected one of "
                         f"{', '.join(sorted(TOLERANCES))}")
    bad = [t for t in trials if t not in TRIALS]
    if bad or not trials:
        raise ValueError(f"verify_module(trials={tuple(trials)!r}): expected some of {TRIALS}")
    report = optimized.report
    target = Target.of(target or report.target)
    table = kernel_funcs(optimized.module)
    regions = [r for r in report.kernels if r.id in table]
    originals = {r.id: table[r.id].original for r in regions
                 if table[r.id].original is not None}
    checkable = [r for r in regions if r.id in originals]
    for r in regions:
        if r.id not in originals:
            r.extra["verify"] = "not verified: original subgraph not kept"
    if not checkable:
        return optimized
    if backend_for(target) is not None:
        verdicts = _check_on_device(optimized.module, checkable, originals, target, seed,
                                    trials, category)
    else:
        verdicts = _check_interpret(checkable, originals, target, seed, trials, category,
                                    optimized.module.context)
    for r in checkable:
        v = verdicts[r.id]
        if v.status == "rolled back":
            reason = f"verification failed: {v.detail}"
            rollback(optimized, r, reason)
            r.extra["verify"] = f"rolled back: {v.detail}"
            where = ", ".join(r.locations[:3]) or "unknown location"
            msg = f"hlofuse: region {r.id} ({r.kind}, at {where}) rolled back to XLA: {reason}"
            report.note(msg)
            if warn:
                warnings.warn(msg, HlofuseWarning, stacklevel=2)
        else:
            r.extra["verify"] = f"{v.status}" + (f" ({v.detail})" if v.detail else "")
            if v.status == "not verified":
                report.note(f"region {r.id} not verified: {v.detail}")
    report.ops_after = count_main_ops(optimized.module)
    return optimized


def verify_regions(exp0, opt, opts, *, name: str = "fun"):
    """``hlofuse.jit(..., check=True)``'s hook (called by :func:`hlofuse.runtime.program.export_optimized`).

    ``exp0`` (the unoptimized ``Exported``) is not needed: regions are checked against the
    original subgraphs kept in the report. ``opts.pass_options['verify_seed']`` sets the seed.
    """
    return verify_module(opt, target=opts.target, seed=int(opts.pass_options.get("verify_seed", 0)))


def unoptimized(exp0, opts, *, name: str, error: BaseException):
    """The fallback when optimizing failed: the original module, unchanged, with a warning
    naming what failed. Re-raises with ``options={'strict': True}`` (debugging) and for
    configuration errors (unknown pass names)."""
    if opts.pass_options.get("strict") or is_config_error(error):
        raise error
    what = f"pass '{error.pass_name}'" if isinstance(error, PassFailure) else type(error).__name__
    msg = (f"hlofuse: optimizing {name} failed in {what}; running it unoptimized. "
           f"{_short(error)} (options={{'strict': True}} raises instead)")
    warnings.warn(msg, HlofuseWarning, stacklevel=3)
    mod = hir.parse(exp0.mlir_module(), hir.new_context(), source=name)
    report = Report(target=Target.of(opts.target).kind, source=name)
    report.note(msg)
    report.ops_before = report.ops_after = count_main_ops(mod)
    return Optimized(mod, report)


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:300] if msg else ''}"


# ---------------------------------------------------------------------------------------------
# Whole programs: the differential oracle of the fuzz tests
# ---------------------------------------------------------------------------------------------

def check_graph(spec: GraphSpec, *, target: str = "cpu", category: str | None = None,
                verify: bool = False, pipeline=None, options: dict | None = None) -> Optimized:
    """Differential check of one random graph; raises AssertionError on any violation.

    Exports the program, optimizes it for ``target`` and asserts that the module verifies,
    that a second run of the pipeline over the result changes nothing (idempotence), and — on
    a target present in this process — that the optimized module gives the unoptimized one's
    results (``category`` tolerance; ints and bools exact). The default category follows the
    kernels made, as :func:`verify_module` does: ``kernel`` when all are elementwise,
    ``reassociate`` when a reduction, contraction or attention kernel may sum in another order.
    ``verify=True`` also runs :func:`verify_module` and asserts no region is rolled back.
    ``spec`` comes from :func:`hlofuse.runtime.testing.stablehlo_graphs`. ``options``: pass options
    (default :data:`hlofuse.runtime.testing.ALL_KERNELS`: every kernel is built, on gpu/tpu too, since
    the kernels are what this checks).
    """
    options = ALL_KERNELS if options is None else options
    exp = jax.export.export(jax.jit(spec.build()), platforms=[Target.of(target).platform])(*spec.avals())
    text = exp.mlir_module()
    opt = optimize(text, target=target, pipeline=pipeline, options=options, source="fuzz")
    hir.verify(opt.module)
    again = optimize(opt.text, target=target, pipeline=pipeline, options=options,
                     source="fuzz-again")
    assert again.text == opt.text, "a second run of the pipeline changed the module:\n" + _diff(opt.text, again.text)
    if verify:
        verify_module(opt, warn=False)
        bad = [r for r in opt.report.regions if str(r.extra.get("verify", "")).startswith("rolled back")]
        assert not bad, "verification rolled back: " + "; ".join(f"region {r.id}: {r.reason}" for r in bad)
    if backend_for(target) is not None:
        values = spec.input_values()
        inputs = [values[i] for i in sorted(exp.module_kept_var_idx)]  # export drops unused args
        want = run_module(text, inputs, target=target)
        got = run_module(opt.module, inputs, target=target)
        assert_same(got, want, category or program_category(opt.report))
    return opt


def _diff(a: str, b: str, n: int = 60) -> str:
    return "\n".join(list(difflib.unified_diff(a.splitlines(), b.splitlines(), lineterm=""))[:n])
