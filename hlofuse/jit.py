"""``@hlofuse.jit``: ``jax.jit`` with hlofuse's StableHLO pipeline between tracing and XLA."""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Any, Callable, Sequence

import jax
from jax import tree_util

from hlofuse.api import normalize_target
from hlofuse.kernels.lowering import platform_for
from hlofuse.runtime import Entry, FlatJit, Options, signature_of

__all__ = ["jit", "Lowered", "HlofuseFunction"]


def _norm_tuple(x) -> tuple:
    if x is None:
        return ()
    if isinstance(x, (int, str)):
        return (x,)
    return tuple(x)


class Lowered:
    """What ``fn.lower(*args)`` returns: the optimized module for one signature and its report."""

    def __init__(self, entry: Entry, out_tree, target: str, prepare=None, donate: tuple = ()):
        self._entry = entry
        self._prepare = prepare
        self._donate = donate
        self.out_tree = out_tree
        self.target = target

    def as_text(self, debug_info: bool = False) -> str:
        """The optimized StableHLO (for any target, including gpu/tpu from a CPU machine)."""
        opt = self._entry.optimized
        return opt.text_with_locations() if debug_info else opt.text

    @property
    def report(self):
        return self._entry.report

    @property
    def exported(self):
        """The ``jax.export.Exported`` carrying the optimized module (serializable)."""
        return self._entry.exported

    def compile(self) -> "Compiled":
        """XLA-compile the optimized module on the current backend."""
        entry = self._entry
        args = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=a.weak_type) for a in entry.in_avals]
        from hlofuse.autotune import cached_options  # options autotune chose, if it did
        opts = cached_options(entry.optimized.text) if self.target == jax.default_backend() else {}
        jitted = jax.jit(entry.call, donate_argnums=self._donate, compiler_options=opts or None)
        return Compiled(jitted.lower(*args).compile(), self._prepare, self.out_tree)


class Compiled:
    """What ``Lowered.compile()`` returns: call it with the same arguments as the function
    (static ones included); ``memory_analysis()``, ``cost_analysis()`` and ``as_text()`` come
    from XLA's compiled executable."""

    def __init__(self, compiled, prepare, out_tree):
        self._compiled = compiled
        self._prepare = prepare
        self.out_tree = out_tree

    def __call__(self, *args, **kwargs):
        _, _, leaves, _, _ = self._prepare(args, kwargs)
        return tree_util.tree_unflatten(self.out_tree, self._compiled(*leaves))

    def memory_analysis(self):
        return self._compiled.memory_analysis()

    def cost_analysis(self):
        return self._compiled.cost_analysis()

    def as_text(self) -> str:
        return self._compiled.as_text()


class HlofuseFunction:
    """The callable returned by :func:`jit`."""

    def __init__(self, fun: Callable, *, static_argnums, static_argnames, donate_argnums,
                 target, pipeline, disable, check, options, dump_dir, autotune=None,
                 freeze_argnums=()):
        functools.update_wrapper(self, fun)
        self._autotune = autotune  # None: on where it pays (CPU), see hlofuse.autotune
        self._fun = fun
        self._target = normalize_target(target)
        try:
            self._sig = inspect.signature(fun)
        except (TypeError, ValueError):
            self._sig = None
        static_argnums = _norm_tuple(static_argnums)
        static_argnames = _norm_tuple(static_argnames)
        # like jax.jit: infer names from numbers and numbers from names where the signature allows
        if self._sig is not None:
            params = list(self._sig.parameters.values())
            positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            for n in static_argnums:
                if -len(positional) <= n < len(positional):
                    p = positional[n]
                    if p.kind is p.POSITIONAL_OR_KEYWORD and p.name not in static_argnames:
                        static_argnames += (p.name,)
            for name in static_argnames:
                for i, p in enumerate(positional):
                    if p.name == name and i not in static_argnums:
                        static_argnums += (i,)
            for name in static_argnames:
                if name not in self._sig.parameters and not any(
                        p.kind is p.VAR_KEYWORD for p in params):
                    raise ValueError(f"static_argnames {name!r} is not a parameter of {fun.__name__}")
        self._static_argnums = static_argnums
        self._static_argnames = static_argnames
        self._donate_argnums = _norm_tuple(donate_argnums)
        if set(self._donate_argnums) & set(self._static_argnums):
            raise ValueError("static arguments cannot be donated: "
                             f"{sorted(set(self._donate_argnums) & set(self._static_argnums))}")
        self._freeze_argnums = _norm_tuple(freeze_argnums)
        clash = set(self._freeze_argnums) & (set(self._static_argnums) | set(self._donate_argnums))
        if clash:
            raise ValueError(f"frozen arguments cannot also be static or donated: {sorted(clash)}")
        self._opts = Options(target=self._target, pipeline=pipeline, disable=tuple(disable),
                             pass_options=dict(options or {}), dump_dir=dump_dir, check=check)
        self._flat: dict[Any, tuple[FlatJit, list]] = {}
        self._jitted: dict[tuple, Callable] = {}
        self._lock = threading.RLock()

    # -- argument handling -----------------------------------------------------------------
    def _split(self, args: tuple, kwargs: dict):
        n = len(args)
        nums = set()
        for i in self._static_argnums:
            j = i + n if i < 0 else i
            if 0 <= j < n:
                nums.add(j)
            elif not (self._sig and any(p.name in kwargs for p in self._sig.parameters.values())):
                if j >= n and not self._static_argnames:
                    raise ValueError(f"jitted function has static_argnums={self._static_argnums}, "
                                     f"but only accepts {n} positional arguments")
        frozen = set()
        for i in self._freeze_argnums:
            j = i + n if i < 0 else i
            if not 0 <= j < n:
                raise ValueError(f"jitted function has freeze_argnums={self._freeze_argnums}, but "
                                 f"was called with {n} positional arguments")
            frozen.add(j)
        static_pos = tuple((i, args[i]) for i in sorted(nums))
        static_kw = tuple(sorted((k, v) for k, v in kwargs.items() if k in self._static_argnames))
        for where, v in [(f"argument {i}", v) for i, v in static_pos] + [(f"argument {k!r}", v) for k, v in static_kw]:
            try:
                hash(v)
            except TypeError:
                raise ValueError(f"Non-hashable static arguments are not supported. An error occurred "
                                 f"while trying to hash static {where} of type {type(v)}") from None
        dyn_args = tuple(a for i, a in enumerate(args) if i not in nums and i not in frozen)
        dyn_kwargs = {k: v for k, v in kwargs.items() if k not in self._static_argnames}
        return static_pos, static_kw, dyn_args, dyn_kwargs, nums | frozen

    def _flat_fn(self, key, static_pos, static_kw, in_tree, n_args) -> tuple[FlatJit, list]:
        with self._lock:
            if key in self._flat:
                return self._flat[key]
            out_tree_box: list = []
            fun = self._fun
            static_map = dict(static_pos)

            def flat_fun(*leaves):
                dyn_args, dyn_kwargs = tree_util.tree_unflatten(in_tree, leaves)
                it = iter(dyn_args)
                args = [static_map[i] if i in static_map else next(it) for i in range(n_args)]
                out = fun(*args, **dyn_kwargs, **dict(static_kw))
                flat, tree = tree_util.tree_flatten(out)
                if not out_tree_box:
                    out_tree_box.append(tree)
                return tuple(flat)

            name = getattr(fun, "__name__", "fun")
            self._flat[key] = (FlatJit(flat_fun, self._opts, name=name), out_tree_box)
            return self._flat[key]

    def _prepare(self, args, kwargs):
        static_pos, static_kw, dyn_args, dyn_kwargs, static_nums = self._split(args, kwargs)
        leaves_with_path, in_tree = tree_util.tree_flatten_with_path((dyn_args, dyn_kwargs))
        leaves = [leaf for _, leaf in leaves_with_path]
        avals = []
        for path, leaf in leaves_with_path:
            try:
                avals.append(jax.typeof(leaf))
            except TypeError:
                raise TypeError(
                    f"Error interpreting argument to {self._fun!r} as an abstract array. The "
                    f"problematic value is of type {type(leaf)} and was passed to the function at "
                    f"path {_path_str(path)}. If this argument should be static, mark it with "
                    f"static_argnums or static_argnames.") from None
        # frozen args are closed over (compile-time constants); the cache key holds their
        # identity, and the closure keeps them alive so an id is never reused while cached
        frozen_pos = tuple((i, args[i]) for i in sorted(static_nums) if i in self._frozen_set(len(args)))
        key = (in_tree, static_pos, static_kw, len(args), _frozen_key(frozen_pos))
        flat, out_tree_box = self._flat_fn(key, static_pos + frozen_pos, static_kw, in_tree, len(args))
        # donated positional args -> flat leaf indices
        donate = []
        if self._donate_argnums:
            dyn_index = {i: k for k, i in enumerate(i for i in range(len(args)) if i not in static_nums)}
            offsets, pos = [], 0
            for a in dyn_args:
                cnt = len(tree_util.tree_leaves(a))
                offsets.append((pos, cnt))
                pos += cnt
            for d in self._donate_argnums:
                d = d + len(args) if d < 0 else d
                if d in dyn_index:
                    start, cnt = offsets[dyn_index[d]]
                    donate.extend(range(start, start + cnt))
        flat.donated = tuple(donate)  # the buffer-aliasing pass pairs them with outputs
        return flat, out_tree_box, leaves, signature_of(avals), tuple(donate)

    def _frozen_set(self, n: int) -> set:
        return {i + n if i < 0 else i for i in self._freeze_argnums}

    # -- public ----------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        flat, out_tree_box, leaves, sig, donate = self._prepare(args, kwargs)
        entry = flat.entry(sig)
        platform = platform_for(self._target)
        backend = jax.default_backend()
        if {"cuda": "gpu", "rocm": "gpu"}.get(backend, backend) != self._target:
            raise RuntimeError(
                f"{self.__name__} was optimized for target={self._target!r} ({platform}) but this "
                f"process runs on {backend!r}. Use .lower(...).as_text() to inspect the "
                f"{self._target} module, or target=None to run here.")
        jkey = (id(entry), donate)
        fn = self._jitted.get(jkey)
        if fn is None:
            with self._lock:
                fn = self._jitted.get(jkey)
                if fn is None:
                    fn = self._jitted.setdefault(jkey, _autotuned(entry, donate, self._autotune))
        out = fn(*leaves)
        return tree_util.tree_unflatten(out_tree_box[0], out)

    def lower(self, *args, **kwargs) -> Lowered:
        flat, out_tree_box, leaves, sig, donate = self._prepare(args, kwargs)
        entry = flat.entry(sig)
        return Lowered(entry, out_tree_box[0] if out_tree_box else None, self._target, self._prepare,
                       donate)

    def report(self, *args, **kwargs):
        """Shortcut for ``self.lower(*args, **kwargs).report``."""
        return self.lower(*args, **kwargs).report

    def autotune_decision(self, *args, **kwargs):
        """The compiler-option decision (:class:`hlofuse.autotune.Decision`) for these
        arguments' signature, or None while undecided / when autotuning is off."""
        flat, _, _, sig, donate = self._prepare(args, kwargs)
        tuner = self._jitted.get((id(flat.entry(sig)), donate))
        return getattr(tuner, "decision", None)

    @property
    def compilations(self) -> int:
        """How many signatures have been optimized and compiled so far."""
        return sum(f.builds for f, _ in self._flat.values())

    def __repr__(self):
        return f"<hlofuse.jit {getattr(self._fun, '__qualname__', self._fun)} target={self._target}>"

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return functools.partial(self, obj)


def _autotuned(entry, donate: tuple, autotune):
    """``jax.jit(entry.call, donate_argnums=donate)`` with measured compiler options; the
    choice is recorded in the entry's report notes."""
    from hlofuse.autotune import Autotuner

    def record(decision, cached):
        entry.report.note(decision.note(cached))

    # hash the optimized module *without* locations: locations carry the caller's stack, and the
    # same program called from elsewhere must find the same cached decision
    return Autotuner(entry.call, entry.optimized.text, donate_argnums=donate,
                     enabled=autotune, on_decision=record)


def _frozen_key(frozen_pos) -> tuple:
    """Identity of frozen arguments: position, pytree structure and per leaf ``id`` + shape +
    dtype (hashable scalars by value). Mutating a frozen numpy array in place is not seen:
    create a new ``hlofuse.jit`` (or pass a new array) after changing parameters."""
    out = []
    for i, v in frozen_pos:
        leaves, tree = tree_util.tree_flatten(v)
        ids = []
        for leaf in leaves:
            if isinstance(leaf, (bool, int, float, complex, str)):
                ids.append((type(leaf).__name__, leaf))
            else:
                ids.append((id(leaf), tuple(getattr(leaf, "shape", ())), str(getattr(leaf, "dtype", ""))))
        out.append((i, tree, tuple(ids)))
    return tuple(out)


def _path_str(path) -> str:
    s = tree_util.keystr(path)
    # ((args, kwargs)) -> args[i] / kwargs['k']
    if s.startswith("[0]"):
        return "args" + s[3:]
    if s.startswith("[1]"):
        return "kwargs" + s[3:]
    return s


def jit(fun: Callable | None = None, *, static_argnums: int | Sequence[int] = (),
        static_argnames: str | Sequence[str] = (), donate_argnums: int | Sequence[int] = (),
        target: str | None = None, pipeline=None, disable: Sequence[str] = (),
        check: bool = False, options: dict | None = None, dump_dir: str | None = None,
        autotune: bool | None = None, freeze_argnums: int | Sequence[int] = ()):
    """Like ``jax.jit``, with hlofuse's StableHLO optimization between tracing and XLA.

    Args:
      fun: the function to compile (pytrees in and out, like ``jax.jit``).
      static_argnums, static_argnames, donate_argnums: as in ``jax.jit``.
      target: None (the current backend), 'cpu', 'gpu' or 'tpu'. A gpu/tpu target can be
        lowered and inspected from a CPU machine (``.lower(...).as_text()``) but only run on one.
      pipeline: pipeline name ('default', 'cleanup', 'none') or list of pass names.
      disable: pass names to skip.
      check: verify every kernelized region against its original subgraph on the first call
        and roll back regions that disagree (see :mod:`hlofuse.verify`).
      options: pass options; dump_dir: write the module after each pass. An optimization
        never makes the program fail: when a pass fails the function runs unoptimized with a
        ``hlofuse.HlofuseWarning``; ``options={'strict': True}`` raises instead (debugging).
      freeze_argnums: positional arguments (e.g. parameters, for inference) treated as
        compile-time constants: the traced function closes over their values, so
        ``constant-fold`` and ``batchnorm-fold`` can act on them. One compilation per frozen
        value identity (``id`` + shape + dtype of each leaf; the values are kept alive while
        cached). Mutating a frozen array in place is not detected: pass a new array or make a
        new ``hlofuse.jit``.
      autotune: measure XLA compiler-option variants (XLA:CPU library fusion) for each
        compiled signature on its second call and keep the fastest when it beats XLA's defaults
        (decisions cached in ``~/.cache/hlofuse/autotune.json``; see :mod:`hlofuse.autotune`).
        None (default): on for CPU, off elsewhere (env ``HLOFUSE_AUTOTUNE=0/1`` overrides).
    """
    if fun is None:
        return functools.partial(jit, static_argnums=static_argnums, static_argnames=static_argnames,
                                 donate_argnums=donate_argnums, target=target, pipeline=pipeline,
                                 disable=disable, check=check, options=options, dump_dir=dump_dir,
                                 autotune=autotune, freeze_argnums=freeze_argnums)
    if not callable(fun):
        raise TypeError(f"Expected a callable value, got {fun!r}")
    return HlofuseFunction(fun, static_argnums=static_argnums, static_argnames=static_argnames,
                           donate_argnums=donate_argnums, target=target, pipeline=pipeline,
                           disable=disable, check=check, options=options, dump_dir=dump_dir,
                           autotune=autotune, freeze_argnums=freeze_argnums)
