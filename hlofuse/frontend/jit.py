"""``@hlofuse.jit``: ``jax.jit`` with hlofuse's StableHLO pipeline between tracing and XLA.

An :class:`HlofuseFunction` *is* a ``jax.jit`` function: it wraps ``jax.jit(traced, **kw)``
with every ``jax.jit`` keyword passed through (shardings, static and donated arguments,
``keep_unused``, ``inline``, ``compiler_options``...). ``traced`` binds the user's function as
one :class:`hlofuse.runtime.program.Program` through the ``hlofuse_call`` primitive, whose lowering
inlines hlofuse's optimized module. So calling it costs what a ``jax.jit`` call costs (jax's
C++ dispatch path), its caches are jax's caches, and it composes with every JAX
transformation exactly like ``jax.jit`` does.

A call passes three parts, each once, with plain data between them:

1. :mod:`hlofuse.frontend.signature`: the arguments (static, frozen, donated, shardings, typed
   keys) as a call key and a :class:`~hlofuse.frontend.signature.CallInfo`, which the inner
   ``jax.jit`` receives as its static argument 0;
2. :mod:`hlofuse.frontend.tracing`: the trace of a new signature, its program (built by
   :mod:`hlofuse.runtime.program`: export, pipeline, kernels, re-injected module and report);
3. :mod:`hlofuse.frontend.dispatch` (with :mod:`hlofuse.frontend.tuning`): which executable
   runs: tiers, measured decisions, the fast path.

Autotuning (:mod:`hlofuse.runtime.autotune`) sits beside that path, never inside it: a tuned
signature whose decision is "XLA defaults" runs the very same ``jax.jit`` object as
``autotune=False``; only a signature whose measured winner is a compiler-option variant runs a
second, top-level ``jax.jit(traced, compiler_options=...)``. Under any transformation
(arguments are tracers) the default ``jax.jit`` is used, so ``compiler_options`` never meets a
tracer.

Tiered first call (``tiered=``, default on): a top-level call of a new signature whose
optimized module is not in the module cache runs XLA's code for the function at once (what
``jax.jit`` would compile: the traced jaxpr inlined, same donation and shardings), and a
background thread exports, optimizes and XLA-compiles hlofuse's module. Calls of that
signature run XLA's code until it is ready, then hlofuse's; autotune starts from there.
:meth:`HlofuseFunction.block_until_optimized` waits for it. Under a transformation, from
``lower``/``report``/``tune``, or with a warm module cache, the build is synchronous as before.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import re
import time
from typing import Callable, Sequence

import jax
from jax import tree_util

from hlofuse.core import compat
from hlofuse.core import ir as hir
from hlofuse.core.pipeline import OptionError, PassManager, UnknownPassError
from hlofuse.core.report import Report
from hlofuse.core.target import Target
from hlofuse.frontend.dispatch import Dispatcher
from hlofuse.frontend.signature import CallInfo, CallSignature, Frozen, norm_tuple, static_key
from hlofuse.frontend.tracing import TracedFunction
from hlofuse.frontend.tuning import decision_key, report_decision
from hlofuse.runtime.kernel_choice import xla_to_apply
from hlofuse.passes import graph_util as gu
from hlofuse.passes.buffer_aliasing import memory_plan
from hlofuse.passes.kernel_table import text_without_originals
from hlofuse.runtime import memory
from hlofuse.runtime import module_cache
from hlofuse.runtime.autotune import mode as at_mode
from hlofuse.runtime.program import (TRACED_NOTE, Options, Program, find_calls,
                                     lower_traced)

__all__ = ["jit", "Lowered", "Compiled", "HlofuseFunction"]

class Wrapper:
    """What a function made around an inner :class:`HlofuseFunction` (``hlofuse_function``)
    shares: used as a method, the instance is its first argument; ``block_until_optimized``
    and ``compilations`` are the inner function's (:func:`hlofuse.filter_jit`,
    :func:`hlofuse.nnx_jit`)."""

    hlofuse_function: "HlofuseFunction"

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return functools.partial(self, obj)

    def block_until_optimized(self, timeout: float | None = None) -> bool:
        return self.hlofuse_function.block_until_optimized(timeout)

    @property
    def compilations(self) -> int:
        return self.hlofuse_function.compilations


_ALIAS = re.compile(r"\{(\d*)\}:\s*\((\d+),\s*\{[^}]*\},\s*([\w-]+)\)")


def compiled_aliases(compiled) -> dict[int, int]:
    """Output -> flat argument index of the buffers XLA's compiled executable aliases (read
    back from its HLO header, mapped through the arguments jax kept)."""
    text = compiled.as_text() or ""
    header = text.split("\n", 1)[0]
    m = re.search(r"input_output_alias=\{(.*?)\}\s*,\s*entry_computation_layout", header)
    if not m:
        return {}
    kept = getattr(getattr(compiled, "_executable", None), "_kept_var_idx", None)
    kept = sorted(kept) if kept is not None else None
    out = {}
    for o, p, _ in _ALIAS.findall(m.group(1) + "}"):
        p = int(p)
        out[int(o) if o else 0] = kept[p] if kept is not None and p < len(kept) else p
    return out


_MISSING = object()


class Lowered:
    """What ``fn.lower(*args)`` returns: jax's ``Lowered`` for the whole call plus hlofuse's
    optimized module and report for the function's signature."""

    def __init__(self, fn: "HlofuseFunction", jax_lowered, entry, n_args: int, report=None,
                 call: tuple = ({}, {})):
        self._fn = fn
        self._lowered = jax_lowered
        self._entry = entry
        self._n_args = n_args
        self._report = report
        self._call = call   # the lowered static and frozen values: ({position: v}, {name: v})
        self.out_tree = jax_lowered.out_tree

    def __getattr__(self, name):
        """The rest of jax's ``Lowered`` (``in_tree``, ``args_info``, ``out_info``,
        ``compiler_ir()``, ``cost_analysis()``...): jax's own, of the call as it compiles
        (the outer module with the optimized one inlined)."""
        try:
            inner = object.__getattribute__(self, "_lowered")
        except AttributeError:   # not set up (copying, unpickling): no recursion
            raise AttributeError(name) from None
        return getattr(inner, name)

    def as_text(self, dialect: str | None = None, *, debug_info: bool = False) -> str:
        """The optimized StableHLO (for any target, including gpu/tpu from a CPU machine);
        another ``dialect`` (``'hlo'``) is jax's text of the call as it compiles."""
        if dialect not in (None, "stablehlo"):
            return self._lowered.as_text(dialect=dialect, debug_info=debug_info)
        if self._entry is None:
            return self._lowered.as_text(debug_info=debug_info)
        # the program that runs: the originals kept for rollback are hlofuse's bookkeeping
        return text_without_originals(self._entry.optimized.module, debug_info=debug_info)

    @property
    def report(self):
        return self._entry.report if self._entry is not None else self._report

    @property
    def exported(self):
        """The ``jax.export.Exported`` carrying the optimized module (serializable), called
        like the function: ``exported.call(*args, **kwargs)`` with its dynamic arguments' pytree
        structure, returning its output structure, as ``jax.export.export(jax.jit(f))`` makes,
        but without VJPs (``serialize(vjp_order=0)``; for a differentiable artifact export the
        function itself: ``jax.export.export(hlofuse.jit(f))(*args)``).
        None for a function left to XLA whole, and for one that calls back into Python: its
        module holds placeholders for the callbacks, which only this process can put back."""
        if self._entry is None or self._entry.callbacks:
            return None
        exp = self._entry.exported
        in_tree, out_tree = self._lowered.in_tree, self.out_tree
        if exp is None or in_tree.num_leaves != len(exp.in_avals) or \
                out_tree.num_leaves != len(exp.out_avals):
            return exp
        # the program's own is flat (one input per leaf); the leaves are in the same order
        return dataclasses.replace(exp, in_tree=in_tree, out_tree=out_tree)

    @property
    def jax_lowered(self):
        """jax's own ``Lowered`` of the call (the outer module with the optimized one inlined)."""
        return self._lowered

    def compile(self, compiler_options: dict | None = None) -> "Compiled":
        """XLA-compile for the current backend, with the compiler options autotune decided for
        this program (if it did) unless ``compiler_options`` are given."""
        if compiler_options is None and self._entry is not None:
            compiler_options = self._fn._decided_options(self._entry)
        compiled = self._lowered.compile(compiler_options or None)
        return Compiled(compiled, self._fn, self._n_args, self._call)


class Compiled:
    """What ``Lowered.compile()`` returns: call it like the function (static and frozen
    arguments may be passed or left out); ``memory_analysis()``, ``cost_analysis()``,
    ``as_text()`` and :meth:`aliases` come from XLA's executable."""

    def __init__(self, compiled, fn: "HlofuseFunction", n_args: int, call: tuple = ({}, {})):
        self._compiled = compiled
        self._fn = fn
        self._n_args = n_args
        self._call = call
        self.out_tree = compiled.out_tree

    def __getattr__(self, name):
        """The rest of jax's ``Compiled`` (``input_shardings``, ``output_shardings``,
        ``in_tree``, ``args_info``, ``input_formats``, ``runtime_executable()``...)."""
        try:
            inner = object.__getattribute__(self, "_compiled")
        except AttributeError:   # not set up (copying, unpickling): no recursion
            raise AttributeError(name) from None
        return getattr(inner, name)   # jax's own (serialize_executable reads ``_executable``)

    def __call__(self, *args, **kwargs):
        if len(args) == self._n_args:  # the full argument list: drop static / frozen ones
            drop = self._fn._static_positions(len(args))
            for i in sorted(drop):
                if i < len(args) and i in self._call[0]:
                    self._check_static(f"argument {i}", args[i], self._call[0][i])
            args = tuple(a for i, a in enumerate(args) if i not in drop)
        for k in self._fn._static_names:
            if k in kwargs:
                lowered = self._call[1].get(k, _MISSING)
                if lowered is _MISSING:   # lowered by position, passed by name
                    lowered = self._call[0].get(self._fn._param_position(k), _MISSING)
                if lowered is not _MISSING:
                    self._check_static(f"argument {k!r}", kwargs[k], lowered)
        kwargs = {k: v for k, v in kwargs.items() if k not in self._fn._static_names}
        return self._compiled(*args, **kwargs)

    def _check_static(self, what: str, given, lowered) -> None:
        """The executable holds the lowered static (or frozen) value: another one would run
        the old program silently (its result for the lowered value), so it is refused, as
        jax's ``Compiled`` refuses a call that does not match its signature."""
        if isinstance(lowered, Frozen):
            same = Frozen(given) == lowered
        else:
            try:
                same = static_key(given) == static_key(lowered)
            except Exception:  # noqa: BLE001 - an uncomparable value is not the lowered one
                same = False
        if not same:
            kind = "frozen" if isinstance(lowered, Frozen) else "static"
            old = "other arrays" if isinstance(lowered, Frozen) else repr(lowered)[:80]
            raise TypeError(f"{self._fn._name}: this executable was compiled for {kind} {what} "
                            f"= {old}, and called with {repr(given)[:80]}; lower and compile "
                            f"again for another value (or call the function itself)")

    def memory_analysis(self):
        return self._compiled.memory_analysis()

    def cost_analysis(self):
        return self._compiled.cost_analysis()

    def as_text(self) -> str:
        return self._compiled.as_text()

    def aliases(self) -> dict[int, int]:
        """Flat output index -> flat (dynamic) argument index XLA actually aliases."""
        return compiled_aliases(self._compiled)


class HlofuseFunction:
    """The callable returned by :func:`jit`: the user's face of the three parts (the
    :class:`CallSignature`, the :class:`TracedFunction` and the :class:`Dispatcher`)."""

    def __init__(self, fun: Callable, *, target, pipeline, disable, check, options, dump_dir,
                 autotune=None, freeze_argnums=(), tiered=None, memory_limit=None,
                 **jit_kwargs):
        functools.update_wrapper(self, fun)
        self._fun = fun
        disable = norm_tuple(disable)  # one pass name as a string, not its letters
        if autotune is not None:       # a typo fails here, not at the first call
            at_mode(autotune)
        self._target = None if target is None else Target.of(target)
        self._opts = Options(target=self._target, pipeline=pipeline, disable=disable,
                             pass_options=dict(options or {}), dump_dir=dump_dir, check=check,
                             autotune=autotune)
        self._name = getattr(fun, "__name__", "fun")
        _check_pass_names(pipeline, disable)
        self._sig = CallSignature(fun, self._name, freeze_argnums, jit_kwargs)
        if memory_limit is not None:   # checked now: a typo fails here, not at the first call
            memory.resolve_limit(memory_limit, self._target or Target.of(None))
        self._memory_limit = memory_limit
        self._traced = TracedFunction(fun, self._name, self._opts, self._sig,
                                      tiering=lambda: self._dispatch.tiering())
        self._dispatch = Dispatcher(self._name, self._opts, self._sig, self._traced,
                                    autotune=autotune, tiered=tiered,
                                    memory_limit=memory_limit)
        module_cache.enable_xla_cache()   # a second process skips XLA's compile too

    def __deepcopy__(self, memo):
        """The function itself, as ``copy.deepcopy`` gives a Python function or a ``jax.jit``
        one: its caches and locks are not copied (an object holding it deep-copies)."""
        return self

    def __copy__(self):
        return self

    # -- what other parts and tests read -------------------------------------------------------
    @property
    def _jit(self):
        """The default inner ``jax.jit`` object (its argument 0 is a :class:`CallInfo`)."""
        return self._dispatch.default.jitted

    @property
    def _tuning(self) -> dict:
        return self._dispatch.states

    @property
    def _fast(self) -> bool:
        return self._dispatch.fast

    @property
    def _fast_fn(self):
        return self._dispatch.fast_fn

    @property
    def _static_names(self) -> tuple:
        return self._sig.static_names

    @property
    def _donating(self) -> bool:
        return self._sig.donating

    def _param_position(self, name: str) -> int | None:
        """The position of parameter ``name`` in the function's signature (None: unknown)."""
        sig = self._sig.sig
        names = list(sig.parameters) if sig is not None else []
        return names.index(name) if name in names else None

    def _static_positions(self, n: int) -> set:
        return self._sig.static_positions(n)

    def _wrap_frozen(self, args: tuple) -> tuple:
        return self._sig.wrap_frozen(args)

    def _call_key(self, args, kwargs):
        return self._sig.call_key(args, kwargs)

    def _variant_jit(self, options: dict, donate: bool, xla: frozenset = frozenset(),
                     plain: bool = False, full: bool = False):
        """The executable (:class:`~hlofuse.frontend.tuning.Exe`) of a variant: callable like
        the function, with ``lower``."""
        return self._dispatch.variant(options, donate, xla, plain, full)

    @staticmethod
    def _decision_key(entry, text: str | None = None) -> str:
        return decision_key(entry, text)

    def _decided_options(self, entry) -> dict:
        return self._dispatch.decided_options(entry)

    # -- calling -----------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if jax.config.jax_disable_jit:
            # as jax.jit under jax.disable_jit(): the function runs op by op on concrete
            # values (a user debugging with print / breakpoints sees arrays, not tracers)
            return self._fun(*args, **kwargs)
        if self._sig.freeze:
            args = self._sig.wrap_frozen(args)
        d = self._dispatch
        if d.fast and time.perf_counter() < d.recheck_at:
            # one executable for every signature, no re-check due: jax's C++ dispatch, no
            # per-call key
            fn = d.fast_fn
            if fn is None or not compat.at_top_level():
                fn = d.default
            info = CallInfo((args, kwargs), True, fn.plain)
            try:
                out = fn.jitted(info, *args, **kwargs)
                if info.traced:
                    d.first_call(info, args, kwargs, out)
                return out
            finally:
                info.leave()
        info = CallInfo((args, kwargs), True)
        try:
            if self._memory_limit is not None:
                d.plan_memory(args, kwargs, self.lower)
            return d.tuned_call(info, args, kwargs)
        finally:
            info.leave()

    def _run(self, what: str, args, kwargs):
        """``self._jit.<what>(info, *args, **kwargs)`` for ``trace``/``lower``/``eval_shape``:
        a trace there is a new signature to the dispatcher too."""
        info = CallInfo((args, kwargs))
        try:
            return getattr(self._jit, what)(info, *args, **kwargs)
        finally:
            info.leave()
            self._dispatch.traced_new(info)

    def block_until_optimized(self, timeout: float | None = None) -> bool:
        """Wait until every signature's hlofuse executable built in the background (tiered
        first calls) is ready. True when none is pending (``timeout`` seconds at most)."""
        return self._dispatch.block_until_optimized(timeout)

    def tier_status(self, *args, **kwargs) -> dict:
        """For these arguments' signature: ``{'state': ..., 'seconds': ..., 'error': ...}``.
        state: None (not tiered: built in place, or never called), 'building' (calls run XLA's
        code), 'ready' (hlofuse's code runs; seconds: from the first call's start until it was
        ready) or 'failed' (XLA's code for good; error says why)."""
        st = self._tuning.get(self._call_key(self._wrap_frozen(args), kwargs))
        if st is None:
            return {"state": None, "seconds": None, "error": None}
        return {"state": st.tier, "seconds": st.tier_s, "error": st.tier_error}

    # -- public ----------------------------------------------------------------------------
    def lower(self, *args, **kwargs) -> Lowered:
        """Trace and lower for the function's target (default: the current backend)."""
        args = self._wrap_frozen(args)
        platform = (self._target or Target.of(None)).platform
        traced = self._run("trace", args, kwargs)
        lowered = lower_traced(traced, platform, self._name)
        calls = find_calls(traced.jaxpr)
        entry, report = None, None
        if calls:
            program, sig = calls[0]
            entry = program.entry(sig, program.target_for(platform))
            st = self._tuning.get(self._call_key(args, kwargs))
            xla, full = xla_to_apply(entry, st.decision if st else None)
            if xla or full:  # what calls run: regions measured slower as kernels are XLA's
                entry = program.with_xla(xla, full).entry(sig, program.target_for(platform))
                report_decision(entry.report, st.decision, st.cached)
        else:
            report = Report(target=(self._target or Target.of(None)).kind, source=self._name)
            report.note(TRACED_NOTE)
        drop = self._static_positions(len(args))
        statics = ({i: a for i, a in enumerate(args) if i in drop},   # static and frozen only:
                   {k: v for k, v in kwargs.items() if k in self._static_names})  # no batch kept alive
        return Lowered(self, lowered, entry, len(args), report, statics)

    def trace(self, *args, **kwargs):
        """jax's ``Traced`` of the call (``.jaxpr`` shows the ``hlofuse_call``)."""
        return self._run("trace", self._wrap_frozen(args), kwargs)

    def eval_shape(self, *args, **kwargs):
        return self._run("eval_shape", self._wrap_frozen(args), kwargs)

    def report(self, *args, **kwargs):
        """The fusion report for these arguments' signature. Aliases and the memory plan are
        read back from XLA's compiled executable when it can be compiled here (the outer
        ``jax.jit``'s donation decides them, not the module's own annotations).

        Without arguments, for a function that needs some: the report of the last signature
        traced (a call, ``lower`` or a transformation)."""
        if not args and not kwargs and not self._binds_no_arguments():
            if self._traced.last_sig is None:
                raise TypeError(
                    f"{self._name}.report() needs the arguments of a call (arrays, or "
                    f"jax.ShapeDtypeStruct for the dynamic ones): report(*args, **kwargs); "
                    f"without them it reports the last signature called, and {self._name} "
                    f"has not been called yet")
            in_tree, leaves = self._traced.last_sig
            args, kwargs = tree_util.tree_unflatten(in_tree, leaves)
        lowered = self.lower(*args, **kwargs)
        rep = lowered.report
        if lowered._entry is not None and self._donating and (
                self._target is None or self._target.kind == Target.of(None).kind):
            try:
                aliases = lowered.compile().aliases()
            except Exception as e:  # noqa: BLE001 - report() never fails on hlofuse's compile: noted
                rep.note(f"buffer-aliasing: could not read the compiled executable's aliases "
                         f"({type(e).__name__}: {e}); the plan above is the module's own")
            else:
                _report_compiled_aliases(rep, lowered._entry, aliases)
        return rep

    def _binds_no_arguments(self) -> bool:
        try:
            inspect.signature(self._fun).bind()
        except TypeError:
            return False
        except ValueError:  # no signature to read (a builtin): let the call decide
            return True
        return True

    def tune(self, *args, budget_s: float | None = None, **kwargs):
        """Measure now, for these arguments' signature, whatever a call would measure: XLA
        compiler options and every kernelized region against XLA's own code (short calls
        included), cache the decisions on disk and return them (``hlofuse tune`` runs this
        offline, so a deployment ships its decisions and runs with ``autotune='cached'``).
        None when there is nothing to tune. Does not run under a transformation."""
        if budget_s is not None and not (isinstance(budget_s, (int, float))
                                         and math.isfinite(budget_s) and budget_s >= 0):
            raise ValueError(f"tune(budget_s={budget_s!r}): give a finite number of seconds "
                             f">= 0, or None for the configured budget")
        args = self._wrap_frozen(args)
        key = self._call_key(args, kwargs)
        if key is None:
            raise TypeError("tune() needs concrete (non-tracer), hashable arguments")
        return self._dispatch.tune_now(key, args, kwargs, budget_s)

    def autotune_decision(self, *args, **kwargs):
        """The compiler-option decision (:class:`hlofuse.runtime.autotune.Decision`) for these
        arguments' signature, or None while undecided / when autotuning is off. Once a
        steady-state re-check switched what the calls run, the re-check's decision (its
        ``reason`` starts with "steady-state re-check")."""
        key = self._call_key(self._wrap_frozen(args), kwargs)
        st = self._tuning.get(key)
        return st.decision if st is not None else None

    @property
    def compilations(self) -> int:
        """How many programs hlofuse has optimized so far: one per call signature, plus the
        derived ones transformations asked for (forward-with-residuals and backward under
        grad, batched under vmap...)."""
        return sum(p.builds for p in self.all_programs())

    def all_programs(self) -> list[Program]:
        """The programs of every signature and every program derived from them."""
        return self._traced.all_programs()

    def programs(self) -> list[Program]:
        return list(self._traced.programs.values())

    def clear_cache(self):
        self._dispatch.clear()
        self._traced.programs.clear()

    def __repr__(self):
        return (f"<hlofuse.jit {getattr(self._fun, '__qualname__', self._fun)} "
                f"target={self._target.kind if self._target else 'auto'}>")

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return functools.partial(self, obj)


def _check_pass_names(pipeline, disable) -> None:
    """An unknown pass name is the user's error, raised here (a tiered first call would only
    meet it in a background build, and run XLA's code with a warning). A bad pass option is
    reported where the module is built: that build falls back to XLA's program and warns."""
    try:
        PassManager(pipeline, disable=disable)
    except UnknownPassError:
        raise
    except (OptionError, ValueError, TypeError):
        pass


def _report_compiled_aliases(report, entry, aliases: dict[int, int]) -> None:
    """Replace the report's aliases and memory plan with what the executable does (the
    outer ``jax.jit``'s donation decides them; the report's text shows the rows)."""
    module = entry.optimized.module
    with module.context:
        func = hir.main_func(module)
        block = func.regions[0].blocks[0]
        outs = list(hir.block_ops(block)[-1].operands)
        rows = []
        for j, i in sorted(aliases.items()):
            t = gu.info(outs[j]) if j < len(outs) else None
            rows.append({"output": j, "argument": i, "bytes": t.nbytes if t else 0,
                         "type": f"{t.dtype}[{','.join(map(str, t.shape))}]" if t else "",
                         "source": "compiled executable"})
        before = dict(report.memory)
        plan = memory_plan(func, {j: i for j, i in aliases.items() if j < len(outs)})
    # the module's arguments are those jax kept (an unused one is dropped): in the call's terms
    kept = sorted(entry.exported.module_kept_var_idx) if entry.exported is not None else None
    arg = (lambda i: kept[i] if kept is not None and i < len(kept) else i)  # noqa: E731
    asked = [(r["output"], arg(r["argument"])) for r in report.aliases
             if r.get("source") != "compiled executable"]
    if asked not in ([], sorted(aliases.items())):
        claimed = ", ".join(f"output {j} <- argument {i}" for j, i in asked) or "none"
        report.note(f"buffer-aliasing: the compiled executable aliases "
                    f"{', '.join(f'output {j} <- argument {i}' for j, i in sorted(aliases.items())) or 'nothing'}"
                    f" (the module asked for {claimed}; the outer jax.jit's donation decides)")
    report.aliases = rows
    report.memory = dict(before, peak_live_bytes_after=plan.peak_bytes, peak_at=plan.peak_at,
                         alias_bytes=plan.alias_bytes, aliases_from="compiled executable")


def jit(fun: Callable | None = None, *, target: str | None = None, pipeline=None,
        disable: Sequence[str] = (), check: bool = False, options: dict | None = None,
        dump_dir: str | None = None, autotune: bool | str | None = None,
        freeze_argnums: int | Sequence[int] = (), tiered: bool | None = None,
        memory_limit: int | str | None = None, **jit_kwargs):
    """Like ``jax.jit``, with hlofuse's StableHLO optimization between tracing and XLA.

    Args:
      fun: the function to compile (pytrees in and out, like ``jax.jit``).
      **jit_kwargs: every ``jax.jit`` keyword, passed through unchanged: ``static_argnums``,
        ``static_argnames``, ``donate_argnums``, ``donate_argnames``, ``in_shardings``,
        ``out_shardings``, ``keep_unused``, ``device``, ``backend``, ``inline``,
        ``compiler_options``.
      target: None (default: whatever platform the call is lowered for), 'cpu', 'gpu' or
        'tpu'. A gpu/tpu target can be lowered and inspected from a CPU machine
        (``.lower(...).as_text()``) but only run on one.
      pipeline: pipeline name ('default', 'cleanup', 'none') or list of pass names.
      disable: pass names to skip.
      check: verify every kernelized region against its original subgraph on the first call
        and roll back regions that disagree (see :mod:`hlofuse.runtime.verify`).
      options: pass options; dump_dir: write the module after each pass. An optimization
        never makes the program fail: when a pass fails the function runs unoptimized with a
        ``hlofuse.HlofuseWarning``; ``options={'strict': True}`` raises instead (debugging).
      freeze_argnums: positional arguments (e.g. parameters, for inference) treated as
        compile-time constants: the traced function closes over their values, so
        ``constant-fold`` and ``batchnorm-fold`` can act on them. One compilation per frozen
        value identity (``id`` + shape + dtype of each leaf; the values are kept alive while
        cached). Mutating a frozen array in place is not detected: pass a new array or make a
        new ``hlofuse.jit``.
      autotune: measure XLA compiler-option variants for each signature on its second call
        and keep one only when it beats XLA's defaults (see :mod:`hlofuse.runtime.autotune` and the
        README). True/'on', False/'off', 'cached' (use decisions on disk, never measure), or
        None: ``$HLOFUSE_AUTOTUNE``, else on (every platform; on gpu/tpu, until measured,
        only the kernels XLA cannot match run: :mod:`hlofuse.passes.kernelize`).
      tiered: the first call of a signature whose optimized module is not cached runs XLA's
        code for the function (about jax.jit's first-call time) while hlofuse builds its
        module in a background thread; later calls switch to it when it is ready
        (:meth:`HlofuseFunction.block_until_optimized` waits). Results of the calls before
        and after the switch may differ within the tolerance of the rewrites. None:
        ``$HLOFUSE_TIERED`` (default on); False builds during the first call.
      memory_limit: bytes, a size ('12GiB'), or 'device' (the device's capacity): before a
        signature's first call, hlofuse's program and XLA's own module are compiled and the
        one with the fewest flops whose peak (XLA's ``memory_analysis()``) fits runs; the
        report says which. When neither fits, :class:`hlofuse.MemoryLimitError` says by how
        much and lists the largest buffers live at the peak (:mod:`hlofuse.runtime.memory`). Builds
        during the first call (no tiered first call).
    """
    if fun is None:
        return functools.partial(jit, target=target, pipeline=pipeline, disable=disable,
                                 check=check, options=options, dump_dir=dump_dir,
                                 autotune=autotune, freeze_argnums=freeze_argnums,
                                 tiered=tiered, memory_limit=memory_limit, **jit_kwargs)
    if not callable(fun):
        raise TypeError(f"Expected a callable value, got {fun!r}")
    return HlofuseFunction(fun, target=target, pipeline=pipeline, disable=disable, check=check,
                           options=options, dump_dir=dump_dir, autotune=autotune,
                           freeze_argnums=freeze_argnums, tiered=tiered,
                           memory_limit=memory_limit, **jit_kwargs)
