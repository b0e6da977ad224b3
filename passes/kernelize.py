"""``kernelize``: replace each outlined region with a Pallas kernel lowered for the target.

For every ``func.call`` of a function carrying ``hlofuse.kind``, the kernel family for that kind
builds a ``pallas_call`` wrapper, lowers it for the target (cpu: interpret mode, plain StableHLO;
gpu: Triton; tpu: Mosaic), imports the lowered functions into the module and points the call at
the kernel. Any failure (unsupported op, lowering error) leaves the region to XLA — the call to
the plain outlined function, which XLA inlines — and the report says why.
Preconditions: regions outlined by a fusion pass. Invariant: results within the tolerance table
(kernels compute the same ops; transcendental approximations can differ per backend).
"""

from __future__ import annotations

import hashlib
import threading

import jax
from jaxlib.mlir import ir

from hlofuse import ir as hir
from hlofuse.pipeline import Pass, register_pass
from hlofuse.passes.fusion.outline import KIND_ATTR, REGION_ATTR

_CACHE: dict[tuple, tuple[str, str, str]] = {}
_CACHE_LOCK = threading.Lock()


def _avals(fn_op) -> list:
    ftype = ir.FunctionType(ir.TypeAttr(fn_op.attributes["function_type"]).value)
    out = []
    for t in ftype.inputs:
        info = hir.tensor_type_info(t)
        out.append(jax.ShapeDtypeStruct(info.shape, hir.np_dtype(info.dtype)))
    return out


def lower_region(fn_op, kind: str, target: str) -> tuple[str, str, str]:
    """(kernel module text, kernel name, block description), cached by region body + target."""
    from hlofuse.kernels import FAMILIES
    from hlofuse.kernels.lowering import lower_to_text
    family = FAMILIES.get(kind)
    if family is None:
        raise NotImplementedError(f"no kernel family for region kind '{kind}'")
    body = "\n".join(str(op) for op in fn_op.regions[0].blocks[0].operations)
    sig = str(fn_op.attributes["function_type"])
    key = (target, kind, hashlib.sha1((sig + body).encode()).hexdigest())
    with _CACHE_LOCK:
        if key in _CACHE:
            return _CACHE[key]
    spec = family.spec_from_func(fn_op)
    fn = family.build(spec, target)
    text = lower_to_text(fn, _avals(fn_op), target)
    result = (text, fn.kernel_name, str(fn.blocks))
    with _CACHE_LOCK:
        _CACHE[key] = result
    return result


def _short(e: Exception) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:200] if msg else ''}"


@register_pass
class Kernelize(Pass):
    name = "kernelize"

    def run(self, module, ctx):
        table = ir.SymbolTable(module.operation)
        calls = [op for op in hir.all_ops(module) if op.name == "func.call"]
        n_kernels = n_failed = 0
        for call in calls:
            callee = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
            fn_op = table[callee]
            if KIND_ATTR not in fn_op.attributes:
                continue
            kind = ir.StringAttr(fn_op.attributes[KIND_ATTR]).value
            rid = ir.IntegerAttr(fn_op.attributes[REGION_ATTR]).value
            region = ctx.report.region(rid)
            if ctx.option("no_kernels"):
                region.reason = "kernels disabled by option"
                continue
            try:
                text, kname, blocks = lower_region(fn_op, kind, ctx.target)
                kmod = hir.parse(text, module.context, source=f"kernel for region {rid}")
                mapping = hir.import_funcs(module, kmod, f"hlofuse_k{rid}_")
                with module.context:
                    call.attributes["callee"] = ir.FlatSymbolRefAttr.get(mapping["main"])
                region.kernel = kname
                region.block = blocks
                n_kernels += 1
            except Exception as e:  # leave the region to XLA, say why
                region.reason = f"kernel build failed ({_short(e)})"
                n_failed += 1
                if ctx.option("strict"):
                    raise
        return {"kernels": n_kernels, "left_to_xla": n_failed}
