"""Which regions run as kernels and which as XLA's own code: the one place that decides it
after the passes, and the one that puts a kernel back.

``kernelize`` builds a kernel for each region the cost model picked, unless its build-time rules
leave the region to XLA (a failed build; on gpu/tpu the unmeasured policy for what XLA fuses
itself, :func:`hlofuse.passes.kernelize.unmeasured_reasons`); it keeps each region's original
function in the module (:mod:`hlofuse.passes.kernel_table`). Everything after that is here:

* :func:`hold_back_unmeasured`: on gpu/tpu, when this process will measure, every kernel is
  built (:func:`measuring_options`) and the unmeasured ones XLA fuses itself run as XLA's code
  until a measurement decides them;
* :func:`apply_cached_decisions`: regions a measurement on this device found slower as
  kernels (the autotune cache) run as XLA's code;
* :func:`xla_to_apply`: under a decision measured in this process, the regions that run as
  XLA's code (the call path's answer, :mod:`hlofuse.frontend.tuning`);
* :func:`rollback`: the one operation all of them, verification (a kernel that disagrees with
  its original, :mod:`hlofuse.runtime.verify`) and the AOT compile check (a kernel that does
  not compile for a chip, :mod:`hlofuse.runtime.aot`) use: the region's calls go back to its
  original function, the kernel is dropped, the report says why.
"""

from __future__ import annotations

import copy

from jaxlib.mlir import ir

from hlofuse.core import ir as hir
from hlofuse.core.report import Region
from hlofuse.core.target import Target
from hlofuse.passes import kernelize
from hlofuse.passes.fusion.outline import XLA_ATTR
from hlofuse.passes.kernel_table import kernel_funcs, original_func
from hlofuse.runtime import autotune as at
from hlofuse.runtime.api import Optimized, count_main_ops

__all__ = ["rollback", "without_kernels", "apply_cached_decisions", "hold_back_unmeasured",
           "measuring_options", "measured_form", "xla_to_apply"]


def rollback(optimized, region: Region, reason: str) -> None:
    """Point the region's call(s) back at its original function and drop the kernel."""
    module = optimized.module
    ctx = module.context
    k = kernel_funcs(module)[region.id]
    kernel_func = k.symbol
    _, fn = original_func(k.original, ctx)
    with ctx, ir.Location.unknown():
        table = ir.SymbolTable(module.operation)
        base = name = hir.func_name(fn)
        k = 0
        while name in table:
            k += 1
            name = f"{base}_{k}"
        new = fn.operation.clone(ip=ir.InsertionPoint(module.body))
        ir.SymbolTable.set_symbol_name(new, name)
        new.attributes[XLA_ATTR] = ir.StringAttr.get(reason)
        for op in hir.all_ops(module):
            if op.name == "func.call" and ir.FlatSymbolRefAttr(op.attributes["callee"]).value == kernel_func:
                op.attributes["callee"] = ir.FlatSymbolRefAttr.get(name)
    hir.run_upstream_passes(module, "builtin.module(symbol-dce)")
    hir.verify(module)
    region.reason = reason
    region.kernel = None
    region.block = None


def without_kernels(opt: Optimized, reasons: dict[str, str]) -> Optimized:
    """A copy of ``opt`` whose regions with a hash in ``reasons`` (region hash -> why) run as
    their own ops (XLA's code) instead of their kernels; the report says why per region. The
    region's original function is the one kernelize replaced, so results are unchanged."""
    report = copy.deepcopy(opt.report)
    module = hir.clone_module(opt.module)
    out = Optimized(module, report, base_hash=opt.base_hash or at.module_hash(opt.text))
    kept = {rid for rid, k in kernel_funcs(module).items() if k.original is not None}
    for r in list(report.kernels):
        h = r.extra.get("region_hash")
        if h in reasons and r.id in kept:
            rollback(out, r, reasons[h])
            r.extra["decision"] = reasons[h]
    report.ops_after = count_main_ops(module)
    return out


def apply_cached_decisions(opt: Optimized) -> Optimized:
    """``opt`` with the regions whose cached measured decision on this device is XLA run
    without their kernels (:func:`without_kernels`); unchanged when there is none."""
    hashes = [r.extra["region_hash"] for r in opt.report.kernels if r.extra.get("region_hash")]
    if not hashes:
        return opt
    try:
        found = at.cached_xla_regions(hashes)
    except Exception:  # noqa: BLE001 - a decision cache never breaks a compile
        return opt
    if not found:
        return opt
    return without_kernels(opt, {h: f"{d.get('reason', 'kept XLA, measured')} (cached decision)"
                                 for h, d in found.items()})


def measuring_options(pass_options: dict, target: Target) -> dict:
    """``pass_options`` for a program whose kernels this process will measure: where the
    ``unmeasured`` policy holds regions back with XLA (gpu/tpu), kernelize builds them all
    (``unmeasured="kernel"``) and :func:`hold_back_unmeasured` sends the ones no measurement
    decided back to XLA, so tuning can time each against XLA's code."""
    k = dict(pass_options.get("kernelize", {}))
    if kernelize.unmeasured_policy(k.get("unmeasured", "auto"), target) != "xla":
        return pass_options
    k["unmeasured"] = "kernel"
    return dict(pass_options, kernelize=k)


def hold_back_unmeasured(opt: Optimized) -> Optimized:
    """``opt`` with its unmeasured kernels that XLA fuses itself (kernelize's
    ``region.extra['xla_fuses']``) run as XLA's code, except those whose cached measured
    decision on this device is the kernel. The result remembers ``opt`` (``.full``) and the
    regions held back (``.unmeasured``, hashes): tuning times them from ``.full``."""
    cand = {r.extra["region_hash"] for r in opt.report.kernels
            if r.extra.get("xla_fuses") and r.extra.get("region_hash")}
    if not cand:
        return opt
    try:
        decided = at.cached_kernel_regions(cand)
    except Exception:  # noqa: BLE001 - a decision cache never breaks a compile
        decided = {}
    for r in opt.report.kernels:
        d = decided.get(r.extra.get("region_hash"))
        if d is not None:
            r.extra["measured"] = f"{d.get('reason', 'kept kernel, measured')} (cached decision)"
    held = frozenset(cand - set(decided))
    if not held:
        return opt
    out = without_kernels(opt, {h: kernelize.XLA_FUSES for h in held})
    out.full, out.unmeasured = opt, held
    return out


def measured_form(opt: Optimized) -> Optimized:
    """The optimized module tuning measures: with every kernel built (``Optimized.full``)
    where unmeasured ones are held back, else the module as built."""
    return opt.full or opt


def xla_to_apply(entry, d: at.Decision) -> tuple[frozenset, bool]:
    """``(hashes, full)``: the regions that run as XLA's code under decision ``d``, and
    whether they are counted from the module with every kernel built (``full``: some kernel
    held back unmeasured was measured to win and runs). Without ``full``: the decision's XLA
    regions that still have a kernel in ``entry``'s module. The call path's one answer to
    "kernel or XLA" for a region once measured."""
    if entry is None or d is None or not d.regions:
        return frozenset(), False
    opt = entry.optimized
    present = {r.extra.get("region_hash") for r in measured_form(opt).report.kernels}
    xla = frozenset(d.xla_regions & present)
    won = {h for h, c in d.regions.items() if c.get("choice") == "kernel"} & opt.unmeasured
    if not won:   # every held-back kernel stays held back: the module as built, minus xla
        return xla - opt.unmeasured, False
    return xla | (opt.unmeasured - won), True
