"""The pass manager: passes registered by name, pipelines as data, observability built in.

* A pass is a small class with a kebab-case ``name`` and a ``run(module, ctx)`` method that
  returns a dict of statistics (or None). Register it with :func:`register_pass`.
* A pipeline is a list of pass names (see :data:`PIPELINES`); each step says why it is there.
* After every pass the module is verified. A failure raises :class:`PassFailure` naming the
  pass, the op and its source location, with the module dumped to a file.
* ``dump_dir`` writes ``NNN_<pass>.mlir`` after every pass (``000_input.mlir`` first).
* A pass can be disabled by name: ``PassManager(disable=[...])`` or the environment variable
  ``HLOFUSE_DISABLE_PASSES=name1,name2``.
* Per-pass wall time and statistics are recorded in the :class:`~hlofuse.report.Report`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import time
from typing import Any, Callable, Iterable, Sequence

from jaxlib.mlir import ir

from hlofuse import ir as hir
from hlofuse.report import Report

__all__ = ["Pass", "PassContext", "PassFailure", "PassManager", "register_pass", "get_pass",
           "all_passes", "PIPELINES", "resolve_pipeline", "DISABLE_ENV"]

DISABLE_ENV = "HLOFUSE_DISABLE_PASSES"

_REGISTRY: dict[str, type] = {}


def register_pass(cls):
    """Class decorator: register a pass under its ``name`` (kebab-case, unique)."""
    name = getattr(cls, "name", None)
    if not name or not re.fullmatch(r"[a-z][a-z0-9-]*", name):
        raise ValueError(f"pass {cls.__name__} needs a kebab-case 'name', got {name!r}")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"pass name {name!r} registered twice")
    _REGISTRY[name] = cls
    return cls


def _load_builtin_passes() -> None:
    import hlofuse.passes  # noqa: F401  (registers every pass on import)


def all_passes() -> dict[str, type]:
    _load_builtin_passes()
    return dict(_REGISTRY)


def get_pass(name: str) -> type:
    passes = all_passes()
    if name not in passes:
        raise KeyError(f"unknown pass {name!r}; known passes: {', '.join(sorted(passes))}")
    return passes[name]


class Pass:
    """Base class. Subclasses set ``name`` and implement ``run``.

    ``run(module, ctx)`` rewrites ``module`` in place and returns statistics (a dict of ints or
    floats), which the pass manager records. Every pass must keep the module verifying and must
    not change the program's results (beyond the tolerance table, and only where its docstring
    says it reassociates floating point).
    """
    name: str = ""

    def run(self, module: ir.Module, ctx: "PassContext") -> dict | None:  # pragma: no cover
        raise NotImplementedError


@dataclasses.dataclass
class PassContext:
    """What passes may read and record: the target, the report, options, shared caches."""
    target: str = "cpu"  # 'cpu' | 'gpu' | 'tpu'
    report: Report = dataclasses.field(default_factory=Report)
    options: dict = dataclasses.field(default_factory=dict)
    donated_args: tuple = ()  # indices of @main arguments the caller donates
    source: str = "<module>"

    def option(self, key: str, default=None):
        return self.options.get(key, default)


class PassFailure(RuntimeError):
    """A pass raised or left an invalid module. Names the pass, the op and where it came from."""

    def __init__(self, pass_name: str, message: str, *, op: str | None = None,
                 location: str | None = None, dump_path: str | None = None, after: Sequence[str] = ()):
        self.pass_name, self.op, self.location, self.dump_path = pass_name, op, location, dump_path
        parts = [f"pass '{pass_name}' failed"]
        if op:
            parts.append(f"at op '{op}'" + (f" ({location})" if location else ""))
        if after:
            parts.append(f"after passes [{', '.join(after)}]")
        text = " ".join(parts) + f": {message}"
        if dump_path:
            text += f"\n  module before the pass dumped to {dump_path}"
        super().__init__(text)


# ---------------------------------------------------------------------------------------------
# Pipelines as data. Each step: (pass name, why it is there).
# ---------------------------------------------------------------------------------------------
PIPELINES: dict[str, list[tuple[str, str]]] = {
    "default": [
        ("inline-calls", "jax emits private funcs (jit(relu), pjit); fusion needs one flat body"),
        ("canonicalize", "upstream: remove dead ops before analysis"),
        ("cse", "upstream: merge duplicate ops so fusion sees shared producers once"),
        ("constant-fold", "evaluate constant subgraphs (frozen parameters) on the host, size-limited"),
        ("algebraic-simplify", "exact identities (x*1, double transpose, relu o relu, ...) as a table"),
        ("batchnorm-fold", "fold inference BatchNorm scale/shift into constant conv/dot weights"),
        ("layout-assignment", "target layouts (NHWC convs on gpu/tpu); sink and cancel transposes"),
        ("cse", "upstream: merge what the cleanups made identical (e.g. boundary transposes)"),
        ("constant-fold", "again: fold what simplification and cse exposed (e.g. x|x of two merged "
                          "constants); without it a second run of the pipeline still changes the module"),
        ("algebraic-simplify", "again: identities exposed by the second fold (idempotence, fuzz-found)"),
        ("fuse-attention", "outline QK^T-softmax-PV subgraphs for flash kernels before other fusions claim their ops"),
        ("conv1x1-to-dot", "1x1 NHWC convolutions are matmuls (gpu/tpu; cpu with conv1x1_as_dot): their epilogue fuses as a dot's"),
        ("fuse-matmul-epilogue", "dot_general + operand prologues + epilogue (bias, activations, residual) as one tiled kernel"),
        ("fuse-reduction", "row reductions with their producers and epilogue (softmax, layernorm, rmsnorm) kept on chip"),
        ("fuse-horizontal", "merge sibling dots sharing an lhs (QKV) and sibling elementwise chains"),
        ("fuse-elementwise", "form cycle-free elementwise regions and outline them"),
        ("kernelize", "turn each outlined region into a Pallas kernel for the target"),
        ("symbol-dce", "upstream: drop outlined bodies replaced by kernels"),
        ("canonicalize", "upstream: drop constants left dead by outlining"),
        ("buffer-aliasing", "liveness + memory plan; alias donated args to outputs; donation auditor"),
    ],
    "cleanup": [
        ("inline-calls", "flatten calls"),
        ("canonicalize", "upstream canonicalization"),
        ("cse", "upstream common-subexpression elimination"),
        ("symbol-dce", "upstream dead-symbol elimination"),
    ],
    "none": [],
}


def resolve_pipeline(pipeline: str | Sequence[str] | None) -> list[str]:
    """A pipeline name, a comma-separated list of pass names, or a list of pass names."""
    if pipeline is None:
        pipeline = "default"
    if isinstance(pipeline, str):
        if pipeline in PIPELINES:
            return [n for n, _ in PIPELINES[pipeline]]
        names = [p.strip() for p in pipeline.split(",") if p.strip()]
    else:
        names = list(pipeline)
    for n in names:
        get_pass(n)  # raises with the list of known names
    return names


def _disabled_from_env() -> set[str]:
    return {p.strip() for p in os.environ.get(DISABLE_ENV, "").split(",") if p.strip()}


def _first_op_in_error(module: ir.Module, msg: str) -> tuple[str | None, str | None]:
    """Best effort: the op name and location a verifier/pass message points at."""
    m = re.search(r"'([a-z_]+\.[a-z_0-9.]+)' op", msg)
    opname = m.group(1) if m else None
    loc = None
    if opname:
        for op in hir.all_ops(module):
            if op.name == opname:
                loc = hir.op_location(op)
                break
    return opname, loc


class PassManager:
    """Runs passes by name on a module, verifying after each one."""

    def __init__(self, pipeline: str | Sequence[str] | None = None, *, disable: Iterable[str] = (),
                 dump_dir: str | None = None, verify_each: bool = True):
        self.names = resolve_pipeline(pipeline)
        self.disabled = set(disable) | _disabled_from_env()
        unknown = self.disabled - set(all_passes())
        if unknown:
            raise KeyError(f"cannot disable unknown pass(es) {sorted(unknown)}; "
                           f"known passes: {', '.join(sorted(all_passes()))}")
        self.dump_dir = dump_dir
        self.verify_each = verify_each

    def _dump(self, module: ir.Module, index: int, name: str) -> str | None:
        if not self.dump_dir:
            return None
        os.makedirs(self.dump_dir, exist_ok=True)
        path = os.path.join(self.dump_dir, f"{index:03d}_{name}.mlir")
        with open(path, "w") as fh:
            fh.write(hir.to_text(module, debug_info=True))
        return path

    def run(self, module: ir.Module, ctx: PassContext) -> ir.Module:
        from hlofuse import chips
        # the pass option 'chip' (e.g. 'a100', 'v4') is the chip tiling and the cost model read
        with chips.use(ctx.option("chip")):
            return self._run(module, ctx)

    def _run(self, module: ir.Module, ctx: PassContext) -> ir.Module:
        report = ctx.report
        self._dump(module, 0, "input")
        done: list[str] = []
        for i, name in enumerate(self.names, start=1):
            if name in self.disabled:
                report.record_pass(name, 0.0, {}, disabled=True)
                continue
            before = hir.to_bytecode(module)
            p = get_pass(name)()
            t0 = time.perf_counter()
            try:
                stats = p.run(module, ctx) or {}
                if self.verify_each:
                    hir.verify(module)
            except PassFailure:
                raise
            except Exception as e:
                dump = self._dump_failure(before, name)
                msg = str(e).strip() or type(e).__name__
                opname, loc = getattr(e, "op", None), getattr(e, "location", None)
                if opname is None:
                    opname, loc = _first_op_in_error(module, msg)
                raise PassFailure(name, f"{type(e).__name__}: {msg}", op=opname, location=loc,
                                  dump_path=dump, after=done) from e
            report.record_pass(name, time.perf_counter() - t0, stats)
            done.append(name)
            self._dump(module, i, name)
        return module

    def _dump_failure(self, module_bytes: bytes, name: str) -> str:
        d = self.dump_dir or tempfile.mkdtemp(prefix="hlofuse-failure-")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"failed_before_{name}.mlirbc")
        with open(path, "wb") as fh:
            fh.write(module_bytes)
        return path
