"""The kernels of an optimized module, read from the module itself.

``kernelize`` marks each kernel's entry function with :data:`KERNEL_INFO_ATTR`
(``"kind|region|name|blocks"``) and keeps, on the same function, the region's original
outlined function as text (:data:`ORIGINAL_ATTR`): what verification checks the kernel against
and what a rollback (a failed check, a measured decision for XLA) puts back. The module is the
truth: whatever copy of it a cache or a process holds carries its kernels and their originals,
and a report never has to (``report.xla_funcs`` and ``region.extra['kernel_func']`` were that
state once). Passes that rewrite the module after kernelize rewrite the originals too
(:func:`set_original`), so a region put back runs what the pipeline makes of it.
"""

from __future__ import annotations

import dataclasses

from jaxlib.mlir import ir

from hlofuse.core import ir as hir

__all__ = ["KERNEL_INFO_ATTR", "ORIGINAL_ATTR", "KernelFunc", "kernel_funcs", "set_original",
           "original_func", "text_without_originals"]

KERNEL_INFO_ATTR = "hlofuse.kernel"       # on a kernel's entry function: "kind|region|name|blocks"
ORIGINAL_ATTR = "hlofuse.xla_original"    # beside it: the region's original function, as text


@dataclasses.dataclass(frozen=True)
class KernelFunc:
    """One kernel of a module: its region id and kind, the entry function's symbol, the
    kernel's name and blocks, and the region's original function (text; None when not kept)."""
    region: int
    kind: str
    symbol: str
    kernel: str
    blocks: str
    original: str | None


def _info(fn) -> tuple | None:
    attrs = fn.operation.attributes
    if KERNEL_INFO_ATTR not in attrs:
        return None
    parts = ir.StringAttr(attrs[KERNEL_INFO_ATTR]).value.split("|", 3)
    if len(parts) != 4 or not parts[1].isdigit():
        return None
    return parts


def kernel_funcs(module: ir.Module) -> dict[int, KernelFunc]:
    """Region id -> :class:`KernelFunc` of every kernel entry function in ``module``."""
    out = {}
    with module.context:
        for fn in hir.funcs(module):
            parts = _info(fn)
            if parts is None:
                continue
            kind, rid, kname, blocks = parts
            attrs = fn.operation.attributes
            original = ir.StringAttr(attrs[ORIGINAL_ATTR]).value if ORIGINAL_ATTR in attrs \
                else None
            out[int(rid)] = KernelFunc(int(rid), kind, hir.func_name(fn), kname, blocks,
                                       original)
    return out


def set_original(module: ir.Module, region: int, text: str) -> None:
    """Keep ``text`` as the original function of ``region``'s kernel in ``module``."""
    with module.context:
        for fn in hir.funcs(module):
            parts = _info(fn)
            if parts is not None and int(parts[1]) == region:
                fn.operation.attributes[ORIGINAL_ATTR] = ir.StringAttr.get(text)
                return
    raise KeyError(f"no kernel of region {region} in the module")


def original_func(text: str, ctx: ir.Context):
    """``(module, func)``: the single ``func.func`` of a kept original (an outlined region's
    text) parsed in ``ctx``."""
    m = hir.parse(text, ctx, source="original region")
    fs = hir.funcs(m)
    if len(fs) != 1:
        raise hir.IRError(f"expected one function in the kept region text, found {len(fs)}")
    return m, fs[0]


def text_without_originals(module: ir.Module, *, debug_info: bool = False) -> str:
    """``module`` printed with the kept originals left out (what ``Lowered.as_text()`` shows:
    the program that runs, without hlofuse's bookkeeping). The module itself keeps them."""
    kernels = kernel_funcs(module)
    if not any(k.original is not None for k in kernels.values()):
        return hir.to_text(module, debug_info=debug_info)
    copy = hir.clone_module(module)
    with copy.context:
        for fn in hir.funcs(copy):
            if ORIGINAL_ATTR in fn.operation.attributes:
                del fn.operation.attributes[ORIGINAL_ATTR]
    return hir.to_text(copy, debug_info=debug_info)
