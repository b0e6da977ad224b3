"""``hlofuse.optimize``: run a pipeline over a StableHLO module (text, bytes or ``ir.Module``);
:func:`optimize_loaded` does it for a file read by :mod:`hlofuse.runtime.formats`."""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from jaxlib.mlir import ir

from hlofuse.core import ir as hir
from hlofuse.core.ops import OpClass, rule_for
from hlofuse.core.pipeline import PassContext, PassManager
import hlofuse.passes  # noqa: F401  (registers the built-in passes: optimize runs them)
from hlofuse.passes.fusion.outline import executable_module
from hlofuse.core.report import Report
from hlofuse.core.target import Target
from hlofuse.runtime import argspec



from hlofuse.runtime import formats
@dataclasses.dataclass
class Optimized:
    """The result of :func:`optimize`: the rewritten module and what was done to it."""
    module: ir.Module
    report: Report
    # hash of the module before cached measured decisions sent some regions back to XLA
    # (hlofuse.jit keys its module decisions by it); None: no decision was applied
    base_hash: str | None = None
    # on gpu/tpu under hlofuse.jit: the module with every kernel built, when unmeasured ones
    # are held back as XLA's code here (runtime.hold_back_unmeasured), and their hashes
    full: "Optimized | None" = None
    unmeasured: frozenset = frozenset()

    @property
    def text(self) -> str:
        return hir.to_text(self.module)

    def text_with_locations(self) -> str:
        return hir.to_text(self.module, debug_info=True)

    @property
    def bytecode(self) -> bytes:
        """The module as XLA compiles it: :attr:`module` with the regions left to XLA inlined
        back into their callers (:func:`hlofuse.passes.fusion.outline.inline_xla_regions`),
        so XLA sees the flat program jax gave it wherever hlofuse built no kernel."""
        return hir.to_bytecode(executable_module(self.module))

    def portable_artifact(self, target_version: str | None = None) -> bytes:
        return hir.to_portable_artifact(self.module, target_version)

    def to_model_explorer(self, directory: str, before=None) -> dict[str, str]:
        """Write the optimized module and its overlays for Google's Model Explorer into
        ``directory`` (:meth:`hlofuse.Report.to_model_explorer`, with ``after`` this module);
        ``before``: the module given to :func:`optimize` (anything it takes: text, bytecode,
        an artifact, an ``ir.Module``), written as ``before.mlir``. Returns name -> path of
        the files written; ``pip install hlofuse[explorer]``."""
        if before is not None and not isinstance(before, str):
            before = hir.to_text(hir.parse(before, source="before"), debug_info=True)
        return self.report.to_model_explorer(directory, after=self.text_with_locations(),
                                             before=before)


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


STABLEHLO_DIALECTS = frozenset({"stablehlo", "chlo"})
STRUCTURAL_DIALECTS = frozenset({"func", "sdy"})  # around StableHLO in what jax exports
MHLO_TO_STABLEHLO = ("convert it first with the hlo-legalize-to-stablehlo pass (in Python: "
                     "jaxlib.mlir.dialects.mhlo.register_mhlo_passes(), then "
                     "PassManager.parse('builtin.module(hlo-legalize-to-stablehlo)')"
                     ".run(module.operation))")


def module_dialects(module: ir.Module) -> dict[str, list[str]]:
    """The dialects whose ops the module uses (``builtin`` aside), each with its op names."""
    found: dict[str, set[str]] = {}
    for op in hir.all_ops(module):
        dialect = op.name.split(".", 1)[0]
        if dialect != "builtin":
            found.setdefault(dialect, set()).add(op.name)
    return {d: sorted(ops) for d, ops in sorted(found.items())}


def check_dialects(module: ir.Module, *, source: str = "<module>") -> str | None:
    """What hlofuse does with a module, from the dialects it uses.

    StableHLO (``stablehlo``/``chlo`` ops, with ``func`` and anything else around them, or
    only ``func`` ops): None, optimize it. MHLO ops: raise :class:`hlofuse.IRError` (hlofuse
    reads StableHLO; the message says how to convert). Ops of other dialects and no StableHLO
    op (e.g. only ``func`` and ``arith``): the note to pass it through unchanged with.
    """
    found = module_dialects(module)
    if "mhlo" in found:
        ops = found["mhlo"]
        listed = ", ".join(ops[:3]) + (f" and {len(ops) - 3} more" if len(ops) > 3 else "")
        raise hir.IRError(f"{source}: an MHLO module ({listed}), not StableHLO: hlofuse reads "
                          f"StableHLO only; {MHLO_TO_STABLEHLO}")
    if STABLEHLO_DIALECTS & set(found) or not set(found) - STRUCTURAL_DIALECTS:
        return None
    return (f"{source}: no StableHLO ops (dialects: {', '.join(found) or 'none'}); passed "
            f"through unchanged")


def optimize(module, *, target: str | Target | None = "cpu", pipeline: str | Sequence[str] | None = None,
             disable: Sequence[str] = (), dump_dir: str | None = None, options: dict | None = None,
             source: str = "<module>", donated_args: Sequence[int] = ()) -> Optimized:
    """Optimize StableHLO for ``target``.

    Args:
      module: StableHLO text, MLIR bytecode, a portable artifact, ``Exported.serialize()`` bytes,
        or an ``ir.Module`` (re-parsed into a private context; the argument is never mutated).
      target: a :class:`~hlofuse.core.target.Target`, 'cpu', 'gpu', 'tpu' or None (the current
        backend); the pass option ``chip`` picks the gpu/tpu chip (default h100, v5e).
      pipeline: a pipeline name ('default', 'cleanup', 'none'), comma-separated pass names or a list.
      disable: pass names to skip (also ``HLOFUSE_DISABLE_PASSES``).
      dump_dir: write the module after every pass as ``NNN_<pass>.mlir``.
      options: pass options (e.g. ``{'no_kernels': True}``).

    MHLO modules raise :class:`hlofuse.IRError` (convert them to StableHLO first); modules
    without any StableHLO op (only ``func``, ``arith``, ...) are returned unchanged with a note
    (see :func:`check_dialects`).
    """
    target = Target.of(target)
    if hasattr(module, "mlir_module_serialized") and not isinstance(module, (str, bytes, bytearray)):
        raise TypeError(f"{source}: a jax.export.Exported: pass its serialize() bytes (or "
                        f"mlir_module()) to hlofuse.optimize")
    if not isinstance(module, (str, bytes, bytearray, memoryview, ir.Module)):
        raise TypeError(f"{source}: hlofuse.optimize takes StableHLO text, MLIR bytecode, a "
                        f"portable artifact, Exported.serialize() bytes or an ir.Module, not "
                        f"{type(module).__name__}")
    ctx = hir.new_context()
    mod = hir.parse(module, ctx, source=source)
    if mod is module:  # caller's module in our context cannot happen (fresh ctx); be explicit
        mod = hir.clone_module(module)
    main = hir.main_func(mod, source=source)
    if "sym_visibility" in main.attributes and \
            ir.StringAttr(main.attributes["sym_visibility"]).value == "private":
        # symbol-dce deleted it (an empty module returned) or buffer-aliasing found none
        raise hir.IRError(f"{source}: main is private (func.func private @main): XLA runs a "
                          f"public main; make it public")
    passthrough = check_dialects(mod, source=source)
    report = Report(target=target.kind, source=source)
    report.ops_before = count_main_ops(mod)
    if passthrough:
        report.ops_after = report.ops_before
        report.note(passthrough)
        return Optimized(mod, report)
    pctx = PassContext(target=target, report=report, options=dict(options or {}),
                       donated_args=tuple(donated_args), source=source)
    _DumpingPassManager(pipeline, disable=disable, dump_dir=dump_dir).run(mod, pctx)
    report.ops_after = count_main_ops(mod)
    note_unhandled(mod, report)
    return Optimized(mod, report)


class DumpError(hir.IRError):
    """A dump file (``dump_dir``) could not be written; ``path`` names it."""

    def __init__(self, dump_dir: str, path: str, why: str):
        super().__init__(f"dump directory {dump_dir}: {path}: {why}")
        self.dump_dir, self.path, self.why = dump_dir, path, why


class _DumpingPassManager(PassManager):
    """The pass manager, with its dump files written atomically (a temporary file renamed into
    place, so a failed write never leaves a truncated dump) and write errors that name the
    dump file instead of surfacing as an error of the module being optimized."""

    def _dump(self, module: ir.Module, index: int, name: str) -> str | None:
        if not self.dump_dir:
            return None
        path = os.path.join(self.dump_dir, f"{index:03d}_{name}.mlir")
        self._write(path, hir.to_text(module, debug_info=True))
        return path

    def _dump_failure(self, module_bytes: bytes, name: str) -> str:
        if not self.dump_dir:
            return super()._dump_failure(module_bytes, name)
        path = os.path.join(self.dump_dir, f"failed_before_{name}.mlirbc")
        try:
            self._write(path, module_bytes)
        except DumpError as e:  # never hide the pass failure behind a dump failure
            return f"nowhere ({e})"
        return path

    def _write(self, path: str, data) -> None:
        try:
            os.makedirs(self.dump_dir, exist_ok=True)
            formats.atomic_write(path, data)
        except OSError as e:
            raise DumpError(self.dump_dir, path, f"cannot create the directory: "
                                                 f"{e.strerror or e}") from None
        except formats.FileError as e:
            why = str(e)[len(path) + 2:] if str(e).startswith(f"{path}: ") else str(e)
            raise DumpError(self.dump_dir, path, why) from None


_UNHANDLED_WHY = {
    "opaque": "opaque to hlofuse (library call, side effect, collective or RNG); never fused",
    "dynamic": "dynamic shape; passed through unchanged",
}


def note_unhandled(module: ir.Module, report) -> None:
    """Tell the user which ops hlofuse left to XLA on principle, and why (one note per kind)."""
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


# ---------------------------------------------------------------------------------------------
# Optimizing a file (hlofuse optimize / report, the corpus hook)
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class OptimizeResult:
    """What :func:`optimize_loaded` made of a file: the module to write and the report."""
    module: ir.Module
    report: Report
    target: Target
    changed: bool              # False when the module was passed through unchanged

    @property
    def notes(self) -> list[str]:
        return self.report.notes


def resolve_target(loaded: formats.Loaded, target: str | Target | None) -> Target:
    """The optimization target: ``target``, else the exported platform, else jax's backend."""
    plats = loaded.platforms
    if target is not None:
        target = Target.of(target)
        exported_for = Target.from_platform(plats[0]) if len(plats) == 1 else None
        if len(plats) == 1 and (exported_for is None or exported_for.kind != target.kind):
            raise formats.FileError(f"{loaded.source}: was exported for platform {plats[0]}, but "
                                    f"--target is {target}; its kernels could not run there "
                                    f"(re-export for {target.platform})")
        return target
    if len(plats) == 1 and Target.from_platform(plats[0]) is not None:
        return Target.from_platform(plats[0])
    return Target.of(None)


def optimize_loaded(loaded: formats.Loaded, *, target: str | None = None, pipeline=None,
                    disable: Sequence[str] = (), dump_dir: str | None = None,
                    options: dict | None = None,
                    shapes: Sequence[argspec.ArgSpec] | None = None) -> OptimizeResult:
    """Optimize a loaded file (:mod:`hlofuse.runtime.formats`) with :func:`optimize`, or pass it
    through with a note.

    Passed through unchanged (``changed=False``): modules without StableHLO ops (MHLO raises,
    see :func:`check_dialects`), jax.export artifacts for several platforms
    (kernels are per platform) and modules whose ``main`` has dynamic shapes that ``shapes``
    does not refine. The optimized ``main`` of an exported artifact must keep its signature.
    """
    target = resolve_target(loaded, target)
    src = loaded.source
    foreign = check_dialects(loaded.module, source=src)  # raises for MHLO
    if foreign:
        return _passthrough(loaded, target, foreign)
    if len(loaded.platforms) > 1:
        return _passthrough(loaded, target, f"{src} was exported for platforms "
                            f"{', '.join(loaded.platforms)}; hlofuse optimizes single-platform "
                            f"artifacts (kernels are per platform), so it is written unchanged")
    main = hir.main_func(loaded.module, source=src)
    if "sym_visibility" in main.attributes and \
            ir.StringAttr(main.attributes["sym_visibility"]).value == "private":
        raise formats.FileError(f"{src}: main is private (func.func private @main): XLA runs a "
                                f"public main; make it public")
    tup = argspec.tuple_signature(loaded.module)
    if tup:
        return _passthrough(loaded, target, f"{src}: {tup}; written unchanged (hlofuse "
                            f"optimizes modules whose main takes and returns tensors)")
    if shapes:
        argspec.refine_shapes(loaded, shapes)
    dyn = argspec.dynamic_signature(loaded.module)
    if dyn:
        how = ("re-export with concrete shapes" if loaded.exported is not None
               else "refine it with --shapes")
        return _passthrough(loaded, target, f"{src}: {dyn} (dynamic shape); written unchanged; {how}")
    before_sig = (argspec.main_arg_types(loaded.module), argspec.main_result_types(loaded.module))
    before_sig = tuple(tuple(str(t) for t in ts) for ts in before_sig)
    opt = optimize(loaded.module, target=target, pipeline=pipeline, disable=disable,
                   dump_dir=dump_dir, options=options, source=src,
                   donated_args=argspec.donated_args(loaded.module))
    after_sig = tuple(tuple(str(t) for t in ts) for ts in (argspec.main_arg_types(opt.module),
                                                           argspec.main_result_types(opt.module)))
    if after_sig != before_sig:
        raise formats.FileError(f"{src}: internal: optimization changed the signature of main "
                                f"{before_sig} -> {after_sig}")
    return OptimizeResult(opt.module, opt.report, target, True)


def _passthrough(loaded: formats.Loaded, target: Target, note: str) -> OptimizeResult:
    report = Report(target=target.kind, source=loaded.source)
    report.ops_before = report.ops_after = count_main_ops(loaded.module)
    report.note(note)
    return OptimizeResult(loaded.module, report, target, False)
