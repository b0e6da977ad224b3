"""The first part of a call: its arguments, as plain data.

:class:`CallSignature` knows, for one ``hlofuse.jit`` function, which arguments are static,
frozen and donated, and turns a call's arguments into what selects an executable: the call key
(statics by value, dynamic leaves by type, shape and dtype), the trace key (tree, donation,
shardings, typed PRNG keys, the mesh in context) and shape specs for building ahead of a call.

:class:`CallInfo` is what one call hands to the trace of the inner ``jax.jit``: its concrete
arguments (for argument shardings), whether it may start a tiered build, and whether the trace
is XLA's own module. It travels as the inner ``jax.jit``'s static argument 0, so the trace
receives it as an argument: no thread-local state, no exception through JAX's tracing. Every
:class:`CallInfo` compares equal to every other of the same ``plain``-ness, so it never splits
jax's caches; a trace that ran XLA's code for a tiered first call marks its own info ``plain``,
so later hlofuse calls of that signature miss that entry and trace hlofuse's program.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable

import numpy as np

import jax
from jax import tree_util

from hlofuse.core import compat
from hlofuse.runtime import module_cache
from hlofuse.runtime.program import typed_shardings

__all__ = ["CallInfo", "CallSignature", "TraceKey", "Frozen"]

#: the inner jax.jit's first parameter (static): the call's :class:`CallInfo`
INFO_PARAM = "__hlofuse_call__"


def norm_tuple(x) -> tuple:
    if x is None:
        return ()
    if isinstance(x, (int, str)):
        return (x,)
    return tuple(x)


class Frozen:
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
        return isinstance(other, Frozen) and self._key == other._key


class CallInfo:
    """One call's data for the trace of the inner ``jax.jit`` (its static argument 0).

    In: ``args`` (the concrete ``(args, kwargs)`` of the call, or shape specs, or None),
    ``may_tier`` (a top-level call: its trace may run XLA's code and leave the build to the
    background), ``plain`` (trace XLA's own module). Out, set by the trace: ``traced`` (a new
    signature was traced), ``tier`` (the trace chose a tiered first call: ``(call key, (args,
    kwargs) as shape specs)``).
    """

    __slots__ = ("args", "may_tier", "plain", "traced", "tier", "_xla_cache")

    def __init__(self, args=None, may_tier: bool = False, plain: bool = False):
        self.args = args
        self.may_tier = may_tier
        self.plain = plain
        self.traced = False
        self.tier = None
        self._xla_cache = None

    def __hash__(self):
        return 0x5EED

    def __eq__(self, other):
        return isinstance(other, CallInfo) and other.plain == self.plain

    def concrete(self):
        """The call's ``(args, kwargs)`` when they are concrete (no tracer), else None."""
        if self.args is None or self.args[0] is None or any(
                isinstance(x, compat.Tracer) for x in tree_util.tree_leaves(self.args)):
            return None
        return self.args

    def cache_every_compile(self) -> None:
        """This call compiles a new signature next: a second process finds it in jax's cache
        however short it was (left in :meth:`leave`)."""
        if self._xla_cache is None and self.args is not None:
            ctx = module_cache.cache_every_compile()
            if ctx is not None:
                ctx.__enter__()
                self._xla_cache = ctx

    def leave(self) -> None:
        """The call is over: drop its arguments (jax's caches keep this object as a key) and
        leave the compilation-cache context its trace entered."""
        self.args = None
        if self._xla_cache is not None:
            ctx, self._xla_cache = self._xla_cache, None
            ctx.__exit__(None, None, None)


def static_key(leaf):
    """Cache key of a static leaf: by value when hashable (like jax.jit), else by identity."""
    if isinstance(leaf, Frozen):
        return leaf
    try:
        hash(leaf)
    except TypeError:
        return ("id", id(leaf))
    return (type(leaf), leaf)


def is_key(dtype) -> bool:
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)


def key_impls(xs) -> tuple:
    """Each value's PRNG key implementation (``jax.random.key`` arrays: an extended dtype,
    which StableHLO carries as uint32 key data), or None; ``()`` when none is a key."""
    impls = tuple(jax.random.key_impl(x) if is_key(getattr(x, "dtype", None)) else None
                  for x in xs)
    return impls if any(i is not None for i in impls) else ()


def _typed_shardings(leaves, dyn) -> list | None:
    """:func:`hlofuse.runtime.program.typed_shardings` of the dynamic leaves (tracers); None
    for the static ones."""
    typed = typed_shardings([jax.typeof(x) for x, d in zip(leaves, dyn) if d])
    if typed is None:
        return None
    it = iter(typed)
    return [next(it) if d else None for d in dyn]


@dataclasses.dataclass(frozen=True)
class TraceKey:
    """What one trace of the inner ``jax.jit`` is, as data: the flat leaves, which are
    dynamic, the statics' keys, donated and sharded dynamic leaves, typed PRNG keys, and the
    mesh in context (a program per mesh, as jax.jit caches, when no sharding is known)."""
    leaves: list
    in_tree: Any
    dyn: tuple
    static: tuple
    donated: tuple
    shardings: tuple | None
    key_impls: tuple
    ctx_mesh: Any
    context: tuple = ()     # jax's tracing configuration (a program per configuration)

    @property
    def key(self) -> tuple:
        return (self.in_tree, self.dyn, self.static, self.donated, self.shardings,
                self.key_impls, self.ctx_mesh, self.context)

    @property
    def dynamic(self) -> list:
        return [x for x, d in zip(self.leaves, self.dyn) if d]


class CallSignature:
    """The arguments of one ``hlofuse.jit`` function: static, frozen and donated ones, and the
    keyword arguments of its inner ``jax.jit``."""

    def __init__(self, fun: Callable, name: str, freeze_argnums, jit_kwargs: dict):
        self.name = name
        self.freeze = norm_tuple(freeze_argnums)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in self.freeze):
            raise TypeError(f"freeze_argnums={freeze_argnums!r}: expected an int or a sequence "
                            f"of ints (argument positions)")
        static_argnums = norm_tuple(jit_kwargs.pop("static_argnums", None))
        static_argnames = norm_tuple(jit_kwargs.pop("static_argnames", None))
        try:
            sig = compat.fun_signature(fun)
        except (TypeError, ValueError):  # builtins etc.
            sig = None
        self._check_argnums(sig, static_argnums, norm_tuple(jit_kwargs.get("donate_argnums")))
        self.user_static = (static_argnums, static_argnames)
        if sig is not None:
            # () as None: jax infers the missing one only when the other is None
            nums, names = compat.infer_argnums_and_argnames(sig, static_argnums or None,
                                                               static_argnames or None)
        else:
            nums, names = static_argnums, static_argnames
        self.static_nums, self.static_names = tuple(nums), tuple(names)
        self.donate_nums, self.donate_names = self._donation(sig, jit_kwargs)
        self.donating = bool(self.donate_nums or self.donate_names)
        self.sig = sig
        # both inferred from the signature: jax.jit infers neither when it is given both, and
        # a static_argnames argument passed by position would be traced. Positions shift by
        # one: argument 0 of the inner jax.jit is the call's CallInfo (negative ones count
        # from the end and stay)
        shift = lambda ns: tuple(i + 1 if i >= 0 else i for i in ns)  # noqa: E731
        self.jit_kwargs = dict(jit_kwargs, static_argnums=(0,) + shift(self.static_nums +
                                                                        self.freeze),
                               static_argnames=self.static_names)
        if "donate_argnums" in jit_kwargs:
            self.jit_kwargs["donate_argnums"] = shift(norm_tuple(jit_kwargs["donate_argnums"]))

    def _check_argnums(self, sig, static_argnums: tuple, donate_argnums: tuple) -> None:
        """What jax.jit would not say in hlofuse's terms (frozen arguments are static ones of
        the inner jax.jit)."""
        if set(static_argnums) & set(donate_argnums):
            raise ValueError(f"static arguments cannot be donated: "
                             f"{sorted(set(static_argnums) & set(donate_argnums))}")
        params = list(sig.parameters.values()) if sig is not None else []
        if sig is not None and not any(p.kind is p.VAR_POSITIONAL for p in params):
            # jax.jit's own message, in the user's positions: the inner jax.jit's are shifted by
            # hlofuse's CallInfo argument and named (0, 4) for the user's (3,)
            n = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
            for what, nums in (("static_argnums", static_argnums), ("donate_argnums", donate_argnums)):
                if any(not -n <= i < n for i in nums):
                    raise ValueError(f"Jitted function has {what}={tuple(nums)}, but only accepts "
                                     f"{n} positional arguments.")
        if not self.freeze:
            return
        clash = set(self.freeze) & (set(static_argnums) | set(donate_argnums))
        if clash:
            raise ValueError(f"frozen arguments cannot also be static or donated: "
                             f"{sorted(clash)}")
        if sig is not None:
            params = list(sig.parameters.values())
            if not any(p.kind is p.VAR_POSITIONAL for p in params):
                n = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
                bad = [i for i in self.freeze if not -n <= i < n]
                if bad:
                    raise ValueError(f"freeze_argnums={self.freeze}: {self.name} takes only "
                                     f"{n} positional argument(s)")

    @staticmethod
    def _donation(sig, kw) -> tuple[tuple, tuple]:
        nums = norm_tuple(kw.get("donate_argnums"))
        names = norm_tuple(kw.get("donate_argnames"))
        if sig is not None and (nums or names):
            try:
                nums, names = compat.infer_argnums_and_argnames(sig, nums or None,
                                                                   names or None)
            except (TypeError, ValueError):  # jax.jit reports bad donation itself
                pass
        return tuple(nums), tuple(names)

    def traced_signature(self, fun: Callable):
        """The signature jax.jit reads for the inner traced function: the user's, after one
        positional-only parameter for the :class:`CallInfo`. None without a signature."""
        if self.sig is None:
            return None
        info = inspect.Parameter(INFO_PARAM, inspect.Parameter.POSITIONAL_ONLY)
        return self.sig.replace(parameters=[info, *self.sig.parameters.values()])

    # -- per call ---------------------------------------------------------------------------
    def static_positions(self, n: int) -> set:
        return {i + n if i < 0 else i for i in self.static_nums + self.freeze}

    def wrap_frozen(self, args: tuple) -> tuple:
        if not self.freeze:
            return args
        n = len(args)
        pos = {i + n if i < 0 else i for i in self.freeze}
        bad = [i for i in self.freeze if not -n <= i < n]
        if bad:
            raise ValueError(f"{self.name} has freeze_argnums={self.freeze}, but was called "
                             f"with {n} positional arguments")
        return tuple(Frozen(a) if i in pos and not isinstance(a, Frozen) else a
                     for i, a in enumerate(args))

    def call_key(self, args, kwargs, *, top_level: bool = True):
        """What selects an executable: static arguments by value, dynamic leaves by type,
        shape and dtype, and jax's tracing configuration (``jax_enable_x64``, the PRNG
        implementation, default matmul precision...: what ``jax.jit`` keys its own caches on;
        without it a signature kept the executable of the configuration it first ran under).
        None under a transformation (tracers; ``top_level=False``: the caller knows the
        arguments are concrete) or when a static one is unhashable."""
        if top_level and not compat.at_top_level():
            return None
        statics = self.static_positions(len(args))
        parts = []
        for i, a in enumerate(args):
            parts.append(("s", a) if i in statics else self.leaf_keys(a))
        for k in sorted(kwargs):
            v = kwargs[k]
            parts.append((k, ("s", v) if k in self.static_names else self.leaf_keys(v)))
        parts.append(compat.trace_context())
        key = tuple(parts)
        try:
            hash(key)
        except TypeError:
            return None
        return key

    @staticmethod
    def leaf_keys(a):
        # runs on every call of a tuned signature: the dtype object itself (hashable, equal
        # for equal dtypes), not str(dtype) (~5 us each: 0.13 ms per call of a BERT layer)
        leaves, tree = tree_util.tree_flatten(a)
        return (tree, tuple((type(x), tuple(np.shape(x)), getattr(x, "dtype", None),
                             bool(getattr(x, "weak_type", False)))
                            if hasattr(x, "shape") else type(x) for x in leaves))

    def specs(self, args, kwargs):
        """``(args, kwargs)`` with every dynamic leaf replaced by its ``ShapeDtypeStruct``
        (weak type kept; the sharding of committed arrays, so a background lowering is the
        one a call makes), static and frozen arguments as they are. None when a leaf has no
        such spec."""
        statics = self.static_positions(len(args))

        def spec(x):
            a = jax.typeof(x)
            sharding = x.sharding if getattr(x, "_committed", False) else None
            return jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type,
                                        sharding=sharding)
        try:
            sargs = tuple(a if i in statics else tree_util.tree_map(spec, a)
                          for i, a in enumerate(args))
            skw = {k: v if k in self.static_names else tree_util.tree_map(spec, v)
                   for k, v in kwargs.items()}
        except (TypeError, AttributeError, ValueError):  # an unusual leaf: no spec
            return None
        return sargs, skw

    # -- per trace ----------------------------------------------------------------------------
    def trace_key(self, args, kwargs, info: CallInfo, context_mesh: Callable) -> TraceKey:
        """The :class:`TraceKey` of a trace of the inner ``jax.jit`` (``args`` hold tracers
        for the dynamic leaves); ``info``: the call's data (argument shardings)."""
        leaves, in_tree = tree_util.tree_flatten((args, kwargs))
        dyn = tuple(isinstance(x, compat.Tracer) for x in leaves)
        shardings = self.leaf_shardings(args, kwargs, dyn, info)
        return TraceKey(
            leaves=leaves, in_tree=in_tree, dyn=dyn,
            static=tuple(static_key(x) for x, d in zip(leaves, dyn) if not d),
            donated=self.donated_leaves(args, kwargs, dyn), shardings=shardings,
            key_impls=key_impls([x for x, d in zip(leaves, dyn) if d]),
            # without known shardings the trace may still read the caller's mesh (a bare
            # PartitionSpec constraint): a program per mesh in context, as jax.jit caches
            ctx_mesh=None if shardings is not None else context_mesh(),
            context=compat.trace_context())

    def donated_leaves(self, args, kwargs, dyn) -> tuple:
        if not self.donating:
            return ()
        n = len(args)
        nums = {i + n if i < 0 else i for i in self.donate_nums}
        flags = []
        for i, a in enumerate(args):
            flags += [i in nums] * len(tree_util.tree_leaves(a))
        for k in sorted(kwargs):  # tree_flatten orders dict keys sorted
            flags += [k in self.donate_names] * len(tree_util.tree_leaves(kwargs[k]))
        dyn_index = [j for j, d in enumerate(dyn) if d]
        return tuple(k for k, j in enumerate(dyn_index) if j < len(flags) and flags[j])

    def leaf_shardings(self, args, kwargs, dyn, info: CallInfo) -> tuple | None:
        """The ``NamedSharding`` of every dynamic leaf of this call, when all are known and on
        one mesh of several devices: from ``in_shardings=``, else from the concrete arguments
        of the call being traced (committed sharded arrays). None otherwise (then kernels are
        built for the whole arrays; see :func:`hlofuse.runtime.program.export_optimized`)."""
        spec = self.jit_kwargs.get("in_shardings")
        concrete = info.concrete()
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
            elif concrete is not None:
                leaves = tree_util.tree_leaves(concrete)
                per = [getattr(x, "sharding", None) for x in leaves]
                loose = [not isinstance(x, jax.Array) or not x.committed for x in leaves]
            else:
                # under an outer jax.jit / grad: on an Explicit mesh the shardings are the
                # tracers' types (on the mesh jax.set_mesh put in context)
                per = _typed_shardings(tree_util.tree_leaves((args, kwargs)), dyn)
                if per is None:
                    return None
        except (TypeError, ValueError):  # an odd prefix: jax.jit reports it itself
            return None
        if len(per) != len(dyn):
            return None
        if concrete is not None and spec is None:
            # a Python number, a numpy array or an uncommitted array (optax's step count)
            # beside mesh arrays: jax.jit replicates it over their mesh, and so do we (one
            # such leaf turned every per-shard kernel of a training step off)
            named = [p for p, lo in zip(per, loose)
                     if not lo and isinstance(p, jax.sharding.NamedSharding)]
            if named and all(p.mesh == named[0].mesh for p in named):
                rep = jax.sharding.NamedSharding(named[0].mesh, jax.sharding.PartitionSpec())
                per = [rep if lo and not isinstance(p, jax.sharding.NamedSharding) else p
                       for p, lo in zip(per, loose)]
        out = [p for p, d in zip(per, dyn) if d]
        if not out or not all(isinstance(p, jax.sharding.NamedSharding) for p in out):
            return None
        mesh = out[0].mesh
        if (mesh.size <= 1 or any(p.mesh != mesh for p in out)
                or any(t == jax.sharding.AxisType.Manual for t in mesh.axis_types)):
            return None
        return tuple(out)
