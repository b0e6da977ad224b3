"""``hlofuse.nnx_jit``: Flax NNX's ``nnx.jit`` with hlofuse's compilation inside.

NNX modules are mutable: a train step updates BatchNorm statistics, dropout RNG counters and,
through ``nnx.Optimizer.update``, the parameters in place. ``nnx.jit`` writes those updates
back to the caller's objects; ``jax.jit`` and ``hlofuse.jit`` cannot (their traced function
sees copies; ``hlofuse.jit`` warns when it sees it happen). ``nnx_jit`` is ``nnx.jit`` itself,
built with ``hlofuse.jit`` where it calls ``jax.jit``, so NNX's own machinery (graph
splitting, shared references, state write-back, shardings, donation) runs unchanged around
hlofuse's program.

How: ``nnx.jit`` builds its inner ``jax.jit`` when it is constructed (``flax.nnx.transforms.
compilation``). While ``nnx_jit`` constructs it, that module's ``jax`` name is a proxy whose
``jit`` is ``hlofuse.jit`` with the given options (under a lock; only construction is
affected, calls are not). If a Flax version builds it otherwise, ``nnx_jit`` raises and says
so rather than running plain ``jax.jit``.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import jax

from hlofuse.frontend.jit import HlofuseFunction, Wrapper, jit

__all__ = ["nnx_jit", "NnxFunction"]

#: hlofuse.jit's own options (everything else goes to nnx.jit)
JIT_OPTIONS = ("target", "pipeline", "disable", "check", "options", "dump_dir", "autotune",
                   "tiered")

_LOCK = threading.Lock()


class _JaxWithHlofuseJit:
    """``jax`` with ``jit`` replaced (what ``nnx.jit``'s module sees while constructing)."""

    def __init__(self, jit: Callable):
        self.jit = jit

    def __getattr__(self, name):
        return getattr(jax, name)


class NnxFunction(Wrapper):
    """The result of :func:`nnx_jit`: call it like ``nnx.jit``'s; ``report(*args)`` gives
    hlofuse's report for those arguments; ``block_until_optimized`` waits for a tiered
    build; ``hlofuse_function`` is the inner :class:`~hlofuse.frontend.jit.HlofuseFunction`."""

    def __init__(self, wrapped, inner):
        self._wrapped = wrapped
        self.hlofuse_function = inner
        functools.update_wrapper(self, getattr(wrapped, "fun", None) or inner)

    def __call__(self, *args, **kwargs):
        return self._wrapped(*args, **kwargs)

    def lower(self, *args, **kwargs):
        """``nnx.jit``'s ``lower``; its ``.lowered`` is hlofuse's ``Lowered``."""
        return self._wrapped.lower(*args, **kwargs)

    def report(self, *args, **kwargs):
        return self.lower(*args, **kwargs).lowered.report

    def __repr__(self):
        return f"hlofuse.nnx_jit({self.hlofuse_function!r})"


def nnx_jit(fun: Callable | None = None, **options: Any):
    """``flax.nnx.jit`` with ``hlofuse.jit`` as its compiler: a drop-in for ``@nnx.jit``.

    Args:
      fun: the function (``@hlofuse.nnx_jit`` or ``@hlofuse.nnx_jit(...)``).
      **options: :func:`hlofuse.jit`'s own options (``target``, ``pipeline``, ``disable``,
        ``check``, ``options``, ``dump_dir``, ``autotune``, ``tiered``) and every ``nnx.jit``
        keyword (``in_shardings``, ``out_shardings``, ``static_argnums``/``argnames``,
        ``donate_argnums``/``argnames``, ``graph``, ...), passed to ``nnx.jit``.
    """
    if fun is None:
        return functools.partial(nnx_jit, **options)
    try:
        from flax import nnx
        from flax.nnx.transforms import compilation
    except ImportError as e:
        raise ImportError("hlofuse.nnx_jit needs Flax (pip install flax); for other "
                          "libraries use hlofuse.jit or hlofuse.filter_jit") from e
    ours = {k: options.pop(k) for k in JIT_OPTIONS if k in options}
    made: list = []

    def hjit(f, **jit_kwargs):
        made.append(jit(f, **ours, **jit_kwargs))
        return made[-1]

    with _LOCK:
        saved = compilation.jax
        compilation.jax = _JaxWithHlofuseJit(hjit)
        try:
            wrapped = nnx.jit(fun, **options)
        finally:
            compilation.jax = saved
    inner = getattr(wrapped, "jitted_fn", None)
    if not made or inner is not made[-1] or not isinstance(inner, HlofuseFunction):
        import flax
        raise RuntimeError(
            f"hlofuse.nnx_jit: flax {flax.__version__} builds nnx.jit without calling jax.jit "
            "in flax.nnx.transforms.compilation as construction, which nnx_jit relies on; use "
            "hlofuse.jit on nnx.split/nnx.merge state instead")
    return NnxFunction(wrapped, inner)
