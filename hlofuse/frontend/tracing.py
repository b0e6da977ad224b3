"""The second part of a call: the traced function of the inner ``jax.jit``.

:class:`TracedFunction` turns one trace (its :class:`~hlofuse.frontend.signature.TraceKey`) into
the :class:`hlofuse.runtime.program.Program` of the user's function over the dynamic leaves, and
binds it: through the ``hlofuse_call`` primitive, whose lowering builds and inlines hlofuse's
optimized module (export -> pipeline -> kernels -> re-injected module, with its report: the
program builder of :mod:`hlofuse.runtime.program`), or, for a :class:`CallInfo` marked
``plain``, as the traced jaxpr inlined (XLA's own module: what ``jax.jit`` compiles).

Whether a top-level call of a new signature runs XLA's code while the module is built in the
background (a tiered first call) is decided here, where the program is known, and handed back
in the call's :class:`CallInfo` (``info.tier``): the dispatcher starts the build.
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Callable

import jax
from jax import tree_util

from hlofuse.core import compat
from hlofuse.core.report import HlofuseWarning
from hlofuse.frontend.signature import CallInfo, CallSignature, Frozen, key_impls
from hlofuse.runtime.program import (Options, Program, call, context_mesh, context_movable,
                                     signature_of)

__all__ = ["TracedFunction"]


class TracedFunction:
    """The programs of one ``hlofuse.jit`` function, one per trace key, and the plain
    functions ``jax.jit`` traces (:meth:`fn`)."""

    def __init__(self, fun: Callable, name: str, opts: Options, sig: CallSignature,
                 tiering: Callable[[], bool]):
        self.fun = fun
        self.name = name
        self.opts = opts
        self.sig = sig
        self.programs: dict[tuple, Program] = {}
        self.last_sig = None  # (in_tree, leaves): the last signature traced, for report()
        self._lock = threading.RLock()
        self._tiering = tiering   # whether tiered first calls are on (hlofuse.jit(tiered=))

    def fn(self, xla: frozenset = frozenset(), full: bool = False,
           settings: tuple = ()) -> Callable:
        """A plain function with the user's name and signature (after the :class:`CallInfo`)
        that runs :meth:`trace` (``xla``: region hashes run without their kernels; ``full``:
        from the module with every kernel built, :meth:`Program.with_xla`; ``settings``: pass
        options of a kernel variant, :meth:`Program.with_settings`)."""
        def traced(info, *args, **kwargs):
            if compat.at_top_level():
                # called outside every trace: jax runs a jit function's Python again "as if
                # the decorator were removed" to name the op that made a NaN or inf
                # (debug_nans / debug_infs); so is the user's function, on these values
                args = tuple(a.value if isinstance(a, Frozen) else a for a in args)
                return self.fun(*args, **kwargs)
            return self.trace(info, args, kwargs, xla, full, settings)
        try:
            traced = functools.wraps(self.fun)(traced)
        except (AttributeError, TypeError):  # odd callables without __name__ etc.
            return traced
        signature = self.sig.traced_signature(self.fun)
        if signature is not None:
            traced.__signature__ = signature
        return traced

    def trace(self, info: CallInfo, args, kwargs, xla: frozenset, full: bool,
              settings: tuple = ()):
        """One trace of the inner ``jax.jit``: the program of this trace key, bound."""
        tk = self.sig.trace_key(args, kwargs, info, context_mesh)
        self.last_sig = (tk.in_tree, [
            jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=jax.typeof(x).weak_type)
            if d else x for x, d in zip(tk.leaves, tk.dyn)])
        program = self._program(tk)
        xs = tk.dynamic
        if tk.key_impls:   # typed PRNG keys cross hlofuse's module as their uint32 key data
            xs = [jax.random.key_data(x) if i else x for x, i in zip(xs, tk.key_impls)]
        sig = signature_of([jax.typeof(x) for x in xs])
        info.traced = True
        if info.may_tier:
            info.may_tier = False   # asked once per call: nested and later traces build in place
            if not xla and not full and not settings and tk.shardings is None and \
                    self._should_tier(program, sig, info):
                key = self.sig.call_key(*info.args, top_level=False)
                specs = self.sig.specs(*info.args)   # before the call may donate them
                if key is not None and specs is not None:
                    # XLA's code for this call, hlofuse's module in the background; this
                    # trace's info is plain from now on: later hlofuse calls miss its entry
                    info.plain = True
                    info.tier = (key, specs)
        if info.plain:   # a tiered first call, or a signature decided to run XLA's own module
            out = program.traced_fun(*xs)   # traces the function first when it is new
            return program.unflatten_out(sig, out)
        info.cache_every_compile()
        if tk.shardings is None and info.concrete() is not None:
            # a top-level call with uncommitted inputs (or none)
            mesh = _mesh_of_body(program, xs)
            if mesh is not None and not xs:
                # nothing to place on the mesh: jax.jit's own program learns it from its jaxpr
                return program.unflatten_out(sig, program.traced_fun(*xs))
            if mesh is not None:
                rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
                xs = [jax.lax.with_sharding_constraint(x, rep) for x in xs]
        out = call(program.with_settings(settings).with_xla(xla, full), xs)
        return program.unflatten_out(sig, out)

    def _program(self, tk) -> Program:
        program = self.programs.get(tk.key)
        if program is None:
            with self._lock:
                program = self.programs.get(tk.key)
                if program is None:
                    program = self._make_program(tk)
                    program.shardings = tk.shardings
                    self.programs[tk.key] = program
        return program

    def _should_tier(self, program: Program, sig, info: CallInfo) -> bool:
        """Whether this trace (of a top-level call) should run XLA's code now and build
        hlofuse's module in the background: tiering is on, the arguments are concrete and the
        module is not cheap to get (not built in this process, not in the module cache)."""
        if not self._tiering() or info.concrete() is None:
            return False
        jkw = self.sig.jit_kwargs
        if "backend" in jkw or "device" in jkw:
            return False
        try:
            if program.is_built(sig, program.target_for(jax.default_backend())):
                return False
        except (ValueError, RuntimeError):  # the synchronous build reports what is wrong
            return False
        # a background thread does not inherit this thread's jax settings (context managers):
        # under any, the module is built here, as jax.jit would
        return context_movable()

    def _make_program(self, tk) -> Program:
        """The :class:`Program` of the user's function over the dynamic leaves. Typed PRNG key
        leaves (``tk.key_impls``: each dynamic leaf's key implementation or None; empty when
        there are none) come in as their key data and are wrapped again for the function;
        key outputs leave as key data (``Program.unflatten_out`` wraps them)."""
        dyn, in_tree, impls = tk.dyn, tk.in_tree, tk.key_impls
        consts = [None if d else (x.value if isinstance(x, Frozen) else x)
                  for x, d in zip(tk.leaves, dyn)]
        fun, name = self.fun, self.name
        out_trees: dict = {}
        warned = []

        def flat_fun(*xs):
            sig = signature_of([jax.typeof(x) for x in xs])
            if impls:
                xs = [jax.random.wrap_key_data(x, impl=i) if i else x
                      for x, i in zip(xs, impls)]
            it = iter(xs)
            full = [next(it) if d else c for c, d in zip(consts, dyn)]
            args, kwargs = tree_util.tree_unflatten(in_tree, full)
            flat, tree = tree_util.tree_flatten(fun(*args, **kwargs))
            if not warned:
                _warn_argument_updates(name, in_tree, full, dyn, args, kwargs, warned)
            out_impls = key_impls(flat)
            if out_impls:
                flat = [jax.random.key_data(x) if i else x for x, i in zip(flat, out_impls)]
            out_trees[sig] = (tree, out_impls)
            return tuple(flat)

        program = Program(flat_fun, self.opts, name=name, donated=tk.donated)
        program.out_trees = out_trees
        return program

    def all_programs(self) -> list[Program]:
        """The programs of every signature and every program derived from them."""
        out, todo = [], list(self.programs.values())
        while todo:
            p = todo.pop()
            out.append(p)
            todo.extend(list(p.derived.values()))
        return out


def _warn_argument_updates(name: str, in_tree, before: list, dyn, args, kwargs,
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
                f"{arg_path(paths[changed[0]])})")
    warned.append(True)
    nnx = any(type(a).__module__.startswith("flax.nnx") for a in
              list(args) + list(kwargs.values()))
    warnings.warn(HlofuseWarning(
        f"hlofuse.jit({name}): the function {what}; as under jax.jit, those updates stay "
        "inside the trace and the caller's objects keep their old values. Return the new "
        "values" + ("; for Flax NNX modules use hlofuse.nnx_jit, which writes them back as "
                    "nnx.jit does" if nnx else "")), stacklevel=2)


def arg_path(path) -> str:
    """A leaf's path in ``(args, kwargs)`` as the call wrote it: ``argument 0.mean.value``."""
    head, rest = path[:2], tree_util.keystr(tuple(path[2:]))
    if head[0] == tree_util.SequenceKey(0):
        return f"argument {head[1].idx}{rest}"
    return f"argument {head[1].key!r}{rest}"


def _concrete_mesh(v):
    """The concrete multi-device mesh ``v`` names: a ``Mesh`` (shard_map's ``mesh``) or a
    ``NamedSharding`` over one (``sharding_constraint``'s ``sharding``, ``device_put``'s
    ``devices``); None otherwise (an abstract mesh is the context's, which the call has)."""
    if isinstance(v, jax.sharding.NamedSharding):
        v = v.mesh
    if isinstance(v, jax.sharding.Mesh) and v.size > 1:
        return v
    return None


def _inner_mesh(jaxpr):
    """The concrete mesh a ``shard_map``, ``with_sharding_constraint`` or ``device_put``
    anywhere in ``jaxpr`` (sub-jaxprs included) places data on."""
    todo = [getattr(jaxpr, "jaxpr", jaxpr)]
    while todo:
        j = todo.pop()
        for e in j.eqns:
            for v in e.params.values():
                for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                    m = _concrete_mesh(sub)
                    if m is not None:
                        return m
                    if compat.is_jaxpr(sub):
                        todo.append(getattr(sub, "jaxpr", sub))
    return None


def _mesh_of_body(program, xs: list):
    """A function whose body places data on a concrete mesh (a ``shard_map``, a sharding
    constraint, a ``device_put``) runs on that mesh's devices. ``jax.jit`` learns them from
    its jaxpr; the outer ``jax.jit`` of ``hlofuse.jit`` only sees ``hlofuse_call``, so the
    caller places the inputs on the mesh (replicated: the body slices them locally, no
    collective) to tell it. None when the body names no such mesh."""
    try:
        return _inner_mesh(program.jaxpr(signature_of([jax.typeof(x) for x in xs])))
    except Exception:  # noqa: BLE001 - tracing errors surface in call() itself
        return None
