"""``hlofuse.filter_jit``: :func:`hlofuse.jit` with Equinox's ``filter_jit`` calling convention.

Equinox models are pytrees whose leaves mix arrays with functions (``activation=jax.nn.relu``),
strings and numbers. ``jax.jit`` (and so ``hlofuse.jit``) traces every leaf and rejects those
("not a valid JAX type"); Equinox users write ``@eqx.filter_jit`` instead. ``filter_jit``
gives them the same drop-in: every JAX or NumPy array leaf of the arguments is traced, every
other leaf (Python numbers included, as in Equinox) is a compile-time constant, and the outputs
may hold non-array leaves too. It needs no Equinox: the split is over ``jax.tree_util`` leaves.

A new value of a static leaf compiles again (a Python ``int`` step counter passed in would
compile per step: pass it as an array). Static leaves must be hashable; an unhashable one is an
error that names its path.
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any, Callable

import numpy as np

import jax
from jax import tree_util

from hlofuse.frontend.jit import Wrapper, jit
from hlofuse.frontend.tracing import arg_path

log = logging.getLogger("hlofuse.frontend.filter")

__all__ = ["filter_jit", "FilterFunction"]

DONATE = ("none", "all", "all-except-first")


def is_array(x) -> bool:
    """Traced by :func:`filter_jit`: JAX arrays (tracers included) and NumPy arrays/scalars."""
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


class _Static:
    """The non-array part of the arguments, a static argument of the inner ``hlofuse.jit``:
    the tree structure and the static leaves (``None`` where an array goes), compared by
    ``==`` and hashed once."""

    __slots__ = ("treedef", "leaves", "donated", "_hash")

    def __init__(self, treedef, leaves: tuple, paths, donated: tuple):
        self.treedef, self.leaves, self.donated = treedef, leaves, donated
        hashes = []
        for path, leaf in zip(paths, leaves):
            if leaf is None:       # an array's place (None is no pytree leaf)
                continue
            try:
                hashes.append(hash(leaf))
            except TypeError:
                raise TypeError(
                    f"hlofuse.filter_jit: {arg_path(path)} is a {type(leaf).__name__}, neither "
                    "an array (traced) nor hashable "
                    "(a compile-time constant): pass it as an array, make it hashable, or close "
                    "over it") from None
        self._hash = hash((treedef, tuple(hashes), donated))

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        if not isinstance(other, _Static) or other._hash != self._hash \
                or other.treedef != self.treedef or other.donated != self.donated:
            return False
        for a, b in zip(self.leaves, other.leaves):
            if a is b:
                continue
            if type(a) is not type(b):
                return False
            try:
                if not bool(a == b):
                    return False
            except Exception as e:  # noqa: BLE001 - the user's __eq__ runs here: no answer, not equal
                log.debug("static argument %s == %s raised %s: not equal", type(a).__name__,
                          type(b).__name__, type(e).__name__)
                return False
        return True


@tree_util.register_pytree_node_class
class _Out:
    """The non-array part of the outputs, carried out of the trace in the output's tree
    structure (a node without children: ``jax.jit`` keeps it with the compiled call)."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def tree_flatten(self):
        return (), self.value

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(aux)


def _merge(mask, dyn, static_leaves):
    it = iter(dyn)
    return [next(it) if m else s for m, s in zip(mask, static_leaves)]


class FilterFunction(Wrapper):
    """The result of :func:`filter_jit`: call it like the function; ``report``, ``lower``,
    ``tune`` and ``tier_status`` take the function's arguments; ``hlofuse_function`` is the
    inner :class:`~hlofuse.frontend.jit.HlofuseFunction` (over the split arguments)."""

    def __init__(self, fun: Callable, donate: str, jit_options: dict):
        if donate not in DONATE:
            raise ValueError(f"hlofuse.filter_jit(donate={donate!r}): expected one of "
                             f"{', '.join(DONATE)}")
        for k in ("static_argnums", "static_argnames", "donate_argnums", "donate_argnames",
                  "freeze_argnums"):
            if k in jit_options:
                raise TypeError(f"hlofuse.filter_jit: {k} is not an option here: non-array "
                                "leaves are static already; use donate='all' or "
                                "'all-except-first' to donate arrays")
        self._fun = fun
        self._donate = donate
        if donate != "none":
            # donating every array asks for it: an argument no output can reuse (a step's
            # inputs) is expected, a report note, not a DonationWarning (as in Equinox)
            opts = dict(jit_options.get("options") or {})
            opts["buffer-aliasing"] = dict(opts.get("buffer-aliasing") or {}, warn_unusable=False)
            jit_options = dict(jit_options, options=opts)
        functools.update_wrapper(self, fun)

        def inner(dyn_donated, dyn_kept, static):
            gave, kept = iter(dyn_donated), iter(dyn_kept)
            arrays = [next(gave) if d else next(kept) for d in static.donated]
            flat = _merge([leaf is None for leaf in static.leaves], arrays, static.leaves)
            args, kwargs = tree_util.tree_unflatten(static.treedef, flat)
            out = fun(*args, **kwargs)
            leaves, tree = tree_util.tree_flatten(out)
            arr = tuple(is_array(x) for x in leaves)
            return ([x for x, a in zip(leaves, arr) if a],
                    _Out((tree, arr, tuple(None if a else x for x, a in zip(leaves, arr)))))
        inner.__name__ = getattr(fun, "__name__", "fun")
        inner.__qualname__ = getattr(fun, "__qualname__", inner.__name__)
        inner.__module__ = getattr(fun, "__module__", None)
        self.hlofuse_function = jit(inner, static_argnums=(2,),
                        donate_argnums=(0,) if donate != "none" else (), **jit_options)

    def _split(self, args, kwargs):
        """(donated arrays, kept arrays, static part) of a call's arguments."""
        flat, treedef = tree_util.tree_flatten_with_path((args, kwargs))
        paths = [p for p, _ in flat]
        leaves = [x for _, x in flat]
        mask = [is_array(x) for x in leaves]
        donated, kept, gives = [], [], []
        for (path, x), m in zip(flat, mask):
            if not m:
                continue
            # path (0, 0, ...): the first positional argument's leaves
            first = path[:2] == (tree_util.SequenceKey(0), tree_util.SequenceKey(0))
            give = self._donate == "all" or (self._donate == "all-except-first" and not first)
            (donated if give else kept).append(x)
            gives.append(give)
        static = _Static(treedef, tuple(None if m else x for x, m in zip(leaves, mask)),
                         paths, tuple(gives))
        return donated, kept, static

    def __call__(self, *args, **kwargs):
        if self._donate == "none":
            dyn_out, out = self.hlofuse_function(*self._split(args, kwargs))
        else:
            # ... nor jax's warning for it (compiles in this thread: the first call's)
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
                dyn_out, out = self.hlofuse_function(*self._split(args, kwargs))
        tree, arr, static_out = out.value
        return tree_util.tree_unflatten(tree, _merge(arr, dyn_out, static_out))

    def report(self, *args, **kwargs):
        return self.hlofuse_function.report(*self._split(args, kwargs))

    def lower(self, *args, **kwargs):
        """The lowered call; its ``compile()`` is called with the function's own arguments
        (as ``eqx.filter_jit``'s is; it was the inner function's, over the split ones)."""
        return _FilterStage(self, self.hlofuse_function.lower(*self._split(args, kwargs)))

    def _merged(self, dyn_out, out):
        tree, arr, static_out = out.value
        return tree_util.tree_unflatten(tree, _merge(arr, dyn_out, static_out))

    def tune(self, *args, budget_s: float | None = None, **kwargs):
        return self.hlofuse_function.tune(*self._split(args, kwargs), budget_s=budget_s)

    def tier_status(self, *args, **kwargs) -> dict:
        return self.hlofuse_function.tier_status(*self._split(args, kwargs))

    def clear_cache(self):
        self.hlofuse_function.clear_cache()

    def __repr__(self):
        return f"hlofuse.filter_jit({getattr(self._fun, '__qualname__', self._fun)!r})"


class _FilterStage:
    """A lowered (or compiled) :class:`FilterFunction` call: everything of the inner stage, and
    ``compile()`` / calls in the function's own arguments."""

    def __init__(self, fj: "FilterFunction", inner):
        self._fj, self._inner = fj, inner

    def __getattr__(self, name):
        try:
            inner = object.__getattribute__(self, "_inner")
        except AttributeError:
            raise AttributeError(name) from None
        return getattr(inner, name)

    def compile(self, *a, **kw):
        return _FilterStage(self._fj, self._inner.compile(*a, **kw))

    def __call__(self, *args, **kwargs):
        dyn_out, out = self._inner(*self._fj._split(args, kwargs))
        return self._fj._merged(dyn_out, out)


def filter_jit(fun: Callable | None = None, *, donate: str = "none", **jit_options: Any):
    """:func:`hlofuse.jit` called as Equinox's ``eqx.filter_jit``: array leaves of the
    arguments are traced, all other leaves are static; outputs may have non-array leaves.

    Args:
      fun: the function (``@hlofuse.filter_jit`` or ``@hlofuse.filter_jit(...)``).
      donate: ``'none'`` (default), ``'all'`` (every array argument's buffer may be reused
        for the outputs) or ``'all-except-first'`` (not the first positional argument's,
        typically the model), as in Equinox.
      **jit_options: :func:`hlofuse.jit`'s own options (``target``, ``pipeline``,
        ``disable``, ``autotune``, ``tiered``, ``check``, ...) and the ``jax.jit`` keywords
        other than static/donated argument numbers and names.
    """
    if fun is None:
        return functools.partial(filter_jit, donate=donate, **jit_options)
    if not callable(fun):
        raise TypeError(f"Expected a callable value, got {fun!r}")
    return FilterFunction(fun, donate, jit_options)
