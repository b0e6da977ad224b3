"""``@hlofuse.jit``: ``jax.jit`` with hlofuse's StableHLO pipeline between tracing and XLA.

An :class:`HlofuseFunction` *is* a ``jax.jit`` function: it wraps ``jax.jit(traced, **kw)``
with every ``jax.jit`` keyword passed through (shardings, static and donated arguments,
``keep_unused``, ``inline``, ``compiler_options``...). ``traced`` binds the user's function as
one :class:`hlofuse.runtime.program.Program` through the ``hlofuse_call`` primitive, whose lowering
inlines hlofuse's optimized module. So calling it costs what a ``jax.jit`` call costs (jax's
C++ dispatch path), its caches are jax's caches, and it composes with every JAX
transformation exactly like ``jax.jit`` does.

Autotuning (:mod:`hlofuse.runtime.autotune`) sits beside that path, never inside it: a tuned signature
whose decision is "XLA defaults" runs the very same ``jax.jit`` object as ``autotune=False``;
only a signature whose measured winner is a compiler-option variant runs a second, top-level
``jax.jit(traced, compiler_options=...)``. Under any transformation (arguments are tracers)
the plain ``jax.jit`` is used, so ``compiler_options`` never meets a tracer.

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
import logging
import re
import threading
import time
import warnings
from typing import Any, Callable, Sequence

import numpy as np

import jax
from jax import tree_util

from hlofuse.core import compat
from hlofuse.core import config
from hlofuse.core import ir as hir
from hlofuse.runtime import memory
from hlofuse.core.pipeline import trace
from hlofuse.passes import graph_util as gu
from hlofuse.passes.buffer_aliasing import memory_plan
from hlofuse.core.report import HlofuseWarning, Report
from hlofuse.core.target import Target
from hlofuse.runtime.program import (TRACED_NOTE, machinery_failed, Options, Program, call, context_mesh,
                              context_movable, find_calls, lower_traced, signature_of,
                              typed_shardings)
from hlofuse.runtime import autotune as at
from hlofuse.runtime import module_cache

__all__ = ["jit", "Lowered", "Compiled", "HlofuseFunction"]

log = logging.getLogger("hlofuse")
_CALL = threading.local()   # .args: the concrete (args, kwargs) of the call being traced
#                             .tier: this call may start a tiered build (set by __call__ only)

#: ``tiered=None`` follows this variable: "0"/"off"/"false"/"no" turn tiered first calls off
TIERED_ENV = "HLOFUSE_TIERED"


def tiered_mode(setting) -> bool:
    """``hlofuse.jit(tiered=...)``: True/False, or None for ``$HLOFUSE_TIERED`` (default on)."""
    if setting is None:
        return config.get(TIERED_ENV)
    return bool(setting)


class _Tier(Exception):
    """Raised out of ``jax.jit``'s trace of a new signature (from :meth:`HlofuseFunction._traced`)
    when its optimized module would have to be built: the call runs XLA's code instead and the
    build goes to the background. Never escapes :meth:`HlofuseFunction.__call__`."""


def _leave_call() -> None:
    """End this thread's call state (:data:`_CALL`): no concrete arguments, no tiering, and
    the jax compilation-cache context a trace of the call entered is left."""
    _CALL.args = None
    _CALL.tier = False
    ctx = _CALL.__dict__.pop("xla_cache", None)
    if ctx is not None:
        ctx.__exit__(None, None, None)


def _norm_tuple(x) -> tuple:
    if x is None:
        return ()
    if isinstance(x, (int, str)):
        return (x,)
    return tuple(x)


class _Frozen:
    """A frozen argument (``freeze_argnums``) as a static argument of the inner ``jax.jit``:
    hashed by the identity of its leaves (``id`` + shape + dtype; hashable scalars by value).
    Holding the value keeps every ``id`` alive while jax caches the compilation."""

    __slots__ = ("value", "_key")

    def __init__(self, value):
        self.value = value
        leaves, tree = tree_util.tree_flatten(value)
        ids = []
        for leaf in leaves:
            if isinstance(leaf, (bool, int, float, complex, str)):
                ids.append((type(leaf).__name__, leaf))
            else:
                ids.append((id(leaf), tuple(getattr(leaf, "shape", ())),
                            str(getattr(leaf, "dtype", ""))))
        self._key = (tree, tuple(ids))

    def __hash__(self):
        return hash(self._key)

    def __eq__(self, other):
        return isinstance(other, _Frozen) and self._key == other._key


def _warn_argument_updates(name: str, in_tree, before: list, dyn: list, args, kwargs,
                           warned: list) -> None:
    """Warn (once per program) when the traced function assigned new values inside its
    arguments (a Flax NNX module's BatchNorm statistics or an ``nnx.Optimizer`` step): as
    under ``jax.jit``, the caller's objects keep their old values, silently. ``before``: the
    argument leaves (of ``in_tree``) the function was called with; ``dyn``: which are traced
    (only those are compared: a static leaf's flatten may build a new object each time)."""
    try:
        after = in_tree.flatten_up_to((args, kwargs))
    except (ValueError, TypeError):
        what = "changed the structure of its arguments"
    else:
        changed = [k for k, (x, b, d) in enumerate(zip(after, before, dyn)) if d and x is not b]
        if not changed:
            return
        paths = [p for p, _ in tree_util.tree_flatten_with_path(
            tree_util.tree_unflatten(in_tree, range(in_tree.num_leaves)))[0]]
        what = (f"assigned new values to {len(changed)} leaves of its arguments (first: "
                f"{_arg_path(paths[changed[0]])})")
    warned.append(True)
    nnx = any(type(a).__module__.startswith("flax.nnx") for a in
              list(args) + list(kwargs.values()))
    warnings.warn(HlofuseWarning(
        f"hlofuse.jit({name}): the function {what}; as under jax.jit, those updates stay "
        "inside the trace and the caller's objects keep their old values. Return the new "
        "values" + ("; for Flax NNX modules use hlofuse.nnx_jit, which writes them back as "
                    "nnx.jit does" if nnx else "")), stacklevel=2)


def _arg_path(path) -> str:
    """A leaf's path in ``(args, kwargs)`` as the call wrote it: ``argument 0.mean.value``."""
    head, rest = path[:2], tree_util.keystr(tuple(path[2:]))
    if head[0] == tree_util.SequenceKey(0):
        return f"argument {head[1].idx}{rest}"
    return f"argument {head[1].key!r}{rest}"


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


def _top_level() -> bool:
    """Whether this call is outside every JAX transformation (jit tracing, grad, vmap, ...):
    its arguments cannot be tracers then. The current trace, not a scan of the arguments for
    tracers (15 us per call for GPT-2's 36 parameter leaves: 4% of a 0.35 ms decode step)."""
    return compat.at_top_level()


def _is_key(dtype) -> bool:
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def _key_impls(xs) -> tuple:
    """Each value's PRNG key implementation (``jax.random.key`` arrays: an extended dtype,
    which StableHLO carries as uint32 key data), or None; ``()`` when none is a key."""
    impls = tuple(jax.random.key_impl(x) if _is_key(getattr(x, "dtype", None)) else None
                  for x in xs)
    return impls if any(i is not None for i in impls) else ()


def _static_key(leaf):
    """Cache key of a static leaf: by value when hashable (like jax.jit), else by identity."""
    if isinstance(leaf, _Frozen):
        return leaf
    try:
        hash(leaf)
    except TypeError:
        return ("id", id(leaf))
    return (type(leaf), leaf)


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


class Lowered:
    """What ``fn.lower(*args)`` returns: jax's ``Lowered`` for the whole call plus hlofuse's
    optimized module and report for the function's signature."""

    def __init__(self, fn: "HlofuseFunction", jax_lowered, entry, n_args: int, report=None):
        self._fn = fn
        self._lowered = jax_lowered
        self._entry = entry
        self._n_args = n_args
        self._report = report
        self.out_tree = jax_lowered.out_tree

    def as_text(self, debug_info: bool = False) -> str:
        """The optimized StableHLO (for any target, including gpu/tpu from a CPU machine)."""
        if self._entry is None:
            return self._lowered.as_text(debug_info=debug_info)
        opt = self._entry.optimized
        return opt.text_with_locations() if debug_info else opt.text

    @property
    def report(self):
        return self._entry.report if self._entry is not None else self._report

    @property
    def exported(self):
        """The ``jax.export.Exported`` carrying the optimized module (serializable). None for
        a function left to XLA whole, and for one that calls back into Python: its module holds
        placeholders for the callbacks, which only this process can put back."""
        if self._entry is None or self._entry.callbacks:
            return None
        return self._entry.exported

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
        return Compiled(compiled, self._fn, self._n_args)


class Compiled:
    """What ``Lowered.compile()`` returns: call it like the function (static and frozen
    arguments may be passed or left out); ``memory_analysis()``, ``cost_analysis()``,
    ``as_text()`` and :meth:`aliases` come from XLA's executable."""

    def __init__(self, compiled, fn: "HlofuseFunction", n_args: int):
        self._compiled = compiled
        self._fn = fn
        self._n_args = n_args
        self.out_tree = compiled.out_tree

    def __call__(self, *args, **kwargs):
        if len(args) == self._n_args:  # the full argument list: drop static / frozen ones
            drop = self._fn._static_positions(len(args))
            args = tuple(a for i, a in enumerate(args) if i not in drop)
        kwargs = {k: v for k, v in kwargs.items() if k not in self._fn._static_names}
        return self._compiled(*args, **kwargs)

    def memory_analysis(self):
        return self._compiled.memory_analysis()

    def cost_analysis(self):
        return self._compiled.cost_analysis()

    def as_text(self) -> str:
        return self._compiled.as_text()

    def aliases(self) -> dict[int, int]:
        """Flat output index -> flat (dynamic) argument index XLA actually aliases."""
        return compiled_aliases(self._compiled)


@dataclasses.dataclass
class _Tuning:
    """Autotune state of one call signature."""
    calls: int = 0
    decision: at.Decision | None = None
    fn: Callable | None = None        # the jitted function for a non-default decision
    key: str | None = None            # decision-cache key (None: nothing to tune)
    entry: Any = None
    cached: bool = False              # the decision came from the cache
    # tiered first call: None (built synchronously), "building" (calls run XLA's code),
    # "ready" (hlofuse's executable compiled), "failed" (XLA's code for good, error says why)
    tier: str | None = None
    tier_thread: Any = None
    tier_started: float = 0.0
    tier_s: float | None = None       # seconds from the first call to hlofuse's code ready
    tier_error: str | None = None
    # memory_limit: the report's sentence once planned, and whether XLA's own module is over
    # the limit (tuning must then not choose it)
    memory: str | None = None
    plain_over_limit: bool = False


def _typed_shardings(leaves, dyn) -> list | None:
    """:func:`hlofuse.runtime.program.typed_shardings` of the dynamic leaves (tracers); None for the
    static ones."""
    typed = typed_shardings([jax.typeof(x) for x, d in zip(leaves, dyn) if d])
    if typed is None:
        return None
    it = iter(typed)
    return [next(it) if d else None for d in dyn]


class HlofuseFunction:
    """The callable returned by :func:`jit`."""

    def __init__(self, fun: Callable, *, target, pipeline, disable, check, options, dump_dir,
                 autotune=None, freeze_argnums=(), tiered=None, memory_limit=None,
                 **jit_kwargs):
        functools.update_wrapper(self, fun)
        self._fun = fun
        self._target = None if target is None else Target.of(target)
        self._opts = Options(target=self._target, pipeline=pipeline, disable=tuple(disable),
                             pass_options=dict(options or {}), dump_dir=dump_dir, check=check,
                             autotune=autotune)
        self._name = getattr(fun, "__name__", "fun")
        self._freeze = _norm_tuple(freeze_argnums)
        static_argnums = _norm_tuple(jit_kwargs.pop("static_argnums", None))
        static_argnames = _norm_tuple(jit_kwargs.pop("static_argnames", None))
        try:
            sig = compat.fun_signature(fun)
        except Exception:  # noqa: BLE001 - builtins etc.
            sig = None
        self._check_argnums(sig, static_argnums, _norm_tuple(jit_kwargs.get("donate_argnums")))
        self._user_static = (static_argnums, static_argnames)
        if sig is not None:
            # () as None: jax infers the missing one only when the other is None
            nums, names = compat.infer_argnums_and_argnames(sig, static_argnums or None,
                                                               static_argnames or None)
        else:
            nums, names = static_argnums, static_argnames
        self._static_nums, self._static_names = tuple(nums), tuple(names)
        # both inferred from the signature: jax.jit infers neither when it is given both, and
        # a static_argnames argument passed by position would be traced
        self._jit_kwargs = dict(jit_kwargs, static_argnums=self._static_nums + self._freeze,
                                static_argnames=self._static_names)
        self._donate_nums, self._donate_names = self._donation(sig, jit_kwargs)
        self._donating = bool(self._donate_nums or self._donate_names)
        self._sig = sig

        self._jit = jax.jit(self._traced_fn(), **self._jit_kwargs)
        module_cache.enable_xla_cache()   # a second process skips XLA's compile too
        self._programs: dict[tuple, Program] = {}
        self._last_sig = None  # (in_tree, leaves): the last signature traced, for report()
        self._lock = threading.RLock()
        # autotune: None follows HLOFUSE_AUTOTUNE / the platform (see hlofuse.runtime.autotune.mode)
        self._autotune = autotune
        self._tuning: dict[tuple, _Tuning] = {}
        self._variants: dict[tuple, Callable] = {}   # compiler-option variants of self._jit
        self._fast = True      # every signature seen so far is decided and runs _fast_fn
        self._fast_fn = None   # the one jit object they all run (None: self._jit)
        self._tiered = tiered
        self._plain = None     # jax.jit of the traced jaxpr inlined (tiered first calls)
        self._memory_limit = memory_limit
        if memory_limit is not None:   # checked now: a typo fails here, not at the first call
            memory.resolve_limit(memory_limit, self._target or Target.of(None))
            # the plan is chosen before a signature's first call runs anything (a tiered first
            # call would run XLA's module, which may be the plan over the limit)
            self._tiered = False
            self._fast = False

    # -- configuration ---------------------------------------------------------------------
    def _check_argnums(self, sig, static_argnums: tuple, donate_argnums: tuple) -> None:
        """What jax.jit would not say in hlofuse's terms (frozen arguments are static ones of
        the inner jax.jit)."""
        if set(static_argnums) & set(donate_argnums):
            raise ValueError(f"static arguments cannot be donated: "
                             f"{sorted(set(static_argnums) & set(donate_argnums))}")
        if not self._freeze:
            return
        clash = set(self._freeze) & (set(static_argnums) | set(donate_argnums))
        if clash:
            raise ValueError(f"frozen arguments cannot also be static or donated: "
                             f"{sorted(clash)}")
        if sig is not None:
            params = list(sig.parameters.values())
            if not any(p.kind is p.VAR_POSITIONAL for p in params):
                n = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
                bad = [i for i in self._freeze if not -n <= i < n]
                if bad:
                    raise ValueError(f"freeze_argnums={self._freeze}: {self._name} takes only "
                                     f"{n} positional argument(s)")

    @staticmethod
    def _donation(sig, kw) -> tuple[tuple, tuple]:
        nums = _norm_tuple(kw.get("donate_argnums"))
        names = _norm_tuple(kw.get("donate_argnames"))
        if sig is not None and (nums or names):
            try:
                nums, names = compat.infer_argnums_and_argnames(sig, nums or None,
                                                                   names or None)
            except Exception:  # noqa: BLE001 - jax.jit reports bad donation itself
                pass
        return tuple(nums), tuple(names)

    def _static_positions(self, n: int) -> set:
        return {i + n if i < 0 else i for i in self._static_nums + self._freeze}

    def _wrap_frozen(self, args: tuple) -> tuple:
        if not self._freeze:
            return args
        n = len(args)
        pos = {i + n if i < 0 else i for i in self._freeze}
        bad = [i for i in self._freeze if not -n <= i < n]
        if bad:
            raise ValueError(f"{self._name} has freeze_argnums={self._freeze}, but was called "
                             f"with {n} positional arguments")
        return tuple(_Frozen(a) if i in pos and not isinstance(a, _Frozen) else a
                     for i, a in enumerate(args))

    def _mode(self) -> str:
        return at.mode(self._autotune, jax.default_backend())

    # -- the traced function (runs once per signature, inside jax.jit's tracing) -------------
    def _traced_fn(self, xla: frozenset = frozenset(), plain: bool = False,
                   full: bool = False) -> Callable:
        """A plain function with the user's name and signature (jax.jit reads both) that
        runs :meth:`_traced` (``xla``: region hashes run without their kernels; ``plain``:
        the traced function inlined, no hlofuse module: what jax.jit compiles; ``full``: from
        the module with every kernel built, :meth:`Program.with_xla`)."""
        def traced(*args, **kwargs):
            return self._traced(*args, _xla=xla, _plain=plain, _full=full, **kwargs)
        try:
            return functools.wraps(self._fun)(traced)
        except Exception:  # noqa: BLE001 - odd callables without __name__ etc.
            return traced

    def _traced(self, *args, _xla: frozenset = frozenset(), _plain: bool = False,
                _full: bool = False, **kwargs):
        leaves, in_tree = tree_util.tree_flatten((args, kwargs))
        dyn = [isinstance(x, compat.Tracer) for x in leaves]
        static = tuple(_static_key(x) for x, d in zip(leaves, dyn) if not d)
        donated = self._donated_leaves(args, kwargs, dyn)
        shardings = self._leaf_shardings(args, kwargs, dyn)
        xs = [x for x, d in zip(leaves, dyn) if d]
        self._last_sig = (in_tree, [jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                         weak_type=jax.typeof(x).weak_type)
                                    if d else x for x, d in zip(leaves, dyn)])
        key_impls = _key_impls(xs)
        # without known shardings the trace may still read the caller's mesh (a bare
        # PartitionSpec constraint): a program per mesh in context, as jax.jit caches
        ctx_mesh = None if shardings is not None else context_mesh()
        key = (in_tree, tuple(dyn), static, donated, shardings, key_impls, ctx_mesh)
        program = self._programs.get(key)
        if program is None:
            with self._lock:
                program = self._programs.get(key)
                if program is None:
                    program = self._make_program(leaves, in_tree, dyn, donated, key_impls)
                    program.shardings = shardings
                    self._programs[key] = program
        if key_impls:   # typed PRNG keys cross hlofuse's module as their uint32 key data
            xs = [jax.random.key_data(x) if i else x for x, i in zip(xs, key_impls)]
        sig = signature_of([jax.typeof(x) for x in xs])
        if _plain:  # a tiered first call, or a signature decided to run XLA's own module
            # a new signature traced here from the fast path (its jit object is the plain one
            # when every signature so far was decided so): the call then finds it untuned
            self._fast = False
            out = program.traced_fun(*xs)   # traces the function first when it is new
            return program.unflatten_out(sig, out)
        if self._mode() != "off":
            self._fast = False  # a new signature: the next concrete call decides its options
        concrete = getattr(_CALL, "args", None)
        if getattr(_CALL, "tier", False):
            _CALL.tier = False   # asked once per call: nested and later traces build in place
            if not _xla and not _full and shardings is None and \
                    self._should_tier(program, sig, concrete):
                raise _Tier()
        if concrete is not None and "xla_cache" not in _CALL.__dict__:
            # this call compiles the new signature next: a second process finds it in jax's
            # cache however short it was (left when the call returns, in __call__)
            ctx = module_cache.cache_every_compile()
            if ctx is not None:
                ctx.__enter__()
                _CALL.xla_cache = ctx
        if shardings is None and xs and concrete is not None and not any(
                isinstance(x, compat.Tracer) for x in tree_util.tree_leaves(concrete)):
            xs = _on_inner_mesh(program, xs)   # a top-level call with uncommitted inputs
        out = call(program.with_xla(_xla, _full), xs)
        return program.unflatten_out(sig, out)

    def _should_tier(self, program: Program, sig, concrete) -> bool:
        """Whether this trace (of a top-level call) should run XLA's code now and build
        hlofuse's module in the background: tiering is on, the arguments are concrete and the
        module is not cheap to get (not built in this process, not in the module cache)."""
        if not tiered_mode(self._tiered) or concrete is None:
            return False
        if "backend" in self._jit_kwargs or "device" in self._jit_kwargs:
            return False
        if any(isinstance(x, compat.Tracer) for x in tree_util.tree_leaves(concrete)):
            return False
        try:
            target = program.target_for(jax.default_backend())
            if program.is_built(sig, target):
                return False
            # a background thread does not inherit this thread's jax settings (context
            # managers): under any, the module is built here, as jax.jit would
            return context_movable()
        except Exception:  # noqa: BLE001 - the synchronous build reports what is wrong
            return False

    def _leaf_shardings(self, args, kwargs, dyn) -> tuple | None:
        """The ``NamedSharding`` of every dynamic leaf of this call, when all are known and on
        one mesh of several devices: from ``in_shardings=``, else from the concrete arguments
        of the call being traced (committed sharded arrays). None otherwise (then kernels are
        built for the whole arrays; see :func:`hlofuse.runtime.program.export_optimized`)."""
        spec = self._jit_kwargs.get("in_shardings")
        concrete = getattr(_CALL, "args", None)
        try:
            if spec is not None and not kwargs:
                if isinstance(spec, jax.sharding.Sharding):
                    spec = (spec,) * len(args)
                per = []
                for a, sp in zip(args, tuple(spec)):
                    per += tree_util.tree_leaves(
                        tree_util.tree_map(lambda _, s=sp: s, a) if isinstance(
                            sp, jax.sharding.Sharding) else sp,
                        is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
            elif concrete is not None and concrete[0] is not None and not any(
                    isinstance(x, compat.Tracer) for x in tree_util.tree_leaves(concrete)):
                c_args, c_kwargs = concrete
                per = [getattr(x, "sharding", None)
                       for x in tree_util.tree_leaves((c_args, c_kwargs))]
            else:
                # under an outer jax.jit / grad: on an Explicit mesh the shardings are the
                # tracers' types (on the mesh jax.set_mesh put in context)
                per = _typed_shardings(tree_util.tree_leaves((args, kwargs)), dyn)
                if per is None:
                    return None
        except Exception:  # noqa: BLE001 - an odd prefix: jax.jit reports it itself
            return None
        if len(per) != len(dyn):
            return None
        out = [p for p, d in zip(per, dyn) if d]
        if not out or not all(isinstance(p, jax.sharding.NamedSharding) for p in out):
            return None
        mesh = out[0].mesh
        if (mesh.size <= 1 or any(p.mesh != mesh for p in out)
                or any(t == jax.sharding.AxisType.Manual for t in mesh.axis_types)):
            return None
        return tuple(out)

    def _donated_leaves(self, args, kwargs, dyn) -> tuple:
        if not (self._donate_nums or self._donate_names):
            return ()
        n = len(args)
        nums = {i + n if i < 0 else i for i in self._donate_nums}
        flags = []
        for i, a in enumerate(args):
            flags += [i in nums] * len(tree_util.tree_leaves(a))
        for k in sorted(kwargs):  # tree_flatten orders dict keys sorted
            flags += [k in self._donate_names] * len(tree_util.tree_leaves(kwargs[k]))
        dyn_index = [j for j, d in enumerate(dyn) if d]
        return tuple(k for k, j in enumerate(dyn_index) if j < len(flags) and flags[j])

    def _make_program(self, leaves, in_tree, dyn, donated, key_impls=()) -> Program:
        """The :class:`Program` of the user's function over the dynamic leaves. Typed PRNG key
        leaves (``key_impls``: each dynamic leaf's key implementation or None; empty when
        there are none) come in as their key data and are wrapped again for the function;
        key outputs leave as key data (``Program.unflatten_out`` wraps them)."""
        consts = [None if d else (x.value if isinstance(x, _Frozen) else x)
                  for x, d in zip(leaves, dyn)]
        fun = self._fun
        out_trees: dict = {}
        warned = []

        def flat_fun(*xs):
            sig = signature_of([jax.typeof(x) for x in xs])
            if key_impls:
                xs = [jax.random.wrap_key_data(x, impl=i) if i else x
                      for x, i in zip(xs, key_impls)]
            it = iter(xs)
            full = [next(it) if d else c for c, d in zip(consts, dyn)]
            args, kwargs = tree_util.tree_unflatten(in_tree, full)
            flat, tree = tree_util.tree_flatten(fun(*args, **kwargs))
            if not warned:
                _warn_argument_updates(self._name, in_tree, full, dyn, args, kwargs, warned)
            out_impls = _key_impls(flat)
            if out_impls:
                flat = [jax.random.key_data(x) if i else x for x, i in zip(flat, out_impls)]
            out_trees[sig] = (tree, out_impls)
            return tuple(flat)

        program = Program(flat_fun, self._opts, name=self._name, donated=donated)
        program.out_trees = out_trees
        return program

    # -- calling -----------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if jax.config.jax_disable_jit:
            # as jax.jit under jax.disable_jit(): the function runs op by op on concrete
            # values (a user debugging with print / breakpoints sees arrays, not tracers)
            return self._fun(*args, **kwargs)
        if self._freeze:
            args = self._wrap_frozen(args)
        _CALL.args = (args, kwargs)  # read only when this call traces (argument shardings)
        _CALL.tier = True
        try:
            if self._memory_limit is not None:
                self._plan_memory(args, kwargs)
            if self._fast:
                fn = self._fast_fn
                # a decided variant is for top-level calls: under a transformation (tracers)
                # hlofuse's program runs, as in _tuned_call (and options can't nest)
                if fn is None or not _top_level():
                    fn = self._jit
                out = fn(*args, **kwargs)
                if not self._fast:  # this call traced a new signature: its first call for tuning
                    self._tuned_call(args, kwargs, out)
                return out
            return self._tuned_call(args, kwargs)
        except _Tier:
            return self._tier_call(args, kwargs)
        finally:
            _leave_call()

    # -- tiered first call -------------------------------------------------------------------
    def _plain_jit(self):
        if self._plain is None:
            with self._lock:
                if self._plain is None:
                    self._plain = jax.jit(self._traced_fn(plain=True), **self._jit_kwargs)
        return self._plain

    def _tier_call(self, args, kwargs):
        """The call whose trace raised :class:`_Tier`: run XLA's code for it, then start
        building hlofuse's executable for its signature in the background."""
        key = self._call_key(args, kwargs)
        if key is None:  # cannot be tracked per signature: build in place
            return self._jit(*args, **kwargs)
        # jax's C++ dispatch marked this signature's entry of self._jit "fall back to Python"
        # when _Tier left its trace (any exception out of a cache miss does): every later call
        # of it would take the Python path (~0.1 ms per call). Drop this function's C++
        # entries (only those: the traces and executables stay cached); the next call of each
        # signature fills its entry again (``_clear_cache``: the C++ half of jit's clear_cache)
        clear = getattr(self._jit, "_clear_cache", None)
        if clear is not None:
            clear()
        specs = self._specs(args, kwargs)   # before the call: it may donate the arguments
        if specs is None:
            return self._jit(*args, **kwargs)
        with self._lock:
            st = self._tuning.setdefault(key, _Tuning())
            self._fast = False
            start = st.tier is None
            if start:
                st.tier, st.calls, st.tier_started = "building", 0, time.perf_counter()
        try:
            out = self._plain_jit()(*args, **kwargs)
        except BaseException:
            if start:   # nothing to wait for: the next call tries again
                st.tier = None
            raise
        if start:
            t = threading.Thread(target=self._tier_build, args=(st, *specs, [out]),
                                 name=f"hlofuse-build-{self._name}")
            st.tier_thread = t
            t.start()
        return out

    def _specs(self, args, kwargs):
        """``(args, kwargs)`` with every dynamic leaf replaced by its ``ShapeDtypeStruct``
        (weak type kept; the sharding of committed arrays, so the background lowering is the
        one a call makes), static and frozen arguments as they are. None when a leaf has no
        such spec."""
        statics = self._static_positions(len(args))

        def spec(x):
            a = jax.typeof(x)
            sharding = x.sharding if getattr(x, "_committed", False) else None
            return jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type,
                                        sharding=sharding)
        try:
            sargs = tuple(a if i in statics else tree_util.tree_map(spec, a)
                          for i, a in enumerate(args))
            skw = {k: v if k in self._static_names else tree_util.tree_map(spec, v)
                   for k, v in kwargs.items()}
        except Exception:  # noqa: BLE001 - an unusual leaf: no background build
            return None
        return sargs, skw

    def _tier_build(self, st: _Tuning, args, kwargs, first_out: list):
        """Background thread: lower and compile hlofuse's executable for the signature of
        ``args`` (shape/dtype specs), as the call path would, so later calls find it in
        jax's caches. Then the first sight of autotune (the XLA-code call was call 1).
        ``first_out``: the first call's outputs; the build starts when they are computed, so
        it does not take CPU from that first run."""
        _CALL.args, _CALL.tier = (args, kwargs), False
        try:
            jax.block_until_ready(first_out.pop())
        except Exception:  # noqa: BLE001 - e.g. already donated to a later call: computed
            pass
        try:
            with trace("tiered build", function=self._name):
                self._jit.lower(*args, **kwargs).compile()
            with self._lock:
                st.tier, st.calls = "ready", 1
                st.tier_s = time.perf_counter() - st.tier_started
                try:
                    _, entry = self._entry_of(args, kwargs)
                except Exception:  # noqa: BLE001 - the note is all this is for
                    entry = None
                if entry is not None:
                    entry.report.note(
                        f"tiered first call: the first call ran XLA's code for the function "
                        f"while hlofuse optimized and compiled this module in the background; "
                        f"calls run it since {st.tier_s:.2f}s after the first call started "
                        f"(tiered=False or HLOFUSE_TIERED=0 builds it during the first call)")
                try:
                    self._first_sight(st, args, kwargs)
                except Exception as e:  # noqa: BLE001 - tuning never breaks a call
                    log.debug("hlofuse: autotune skipped for %s: %s", self._name, e)
                    st.calls = 0   # the next call is its first sight
                self._maybe_fast()
            log.log(logging.INFO if st.tier_s >= at.LOG_AFTER_S else logging.DEBUG,
                    "%s optimized in the background in %.2f s", self._name, st.tier_s)
        except BaseException as e:  # noqa: BLE001 - the calls keep XLA's code; say why
            note = machinery_failed("background build", e, self._name,
                                    "calls of this signature run XLA's code for the function")
            with self._lock:
                st.tier, st.tier_error = "failed", f"{type(e).__name__}: {e}"
                st.tier_s = time.perf_counter() - st.tier_started
                st.decision = at.Decision("default", {}, {}, reason=note)
                st.fn = self._plain_jit()
        finally:
            _leave_call()

    def block_until_optimized(self, timeout: float | None = None) -> bool:
        """Wait until every signature's hlofuse executable built in the background (tiered
        first calls) is ready. True when none is pending (``timeout`` seconds at most)."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        for st in list(self._tuning.values()):
            t = st.tier_thread
            if t is not None:
                t.join(None if deadline is None else max(0.0, deadline - time.perf_counter()))
        return not any(st.tier == "building" for st in list(self._tuning.values()))

    def tier_status(self, *args, **kwargs) -> dict:
        """For these arguments' signature: ``{'state': ..., 'seconds': ..., 'error': ...}``.
        state: None (not tiered: built in place, or never called), 'building' (calls run XLA's
        code), 'ready' (hlofuse's code runs; seconds: from the first call's start until it was
        ready) or 'failed' (XLA's code for good; error says why)."""
        st = self._tuning.get(self._call_key(self._wrap_frozen(args), kwargs))
        if st is None:
            return {"state": None, "seconds": None, "error": None}
        return {"state": st.tier, "seconds": st.tier_s, "error": st.tier_error}

    def _plan_memory(self, args, kwargs) -> None:
        """``memory_limit``: before a signature's first call, compile hlofuse's program and
        XLA's own module for it, and run the one with the fewest flops that fits
        (:func:`hlofuse.runtime.memory.choose`; raises :class:`hlofuse.runtime.memory.MemoryLimitError` when
        none does). Top-level calls only (under a transformation the outer program decides)."""
        key = self._call_key(args, kwargs)
        if key is None:
            return
        st = self._tuning.get(key)
        if st is not None and st.memory is not None:
            return
        with self._lock:
            st = self._tuning.setdefault(key, _Tuning())
            if st.memory is not None:
                return
            specs = self._specs(args, kwargs)   # compiling must not consume donated arguments
            if specs is None:
                return
            sargs, skw = specs
            tier, _CALL.tier = _CALL.tier, False
            try:
                lowered = self.lower(*sargs, **skw)
                plans = {"hlofuse's program": memory.figures(lowered.compile()),
                         "XLA's own module": memory.figures(
                             self._plain_jit().lower(*sargs, **skw).compile())}
            finally:
                _CALL.tier = tier
            entry = lowered._entry
            target = entry.target if entry is not None else Target.of(None)
            limit = memory.resolve_limit(self._memory_limit, target, jax.devices()[0])
            pick, note = memory.choose(
                plans, limit, name=self._name,
                module=entry.optimized.module if entry is not None else None)
            st.memory = note
            st.plain_over_limit = plans["XLA's own module"].peak > limit
            if entry is not None:
                entry.report.note(note)
            if pick == "XLA's own module" and entry is not None:
                self._decide(st, at.Decision(at.XLA_MODULE, {}, {}, reason=note),
                             cached=False, record=False)

    def _tuned_call(self, args, kwargs, done=None):
        """A call while some signature's options are undecided or not XLA's defaults.
        ``done``: the output when the fast path already ran this (first) call."""
        key = self._call_key(args, kwargs)
        if key is None:  # under a transformation (tracers), or unhashable: the plain jit
            return done if done is not None else self._jit(*args, **kwargs)
        st = self._tuning.get(key)
        if st is None:
            with self._lock:
                st = self._tuning.setdefault(key, _Tuning())
        if st.tier == "building":   # hlofuse's executable is still being built
            return done if done is not None else self._plain_jit()(*args, **kwargs)
        if done is not None:  # already ran (a retrace after jax evicted it, or a new one)
            with self._lock:
                st.calls += 1
                if st.calls == 1:
                    self._guarded(st, "tuning (first sight)", self._first_sight, st, args, kwargs)
            return done
        if st.decision is not None:
            self._maybe_fast()
            return (st.fn or self._jit)(*args, **kwargs)
        with self._lock:
            st.calls += 1
            if st.calls == 1:
                out = self._jit(*args, **kwargs)
                self._guarded(st, "tuning (first sight)", self._first_sight, st, args, kwargs)
                return out
            if st.decision is None and st.calls >= at.TUNE_AT_CALL:
                ok, out = self._guarded(st, "tuning", self._tune, st, args, kwargs)
                if ok:
                    return out
        return (st.fn or self._jit)(*args, **kwargs)

    def _guarded(self, st: _Tuning, where: str, step, *a) -> tuple[bool, object]:
        """The boundary of tuning and measured decisions: ``(True, step(*a))``, or, when the
        step raised, ``(False, None)`` with this signature decided for XLA's own program (what
        ``jax.jit`` runs) in this process only, the failure in its report, warned and logged
        once (:func:`hlofuse.runtime.program.machinery_failed`). Tuning is an optimization: it never
        fails the call it was tuning. ``options={'strict': True}`` raises instead."""
        try:
            return True, step(*a)
        except Exception as e:
            if self._opts.pass_options.get("strict"):
                raise
            note = machinery_failed(where, e, self._name,
                                    "this signature runs XLA's program (jax.jit's) in this process")
            self._decide(st, at.Decision(at.XLA_MODULE, {}, {}, reason=note), cached=False,
                         record=False)
            entry = st.entry
            if entry is None:
                try:
                    _, entry = self._entry_of(*a[1:])
                except Exception:  # noqa: BLE001 - no report to write it to: warned and logged
                    entry = None
            if entry is not None:
                entry.report.note(note)
            return False, None

    def _call_key(self, args, kwargs):
        """What selects an executable: static arguments by value, dynamic leaves by type,
        shape and dtype. None under a transformation (tracers) or when a static one is
        unhashable."""
        if not _top_level():
            return None
        statics = self._static_positions(len(args))
        parts = []
        for i, a in enumerate(args):
            parts.append(("s", a) if i in statics else self._leaf_keys(a))
        for k in sorted(kwargs):
            v = kwargs[k]
            parts.append((k, ("s", v) if k in self._static_names else self._leaf_keys(v)))
        key = tuple(parts)
        try:
            hash(key)
        except TypeError:
            return None
        return key

    @staticmethod
    def _leaf_keys(a):
        # runs on every call of a tuned signature: the dtype object itself (hashable, equal
        # for equal dtypes), not str(dtype) (~5 us each: 0.13 ms per call of a BERT layer)
        leaves, tree = tree_util.tree_flatten(a)
        return (tree, tuple((type(x), tuple(np.shape(x)), getattr(x, "dtype", None),
                             bool(getattr(x, "weak_type", False)))
                            if hasattr(x, "shape") else type(x) for x in leaves))

    def _maybe_fast(self):
        """Calls take the fast path (one jit object, no per-call signature key: ~30 us for a
        BERT layer's 18 arguments) when every signature is decided and all run the same jit
        object: ``self._jit``, or e.g. XLA's own module for a single decided signature. A new
        signature traced there clears ``_fast`` (in :meth:`_traced`), and its call is then
        handed to :meth:`_tuned_call` as a first call."""
        sts = list(self._tuning.values())
        if not all(s.decision is not None and s.tier != "building" for s in sts):
            return
        fns = {id(s.fn or self._jit): s.fn for s in sts}
        if len(fns) <= 1:
            self._fast_fn = next(iter(fns.values()), None)
            self._fast = True

    def _entry_of(self, args, kwargs, platform=None):
        """(jax Traced, hlofuse Entry or None) for concrete arguments."""
        traced = self._jit.trace(*args, **kwargs)
        calls = find_calls(traced.jaxpr)
        if not calls:
            return traced, None
        program, sig = calls[0]
        platform = platform or jax.default_backend()
        return traced, program.entry(sig, program.target_for(platform))

    def _first_sight(self, st: _Tuning, args, kwargs):
        """After the first call of a signature: find its program and a cached decision."""
        mode = self._mode()
        try:
            traced, entry = self._entry_of(args, kwargs)
        except Exception as e:  # noqa: BLE001 - tuning never breaks a call
            log.debug("hlofuse: autotune skipped for %s: %s", self._name, e)
            traced, entry = None, None
        if entry is not None and mode != "off" and _not_timed(traced, entry):
            self._decide(st, at.Decision("default", {}, {}, reason=EFFECTS_NOT_TIMED),
                         cached=False, record=False)
            return
        # the optimized module's text, printed once for both (a first call pays for it)
        text = entry.optimized.text if entry is not None else None
        variants = self._candidates(entry, text) if entry is not None else {}
        if entry is None or len(variants) < 2 or mode == "off":
            self._decide(st, at.Decision("default", {}, {}, reason="nothing to tune"),
                         cached=False, record=False)
            return
        st.entry = entry
        st.key = self._decision_key(entry, text)
        cached = at.cache().get(st.key)
        if cached is not None:
            self._decide(st, cached, cached=True)
        elif mode == "cached":
            self._decide(st, at.Decision("default", {}, {}, reason="autotune=cached: no cached "
                                         "decision for this program"), cached=False)

    @staticmethod
    def _decision_key(entry, text: str | None = None) -> str:
        """Module decisions are keyed by the module as the passes made it (before cached
        region decisions changed it), so a later process finds them. ``text``: the optimized
        module's text when the caller has it."""
        opt = entry.optimized
        return at.cache_key(opt.base_hash or at.module_hash(text if text is not None else opt.text),
                            at.device_key())

    @staticmethod
    def _candidates(entry, text: str | None = None) -> dict:
        """What tuning times against the program as optimized: XLA-option variants, then one
        variant per distinct kernelized region with that region left to XLA."""
        opts = at.applicable_variants(jax.default_backend(),
                                      text if text is not None else entry.optimized.text)
        out = {"default": at.Variant()}
        # second: when the budget allows few variants, this comparison is the one kept
        out[at.XLA_MODULE] = at.Variant(plain=True)
        out.update((n, at.Variant.of(o)) for n, o in opts.items() if n != "default")
        # regions held back unmeasured (gpu/tpu) are timed too: from the module with every
        # kernel (``default`` is then that module; see _tune)
        out.update(at.region_variants(_measured_form(entry).report.kernels))
        return out

    def _region_info(self, entry, variants: dict) -> dict:
        """Features, hash and the learned cost model's prediction per region variant."""
        from hlofuse.passes.fusion import cost as cost_model
        from hlofuse.runtime.program import learned_for
        info = {}
        by_hash = {r.extra.get("region_hash"): r for r in _measured_form(entry).report.kernels}
        with cost_model.learned_model(entry.target.kind, learned_for(entry.target)):
            for n, v in variants.items():
                if not n.startswith(at.REGION_PREFIX):
                    continue
                (h,) = v.xla
                feats = at.record_of(by_hash[h], entry.target.kind)
                info[n] = {"hash": h, "features": feats,
                           "predicted": cost_model.predicted_ratio(feats, entry.target)}
        return info

    def _tune(self, st: _Tuning, args, kwargs, **tune_kw):
        """Second call of an undecided signature: measure the variants (compiler options and
        each region's kernel against XLA's code), then run the call."""
        variants = self._candidates(st.entry)
        regions = self._region_info(st.entry, variants)

        # with kernels held back unmeasured, every variant (``default`` too) starts from the
        # module with all kernels built, so each held-back kernel is timed against XLA's code
        full = st.entry.optimized.full is not None

        def make(spec):
            v = at.Variant.of(spec)
            return self._variant_jit(v.options_dict, donate=False, xla=v.xla, plain=v.plain,
                                     full=full and not v.plain)

        if tune_kw:  # offline tuning (HlofuseFunction.tune): the call itself is not needed
            d = at.tune(make, args, kwargs, variants, name=self._name, key=st.key,
                        regions=regions, **tune_kw)
            self._decide(st, d, cached=False)
            return None

        out = None
        if self._donating:
            d = at.tune(make, args, kwargs, variants, name=self._name, key=st.key,
                        regions=regions)
        else:  # this call runs anyway: time it warm, so a module too slow to tune costs nothing
            t0 = time.perf_counter()
            out = jax.block_until_ready(self._jit(*args, **kwargs))
            t = time.perf_counter() - t0
            if t < 10 * at.MIN_CALL_S:  # short: one preempted call must not decide alone
                for _ in range(2):
                    t0 = time.perf_counter()
                    jax.block_until_ready(self._jit(*args, **kwargs))
                    t = min(t, time.perf_counter() - t0)
            d = at.tune(make, args, kwargs, variants, name=self._name, key=st.key,
                        default_s=t, regions=regions)
        self._decide(st, d, cached=False)
        if out is None:
            out = (st.fn or self._jit)(*args, **kwargs)
        return out

    def _decide(self, st: _Tuning, d: at.Decision, *, cached: bool, record: bool = True):
        if d.xla_module and st.plain_over_limit:
            d = dataclasses.replace(d, variant="default", reason=(
                f"{d.reason}; not XLA's own module: {st.memory}"))
        if d.xla_module:   # hlofuse's program was not measurably faster than jax.jit's
            st.fn = self._variant_jit({}, donate=True, plain=True)
        else:
            options = at.options_of(d)
            xla, full = self._xla_to_apply(st.entry, d)
            if options or xla or full:
                st.fn = self._variant_jit(options, donate=True, xla=xla, full=full)
        st.decision = d
        st.cached = cached
        if record and st.entry is not None:
            report_decision(st.entry.report, d, cached)
        self._maybe_fast()

    @staticmethod
    def _xla_to_apply(entry, d: at.Decision) -> tuple[frozenset, bool]:
        """``(hashes, full)``: the regions that run as XLA's code under decision ``d``, and
        whether they are counted from the module with every kernel built (``full``: some
        kernel held back unmeasured was measured to win and runs). Without ``full``: the
        decision's XLA regions that still have a kernel in ``entry``'s module."""
        if entry is None or not d.regions:
            return frozenset(), False
        opt = entry.optimized
        present = {r.extra.get("region_hash") for r in _measured_form(entry).report.kernels}
        xla = frozenset(d.xla_regions & present)
        won = {h for h, c in d.regions.items() if c.get("choice") == "kernel"} & opt.unmeasured
        if not won:   # every held-back kernel stays held back: the module as built, minus xla
            return xla - opt.unmeasured, False
        return xla | (opt.unmeasured - won), True

    def _variant_jit(self, options: dict, donate: bool, xla: frozenset = frozenset(),
                     plain: bool = False, full: bool = False):
        """The ``jax.jit`` of this function with extra compiler ``options`` and the regions
        ``xla`` (hashes) run without their kernels (one object per variant, so the executables
        compiled while measuring are the ones calls reuse). ``donate=False``: without the
        donation (measurements must not consume arguments). ``plain``: XLA's own module for
        the function (what ``jax.jit`` runs; the tiered first call's executable)."""
        if not options and not xla and not full and (donate or not self._donating):
            return self._plain_jit() if plain else self._jit
        key = (tuple(sorted(options.items())), donate and self._donating,
               frozenset() if plain else frozenset(xla), plain, full and not plain)
        fn = self._variants.get(key)
        if fn is None:
            kw = dict(self._jit_kwargs)
            if not donate:
                kw.pop("donate_argnums", None)
                kw.pop("donate_argnames", None)
            if options:
                kw["compiler_options"] = dict(kw.get("compiler_options") or {}, **options)
            traced = self._traced_fn(plain=True) if plain else \
                self._traced_fn(frozenset(xla), full=full)
            fn = self._variants.setdefault(key, jax.jit(traced, **kw))
        return fn

    def _decided_options(self, entry) -> dict:
        for st in list(self._tuning.values()):
            if st.entry is entry and st.decision is not None:
                return at.options_of(st.decision)
        if self._mode() == "off":
            return {}
        d = at.cache().get(self._decision_key(entry))
        return at.options_of(d) if d is not None else {}

    # -- public ----------------------------------------------------------------------------
    def lower(self, *args, **kwargs) -> Lowered:
        """Trace and lower for the function's target (default: the current backend)."""
        args = self._wrap_frozen(args)
        platform = (self._target or Target.of(None)).platform
        _CALL.args = (args, kwargs)
        try:
            traced = self._jit.trace(*args, **kwargs)
        finally:
            _CALL.args = None
        lowered = lower_traced(traced, platform, self._name)
        calls = find_calls(traced.jaxpr)
        entry, report = None, None
        if calls:
            program, sig = calls[0]
            entry = program.entry(sig, program.target_for(platform))
            st = self._tuning.get(self._call_key(args, kwargs))
            xla, full = self._xla_to_apply(entry, st.decision) if st and st.decision \
                else (frozenset(), False)
            if xla or full:  # what calls run: regions measured slower as kernels are XLA's
                entry = program.with_xla(xla, full).entry(sig, program.target_for(platform))
                report_decision(entry.report, st.decision, st.cached)
        else:
            report = Report(target=(self._target or Target.of(None)).kind, source=self._name)
            report.note(TRACED_NOTE)
        return Lowered(self, lowered, entry, len(args), report)

    def trace(self, *args, **kwargs):
        """jax's ``Traced`` of the call (``.jaxpr`` shows the ``hlofuse_call``)."""
        return self._jit.trace(*self._wrap_frozen(args), **kwargs)

    def eval_shape(self, *args, **kwargs):
        return self._jit.eval_shape(*self._wrap_frozen(args), **kwargs)

    def report(self, *args, **kwargs):
        """The fusion report for these arguments' signature. Aliases and the memory plan are
        read back from XLA's compiled executable when it can be compiled here (the outer
        ``jax.jit``'s donation decides them, not the module's own annotations).

        Without arguments, for a function that needs some: the report of the last signature
        traced (a call, ``lower`` or a transformation)."""
        if not args and not kwargs and not self._binds_no_arguments():
            if self._last_sig is None:
                raise TypeError(
                    f"{self._name}.report() needs the arguments of a call (arrays, or "
                    f"jax.ShapeDtypeStruct for the dynamic ones): report(*args, **kwargs); "
                    f"without them it reports the last signature called, and {self._name} "
                    f"has not been called yet")
            in_tree, leaves = self._last_sig
            args, kwargs = tree_util.tree_unflatten(in_tree, leaves)
        lowered = self.lower(*args, **kwargs)
        rep = lowered.report
        if lowered._entry is not None and self._donating and (
                self._target is None or self._target.kind == Target.of(None).kind):
            try:
                aliases = lowered.compile().aliases()
            except Exception as e:  # noqa: BLE001 - the report stays the module's own plan
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
        args = self._wrap_frozen(args)
        key = self._call_key(args, kwargs)
        if key is None:
            raise TypeError("tune() needs concrete (non-tracer), hashable arguments")
        traced, entry = self._entry_of(args, kwargs)
        if entry is not None and _not_timed(traced, entry):
            return None
        jax.block_until_ready(self._jit(*args, **kwargs))
        variants = self._candidates(entry) if entry is not None else {}
        if entry is None or len(variants) < 2:
            return None
        with self._lock:
            st = self._tuning.setdefault(key, _Tuning())
            st.calls = max(st.calls, 1)
            st.entry, st.key, st.decision, st.fn = entry, self._decision_key(entry), None, None
            self._fast = False
            self._tune(st, args, kwargs, budget_s=at.budget() if budget_s is None else budget_s,
                       min_call_s=0.0)
        return st.decision

    def autotune_decision(self, *args, **kwargs):
        """The compiler-option decision (:class:`hlofuse.runtime.autotune.Decision`) for these
        arguments' signature, or None while undecided / when autotuning is off."""
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
        out, todo = [], list(self._programs.values())
        while todo:
            p = todo.pop()
            out.append(p)
            todo.extend(list(p.derived.values()))
        return out

    def programs(self) -> list[Program]:
        return list(self._programs.values())

    def clear_cache(self):
        self._jit.clear_cache()
        if self._plain is not None:
            self._plain.clear_cache()
        with self._lock:
            self._programs.clear()
            self._tuning.clear()
            self._variants.clear()
            self._fast, self._fast_fn = True, None

    def __repr__(self):
        return (f"<hlofuse.jit {getattr(self._fun, '__qualname__', self._fun)} "
                f"target={self._target.kind if self._target else 'auto'}>")

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return functools.partial(self, obj)


def _inner_mesh(jaxpr):
    """The concrete mesh of a ``shard_map`` anywhere in ``jaxpr`` (sub-jaxprs included)."""
    todo = [getattr(jaxpr, "jaxpr", jaxpr)]
    while todo:
        j = todo.pop()
        for e in j.eqns:
            m = e.params.get("mesh")
            if isinstance(m, jax.sharding.Mesh) and m.size > 1:
                return m
            for v in e.params.values():
                for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                    if compat.is_jaxpr(sub):
                        todo.append(getattr(sub, "jaxpr", sub))
    return None


def _on_inner_mesh(program, xs: list) -> list:
    """A function whose body holds a ``shard_map`` over a concrete mesh runs on that mesh's
    devices. ``jax.jit`` learns them from the shard_map in its jaxpr; the outer ``jax.jit`` of
    ``hlofuse.jit`` only sees ``hlofuse_call``, so the inputs are placed on the mesh
    (replicated: the shard_map slices them locally, no collective) to tell it."""
    try:
        mesh = _inner_mesh(program.jaxpr(signature_of([jax.typeof(x) for x in xs])))
    except Exception:  # noqa: BLE001 - tracing errors surface in call() itself
        return xs
    if mesh is None:
        return xs
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return [jax.lax.with_sharding_constraint(x, rep) for x in xs]


#: why a function with side effects is never measured (its report says so)
EFFECTS_NOT_TIMED = (
    "autotune: not measured: the function has side effects (jax.debug.print, "
    "jax.debug.callback, io_callback) that timing its variants would run again")


def _not_timed(traced, entry) -> bool:
    """Whether autotune must not time this function: running it has side effects (host
    callbacks other than ``pure_callback``, which jax may run any number of times). Its report
    says so."""
    if not traced.jaxpr.effects:
        return False
    entry.report.note(EFFECTS_NOT_TIMED)
    return True


def _measured_form(entry):
    """The optimized module tuning measures: with every kernel built (``Optimized.full``)
    where unmeasured ones are held back, else the module as built."""
    return entry.optimized.full or entry.optimized


def report_decision(report, d: at.Decision, cached: bool) -> None:
    """Put a measured decision into a report: the options note, and per region the outcome
    with the measured kernel/XLA ratio (and the cost model's prediction) in
    ``region.extra['measured']``. (The report of what runs, ``f.report(...)``, is the decided
    variant's: there the regions kept as XLA's code say so as their reason.)"""
    report.note(d.note(cached))
    for r in report.regions:
        c = d.regions.get(r.extra.get("region_hash"))
        if c is None:
            continue
        text = c.get("reason", "") + (" (cached decision)" if cached else "")
        r.extra["measured"] = text
        if c.get("choice") == "xla" and not r.kernel and "merged_into" not in r.extra:
            r.reason = text


def _report_compiled_aliases(report, entry, aliases: dict[int, int]) -> None:
    """Replace the report's aliases and memory plan with what the executable does."""
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
    if [(r["output"], r["argument"]) for r in report.aliases
            if r.get("source") != "compiled executable"] not in ([], sorted(aliases.items())):
        claimed = ", ".join(f"output {r['output']} <- argument {r['argument']}"
                            for r in report.aliases) or "none"
        report.note(f"buffer-aliasing: the compiled executable aliases "
                    f"{', '.join(f'output {j} <- argument {i}' for j, i in sorted(aliases.items())) or 'nothing'}"
                    f" (the module asked for {claimed}; the outer jax.jit's donation decides)")
    report.notes[:] = [n for n in report.notes
                       if not re.match(r"buffer-aliasing: output \d+ aliases ", n)]
    for r in rows:
        report.note(f"buffer-aliasing: output {r['output']} aliases argument {r['argument']} "
                    f"({r['bytes']} bytes; read back from the compiled executable)")
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
