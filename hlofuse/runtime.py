"""Re-injection: run an optimized StableHLO module through XLA so it composes like ``jax.jit``.

Route chosen (facts §4 compares three): **B, an ``Exported`` with a rewritten payload.**
``jax.export.export`` gives the module plus its calling convention (avals, platform checks);
we optimize the module and put it back with ``dataclasses.replace(exp, mlir_module_serialized=...)``.
``exp.call`` is an ordinary JAX primitive, so the result composes with ``jax.jit`` (the payload is
inlined into the outer module), keeps shape/dtype checks, and takes donation from the outer jit.
Route A (raw ``compile_and_load``) has no dtype checks and no transformations; route C (mutating a
``Lowered``) poisons JAX's caches (H1/H4) and cannot be used under jit or grad.

Route B lacks two transformations, which we add ourselves so they are optimized too:

* grad: a ``jax.custom_vjp`` whose backward is ``jax.vjp`` of the *original* function, itself
  exported and optimized by hlofuse (the forward is recomputed in the backward, like remat);
* vmap: a ``jax.custom_batching.custom_vmap`` whose rule optimizes ``jax.vmap`` of the original
  function with the batched axes, so the batched program is fused as a whole.

Every :class:`FlatJit` caches one entry per input signature (shape, dtype, weak type); building
an entry is serialized by a lock so concurrent first calls compile once.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Callable, Sequence

import numpy as np

import jax
import jax.numpy as jnp
from jax import export as jexport

from hlofuse import ir as hir
from hlofuse.api import Optimized, optimize
from hlofuse.kernels.lowering import platform_for

Signature = tuple  # tuple of (shape, dtype name, weak_type)


def signature_of(avals: Sequence) -> Signature:
    return tuple((tuple(a.shape), str(a.dtype), bool(getattr(a, "weak_type", False))) for a in avals)


def sds(sig: Signature) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(s, np.dtype(d) if d != "bfloat16" else jnp.bfloat16, weak_type=w)
            for s, d, w in sig]


def _inexact(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


@dataclasses.dataclass
class Options:
    target: str
    pipeline: object = None
    disable: tuple = ()
    pass_options: dict = dataclasses.field(default_factory=dict)
    dump_dir: str | None = None
    check: bool = False


@dataclasses.dataclass
class Entry:
    """One compiled signature."""
    exported: jexport.Exported
    optimized: Optimized
    out_avals: tuple
    call: Callable              # flat arrays -> list of flat arrays, transformation-aware
    in_avals: tuple = ()

    @property
    def report(self):
        return self.optimized.report


def export_optimized(fun: Callable, sig: Signature, opts: Options, *, name: str = "fun",
                     donated: Sequence[int] = ()) -> tuple[jexport.Exported, Optimized]:
    """Export ``fun`` (flat arrays -> flat arrays) for the target and optimize its module."""
    platform = platform_for(opts.target)
    exp0 = jexport.export(jax.jit(fun), platforms=[platform])(*sds(sig))
    try:  # an optimization never makes a program fail (options={'strict': True} re-raises)
        opt = optimize(exp0.mlir_module(), target=opts.target, pipeline=opts.pipeline,
                       disable=opts.disable, dump_dir=opts.dump_dir, options=opts.pass_options,
                       source=name, donated_args=donated)
        if opts.check:
            from hlofuse.verify import verify_regions
            opt = verify_regions(exp0, opt, opts, name=name)
    except Exception as e:
        from hlofuse.verify import unoptimized
        opt = unoptimized(exp0, opts, name=name, error=e)
    checks = tuple(exp0.disabled_safety_checks)
    if opts.target == "gpu":
        checks += (jexport.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton"),)
    exp = dataclasses.replace(exp0, mlir_module_serialized=hir.to_bytecode(opt.module),
                              disabled_safety_checks=checks, _get_vjp=None)
    return exp, opt


class FlatJit:
    """hlofuse's jit over a flat function: ``fun(*arrays) -> tuple of arrays``."""

    def __init__(self, fun: Callable, opts: Options, *, name: str = "fun", donated: tuple = ()):
        self.fun = fun
        self.opts = opts
        self.name = name
        self.donated = tuple(donated)  # flat argument indices the caller donates (buffer-aliasing)
        self._entries: dict[Signature, Entry] = {}
        self._lock = threading.RLock()
        self._vjp: FlatJit | None = None
        self._batched: dict[tuple, FlatJit] = {}
        self.builds = 0  # number of signatures compiled (for tests and reports)

    # -- entries ---------------------------------------------------------------------------
    def entry(self, sig: Signature) -> Entry:
        e = self._entries.get(sig)
        if e is not None:
            return e
        with self._lock:
            e = self._entries.get(sig)
            if e is None:
                e = self._build(sig)
                self._entries[sig] = e
                self.builds += 1
            return e

    def _build(self, sig: Signature) -> Entry:
        try:
            exp, opt = export_optimized(self.fun, sig, self.opts, name=self.name,
                                        donated=self.donated)
        except NotImplementedError as e:
            if "host_callbacks" not in str(e):
                raise
            return self._plain_jit_entry(sig)
        return Entry(exp, opt, tuple(exp.out_avals), self._transformable(exp, sig), tuple(sds(sig)))

    def _plain_jit_entry(self, sig: Signature) -> Entry:
        """Functions with Python host callbacks (jax.debug.print, pure_callback, io_callback)
        cannot go through jax.export (it cannot serialize them), so they run with plain
        ``jax.jit``; the report says so."""
        from hlofuse.api import normalize_target
        from hlofuse.report import Report
        jitted = jax.jit(self.fun)
        lowered = jitted.trace(*sds(sig)).lower(lowering_platforms=(platform_for(self.opts.target),))
        module = hir.parse(lowered.as_text(debug_info=True), source=self.name)
        report = Report(target=self.opts.target, source=self.name)
        report.note("left to XLA whole: the function uses Python host callbacks (jax.debug.print, "
                    "pure_callback or io_callback), which jax.export cannot serialize, so hlofuse "
                    "runs it with plain jax.jit")
        out_avals = tuple(jax.tree_util.tree_leaves(lowered.out_info))
        return Entry(None, Optimized(module, report), out_avals, lambda *xs: tuple(jitted(*xs)),
                     tuple(sds(sig)))

    # -- transformations -------------------------------------------------------------------
    def _transformable(self, exp: jexport.Exported, sig: Signature) -> Callable:
        n_out = len(exp.out_avals)

        @jax.custom_batching.custom_vmap
        def primal(*xs):
            return tuple(exp.call(*xs))

        @primal.def_vmap
        def _vmap_rule(axis_size, in_batched, *xs):
            outs = self.batched(tuple(bool(b) for b in in_batched))(*xs)
            return tuple(outs), tuple(True for _ in range(n_out))

        @jax.custom_vjp
        def f(*xs):
            return primal(*xs)

        def fwd(*xs):
            return primal(*xs), xs

        def bwd(xs, cts):
            diff = [i for i, x in enumerate(xs) if _inexact(x.dtype)]
            ct_idx = [j for j, a in enumerate(exp.out_avals) if _inexact(a.dtype)]
            grads = self.vjp(len(xs), tuple(diff), tuple(ct_idx))(*xs, *[cts[j] for j in ct_idx])
            out = [None] * len(xs)
            for i, g in zip(diff, grads):
                out[i] = g
            return tuple(out)

        f.defvjp(fwd, bwd)
        return f

    def vjp(self, n_in: int, diff: tuple, ct_idx: tuple) -> "FlatJit":
        key = ("vjp", n_in, diff, ct_idx)
        with self._lock:
            if key not in self._batched:
                fun = self.fun

                def vjp_fun(*args):
                    prim, cts = list(args[:n_in]), args[n_in:]

                    def g(*d):
                        full = list(prim)
                        for i, v in zip(diff, d):
                            full[i] = v
                        return tuple(fun(*full))

                    outs, pull = jax.vjp(g, *[prim[i] for i in diff])
                    full_cts = [jnp.zeros(o.shape, jax.dtypes.float0) if not _inexact(o.dtype)
                                else None for o in outs]
                    for j, c in zip(ct_idx, cts):
                        full_cts[j] = c
                    return tuple(pull(tuple(full_cts)))

                self._batched[key] = FlatJit(vjp_fun, self.opts, name=f"vjp({self.name})")
            return self._batched[key]

    def batched(self, in_batched: tuple) -> "FlatJit":
        key = ("vmap", in_batched)
        with self._lock:
            if key not in self._batched:
                axes = tuple(0 if b else None for b in in_batched)
                fun = self.fun
                self._batched[key] = FlatJit(
                    lambda *xs: tuple(jax.vmap(lambda *a: tuple(fun(*a)), in_axes=axes)(*xs)),
                    self.opts, name=f"vmap({self.name})")
            return self._batched[key]

    # -- calling ---------------------------------------------------------------------------
    def __call__(self, *xs):
        sig = signature_of([jax.typeof(x) for x in xs])
        return self.entry(sig).call(*xs)
