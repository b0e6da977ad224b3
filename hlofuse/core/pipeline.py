"""The pass manager: passes registered by name, pipelines as data, observability built in.

* A pass is a small class with a kebab-case ``name`` and a ``run(module, ctx)`` method that
  returns a dict of statistics (or None). Register it with :func:`register_pass`. Its options
  are a frozen dataclass ``Options`` (``self.options`` in ``run``); an unknown or mistyped
  option is an :class:`OptionError` that lists the known ones.
* A pipeline is a list of pass names (see :data:`PIPELINES`); each step says why it is there.
  A named pipeline may run one group of its steps again until they change nothing
  (:data:`UNTIL_STABLE`).
  As text: ``"inline-calls,cse,constant-fold{max_bytes=4096},kernelize"`` (options of one step
  in braces, like MLIR's pass pipelines).
* After every pass the module is verified. A failure raises :class:`PassFailure` naming the
  pass, the op and its source location, with the module dumped to a file.
* ``dump_dir`` writes ``NNN_<pass>.mlir`` after every pass (``000_input.mlir`` first).
* A pass can be disabled by name: ``PassManager(disable=[...])`` or the environment variable
  ``HLOFUSE_DISABLE_PASSES=name1,name2``.
* Per-pass wall time and statistics are recorded in the :class:`~hlofuse.core.report.Report`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import time
import typing
from typing import Any, Callable, Iterable, Sequence

from jaxlib.mlir import ir

from hlofuse.core import chips
from hlofuse.core import config
from hlofuse.core import ir as hir
from hlofuse.core.report import Report
from hlofuse.core.target import Target

__all__ = ["Pass", "PassContext", "PassFailure", "PassManager", "register_pass", "get_pass",
           "all_passes", "UpstreamPass", "PIPELINES", "UNTIL_STABLE", "resolve_pipeline",
           "parse_pipeline", "Step", "GlobalOptions", "NoOptions", "OptionError", "split_options", "DISABLE_ENV"]

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


def all_passes() -> dict[str, type]:
    """Every registered pass by name. The built-in passes register when ``hlofuse.passes`` is
    imported, which the runtime's ``optimize`` module (:mod:`hlofuse.runtime.api`) and every
    public name of ``hlofuse`` do (this module sits below the passes and never imports
    them)."""
    return dict(_REGISTRY)


class UnknownPassError(KeyError):
    """A pass name that is not registered (in a pipeline or ``disable=``): a configuration
    error, raised to the caller, never turned into a fallback."""


def trace(what: str, **meta):
    """A named event of hlofuse's in ``jax.profiler`` traces: ``hlofuse/<what>``, ``meta`` as
    its arguments (shown by xprof/Perfetto beside the event). Every step of hlofuse's own work
    (the pipeline and each pass, building a program and its kernels, verification, tuning and
    its rounds, a tiered build) runs inside one, so a trace a user records with
    ``jax.profiler.trace(...)`` shows where hlofuse spent its time. Costs nothing measurable
    when no trace is being recorded."""
    import jax.profiler
    return jax.profiler.TraceAnnotation(f"hlofuse/{what}", **meta)


def is_config_error(e: BaseException) -> bool:
    """A pipeline that cannot be assembled (an unknown pass name): raised to the caller.
    Every other failure of hlofuse's machinery, a mistyped option value a pass reads included,
    falls back to XLA's program with a warning naming it."""
    return isinstance(e, UnknownPassError)


def get_pass(name: str) -> type:
    passes = all_passes()
    if name not in passes:
        raise UnknownPassError(f"unknown pass {name!r}; known passes: {', '.join(sorted(passes))}")
    return passes[name]


# ---------------------------------------------------------------------------------------------
# Typed options
# ---------------------------------------------------------------------------------------------
class OptionError(ValueError):
    """An unknown option, or a value of the wrong type; the message lists the known ones."""


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """The options of a pass that has none."""


@dataclasses.dataclass(frozen=True)
class GlobalOptions:
    """Options of the whole optimization, not of one pass."""
    chip: str | None = None   # gpu/tpu chip the kernels are tiled for (hlofuse.core.chips.CHIPS)
    strict: bool = False      # raise where a region would be left to XLA (debugging)


def _fields(cls) -> dict[str, tuple[object, object]]:
    """field name -> (type, default) of an options dataclass, with string annotations resolved."""
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f.default) for f in dataclasses.fields(cls)}


def _type_name(tp) -> str:
    if typing.get_origin(tp) is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    args = typing.get_args(tp)
    if args:
        return " | ".join(_type_name(a) for a in args)
    return "None" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _coerce(tp, value, where: str):
    """``value`` as type ``tp`` (bool, int, float, str, Literal, ``X | None``); a string (from
    the textual pipeline syntax) is parsed. Raises OptionError naming ``where``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        if value in args:
            return value
        raise OptionError(f"{where}: expected one of {', '.join(map(repr, args))}, got {value!r}")
    if args and type(None) in args:  # Optional
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            return None
        rest = [a for a in args if a is not type(None)]
        return _coerce(rest[0] if len(rest) == 1 else typing.Union[tuple(rest)], value, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
            return value.lower() in ("true", "1")
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
    raise OptionError(f"{where}: expected {_type_name(tp)}, got {value!r}")


def make_options(cls, values: dict, owner: str):
    """An instance of options dataclass ``cls`` from ``values`` (checked and coerced)."""
    known = _fields(cls)
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise OptionError(f"unknown option(s) {', '.join(map(repr, unknown))} for {owner}; "
                          f"known: {describe_options(cls) or 'none'}")
    coerced = {k: _coerce(known[k][0], v, f"option {k!r} of {owner}") for k, v in values.items()}
    try:
        return cls(**coerced)
    except ValueError as e:  # an Options class's own check (its __post_init__)
        raise OptionError(f"{owner}: {e}") from None


def describe_options(cls) -> str:
    return ", ".join(f"{k} ({_type_name(tp)}, default {d!r})" for k, (tp, d) in _fields(cls).items())


def split_options(options: dict | None) -> tuple[GlobalOptions, dict[str, dict]]:
    """A user's ``options`` dict as (global options, {pass name: {option: value}}).

    Keys: a global option (``chip``, ``strict``); a pass name with a dict of that pass's options
    (``{"constant-fold": {"max_bytes": 4096}}``); or a pass option's own name where exactly one
    pass has it (``{"no_kernels": True}``). Anything else is an OptionError listing what is known.
    """
    glob: dict = {}
    per_pass: dict[str, dict] = {}
    registry = all_passes()
    global_fields = _fields(GlobalOptions)
    for key, value in (options or {}).items():
        if key in global_fields:
            glob[key] = value
        elif key in registry:
            if not isinstance(value, dict):
                raise OptionError(f"options[{key!r}]: expected a dict of {key}'s options "
                                  f"({describe_options(registry[key].Options) or 'it has none'}), "
                                  f"got {value!r}")
            _enabled(key, value)   # the old spelling of disable=, checked and warned
            make_options(registry[key].Options,
                         {k: v for k, v in value.items() if k != ENABLED}, f"pass '{key}'")
            per_pass.setdefault(key, {}).update(value)
        else:
            owners = [n for n, c in sorted(registry.items()) if key in _fields(c.Options)]
            if len(owners) != 1:
                raise OptionError(_unknown_option_message(key, owners, registry))
            make_options(registry[owners[0]].Options, {key: value}, f"pass '{owners[0]}'")
            per_pass.setdefault(owners[0], {})[key] = value
    return make_options(GlobalOptions, glob, "hlofuse"), per_pass


#: ``{"pass-name": {"enabled": False}}``: the old spelling of ``disable=["pass-name"]`` (nine
#: passes had an ``enabled`` option of their own); still read, with a DeprecationWarning
ENABLED = "enabled"


def _enabled(name: str, values: dict) -> bool:
    """Whether ``values`` (one pass's options) leave pass ``name`` on; warns when they use
    the old ``enabled`` spelling."""
    if ENABLED not in values:
        return True
    on = values[ENABLED]
    if isinstance(on, str) and on.strip().lower() in ("true", "false"):   # pipeline text
        on = on.strip().lower() == "true"
    if not isinstance(on, bool):
        raise OptionError(f"option 'enabled' of pass '{name}': expected bool, got {on!r}")
    import warnings
    warnings.warn(f"options={{'{name}': {{'enabled': {on}}}}} is deprecated: "
                  + (f"use disable=['{name}'] (or HLOFUSE_DISABLE_PASSES={name})" if not on
                     else "passes are on unless disabled; drop it"),
                  DeprecationWarning, stacklevel=4)
    return on


def _unknown_option_message(key: str, owners: list[str], registry: dict) -> str:
    if owners:
        return (f"option {key!r} belongs to several passes ({', '.join(owners)}); "
                f"say which: {{'{owners[0]}': {{'{key}': ...}}}}")
    import difflib
    names = set(_fields(GlobalOptions))
    for c in registry.values():
        names |= set(_fields(c.Options))
    close = difflib.get_close_matches(key, sorted(names), n=1)
    # the first line stands alone (a fallback warning quotes only it)
    lines = [f"unknown option {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
             + "; known options (docs/settings.md):",
             f"  global: {describe_options(GlobalOptions)}"]
    for n, c in sorted(registry.items()):
        if _fields(c.Options):
            lines.append(f"  {n}: {describe_options(c.Options)}")
    return "\n".join(lines)


class Pass:
    """Base class. Subclasses set ``name`` and implement ``run``; options go in a frozen
    dataclass named ``Options`` (the pass reads ``self.options``).

    ``run(module, ctx)`` rewrites ``module`` in place and returns statistics (a dict of ints or
    floats), which the pass manager records. Every pass must keep the module verifying and must
    not change the program's results (beyond the tolerance table, and only where its docstring
    says it reassociates floating point).
    """
    name: str = ""
    Options: type = NoOptions

    def __init__(self, options=None):
        self.options = options if options is not None else self.Options()

    def run(self, module: ir.Module, ctx: "PassContext") -> dict | None:  # pragma: no cover
        raise NotImplementedError


class UpstreamPass(Pass):
    """A pass that runs one of jaxlib's upstream MLIR passes (``upstream``, e.g. ``cse``) over
    the module and reports how much it removed, counted by ``count`` (ops by default)."""
    upstream: str = ""
    stat: str = "ops_removed"

    @staticmethod
    def count(module) -> int:
        return len(hir.all_ops(module))

    def run(self, module, ctx):
        before = self.count(module)
        hir.run_upstream_passes(module, f"builtin.module({self.upstream})")
        return {self.stat: before - self.count(module)}


@dataclasses.dataclass
class PassContext:
    """What passes may read and record: the target, the report, options, shared caches.

    ``options`` is the user's options dict (see :func:`split_options`); it is checked when the
    context is made, and each pass receives its own typed ``Options`` from the pass manager.
    """
    target: Target | str = "cpu"  # a Target after construction (names are normalized here)
    report: Report = dataclasses.field(default_factory=Report)
    options: dict = dataclasses.field(default_factory=dict)
    donated_args: tuple = ()  # indices of @main arguments the caller donates
    source: str = "<module>"

    def __post_init__(self):
        self.globals, self.pass_options = split_options(self.options)
        self.target = Target.of(self.target, self.globals.chip)

    @property
    def strict(self) -> bool:
        return self.globals.strict

    def options_for(self, cls, step: "Step | None" = None):
        """The typed options of pass class ``cls``: the user's, overridden by the step's own."""
        values = self._values(cls, step)
        values.pop(ENABLED, None)
        return make_options(cls.Options, values, f"pass '{cls.name}'")

    def turned_off(self, cls, step: "Step | None" = None) -> bool:
        """Whether the options say ``{"enabled": False}`` for this pass (the old spelling of
        ``disable=``)."""
        values = self._values(cls, step)
        return ENABLED in values and not _enabled(cls.name, values)

    def _values(self, cls, step) -> dict:
        values = dict(self.pass_options.get(cls.name, {}))
        if step is not None:
            values.update(step.options)
        return values


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
        ("row-gather-scatter", "per-row gathers/scatters (cross-entropy labels) and size-1 reduces as row-view ops, "
                               "so the loss forward and backward form one row region; before the second "
                               "cse/constant-fold/algebraic-simplify, which clean up what it builds"),
        ("cse", "upstream: merge what the cleanups made identical (e.g. boundary transposes)"),
        ("constant-fold", "again: fold what simplification and cse exposed (e.g. x|x of two merged "
                          "constants); without it a second run of the pipeline still changes the module"),
        ("algebraic-simplify", "again: identities exposed by the second fold (idempotence, fuzz-found)"),
        ("quantize-matmul", "fake-quant / weight-only int8 dots as integer dots with the dequant scale after "
                            "the sum, so the matmul fusion below sees an int8 dot and its scale epilogue"),
        ("split-reduce", "cpu: reductions over non-adjacent dims (GroupNorm's (1, 2, 4)) as a chain of single-run "
                         "reductions XLA:CPU vectorizes; before propagate-shardings (annotates the new ops) and "
                         "the fusions (see the row reductions it leaves)"),
        ("depthwise-conv-taps", "cpu: depthwise and few-channel grouped convolutions (MobileNet, ConvNeXt, "
                                "ResNeXt) and their gradients as sums of their taps, which XLA:CPU fuses into "
                                "vectorized loops (its depthwise convolution is "
                                "5-17x slower); "
                                "after the last constant-fold (frozen filters' tap vectors stay small), before "
                                "propagate-shardings (annotates the new ops)"),
        ("sink-loop-generators", "masks from iotas that scan (or cse) hoisted out of a loop are generated in the "
                                 "body again, where attention sees its iotas; after the last cse, which would hoist "
                                 "them, and before propagate-shardings, which annotates the copies"),
        ("remat-loop-attention", "a scan's attention whose probabilities the forward loop saves for the backward "
                                 "loop is recomputed there (what jax.checkpoint writes), so fuse-attention finds a "
                                 "forward kernel and a forward + backward; after sink-loop-generators (masks in "
                                 "both bodies), before propagate-shardings (annotates the clones)"),
        ("propagate-shardings", "sharded programs: Shardy's shardings on every op, so kernelize builds per-shard kernels (no-op otherwise)"),
        ("fuse-attention", "outline QK^T-softmax-PV subgraphs for flash kernels before other fusions claim their ops"),
        ("fold-dot-repeats", "a dot reading K/V repeated to the query heads (GQA decode, attention fuse-attention "
                             "left to XLA) reads them unrepeated; after fuse-attention, whose GQA match reads "
                             "the repeat, before the matmul fusions, which see the smaller product"),
        ("dot-f32-accumulate", "cpu: bf16 dots with an f32 result (XLA:CPU's library bf16 matmul; a bf16 result is "
                               "upcast to an f32 matmul); after fuse-attention, so matmul regions hold the f32 dot"),
        ("conv-winograd", "cpu: 3x3 stride-1 f32 convolutions as Winograd F(2x2,3x3) regions (2.25x fewer "
                          "multiplies than XLA:CPU's direct convolution); before conv1x1-to-dot, which notes the rest"),
        ("conv1x1-to-dot", "1x1 NHWC convolutions are matmuls: their epilogue fuses as a dot's (cpu: XLA's library dot beats its library conv)"),
        ("flatten-dot-dims", "multi-head projections (x[B,S,D].W[D,H,Dh], a[B,S,H,Dh].W[H,Dh,D]) and their "
                             "gradients as one-contracting-dim products with their bias moved above the "
                             "result reshape; after fuse-attention, which reads the products as written, "
                             "right before fuse-matmul-epilogue, which takes them"),
        ("fuse-matmul-epilogue", "dot_general + operand prologues + epilogue (bias, activations, residual) as one tiled kernel"),
        ("fuse-reduction", "row reductions with their producers and epilogue (softmax, layernorm, rmsnorm) kept on chip"),
        ("fuse-horizontal", "merge sibling dots sharing an lhs (QKV) and sibling elementwise chains"),
        ("fuse-elementwise", "form cycle-free elementwise regions and outline them"),
        ("kernelize", "turn each outlined region into a Pallas kernel for the target"),
        ("symbol-dce", "upstream: drop outlined bodies replaced by kernels"),
        ("int8-dot-unsigned", "cpu: int8 x int8 dots (the program's and the cpu kernels') in the form the host multiplies fastest: "
                              "u8 x s8 with an exact correction on VNNI CPUs, signed where AMX-INT8 or Arm multiply it; "
                              "matrix-vector dots as small matrix products; after kernelize, which writes the kernels' dots, "
                              "and symbol-dce, which drops the replaced regions"),
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


#: In a named pipeline, a run of consecutive steps (its last occurrence) that the pass manager
#: runs again, as a group, until a round changes nothing (at most :data:`UNTIL_STABLE_ROUNDS`
#: more rounds, each step recorded in the report again). The second cleanup's rewrites expose
#: each other's: a select simplified to the minimum of two constants folds only in a later
#: constant-fold, so a second run of the whole pipeline still changed the module (long fuzz
#: run; a third hand-placed copy would only move the limit one step).
UNTIL_STABLE: dict[str, tuple[str, ...]] = {
    "default": ("cse", "constant-fold", "algebraic-simplify"),
}
UNTIL_STABLE_ROUNDS = 4


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of a pipeline: a pass name and the options given to this step only;
    ``until_stable``: it belongs to the pipeline's :data:`UNTIL_STABLE` group."""
    name: str
    options: tuple[tuple[str, str], ...] = ()   # (option, value as written)
    until_stable: bool = dataclasses.field(default=False, compare=False)

    def __str__(self) -> str:
        if not self.options:
            return self.name
        return self.name + "{" + ",".join(f"{k}={v}" for k, v in self.options) + "}"


_STEP = re.compile(r"\s*([a-z][a-z0-9-]*)\s*(?:\{([^{}]*)\})?\s*(?:,|$)")


def parse_pipeline(text: str) -> list[Step]:
    """``"cse,constant-fold{max_bytes=4096},kernelize"`` as steps (names checked later)."""
    steps: list[Step] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _STEP.match(text, pos)
        if not m or m.end() == pos:
            raise OptionError(f"cannot read pipeline {text!r} at column {pos + 1}: "
                              f"{text[pos:pos + 30]!r} (expected name or name{{opt=value,...}})")
        opts = []
        for item in filter(None, (i.strip() for i in (m.group(2) or "").split(","))):
            k, eq, v = item.partition("=")
            if not eq or not k.strip():
                raise OptionError(f"pipeline step {m.group(1)!r}: {item!r} is not option=value")
            opts.append((k.strip(), v.strip().strip("'\"")))
        steps.append(Step(m.group(1), tuple(opts)))
        pos = m.end()
    return steps


def _steps(pipeline: str | Sequence[str | Step] | None) -> list[Step]:
    if pipeline is None:
        pipeline = "default"
    if isinstance(pipeline, str):
        if pipeline in PIPELINES:
            names = [n for n, _ in PIPELINES[pipeline]]
            group = UNTIL_STABLE.get(pipeline, ())
            starts = [i for i in range(len(names) - len(group) + 1)
                      if group and tuple(names[i:i + len(group)]) == group]
            marked = set(range(starts[-1], starts[-1] + len(group))) if starts else set()
            return [Step(n, until_stable=i in marked) for i, n in enumerate(names)]
        steps = parse_pipeline(pipeline)
    else:
        steps = [p if isinstance(p, Step) else s for p in pipeline
                 for s in ([p] if isinstance(p, Step) else parse_pipeline(p))]
    for st in steps:
        cls = get_pass(st.name)  # raises with the list of known names
        make_options(cls.Options, {k: v for k, v in dict(st.options).items() if k != ENABLED},
                     f"pass '{st.name}'")
    return steps


def resolve_pipeline(pipeline: str | Sequence[str] | None) -> list[str]:
    """A pipeline name, a textual pipeline (``"cse,constant-fold{max_bytes=64}"``), or a list of
    pass names or steps, as the list of pass names it runs (options checked, then dropped)."""
    return [st.name for st in _steps(pipeline)]


def _disabled_from_env() -> set[str]:
    return set(config.get(DISABLE_ENV))


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
        self.steps = _steps(pipeline)
        self.names = [st.name for st in self.steps]
        from_env = _disabled_from_env()
        if isinstance(disable, str):   # one pass name, not its letters
            disable = (disable,)
        self.disabled = set(disable) | from_env
        unknown = self.disabled - set(all_passes())
        if unknown:
            where = [w for w, names in (("disable=", set(disable)), (DISABLE_ENV, from_env))
                     if names & unknown]
            raise UnknownPassError(f"cannot disable unknown pass(es) {sorted(unknown)} (from "
                                   f"{' and '.join(where)}); known passes: "
                                   f"{', '.join(sorted(all_passes()))}")
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
        # the pass option 'chip' (e.g. 'a100', 'v4') is the chip tiling and the cost model read
        with chips.use(ctx.target.chip):
            ctx.report.chip = ctx.target.chip_name or ""
            return self._run(module, ctx)

    def _run(self, module: ir.Module, ctx: PassContext) -> ir.Module:
        with trace("pipeline", source=ctx.report.source or "", target=ctx.target.kind,
                   passes=len(self.steps)):
            return self._run_steps(module, ctx)

    def _run_steps(self, module: ir.Module, ctx: PassContext) -> ir.Module:
        self._dump(module, 0, "input")
        hir.guard_integer_division(module)   # H9: before any pass folds a division
        done: list[str] = []
        steps = self.steps
        i = 0
        while i < len(steps):
            if not steps[i].until_stable:
                self._run_step(module, ctx, steps[i], i + 1, done)
                i += 1
                continue
            j = i
            while j < len(steps) and steps[j].until_stable:
                j += 1
            for _ in range(1 + UNTIL_STABLE_ROUNDS):   # the group, then again while it changes
                start = hir.to_bytecode(module)
                for k in range(i, j):
                    self._run_step(module, ctx, steps[k], k + 1, done)
                if hir.to_bytecode(module) == start:
                    break
            i = j
        hir.guard_integer_division(module)   # H9: what XLA's constant folder would trap on
        return module

    def _run_step(self, module: ir.Module, ctx: PassContext, step: Step, i: int,
                  done: list) -> None:
        report = ctx.report
        name = step.name
        cls = get_pass(name)
        if name in self.disabled or ctx.turned_off(cls, step):
            report.record_pass(name, 0.0, {}, disabled=True)
            return
        before = hir.to_bytecode(module)
        p = cls(ctx.options_for(cls, step))
        t0 = time.perf_counter()
        try:
            with trace(f"pass {name}", source=report.source or "", step=i):
                stats = p.run(module, ctx) or {}
            if self.verify_each:
                hir.verify(module)
        except PassFailure:
            raise
        except Exception as e:  # noqa: BLE001 - re-raised as PassFailure naming pass, op, dump
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

    def _dump_failure(self, module_bytes: bytes, name: str) -> str:
        d = self.dump_dir or tempfile.mkdtemp(prefix="hlofuse-failure-")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"failed_before_{name}.mlirbc")
        with open(path, "wb") as fh:
            fh.write(module_bytes)
        return path
