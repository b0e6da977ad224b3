"""``kernelize``: replace each outlined region with a Pallas kernel lowered for the target.

For every ``func.call`` of a function carrying ``hlofuse.kind``, the kernel family for that kind
builds a ``pallas_call`` wrapper, lowers it for the target (cpu: interpret mode, plain StableHLO;
gpu: Triton; tpu: Mosaic), imports the lowered functions into the module and points the call at
the kernel. Any failure (unsupported op, lowering error) leaves the region to XLA — the call to
the plain outlined function, which XLA inlines — and the report says why; failures other than
``NotImplementedError`` (unsupported-but-legal) also warn, naming the region and its source line.
Region functions left to XLA are marked ``hlofuse.xla`` and kernel functions are named
``hlofuse_k<id>_*``, so running the pipeline again over its output changes nothing.
Preconditions: regions outlined by a fusion pass. Invariant: results within the tolerance table
(kernels compute the same ops; transcendental approximations can differ per backend).
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
import warnings

from jaxlib.mlir import ir

from hlofuse import ir as hir
from hlofuse.pipeline import Pass, register_pass
from hlofuse.kernels import FAMILIES
from hlofuse.kernels.common import func_avals
from hlofuse.kernels import lowering
from hlofuse.target import Target
from hlofuse.passes.fusion.outline import KERNEL_PREFIX, KIND_ATTR, REGION_ATTR, XLA_ATTR
from hlofuse.report import HlofuseWarning

_CACHE: dict[tuple, tuple[str, str, str]] = {}
KERNEL_INFO_ATTR = "hlofuse.kernel"   # on a kernel's entry function: "kind|region|name|blocks"
_CACHE_LOCK = threading.Lock()


def region_hash(fn_op, kind: str, target: Target) -> str:
    """Identity of a region for measured decisions (``region.extra['region_hash']``): its
    kind, the target (kind and chip) and its outlined function's type and body without source
    locations, so the same region in another module or process has the same hash."""
    target = Target.of(target)
    body = "\n".join(hir.op_text(op_) for op_ in fn_op.regions[0].blocks[0].operations)
    sig = str(fn_op.attributes["function_type"])
    text = f"{kind}|{target.kind}|{target.chip_name}|{sig}|{body}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def lower_region(fn_op, kind: str, target: Target) -> tuple[str, str, str]:
    """(kernel module text, kernel name, block description), cached by region body + target."""
    target = Target.of(target)
    family = FAMILIES.get(kind)
    if family is None:
        raise NotImplementedError(f"no kernel family for region kind '{kind}'")
    body = "\n".join(hir.op_text(op_) for op_ in fn_op.regions[0].blocks[0].operations)
    sig = str(fn_op.attributes["function_type"])
    # tiles are per chip: the key holds the target's chip
    key = (target.kind, target.chip_name, kind, hashlib.sha1((sig + body).encode()).hexdigest())
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    spec = family.spec_from_func(fn_op)
    fn = family.build(spec, target)
    text = lowering.lower_to_text(fn, func_avals(fn_op), target)
    result = (text, fn.kernel_name, str(fn.blocks))
    with _CACHE_LOCK:
        _CACHE[key] = result
    return result


def leave_to_xla(fn_op, reason: str) -> None:
    """Mark an outlined region function as left to XLA, so later runs do not retry it."""
    with fn_op.context:
        fn_op.attributes[XLA_ATTR] = ir.StringAttr.get(reason)


def _unique_prefix(module, rid: int) -> str:
    """``hlofuse_k<rid>_``, or with a suffix when a module optimized before already has it."""
    names = [hir.func_name(f) for f in hir.funcs(module)]
    prefix, k = f"{KERNEL_PREFIX}{rid}_", 0
    while any(n.startswith(prefix) for n in names):
        k += 1
        prefix = f"{KERNEL_PREFIX}{rid}_{k}_"
    return prefix


def _short(e: Exception) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:200] if msg else ''}"


@register_pass
class Kernelize(Pass):
    name = "kernelize"

    @dataclasses.dataclass(frozen=True)
    class Options:
        no_kernels: bool = False  # leave every region to XLA (regions are still outlined)

    def run(self, module, ctx):
        table = ir.SymbolTable(module.operation)
        calls = [op for op in hir.all_ops(module) if op.name == "func.call"]
        n_kernels = n_failed = 0
        for call in calls:
            callee = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
            fn_op = table[callee]
            if KIND_ATTR not in fn_op.attributes or XLA_ATTR in fn_op.attributes:
                continue  # not a region, or one left to XLA by an earlier run (idempotence)
            kind = ir.StringAttr(fn_op.attributes[KIND_ATTR]).value
            rid = ir.IntegerAttr(fn_op.attributes[REGION_ATTR]).value
            if rid >= len(ctx.report.regions) or ctx.report.region(rid).kind != kind:
                continue  # outlined by an earlier run whose report we do not have
            region = ctx.report.region(rid)
            if self.options.no_kernels:
                region.reason = "kernels disabled by option"
                leave_to_xla(fn_op, region.reason)
                continue
            original = fn_op.operation.get_asm(enable_debug_info=True)
            region.extra["region_hash"] = region_hash(fn_op, kind, ctx.target)
            try:
                text, kname, blocks = lower_region(fn_op, kind, ctx.target)
                kmod = hir.parse(text, module.context, source=f"kernel for region {rid}")
                # the cleanups later runs apply to the whole module, applied now (idempotence)
                hir.run_upstream_passes(kmod, "builtin.module(canonicalize,cse,canonicalize)")
                mapping = hir.import_funcs(module, kmod, _unique_prefix(module, rid))
                with module.context:
                    call.attributes["callee"] = ir.FlatSymbolRefAttr.get(mapping["main"])
                    # what a compile check of the module alone (hlofuse.aot) reports per kernel
                    kfn = ir.SymbolTable(module.operation)[mapping["main"]]
                    kfn.attributes[KERNEL_INFO_ATTR] = ir.StringAttr.get(
                        f"{kind}|{rid}|{kname}|{blocks}")
                region.kernel = kname
                region.block = blocks
                region.extra["kernel_func"] = mapping["main"]
                ctx.report.xla_funcs[rid] = original  # for hlofuse.verify (check and rollback)
                n_kernels += 1
            except Exception as e:  # leave the region to XLA, say why
                region.reason = f"kernel build failed ({_short(e)})"
                leave_to_xla(fn_op, region.reason)
                n_failed += 1
                if ctx.strict:
                    raise
                if not isinstance(e, NotImplementedError):  # unsupported-but-legal: report only
                    where = ", ".join(region.locations[:3]) or "unknown location"
                    warnings.warn(f"hlofuse: region {rid} ({kind}, at {where}) left to XLA: "
                                  f"{region.reason}", HlofuseWarning, stacklevel=2)
        return {"kernels": n_kernels, "left_to_xla": n_failed}
