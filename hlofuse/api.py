"""``hlofuse.optimize``: run a pipeline over a StableHLO module (text, bytes or ``ir.Module``)."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from jaxlib.mlir import ir

from hlofuse import ir as hir
from hlofuse.pipeline import PassContext, PassManager
from hlofuse.report import Report

TARGETS = ("cpu", "gpu", "tpu")


def normalize_target(target: str | None) -> str:
    """None -> the current default backend; 'cuda'/'rocm' -> 'gpu'."""
    if target is None:
        import jax
        target = jax.default_backend()
    t = {"cuda": "gpu", "rocm": "gpu", "host": "cpu"}.get(target, target)
    if t not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS} or None, got {target!r}")
    return t


@dataclasses.dataclass
class Optimized:
    """The result of :func:`optimize`: the rewritten module and what was done to it."""
    module: ir.Module
    report: Report

    @property
    def text(self) -> str:
        return hir.to_text(self.module)

    def text_with_locations(self) -> str:
        return hir.to_text(self.module, debug_info=True)

    @property
    def bytecode(self) -> bytes:
        return hir.to_bytecode(self.module)

    def portable_artifact(self, target_version: str | None = None) -> bytes:
        return hir.to_portable_artifact(self.module, target_version)


KERNEL_PREFIX = "hlofuse_k"


def count_main_ops(module: ir.Module) -> int:
    """Program-level op count: ops in every function body (nested bodies included), except
    inside imported kernel functions (whose ops are the kernel's implementation)."""
    n = 0
    for f in hir.funcs(module):
        if hir.func_name(f).startswith(KERNEL_PREFIX):
            continue
        n += sum(1 for op in hir.all_ops(f) if op.name not in ("func.func", "func.return", "stablehlo.return"))
    return n


def optimize(module, *, target: str | None = "cpu", pipeline: str | Sequence[str] | None = None,
             disable: Sequence[str] = (), dump_dir: str | None = None, options: dict | None = None,
             source: str = "<module>", donated_args: Sequence[int] = ()) -> Optimized:
    """Optimize StableHLO for ``target``.

    Args:
      module: StableHLO text, MLIR bytecode, a portable artifact, ``Exported.serialize()`` bytes,
        or an ``ir.Module`` (re-parsed into a private context; the argument is never mutated).
      target: 'cpu', 'gpu', 'tpu' or None (the current backend).
      pipeline: a pipeline name ('default', 'cleanup', 'none'), comma-separated pass names or a list.
      disable: pass names to skip (also ``HLOFUSE_DISABLE_PASSES``).
      dump_dir: write the module after every pass as ``NNN_<pass>.mlir``.
      options: pass options (e.g. ``{'no_kernels': True}``).
    """
    target = normalize_target(target)
    ctx = hir.new_context()
    mod = hir.parse(module, ctx, source=source)
    if mod is module:  # caller's module in our context cannot happen (fresh ctx); be explicit
        mod = hir.clone_module(module)
    hir.main_func(mod, source=source)
    report = Report(target=target, source=source)
    report.ops_before = count_main_ops(mod)
    pctx = PassContext(target=target, report=report, options=dict(options or {}),
                       donated_args=tuple(donated_args), source=source)
    PassManager(pipeline, disable=disable, dump_dir=dump_dir).run(mod, pctx)
    report.ops_after = count_main_ops(mod)
    note_unhandled(mod, report)
    return Optimized(mod, report)


_UNHANDLED_WHY = {
    "opaque": "opaque to hlofuse (library call, side effect, collective or RNG); never fused",
    "dynamic": "dynamic shape; passed through unchanged",
}


def note_unhandled(module: ir.Module, report) -> None:
    """Tell the user which ops hlofuse left to XLA on principle, and why (one note per kind)."""
    from hlofuse.ops import OpClass, rule_for
    found: dict[str, list] = {}
    for f in hir.funcs(module):
        if hir.func_name(f).startswith(KERNEL_PREFIX):
            continue
        for op in hir.all_ops(f):
            kind = None
            if rule_for(op.name).cls is OpClass.OPAQUE:
                kind = "opaque"
            elif any(isinstance(r.type, ir.RankedTensorType) and not ir.RankedTensorType(r.type).has_static_shape
                     for r in op.results):
                kind = "dynamic"
            if kind:
                label = op.name
                if op.name == "stablehlo.custom_call":
                    label += " @" + ir.StringAttr(op.attributes["call_target_name"]).value
                found.setdefault(kind, []).append(f"{label} ({hir.op_location(op)})")
    for kind, items in found.items():
        uniq = sorted(set(items))
        more = f" and {len(uniq) - 4} more" if len(uniq) > 4 else ""
        report.note(f"left to XLA: {', '.join(uniq[:4])}{more}: {_UNHANDLED_WHY[kind]}")
