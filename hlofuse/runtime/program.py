"""Re-injection: run an optimized StableHLO module through XLA so it composes like ``jax.jit``.

Route chosen (facts §4 compares three): **B, an ``Exported`` with a rewritten payload**, wrapped
in a JAX primitive of our own.

``jax.export.export`` gives the module plus its calling convention (avals, platform checks); we
optimize the module and put it back with ``dataclasses.replace(exp, mlir_module_serialized=...)``.
Route A (raw ``compile_and_load``) has no dtype checks and no transformations; route C (mutating
a ``Lowered``) poisons JAX's caches (H1/H4) and cannot be used under jit or grad.

A :class:`Program` is one flat function (``fun(*arrays) -> tuple of arrays``) that hlofuse
optimizes, with one :class:`Entry` (export + optimize) per input signature and target. It is
called through the primitive ``hlofuse_call`` whose rules make it a first-class JAX citizen:

* **abstract eval**: the output avals of the traced function (traced once per signature);
* **lowering**: the optimized ``Exported`` of the signature, inlined into the caller's module
  (``compat.lower_fun(exp.call)``), built lazily for the platform being lowered for;
* **jvp**: a derived forward ``fwd(f)`` returns the primal outputs *and* the residuals of
  ``jax.linearize(f)``; a derived tangent program ``jvp(f)`` maps (residuals, tangents) to
  output tangents, linear in the tangents. Both are optimized;
* **transpose** (for derived linear programs): a derived program ``T(g)`` = the VJP of ``g``
  with respect to its linear inputs, optimized. ``grad`` = jvp + partial eval + transpose, so
  the forward runs ``fwd(f)`` once and the backward ``T(jvp(f))`` consumes its residuals:
  nothing is recomputed (like ``jax.jit(jax.grad(f))``), except in a program with attention:
  ``fwd(f)`` then linearizes under a ``jax.checkpoint`` policy that saves products and
  everything but cheap ops, and not attention's probabilities, which ``T(jvp(f))`` recomputes
  (:data:`GRAD_REMAT_NOTE`), so both programs get attention kernels;
  A user's own program reaching a transpose (``jax.linear_transpose``, the matvec of a
  non-symmetric ``custom_linear_solve`` under ``grad``) is transposed with
  ``jax.linear_transpose``, which refuses a non-linear one as for ``jax.jit``;
* **batching**: a derived program ``vmap(f)`` with the batched axes moved to the front;
* **Taylor mode** (``jax.experimental.jet``): a derived program ``jet(f)`` to the order asked.

Because every rule only derives new programs, everything composes: ``jit``, ``grad``, ``vjp``,
``jvp``, ``linearize``, ``hessian``, ``vmap``, ``scan``/``cond``/``while`` bodies,
``jax.checkpoint`` and ``shard_map`` bodies, at any nesting depth, and each derived program is
fused too. Host callbacks (``jax.debug.print``, ``jax.debug.callback``, ``pure_callback``,
unordered ``io_callback``, and the library checks built on them, such as Equinox's
``error_if`` in diffrax, optimistix and lineax) go through export as placeholders and are put
back where the module is inlined (:mod:`hlofuse.runtime.host_callbacks`): the code around them is
optimized. Functions with ordered effects cannot go through ``jax.export``'s module as
hlofuse inlines it; they are inlined as traced and run with plain XLA
(:meth:`Program.runs_as_traced`; the report says so), as is a signature whose export is
refused for a callback no placeholder caught (a library primitive that emits one itself).

Building an entry is serialized per program by a lock, so concurrent first calls compile once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import threading
import warnings
import weakref
from typing import Callable, Sequence

import numpy as np

import jax
import jax.numpy as jnp
from jax import export as jexport
from jax.extend import core as jex_core

from hlofuse.core import compat
from hlofuse.core import config
from hlofuse.core.compat import ad, batching
from hlofuse.core import ir as hir
from hlofuse.runtime import host_callbacks
from hlofuse.runtime.api import Optimized, optimize
from hlofuse.kernels.attention import blocks as attention_blocks
from hlofuse.kernels.attention import cpu as attention_cpu
from hlofuse.kernels.lowering import isolated
from hlofuse.core.pipeline import is_config_error, trace
from hlofuse.core.report import HlofuseWarning, Report
from hlofuse.core.target import CPU, Target
from hlofuse.passes import kernelize
from hlofuse.passes.fusion import cost as cost_model
from hlofuse.runtime import autotune as at
from hlofuse.runtime import module_cache
from hlofuse.runtime.kernel_choice import (apply_cached_decisions, hold_back_unmeasured,
                                           measuring_options, without_kernels)
from hlofuse.runtime.verify import unoptimized, verify_regions

log = logging.getLogger("hlofuse")

Signature = tuple  # tuple of (shape, dtype, weak_type) per flat input



#: what the report says of a function that runs as traced (:meth:`Program.runs_as_traced`)
TRACED_NOTE = ("left to XLA whole: the function has ordered side effects "
               "(jax.debug.print(ordered=True), io_callback(ordered=True)) or calls back into "
               "Python in a way jax.export cannot serialize, so hlofuse runs it as traced with "
               "plain XLA")

_FAILED_ONCE: set = set()


def machinery_failed(where: str, e: BaseException, name: str, then: str) -> str:
    """The one way hlofuse's own machinery (building, verifying, tuning, its caches) reports
    a failure it recovered from: the note for the report, naming what failed and where, and
    what the call does instead (``then``); warned (:class:`HlofuseWarning`) and logged once
    per function, step and error. Configuration errors (:func:`is_config_error`) and
    ``options={'strict': True}`` never reach here: they are raised."""
    msg = str(e).strip().splitlines()
    what = f"{type(e).__name__}: {msg[0][:300] if msg else ''}"
    note = (f"hlofuse's {where} failed for {name} ({what}); {then}. Nothing of it is cached; "
            f"options={{'strict': True}} raises instead")
    once = (name, where, what)
    if once not in _FAILED_ONCE:
        _FAILED_ONCE.add(once)
        log.warning("%s", note, exc_info=log.isEnabledFor(logging.DEBUG))
        warnings.warn(HlofuseWarning(note), stacklevel=3)
    return note


def _all_eqns(jaxpr):
    """The equations of ``jaxpr`` and of every jaxpr nested in them (scan, cond, pjit,
    custom_vjp bodies)."""
    yield from jaxpr.eqns
    for sub in compat.subjaxprs(jaxpr):
        yield from _all_eqns(sub)


def _is_host_callback_refusal(e: BaseException) -> bool:
    """Whether ``e`` is ``jax.export``'s refusal of a module that calls back into Python."""
    return isinstance(e, NotImplementedError) and "serialization of host_callbacks" in str(e)


def lower_traced(traced, platform: str, name: str):
    """``traced.lower`` for ``platform``, with jax's refusal to lower host callbacks for
    another platform than the machine's (``jax.jit`` refuses the same) said plainly."""
    try:
        return traced.lower(lowering_platforms=(platform,))
    except ValueError as e:
        if "different from the lowering platform" not in str(e):
            raise
        raise ValueError(
            f"{name}: cannot lower for {platform} on this {jax.default_backend()} machine: the "
            "function calls back into Python on the host (jax.debug.print, jax.debug.callback, "
            "pure_callback or io_callback), and jax lowers host callbacks only for the platform "
            "it runs on (jax.jit(f).trace(...).lower(lowering_platforms=...) refuses too). "
            f"Lower it on a {platform} machine, or take the callbacks out.") from e


def signature_of(avals: Sequence) -> Signature:
    """Hashable identity of flat input avals: shape, dtype (object, not its name: cheap) and
    weak type."""
    return tuple((tuple(a.shape), np.dtype(a.dtype), bool(getattr(a, "weak_type", False)))
                 for a in avals)


def sds(sig: Signature) -> list[jax.ShapeDtypeStruct]:
    return [jax.ShapeDtypeStruct(s, d, weak_type=w) for s, d, w in sig]


GRAD_REMAT_NOTE = ("grad: this forward saves no attention intermediates for the backward "
                   "program, which recomputes them from the attention's inputs (a "
                   "jax.checkpoint policy saving products and everything but cheap ops), so "
                   "both programs get attention kernels; HLOFUSE_GRAD_REMAT=0 saves them as "
                   "jax.linearize does")


def _attention_dots(closed, exp_shapes: frozenset) -> frozenset:
    """The batched ``dot_general`` s of the jaxpr (and its sub-jaxprs) that look like
    attention's two products: the logits QKᵀ (its result has the sizes of an ``exp`` result)
    and P·V (an operand has them). As ``(lhs shape, rhs shape, dimension numbers)``; shapes, not
    equations, because the softmax is often in another sub-jaxpr (``jax.nn.softmax``,
    ``dot_product_attention``) than the products. ``exp_shapes``: :func:`_exp_shapes` of
    ``closed``."""
    dots = []
    for eqn in _all_eqns(closed.jaxpr):
        if eqn.primitive.name == "dot_general" and eqn.params["dimension_numbers"][1][0]:
            dots.append((tuple(eqn.invars[0].aval.shape), tuple(eqn.invars[1].aval.shape),
                         tuple(eqn.outvars[0].aval.shape), eqn.params["dimension_numbers"]))

    # (batch + query + key dims: rank 3 at least; layouts differ between the products and
    # the softmax, e.g. dot_product_attention's [B, K, T, G, S] logits, so shapes compare as
    # their sorted non-unit sizes)
    def like(shape) -> bool:
        return len(shape) >= 3 and _nonunit(shape) in exp_shapes
    return frozenset((lhs, rhs, _dn_key(dn)) for lhs, rhs, res, dn in dots
                     if like(res) or like(lhs) or like(rhs))


def _exp_shapes(closed) -> frozenset:
    """The sorted non-unit sizes of every ``exp`` result in the jaxpr (a softmax's)."""
    return frozenset(_nonunit(eqn.outvars[0].aval.shape) for eqn in _all_eqns(closed.jaxpr)
                     if eqn.primitive.name == "exp")


def _nonunit(shape) -> tuple:
    return tuple(sorted(int(n) for n in shape if n != 1))


def _dn_key(dn) -> tuple:
    return tuple(tuple(tuple(int(d) for d in x) for x in part) for part in dn)


# recomputed in the backward (not saved as residuals): the cheap ops a softmax, a norm or an
# activation is made of; attention's products are recomputed too (:func:`_attention_dots`)
_RECOMPUTE = frozenset("""
    exp exp2 log log1p expm1 tanh logistic erf erfc erf_inv sin cos sqrt rsqrt cbrt pow
    integer_pow square abs sign neg add add_any sub mul div max min rem select_n clamp
    convert_element_type broadcast_in_dim reshape transpose squeeze expand_dims
    reduce_max reduce_min reduce_sum reduce_prod argmax argmin iota eq ne lt le gt ge
    and or not xor is_finite stop_gradient copy copy_p nextafter real imag conj
    reduce_precision one_minus_square
    """.split())


def _attention_remat_policy(attention_dots: frozenset, exp_shapes: frozenset):
    """A ``jax.checkpoint`` policy for a program with attention: saveable is what is not in
    :data:`_RECOMPUTE` and no attention product (projections and other products,
    convolutions, gathers, loops, custom calls), so the backward recomputes the attention from
    its inputs and its probabilities are no residual: the forward program gets a forward
    kernel, the backward program a flash forward and backward. A ``custom_jvp_call`` whose
    result has a softmax's sizes (``exp_shapes``: ``jax.nn.softmax`` as jax 0.12.1 keeps it
    whole under ``jax.checkpoint``; earlier releases showed the policy its ops) is the softmax:
    recomputed too."""
    def policy(prim, *avals, **params) -> bool:
        if prim.name == "dot_general":
            key = (tuple(avals[0].shape), tuple(avals[1].shape),
                   _dn_key(params["dimension_numbers"]))
            return key not in attention_dots
        if prim.name == "custom_jvp_call" and avals:
            return _nonunit(avals[0].shape) not in exp_shapes
        return prim.name not in _RECOMPUTE
    return policy


def _inexact(dtype) -> bool:
    return jnp.issubdtype(dtype, jnp.inexact)


@dataclasses.dataclass
class Options:
    """How a program is optimized. ``target`` None: the platform it is lowered for."""
    target: Target | None
    pipeline: object = None
    disable: tuple = ()
    pass_options: dict = dataclasses.field(default_factory=dict)
    dump_dir: str | None = None
    check: bool = False
    # hlofuse.jit's autotune setting: unless it is 'off', regions whose kernel a measurement
    # on this device found slower than XLA's code (cached decisions) are built without kernel
    autotune: object = None


@dataclasses.dataclass
class Entry:
    """One optimized signature of a :class:`Program`."""
    exported: jexport.Exported | None   # None: left to plain XLA (see Program.plain_entry)
    optimized: Optimized
    out_avals: tuple
    in_avals: tuple = ()
    target: Target = CPU
    #: the outlined host callbacks, by placeholder index (:mod:`hlofuse.runtime.host_callbacks`)
    callbacks: tuple = ()

    @property
    def report(self):
        return self.optimized.report


def export_optimized(fun: Callable, sig: Signature, opts: Options, *, name: str = "fun",
                     donated: Sequence[int] = (), target: Target | None = None,
                     shardings: tuple | None = None, spmd_devices: int = 1,
                     jaxpr: compat.ClosedJaxpr | None = None
                     ) -> tuple[jexport.Exported, Optimized, tuple]:
    """Export ``fun`` (flat arrays -> flat arrays) for the target and optimize its module.
    Returns the ``Exported``, the optimized module and its outlined host callbacks
    (:mod:`hlofuse.runtime.host_callbacks`; the module holds a placeholder for each).

    ``shardings``: the ``NamedSharding`` of every input when known: the module is exported with
    them, so ``propagate-shardings`` and ``kernelize`` build kernels that run per shard.
    ``spmd_devices``: the number of devices of the SPMD program the module is inlined into;
    with more than one and no known shardings, gpu/tpu kernels are not built (XLA cannot
    partition a Pallas custom call: it would gather the kernel's operands).
    ``jaxpr``: ``fun``'s traced function when known: a second process finds the optimized
    ``Exported`` by it in the module cache's traced entries without exporting again."""
    target = target or Target.of(opts.target)
    platform = target.platform
    blind, pass_options, learned, hold, tkey = _export_plan(
        sig, opts, target, name, donated, shardings, spmd_devices, jaxpr)
    decisions = at.mode(opts.autotune, platform) != "off"
    traced = module_cache.load_traced(tkey) if tkey else None
    if traced is not None:
        exp, module, report = traced
        return (*_decided(exp, Optimized(module, report), decisions, hold), ())
    jitted = jax.jit(fun) if shardings is None else jax.jit(fun, in_shardings=shardings)
    slots = host_callbacks.Slots()
    exp0 = jexport.export(
        jitted, platforms=[platform], _override_lowering_rules=host_callbacks.export_rules(slots),
        # every custom call target: the module is inlined in this process, where jax.jit
        # runs the same targets (LAPACK's ormqr has no compatibility guarantee, say)
        disabled_checks=[jexport.DisabledSafetyCheck.custom_call("ALL")],
    )(*sds_of(sig, shardings))
    # the module's arguments are the ones jax kept (an unused one is dropped): donation by
    # the module's own positions
    kept = sorted(exp0.module_kept_var_idx)
    donated = [kept.index(i) for i in donated if i in kept]
    ckey = _module_cache_key(exp0, opts, target, name, donated, learned, pass_options)
    try:  # an optimization never makes a program fail (options={'strict': True} re-raises)
        opt = _optimized(exp0, ckey, opts, target, name, donated, learned, pass_options,
                         blind=blind and spmd_devices)
        optimized = True
    except Exception as e:  # noqa: BLE001 - the boundary: the program runs unoptimized, the report says why
        opt = unoptimized(exp0, dataclasses.replace(opts, target=target), name=name, error=e)
        optimized = False
    checks = tuple(exp0.disabled_safety_checks)
    if target.is_gpu:
        checks += (jexport.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton"),)
    exp = dataclasses.replace(exp0, mlir_module_serialized=hir.to_bytecode(opt.module),
                              disabled_safety_checks=checks, _get_vjp=None)
    if tkey and optimized and not slots:  # callbacks are this process's: not cached traced
        try:
            module_cache.store_traced(tkey, exp.serialize(), opt.report)
        except Exception:  # noqa: BLE001 - an Exported jax cannot serialize is simply not cached
            pass
    exp, opt = _decided(exp, opt, decisions, hold)
    if slots:
        opt.report.note(
            f"host callbacks: {len(slots)} call(s) back into Python "
            f"({', '.join(sorted({str(x.primitive) for x in slots}))}) stay where they are, "
            f"with XLA; the code around them is optimized")
    return exp, opt, tuple(slots)


def _optimized(exp0, ckey, opts: Options, target: Target, name: str, donated, learned,
               pass_options: dict, *, blind: int) -> Optimized:
    """The exported module optimized: from the module cache (``ckey``), else through the
    pipeline (and verified with ``check=True``), then stored there. ``blind``: the number
    of SPMD devices when kernels were not built for want of input shardings (0: they were)."""
    hit = module_cache.load(ckey) if ckey else None
    if hit is not None:
        return Optimized(*hit)
    with cost_model.learned_model(target.kind, learned):
        opt = optimize(exp0.mlir_module(), target=target, pipeline=opts.pipeline,
                       disable=opts.disable, dump_dir=opts.dump_dir, options=pass_options,
                       source=name, donated_args=donated)
    if blind:
        opt.report.note(
            f"kernels not built: this program runs inside an SPMD program over {blind} "
            f"devices with input shardings hlofuse does not know, and XLA cannot partition a "
            f"{target.kind} kernel (it would gather its operands); pass in_shardings= to "
            f"hlofuse.jit, or call it with sharded arrays, for per-shard kernels")
    if opts.check:
        with trace("verify", function=name):
            opt = verify_regions(exp0, opt, dataclasses.replace(opts, target=target), name=name)
    if ckey:
        module_cache.store(ckey, opt.module, opt.report)
    return opt


def _decided(exp, opt: Optimized, decisions: bool, hold: bool):
    """``(exp, opt)`` with the cached measured decisions applied (regions measured slower
    as kernels run as XLA's code) and, on gpu/tpu before measuring, unmeasured kernels held
    back; ``exp`` carries the module that results, in the form XLA compiles
    (``Optimized.bytecode``: regions left to XLA inlined; ``opt`` keeps them as calls, as the
    module cache stores them)."""
    if decisions:
        opt = apply_cached_decisions(opt)
        if hold:
            opt = hold_back_unmeasured(opt)
    return dataclasses.replace(exp, mlir_module_serialized=opt.bytecode), opt


def _export_plan(sig: Signature, opts: Options, target: Target, name: str, donated,
                 shardings, spmd_devices: int, jaxpr):
    """What :func:`export_optimized` decides before exporting: ``(blind, pass_options,
    learned, hold, traced_key)`` (blind: kernels not built, see there; hold: every kernel is
    built and the unmeasured ones held back after, :func:`measuring_options`; traced_key: the
    module cache's traced entry, None when it has none)."""
    pass_options = opts.pass_options
    blind = shardings is None and spmd_devices > 1 and not target.is_cpu
    if blind:
        pass_options = dict(pass_options, kernelize=dict(pass_options.get("kernelize", {}),
                                                         no_kernels=True))
    decisions = at.mode(opts.autotune, target.platform) != "off"
    learned = learned_for(target) if decisions else None
    hold = False
    if decisions and measurable(target):
        measuring = measuring_options(pass_options, target)
        hold = measuring is not pass_options
        pass_options = measuring
    tkey = (_traced_cache_key(jaxpr, sig, opts, target, name, donated, learned, pass_options,
                              shardings, spmd_devices) if jaxpr is not None else None)
    return blind, pass_options, learned, hold, tkey


def measurable(target: Target) -> bool:
    """Whether this process can time ``target``'s kernels: its platform is jax's default
    backend (a gpu program lowered on a cpu host is compiled elsewhere, unmeasured)."""
    here = Target.from_platform(jax.default_backend())
    return here is not None and here.kind == target.kind


def _traced_cache_key(closed, sig: Signature, opts: Options, target: Target, name: str,
                      donated, learned, pass_options: dict, shardings, spmd_devices: int):
    """The module cache's traced key (:func:`module_cache.load_traced`): everything the
    exported module and the optimization depend on, known before export; None when the cache
    is off or bypassed, or when the traced function cannot be keyed reliably."""
    if not module_cache.enabled() or opts.dump_dir:
        return None
    digest = _jaxpr_digest(closed)
    if digest is None:
        return None
    context = _context_text()
    if " at 0x" in context:
        return None
    return module_cache.key(digest, {
        "traced": True, "signature": repr(sig), "shardings": repr(shardings),
        "spmd_devices": spmd_devices, "platform": target.platform, "trace_context": context,
        **_optimization_key(opts, target, name, donated, learned, pass_options)})


def _optimization_key(opts: Options, target: Target, name: str, donated, learned,
                      pass_options: dict) -> dict:
    """What the optimization of an exported module depends on besides the module: the key
    fields both module-cache entries (traced and exported) share, so neither can miss one."""
    return {
        "target": target.kind, "chip": target.chip_name, "pipeline": opts.pipeline,
        "disable": list(opts.disable),
        "options": pass_options, "check": opts.check, "donated": list(donated), "name": name,
        "learned": dataclasses.asdict(learned) if learned is not None else None,
        # the environment's settings that change a program (hlofuse.core.config), the cpu
        # attention split, step budgets and whole rows as in effect (a harness may set them in
        # the kernels' modules; the host's L2 they derive from is in the key through hostcpu,
        # whole rows from the release and XLA_FLAGS)
        "settings": dict(config.program_key(),
                         HLOFUSE_CPU_ATTENTION_PARTS=attention_cpu.cpu_parts()),
        "cpu_attention_budgets": list(attention_blocks.cpu_budgets()),
        "cpu_attention_whole_rows": (attention_blocks.cpu_whole_rows_key() if target.is_cpu
                                     else None)}


def _context_text() -> str:
    """jax's tracing/lowering configuration (what jax keys its own caches by) as text; the
    axis environment by its contents (its repr is an address)."""
    parts = []
    for v in compat.trace_context():
        if isinstance(v, compat.AxisEnv):
            v = ("AxisEnv", sorted(map(repr, v.axis_sizes.items())),
                 sorted(map(repr, v.spmd_axis_names)), sorted(map(repr, v.explicit_mesh_axis_names)))
        parts.append(repr(v))
    return "(" + ", ".join(parts) + ")"


def context_movable() -> bool:
    """Whether a program built in another thread would be built as in this one: jax's
    tracing/lowering configuration here (thread-local settings such as
    ``jax.default_matmul_precision`` or ``jax.numpy_rank_promotion`` used as context
    managers) equals that of a fresh thread. Mesh contexts do not count: builds run
    :func:`~hlofuse.kernels.lowering.isolated` from them."""
    def text():
        with isolated():
            return _context_text()
    here, there = text(), []
    t = threading.Thread(target=lambda: there.append(text()), name="hlofuse-context-probe")
    t.start()
    t.join()
    return bool(there) and there[0] == here


#: closed jaxpr -> its digest: a signature's key is asked for twice (the tiered first call's
#: ``Program.is_built``, then the build), and hashing constants closed over costs ~1 ms per MB
_DIGESTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _jaxpr_digest(closed) -> bytes | None:
    """sha256 of a closed jaxpr: its text with source locations and name stacks, and the bytes
    of every constant (also those of closed sub-jaxprs and array-valued parameters, which the
    text does not show). None when some part has no faithful text (an object printed by its
    address) or a constant is a tracer. Memoized per jaxpr object (jaxprs are immutable)."""
    try:
        return _DIGESTS[closed]
    except (KeyError, TypeError):
        pass
    digest = _jaxpr_digest_of(closed)
    try:
        _DIGESTS[closed] = digest
    except TypeError:   # not weakly referenceable: not memoized
        pass
    return digest


def _jaxpr_digest_of(closed) -> bytes | None:
    """The digest itself (:func:`_jaxpr_digest`). Parameters the text does not show are hashed
    too: array values, an inner ``hlofuse.jit`` call's program (its own traced digest for the
    call's inputs, and how it is optimized: the text prints only its name, so two nested
    functions with other constants or static values shared one cache entry and the second
    ran the first's module), and the fields of dataclass parameters, with the text of the
    jaxprs inside them (``pallas_call``'s grid mapping prints no block index maps: two
    kernels differing only there shared an entry)."""
    import hashlib
    try:
        text = compat.jaxpr_body(closed).pretty_print(source_info=True, name_stack=True)
    except Exception:  # noqa: BLE001 - a jaxpr that does not print is not keyed
        return None
    if " at 0x" in text:
        return None
    h = hashlib.sha256(text.encode())
    todo = [closed]
    seen: set = set()
    while todo:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if compat.is_jaxpr(item):
            # 0.10.2: a ClosedJaxpr's consts, then its Jaxpr's equations; 0.11+: one Jaxpr
            # carries both (its ``.jaxpr`` is itself)
            for c in compat.jaxpr_consts(item):
                if isinstance(c, compat.Tracer):
                    return None
                a = np.asarray(c)
                h.update(f"{a.dtype}{a.shape}".encode())
                h.update(np.ascontiguousarray(a).tobytes())
            body = compat.jaxpr_body(item)
            if body is not item:
                todo.append(body)
            else:
                for eqn in item.eqns:
                    if eqn.primitive is hlofuse_call_p:
                        inner = _inner_program_key(eqn)
                        if inner is None:
                            return None
                        h.update(inner)
                        continue
                    todo.extend(eqn.params.values())
        elif isinstance(item, (tuple, list)):
            todo.extend(item)
        elif isinstance(item, (np.ndarray, jax.Array)) and np.ndim(item) > 0:
            a = np.asarray(item)
            h.update(f"param{a.dtype}{a.shape}".encode())
            h.update(np.ascontiguousarray(a).tobytes())
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            if not _hash_fields(item, h, todo, 0):
                return None
    return h.digest()


def _hash_fields(obj, h, todo: list, depth: int) -> bool:
    """Hash a dataclass parameter's fields (a jaxpr by its text, its constants through
    ``todo``; nested dataclasses and sequences recursively; anything else by its repr).
    False when some field has no faithful text (an address) or the nesting is too deep."""
    if depth > 8:
        return False
    h.update(f"<{type(obj).__qualname__}".encode())
    values = ([getattr(obj, f.name, None) for f in dataclasses.fields(obj)]
              if dataclasses.is_dataclass(obj) else list(obj))
    for v in values:
        if compat.is_jaxpr(v):
            try:
                h.update(compat.jaxpr_body(v).pretty_print(source_info=False).encode())
            except Exception:  # noqa: BLE001 - not printable: not keyed
                return False
            todo.append(v)
        elif (dataclasses.is_dataclass(v) and not isinstance(v, type)) or isinstance(v, (tuple, list)):
            if not _hash_fields(v, h, todo, depth + 1):
                return False
        elif isinstance(v, (np.ndarray, jax.Array)) and np.ndim(v) > 0:
            todo.append(v)
        else:
            r = repr(v)
            if " at 0x" in r:
                return False
            h.update(r.encode())
    h.update(b">")
    return True


def _inner_program_key(eqn) -> bytes | None:
    """What an ``hlofuse_call`` equation computes: its program's traced digest for the call's
    inputs and its options; None when that has no key."""
    program = eqn.params["program"]
    try:
        inner = program.jaxpr(signature_of([v.aval for v in eqn.invars]))
    except Exception:  # noqa: BLE001 - a call that cannot be traced again is not keyed
        return None
    digest = _jaxpr_digest(inner)
    if digest is None:
        return None
    import json
    o = program.opts
    extra = json.dumps({   # sorted: the same options in another order are the same key
        "target": repr(o.target), "pipeline": repr(o.pipeline), "disable": list(o.disable),
        "options": o.pass_options, "check": o.check, "autotune": repr(o.autotune),
        "shardings": repr(getattr(program, "shardings", None)),
        "linear": list(getattr(program, "linear", ()) or ()),
        "donated": list(getattr(program, "donated", ()) or ())}, sort_keys=True, default=repr)
    if " at 0x" in extra:
        return None
    return b"hlofuse_call:" + digest + extra.encode()


def _module_cache_key(exp0, opts: Options, target: Target, name: str, donated, learned,
                      pass_options: dict):
    """The persistent module cache's key (:mod:`hlofuse.runtime.module_cache`), or None when it
    is off, bypassed (``dump_dir``) or the options cannot be keyed."""
    if not module_cache.enabled() or opts.dump_dir:
        return None
    return module_cache.key(exp0.mlir_module_serialized,
                            _optimization_key(opts, target, name, donated, learned, pass_options))


_FITS: dict = {}


def learned_for(target: Target):
    """The cost model fitted on this device's measurements for ``target``'s kind (records in
    the decision cache), or None; refitted only when the records change."""
    try:
        dev = at.device_key()
        rule = at.record_rule()
        recs = [r for r in at.cache().records() if r.get("device") == dev
                and r.get("target") == target.kind and r.get("rule") == rule]
    except Exception:  # noqa: BLE001 - a decision cache never breaks a compile
        return None
    import json
    key = (target.kind, dev, json.dumps(recs, sort_keys=True))
    if key not in _FITS:
        _FITS[key] = cost_model.fit(recs) if recs else None
    return _FITS[key]


class _Derived:
    """The programs a :class:`Program` derives for JAX's transformations (the forward with
    residuals, tangent and transpose under ``jax.grad``, Taylor series under ``jet``, batched
    under ``vmap``, lifted closed-over tracers), each optimized like any program and cached
    in ``derived``. A base of :class:`Program` (which provides ``fun``, ``opts``, ``name``,
    ``linear``, ``donated``, ``shardings``, ``jaxpr``, ``traced_fun`` and ``build_notes``)."""

    def lifted(self, sig: Signature) -> "Program":
        """``(closed-over tracers..., x...) -> outputs``: the traced function with the tracers
        of an enclosing transformation it closes over turned into inputs."""
        def make():
            closed = self.jaxpr(sig)
            is_tracer = [isinstance(c, compat.Tracer) for c in closed.consts]
            fixed = [None if t else c for c, t in zip(closed.consts, is_tracer)]
            jaxpr = compat.convert_constvars_jaxpr(compat.jaxpr_body(closed))
            k = sum(is_tracer)

            def fun(*args):
                it = iter(args)
                consts = [next(it) if t else c for c, t in zip(fixed, is_tracer)]
                return tuple(compat.eval_jaxpr(jaxpr, [], *consts, *it))
            return Program(fun, self.opts, name=self.name, linear=(),
                           donated=[d + k for d in self.donated])
        return self._derive(("lifted", sig), make)

    def _derive(self, key: tuple, make: Callable[[], "Program"]) -> "Program":
        with self._lock:
            p = self.derived.get(key)
            if p is None:
                p = self.derived[key] = make()
                p.derived_from = key[0]
            return p

    def linearize_program(self, nonzero: tuple) -> "Program":
        """``(x...) -> (outputs..., residuals...)``: the forward that also returns what the
        tangent (and so the backward) program needs, from ``jax.linearize`` with respect to
        the inputs whose tangents are ``nonzero``. ``res_trees[sig]`` holds the structure of
        the linearized function the residuals rebuild."""
        n = len(nonzero)
        nz_idx = [i for i in range(n) if nonzero[i]]

        def make():
            prim = self.traced_fun
            res_trees: dict = {}

            def forward(*xs):
                def restricted(*v):
                    full = list(xs)
                    for i, vi in zip(nz_idx, v):
                        full[i] = vi
                    return prim(*full)
                sig = signature_of([jax.typeof(x) for x in xs])
                closed = self.jaxpr(sig)
                exps = _exp_shapes(closed)
                att = _attention_dots(closed, exps)
                # not with effects: the recomputed forward would run the function's callbacks
                # again (3 debug.callback calls per grad where jax.jit makes 1), and jax's
                # remat has no rule for IO effects (io_callback: NotImplementedError)
                if att and config.get("HLOFUSE_GRAD_REMAT") and not closed.effects:
                    restricted = jax.checkpoint(restricted,
                                                policy=_attention_remat_policy(att, exps))
                    p.build_notes[sig] = [GRAD_REMAT_NOTE]
                out, f_jvp = jax.linearize(restricted, *[xs[i] for i in nz_idx])
                res, tree = jax.tree_util.tree_flatten(f_jvp)
                res_trees[sig] = tree
                return (*out, *res)
            p = Program(forward, self.opts, name=f"fwd({self.name})",
                        shardings=self.shardings)  # the same inputs as the primal
            p.res_trees = res_trees
            return p
        return self._derive(("linearize", nonzero), make)

    def tangent_program(self, nonzero: tuple, sig: Signature) -> "Program":
        """``(residuals..., t_nz...) -> tangent outputs of inexact dtype``, linear in
        ``t_nz``; its transpose is the backward, which reuses the residuals (no forward
        recomputation)."""
        fwd = self.linearize_program(nonzero)

        def make():
            fwd.jaxpr(sig)                      # traces the forward: records res_trees[sig]
            tree = fwd.res_trees[sig]
            n_res = tree.num_leaves
            out_avals = self.jaxpr(sig).out_avals

            def tangent(*args):
                f_jvp = jax.tree_util.tree_unflatten(tree, args[:n_res])
                t_out = f_jvp(*args[n_res:])
                return tuple(t for t, a in zip(t_out, out_avals) if _inexact(a.dtype))
            return Program(tangent, self.opts, name=f"jvp({self.name})",
                           linear=range(n_res, n_res + sum(nonzero)))
        return self._derive(("tangent", nonzero, sig), make)

    def transpose_program(self, n_in: int, lin: tuple, linear_avals: tuple,
                          ct_nonzero: tuple) -> "Program":
        """``(non-linear inputs..., nonzero cotangents...) -> cotangents of the linear inputs``
        (positions ``lin``), by ``jax.linear_transpose`` over the program's trace, as
        ``jax.grad`` transposes a linearized function: a tangent program's ``custom_lin`` (what
        a ``jax.custom_vjp`` linearizes to) has a transpose rule and no derivative. A user's
        function (``jax.linear_transpose`` of it, the matvec of a ``custom_linear_solve`` under
        ``jax.grad``) fails as for ``jax.jit`` when it is not linear."""
        n_nonlin = n_in - len(lin)

        def make():
            fn = self.traced_fun

            def transposed(*args):
                nonlin, cts = args[:n_nonlin], iter(args[n_nonlin:])

                def restricted(*lv):
                    nl, li = iter(nonlin), iter(lv)
                    return fn(*[next(li) if i in lin else next(nl) for i in range(n_in)])
                zeros = [_zeros(s, d, sh, weak) for s, d, sh, weak in linear_avals]
                outs = jax.eval_shape(restricted, *zeros)
                pull = jax.linear_transpose(restricted, *zeros)
                full = [next(cts) if nz else jnp.zeros_like(o) for o, nz in zip(outs, ct_nonzero)]
                return tuple(pull(tuple(full)))
            return Program(transposed, self.opts, name=f"T({self.name})",
                           linear=range(n_nonlin, n_nonlin + sum(ct_nonzero)))
        return self._derive(("T", n_in, lin, linear_avals, ct_nonzero), make)

    def jet_program(self, order: int) -> "Program":
        """``(primals..., series...) -> (primal outputs..., output series...)``: the Taylor
        propagation of ``jax.experimental.jet`` to ``order``, each input's and output's
        ``order`` terms flattened in a row, optimized like any program."""
        def make():
            from jax.experimental.jet import jet
            fn = self.traced_fun

            def jetted(*xs):
                n = len(xs) // (order + 1)
                series = tuple(list(xs[n + i * order:n + (i + 1) * order]) for i in range(n))
                p_out, s_out = jet(lambda *a: tuple(fn(*a)), tuple(xs[:n]), series,
                                   factorial_scaled=False)   # as jet's rules take them
                return (*p_out, *[t for s in s_out for t in s])
            return Program(jetted, self.opts, name=f"jet({self.name})")
        return self._derive(("jet", order), make)

    def batched_program(self, in_batched: tuple) -> "Program":
        axes = tuple(0 if b else None for b in in_batched)

        def make():
            fn = self.traced_fun
            return Program(lambda *xs: tuple(jax.vmap(fn, in_axes=axes)(*xs)), self.opts,
                           name=f"vmap({self.name})", linear=self.linear)
        return self._derive(("vmap", in_batched), make)



def _zeros(shape, dtype, sharding, weak: bool):
    """Zeros of a linear input's type, weakly typed where it is (a Python float argument):
    the transpose's cotangents take these types, and jax.grad of a weak input is weak under
    jax.jit (a strong f32 gradient turned ``grad * bf16_array`` into f32; adversarial round)."""
    if weak and sharding is None:
        z = jax.lax.full(shape, {"f": 0.0, "c": 0j, "i": 0}.get(np.dtype(dtype).kind, False))
        if z.dtype == dtype and getattr(jax.typeof(z), "weak_type", False):
            return z
    return jnp.zeros(shape, dtype, out_sharding=sharding)


class Program(_Derived):
    """A flat function hlofuse optimizes: ``fun(*arrays) -> tuple of arrays``.

    Args:
      fun: the flat function.
      opts: how to optimize it.
      name: for reports and warnings.
      linear: input positions the function is linear in (derived jvp/transpose programs);
        needed by the transpose rule.
      donated: flat input positions the caller donates (the buffer-aliasing pass's audit).
    """

    def __init__(self, fun: Callable, opts: Options, *, name: str = "fun",
                 linear: Sequence[int] = (), donated: Sequence[int] = (),
                 shardings: tuple | None = None):
        self.fun = fun
        self.shardings = shardings      # NamedSharding per flat input, when known
        self.opts = opts
        self.name = name
        self.linear = tuple(linear)
        self.donated = tuple(donated)
        # signature -> (output pytree, each output's PRNG key impl or () if none is a key);
        # set by hlofuse.jit's traced function
        self.out_trees: dict = {}
        self._jaxprs: dict[Signature, compat.ClosedJaxpr] = {}
        self._as_traced: dict[Signature, bool] = {}
        self._entries: dict[tuple, Entry] = {}
        self.derived: dict[tuple, Program] = {}
        self.derived_from = None    # the transformation this program was derived for
        # notes for the report of a signature's build, from how the program was derived
        self.build_notes: dict[Signature, list[str]] = {}
        self._lock = threading.RLock()
        self.builds = 0                 # optimized entries built (tests and reports)
        self.variants: dict[tuple, Program] = {}  # with_xla(...) programs

    def with_xla(self, hashes, full: bool = False) -> "Program":
        """This program with the kernels of the regions whose hash is in ``hashes`` replaced
        by the regions' own ops (measured decisions; the variants autotune times).
        ``full``: from the module with every kernel built (``Optimized.full``, where unmeasured
        kernels are held back): only ``hashes`` run as XLA's code."""
        hashes = frozenset(hashes)
        if not hashes and not full:
            return self
        with self._lock:
            p = self.variants.get((hashes, full))
            if p is None:
                p = self.variants[(hashes, full)] = _XlaVariant(self, hashes, full)
            return p

    def with_settings(self, settings: tuple) -> "Program":
        """This program optimized with some pass options set (``settings``: sorted
        ``(pass, option, value)`` triples, autotune's kernel variants such as a cpu attention
        step budget, :data:`hlofuse.runtime.autotune.KERNEL_VARIANTS`): the same traced
        function and jaxprs, entries of its own (the module cache keys on the options)."""
        settings = tuple(settings)
        if not settings:
            return self
        with self._lock:
            p = self.variants.get(("settings", settings))
            if p is None:
                p = self.variants[("settings", settings)] = _SettingsVariant(self, settings)
            return p

    def typed(self, avals) -> "Program":
        """This program for inputs whose types carry ``Explicit`` shardings (a derived
        program called under ``jax.grad`` on such a mesh): traced and built with them."""
        if self.shardings is not None:
            return self
        sh = typed_shardings(avals)
        if sh is None:
            return self

        def make():
            p = Program(self.fun, self.opts, name=self.name, linear=self.linear,
                        donated=self.donated, shardings=sh)
            p.out_trees = self.out_trees
            p.res_trees = getattr(self, "res_trees", {})
            return p
        return self._derive(("typed", sh), make)

    def __repr__(self):
        return f"<hlofuse program {self.name}>"

    def unflatten_out(self, sig: Signature, flat) -> object:
        """The user's output pytree from the program's flat outputs for ``sig`` (key data of
        typed PRNG key outputs wrapped again)."""
        tree, impls = self.out_trees[sig]
        if impls:
            flat = [jax.random.wrap_key_data(x, impl=i) if i else x for x, i in zip(flat, impls)]
        return jax.tree_util.tree_unflatten(tree, flat)

    # -- tracing -----------------------------------------------------------------------------
    def jaxpr(self, sig: Signature) -> compat.ClosedJaxpr:
        """The traced function for one signature (traced once; the user's Python runs once)."""
        j = self._jaxprs.get(sig)
        if j is None:
            with self._lock:
                j = self._jaxprs.get(sig)
                if j is None:
                    with _tracing(self.shardings, user_code=True):
                        j = jax.make_jaxpr(self.fun)(*sds_of(sig, self.shardings))
                        j = _own_numpy_consts(j)
                    if self.derived_from is not None:
                        _no_leaked_tracers(self.name, j)
                    self._jaxprs[sig] = j
        return j

    def runs_as_traced(self, sig: Signature) -> bool:
        """Whether the function cannot go through ``jax.export`` as hlofuse inlines it: effects
        other than the unordered ones of host callbacks (which are outlined,
        :mod:`hlofuse.runtime.host_callbacks`), or an export refused for a callback no placeholder
        caught (:meth:`_build`). Such a function runs as traced, with plain XLA."""
        traced = self._as_traced.get(sig)
        if traced is None:
            traced = self._as_traced[sig] = any(
                e not in host_callbacks.UNORDERED_EFFECTS for e in self.jaxpr(sig).effects)
        return traced

    def effects(self, avals: Sequence) -> set:
        """The effects the primitive declares for inputs ``avals``: the host callbacks' unordered
        ones (a function with others runs as traced and never binds it). Declared so that jax
        keeps a call whose outputs are unused (its callbacks still run, as under ``jax.jit``)
        and knows a call is not pure."""
        return {e for e in self.jaxpr(signature_of(avals)).effects
                if e in host_callbacks.UNORDERED_EFFECTS}

    def traced_fun(self, *xs):
        """The traced jaxpr on ``xs`` (:func:`run_jaxpr`: copied into a jit trace, else
        evaluated; the user's Python is not traced again)."""
        return run_jaxpr(self.jaxpr(signature_of([jax.typeof(x) for x in xs])), xs)

    def out_avals(self, avals: Sequence) -> list:
        closed = self.jaxpr(signature_of(avals))
        # inside shard_map bodies inputs live on the manual abstract mesh: so do the outputs,
        # varying over the manual axes any input varies over
        mesh = next((a.sharding.mesh for a in avals
                     if getattr(a, "sharding", None) is not None
                     and not a.sharding.mesh.empty), None)
        if mesh is None or jax.sharding.AxisType.Manual not in tuple(mesh.axis_types):
            # no mesh, or one with Explicit axes: the traced outputs carry the shardings
            # jax.jit's own would (sharding in types), the program must keep them
            return list(closed.out_avals)
        varying = frozenset().union(*[a.mat.varying for a in avals if hasattr(a, "mat")])
        out = []
        for a in closed.out_avals:
            sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(
                *[None] * len(a.shape)))
            out.append(a.update(sharding=sharding, manual_axis_type=compat.ManualAxisType(
                varying=varying, unreduced=frozenset(), reduced=frozenset())))
        return out

    # -- entries -----------------------------------------------------------------------------
    def target_for(self, platform: str) -> Target:
        """The hlofuse target when lowering for ``platform`` ('cpu', 'cuda', 'tpu', ...)."""
        here = Target.from_platform(platform)
        if self.opts.target is None:
            return here if here is not None else Target.of(platform)  # the error names it
        if here is None or self.opts.target.kind != here.kind:
            raise RuntimeError(
                f"{self.name} was optimized for target={self.opts.target.kind!r} "
                f"({self.opts.target.platform}) but is being lowered for {platform!r}. "
                f"Use .lower(...).as_text() to inspect the {self.opts.target} module, or "
                f"target=None to run here.")
        return self.opts.target

    def entry(self, sig: Signature, target: Target | None = None,
              spmd_devices: int = 1) -> Entry:
        target = target or Target.of(self.opts.target)
        spmd_devices = spmd_devices if self.shardings is None and not target.is_cpu else 1
        key = (sig, target) if spmd_devices <= 1 else (sig, target, spmd_devices)
        e = self._entries.get(key)
        if e is not None:
            return e
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                with _tracing(self.shardings):
                    e = self._build(sig, target, spmd_devices)
                self._entries[key] = e
                self.builds += 1
            return e

    def is_built(self, sig: Signature, target: Target) -> bool:
        """Whether :meth:`entry` is cheap now (no export, no passes): built in this process,
        left to plain XLA (side effects, host callbacks), or a traced entry of the module
        cache (a second process). ``hlofuse.jit``'s tiered first call asks this."""
        key = (sig, target)
        if key in self._entries or self.runs_as_traced(sig):
            return True
        try:
            with _tracing(self.shardings):   # where :meth:`entry` builds (part of the key)
                *_, tkey = _export_plan(sig, self.opts, target, self.name, self.donated,
                                        self.shardings, 1, self.jaxpr(sig))
        except Exception:  # noqa: BLE001 - unknown: the build says what is wrong
            return False
        return bool(tkey) and module_cache.has_traced(tkey)

    def entries(self) -> list[Entry]:
        return list(self._entries.values())

    def _build(self, sig: Signature, target: Target, spmd_devices: int = 1) -> Entry:
        if self.runs_as_traced(sig):
            return self.plain_entry(sig, target)
        fun = _named(functools.partial(_call_jaxpr, self.jaxpr(sig)), self.name)
        try:
            with trace("build", function=self.name, target=target.kind,
                       inputs=" ".join(f"{d}{list(s)}" for s, d, *_ in sig)):
                exp, opt, callbacks = export_optimized(
                    fun, sig, self.opts, name=self.name, donated=self.donated, target=target,
                    shardings=self.shardings, spmd_devices=spmd_devices, jaxpr=self.jaxpr(sig))
        except NotImplementedError as e:
            if not _is_host_callback_refusal(e):
                return self._failed_build(sig, target, e)
            # a callback no placeholder caught: a library primitive that emits one itself in
            # its lowering rule. From now on this signature runs as traced.
            self._as_traced[sig] = True   # under the lock of :meth:`entry`
            return self.plain_entry(sig, target)
        except Exception as e:  # noqa: BLE001 - the boundary: hlofuse's build never fails a user's call
            return self._failed_build(sig, target, e)
        for msg in self.build_notes.get(sig, ()):
            opt.report.note(msg)
        return Entry(exp, opt, tuple(exp.out_avals), tuple(sds(sig)), target, callbacks)

    def _failed_build(self, sig: Signature, target: Target, e: Exception) -> Entry:
        """Building hlofuse's program raised (export, the module cache, an optimization the
        pipeline's own fallback did not catch): this signature runs the function as traced,
        XLA's program, and the report says what failed. Configuration errors and
        ``options={'strict': True}`` raise; so does an error XLA's program hits too."""
        if self.opts.pass_options.get("strict") or is_config_error(e):
            raise e
        try:
            plain = self.plain_entry(sig, target, note=None)
        except Exception:  # noqa: BLE001 - XLA's program fails too: the user's error, raised
            raise e from None   # not hlofuse's machinery: the function itself does not lower
        plain.report.note(machinery_failed(
            "program build", e, self.name, "this signature runs XLA's program for the function"))
        return plain

    def plain_entry(self, sig: Signature, target: Target, note: str | None = TRACED_NOTE) -> Entry:
        """Functions with ordered effects, or with a callback no placeholder caught
        (:meth:`runs_as_traced`), cannot go through jax.export as hlofuse inlines it: they run
        as traced, with plain XLA, and the report says so (:data:`TRACED_NOTE`)."""
        lowered = lower_traced(jax.jit(functools.partial(_call_jaxpr, self.jaxpr(sig))).trace(
            *sds(sig)), target.platform, self.name)
        module = hir.parse(lowered.as_text(debug_info=True), source=self.name)
        report = Report(target=target.kind, source=self.name)
        if note:
            report.note(note)
        return Entry(None, Optimized(module, report), tuple(self.jaxpr(sig).out_avals),
                     tuple(sds(sig)), target)

    # -- calling -----------------------------------------------------------------------------
    def __call__(self, *xs):
        """Bind the program on flat arrays or tracers (inside any JAX transformation)."""
        return call(self, xs)


class _VariantOf(Program):
    """A program made from ``parent`` without a second trace: its function, jaxprs and output
    trees, with ``opts``."""

    def __init__(self, parent: Program, opts: Options):
        super().__init__(parent.fun, opts, name=parent.name, linear=parent.linear,
                         donated=parent.donated, shardings=parent.shardings)
        self.parent = parent
        self._jaxprs = parent._jaxprs
        self.out_trees = parent.out_trees

    def jaxpr(self, sig: Signature) -> compat.ClosedJaxpr:
        return self.parent.jaxpr(sig)


class _XlaVariant(_VariantOf):
    """:meth:`Program.with_xla`: the parent's traced function and optimized entries, with some
    regions' kernels rolled back (no second trace, no second pass pipeline)."""

    def __init__(self, parent: Program, hashes: frozenset, full: bool = False):
        super().__init__(parent, parent.opts)
        self.hashes = hashes
        self.full = full

    def _build(self, sig: Signature, target: Target, spmd_devices: int = 1) -> Entry:
        base = self.parent.entry(sig, target, spmd_devices)
        if base.exported is None:
            return base
        src = base.optimized.full if self.full and base.optimized.full is not None \
            else base.optimized
        if not self.hashes and src is base.optimized:
            return base
        dev = at.device_key()
        reasons = {}
        for h in self.hashes:
            d = at.cache().get_region(at.region_key(h, dev))
            reasons[h] = (d or {}).get("reason") or (
                kernelize.XLA_FUSES if h in base.optimized.unmeasured
                else "kept XLA: kernel slower, measured")
        opt = without_kernels(src, reasons)
        exp = dataclasses.replace(base.exported, mlir_module_serialized=opt.bytecode)
        return Entry(exp, opt, base.out_avals, base.in_avals, target, base.callbacks)


class _SettingsVariant(_VariantOf):
    """:meth:`Program.with_settings`: the parent's traced function and jaxprs, optimized with
    the parent's options plus ``settings`` (no second trace)."""

    def __init__(self, parent: Program, settings: tuple):
        pass_options = {k: dict(v) for k, v in parent.opts.pass_options.items()}
        for pass_name, option, value in settings:
            pass_options.setdefault(pass_name, {})[option] = value
        super().__init__(parent, dataclasses.replace(parent.opts, pass_options=pass_options))
        self.settings = settings


def _own_numpy_consts(closed: compat.ClosedJaxpr) -> compat.ClosedJaxpr:
    """``closed`` with copies of the numpy arrays it closes over. jax.jit lowers a function
    once, with the values its closed-over numpy arrays have then; hlofuse lowers the traced
    jaxpr again later (the tiered first call's background build, tuning's variants, the module
    cache's key and entry), and a caller that changed such an array in place in between got its
    new values in some calls, and a persistent cache entry holding them under the old values'
    key (adversarial round). Copied, every lowering sees the values of the trace
    (``ndarray.copy`` keeps jax's subclass, jax 0.12's ``TypedNdArray`` with its weak type):
    also those of an inner ``jax.jit``, a ``cond``'s branches and 0-d literals (review).
    The cost: host memory for a second copy of numpy arrays closed over (jax arrays, which
    cannot change, are not copied)."""
    return compat.map_jaxpr_arrays(closed, lambda a: a.copy())


def run_jaxpr(closed: compat.ClosedJaxpr, xs: Sequence) -> tuple:
    """``closed(*xs)``. Inside a jit trace whose arguments are ``xs`` (hlofuse's plain first
    call, ``jax.export`` of the traced function) its equations are copied into that trace as
    they are, as ``jax.jit(..., inline=True)`` copies a nested jit, each with its own source
    location (reports and XLA's metadata name the user's lines): evaluating them again would
    run every primitive's rules a second time, as long as tracing the user's Python took
    (0.1 s of a Llama's 0.8 s first call). Elsewhere (an eager call, a transformation's
    tracers, closed-over tracers, effects, "high" primitives such as ``jnp.searchsorted``'s,
    which the trace must see bound to lower them) the jaxpr is evaluated."""
    trace = compat.current_trace()
    if (isinstance(trace, compat.DynamicJaxprTrace)
            and not compat.jaxpr_is_high(compat.jaxpr_body(closed))
            and not closed.effects and not any(e.effects for e in compat.jaxpr_body(closed).eqns)
            and all(isinstance(x, compat.DynamicJaxprTracer) and x._trace is trace for x in xs)
            and not any(isinstance(c, compat.Tracer) for c in closed.consts)):
        return _copy_eqns(trace, closed, xs)
    return tuple(compat.jaxpr_as_fun(closed)(*xs))


def _copy_eqns(trace, closed: compat.ClosedJaxpr, xs: Sequence) -> tuple:
    """jax's own ``partial_eval.inline_jaxpr_into_trace`` keeping every
    equation's traceback (jax's gives each the caller's)."""
    src = compat.current_source_info()
    jaxpr = compat.jaxpr_body(closed)
    env = dict(zip(jaxpr.constvars, [trace.new_const(c, src) for c in closed.consts]))
    env.update(zip(jaxpr.invars, xs))

    def read(v):
        return compat.DynamicJaxprTracer(trace, v.aval, v, src) if isinstance(v, compat.Literal) \
            else env[v]
    for eqn in jaxpr.eqns:
        esrc = eqn.source_info
        if src.name_stack:
            esrc = esrc.replace(name_stack=src.name_stack + esrc.name_stack)
        outs = trace.emit_eqn([read(v) for v in eqn.invars], [v.aval for v in eqn.outvars],
                              eqn.primitive, eqn.params, eqn.effects, esrc, eqn.ctx)
        env.update(zip(eqn.outvars, outs))
    return tuple(trace.to_jaxpr_tracer(read(v), src) for v in jaxpr.outvars)


def _call_jaxpr(closed, *xs):
    return run_jaxpr(closed, xs)


def context_mesh():
    """The concrete mesh ``jax.set_mesh`` put in context, or None."""
    mesh = compat.get_concrete_mesh()
    return None if mesh is None or mesh.empty else mesh


def typed_shardings(avals) -> tuple | None:
    """The ``NamedSharding`` of each aval read from its type, when those are shardings over
    the ``Explicit`` axes of the concrete mesh in context (``jax.set_mesh``; sharding in
    types), else None (non-array avals get None)."""
    mesh = context_mesh()
    if mesh is None or jax.sharding.AxisType.Explicit not in tuple(mesh.axis_types):
        return None
    out = []
    for a in avals:
        sh = getattr(a, "sharding", None)
        if sh is None or getattr(sh, "mesh", None) is None or sh.mesh.empty or \
                tuple(sh.mesh.axis_names) != tuple(mesh.axis_names):
            return None
        if jax.sharding.AxisType.Manual in tuple(sh.mesh.axis_types):
            # inside a shard_map manual over some axes: the values are per-device there, and
            # a per-shard kernel wrapper over the whole mesh nested in it made XLA abort
            # ("Axes cannot coexist or axes overlap"); whole-array kernels of the local shapes
            return None
        out.append(jax.sharding.NamedSharding(mesh, sh.spec))
    return tuple(out)


def explicit_mesh(shardings):
    """The mesh of ``shardings`` (a ``NamedSharding`` per input) when it has ``Explicit`` axes
    (sharding in types: the avals carry the shardings, and ``out_sharding=P(...)`` needs the
    mesh in context), else None."""
    if not shardings:
        return None
    mesh = shardings[0].mesh
    return mesh if jax.sharding.AxisType.Explicit in tuple(mesh.axis_types) else None


def _tracing(shardings, user_code: bool = False):
    """Where a program is traced, exported and built: under its ``Explicit`` mesh (the
    function's sharding-typed ops need it, as under ``jax.set_mesh`` for ``jax.jit``), else
    :func:`~hlofuse.kernels.lowering.isolated`. ``user_code``: tracing the user's function,
    where a bare ``PartitionSpec`` (``with_sharding_constraint(x, P("data"))``) needs a mesh
    in context: the mesh of its input shardings, else the caller's ``jax.set_mesh`` one (never
    a ``shard_map`` body's manual axes: the trace is cached per signature)."""
    mesh = explicit_mesh(shardings)
    if mesh is None and user_code:
        mesh = shardings[0].mesh if shardings else context_mesh()
        if mesh is None or mesh.empty or \
                jax.sharding.AxisType.Manual in tuple(mesh.axis_types) or \
                jax.sharding.AxisType.Manual in tuple(compat.get_abstract_mesh().axis_types):
            mesh = None
    if mesh is None:
        return isolated()
    stack = contextlib.ExitStack()   # jax.set_mesh's two parts (it refuses inside a trace)
    stack.enter_context(compat.use_abstract_mesh(mesh.abstract_mesh))
    stack.enter_context(compat.use_concrete_mesh(mesh))
    stack.enter_context(compat.check_vma(False))
    return stack


def sds_of(sig: Signature, shardings) -> list[jax.ShapeDtypeStruct]:
    """:func:`sds`, with the inputs' shardings when they are types (``Explicit`` axes)."""
    if explicit_mesh(shardings) is None:
        return sds(sig)
    return [jax.ShapeDtypeStruct(s, d, weak_type=w, sharding=sh)
            for (s, d, w), sh in zip(sig, shardings)]


def _no_leaked_tracers(name: str, closed) -> None:
    """A derived program (jvp, transpose, vmap... of a program whose closed-over tracers were
    lifted to inputs) closes over no tracer, unless the user's code leaked one: a
    ``jax.custom_jvp`` rule (or ``custom_vjp`` backward) that closes over a traced value of the
    function. ``jax.jit`` refuses it when it lowers ("the tracer reached lowering as a
    constant"); evaluated here it computed with the wrong value. Raises as jax does."""
    leaked = [c for c in closed.consts if isinstance(c, compat.Tracer)]
    if leaked:
        raise jax.errors.UnexpectedTracerError(
            f"hlofuse.jit({name}): a traced value escaped into the derived program: "
            f"{type(leaked[0]).__name__} of type {jax.typeof(leaked[0]).str_short()} is closed "
            f"over by a function jax transforms separately (a custom_jvp rule or custom_vjp "
            f"backward that closes over a traced value of the function: pass it as an "
            f"argument, e.g. with nondiff_argnums). jax.jit refuses the same program with "
            f"UnexpectedTracerError.")


def _named(fun, name: str):
    """``fun`` under the program's name (jax.export names the module after it)."""
    def named(*xs):
        return fun(*xs)
    named.__name__ = named.__qualname__ = "".join(c if c.isalnum() else "_" for c in name)
    return named


def _tangent_dtype(dtype):
    return dtype if _inexact(dtype) else jax.dtypes.float0


def call(program: Program, xs: Sequence) -> tuple:
    """``program(*xs)``: through the primitive, or inlined as traced when it has effects or
    host callbacks (:meth:`Program.runs_as_traced`).

    A function that closes over tracers of an enclosing transformation (``hlofuse.jit``
    created inside a ``jax.grad``/``jax.jit``-traced function) gets them as explicit inputs
    of a lifted program, like ``jax.jit`` lifts closed-over tracers."""
    avals = [jax.typeof(x) for x in xs]
    if _manual_with_explicit_axes(avals):
        # in a shard_map body manual over some axes of a mesh whose other axes are Explicit:
        # the outputs' types carry shardings over those axes that jax infers op by op (x @ w
        # with w on 'model' is on 'model'), which a program exported without them would drop
        # (P('data', None) where jax.jit gives P('data', 'model')). Traced here, as jax.jit's
        return tuple(program.fun(*xs))
    sig = signature_of(avals)
    closed = program.jaxpr(sig)
    if program.runs_as_traced(sig):
        if any(compat.manual_axis_type(a) is not None for a in avals):
            # in a shard_map body that checks varying axes (a collective's named-axis effect
            # makes it run as traced): the program's jaxpr is traced once per signature without
            # them, so a varying value meeting a psum's has no pvary and fails there; the
            # function traced on these values gets them, as jax.jit's would
            return tuple(program.fun(*xs))
        return run_jaxpr(closed, xs)
    tracers = [c for c in closed.consts if isinstance(c, compat.Tracer)]
    if tracers:
        return call(program.lifted(sig), [*tracers, *xs])
    return tuple(_bind(program, xs))


def _manual_with_explicit_axes(avals) -> bool:
    """Whether an input lives on a mesh with both Manual and Explicit axes."""
    for a in avals:
        mesh = getattr(getattr(a, "sharding", None), "mesh", None)
        types = tuple(getattr(mesh, "axis_types", ()) or ())
        if jax.sharding.AxisType.Manual in types and jax.sharding.AxisType.Explicit in types:
            return True
    return False


def _bind(program: Program, xs: Sequence):
    """Bind ``program`` on ``xs``: the program for their sharding types on an ``Explicit``
    mesh (:meth:`Program.typed`)."""
    return hlofuse_call_p.bind(*xs, program=program.typed([jax.typeof(x) for x in xs]))


# ------------------------------------------------------------------------------------------
# the primitive
# ------------------------------------------------------------------------------------------
hlofuse_call_p = jex_core.Primitive("hlofuse_call")
hlofuse_call_p.multiple_results = True
hlofuse_call_p.def_impl(functools.partial(compat.apply_primitive, hlofuse_call_p))
hlofuse_call_p.def_effectful_abstract_eval(
    lambda *avals, program: (program.out_avals(avals), program.effects(avals)))


def _plain_lowering(ctx, args, program: Program):
    """The function as jax.jit lowers it (no hlofuse program)."""
    fun = functools.partial(_call_jaxpr, program.jaxpr(signature_of(ctx.avals_in)))
    return compat.lower_fun(fun, multiple_results=True)(ctx, *args)


def _lowering(ctx, *args, program: Program):
    platforms = ctx.module_context.platforms
    if len(platforms) != 1:
        # a multi-platform export (platforms=['cpu', 'cuda', 'tpu']): one module serves every
        # platform, so it is the function's own, as jax.jit's export makes it
        return _plain_lowering(ctx, args, program)
    target = program.target_for(platforms[0])
    params = getattr(ctx.module_context, "lowering_parameters", None)
    if target.is_gpu and getattr(params, "for_export", False):
        # jax.export of the function for a GPU: Triton calls carry no compatibility guarantee,
        # and jax.export refuses to serialize them (jax.jit's export has XLA's fusions instead)
        return _plain_lowering(ctx, args, program)
    # an SPMD program XLA partitions (a shard_map body is manual: its kernels run per shard)
    axis_context = ctx.module_context.axis_context
    n_dev = (axis_context.num_devices
             if isinstance(axis_context, compat.ShardingContext) else 1)
    entry = program.entry(signature_of(ctx.avals_in), target, spmd_devices=int(n_dev or 1))
    if entry.exported is None:  # left to plain XLA
        return _plain_lowering(ctx, args, program)
    exp = entry.exported
    before = (host_callbacks.top_level_symbols(ctx.module_context.module)
              if entry.callbacks else None)
    with (_no_lapack_init() if b"lapack" not in exp.mlir_module_serialized
          else contextlib.nullcontext()):
        outs = compat.lower_fun(lambda *xs: tuple(exp.call(*xs)), multiple_results=True)(ctx, *args)
    if entry.callbacks:
        host_callbacks.reinject(ctx, entry.callbacks, before)
    return outs


# ``Exported.call``'s lowering first initializes jaxlib's LAPACK FFI handlers on CPU, which
# imports scipy.linalg: 0.4-1 s of a first call that plain jax.jit never pays. It is only
# needed for modules with LAPACK custom calls, and those were exported in this process (jax's
# own lowering of the linalg primitive initialized LAPACK then). For modules without any,
# hlofuse skips it (this thread, while lowering its own call only).
_SKIP_LAPACK = threading.local()


@contextlib.contextmanager
def _no_lapack_init():
    _SKIP_LAPACK.on = True
    try:
        yield
    finally:
        _SKIP_LAPACK.on = False


compat.install_export_backend_guard(lambda: getattr(_SKIP_LAPACK, "on", False))


compat.register_lowering(hlofuse_call_p, _lowering)
# checkify(hlofuse.jit(f)): f's own checks, as checkify(jax.jit(f)) makes them
compat.register_checkify(hlofuse_call_p, lambda program: lambda *xs: tuple(program.fun(*xs)))


def _jvp(primals, tangents, *, program: Program):
    nonzero = tuple(type(t) is not ad.Zero and _inexact(jax.typeof(x).dtype)
                    for x, t in zip(primals, tangents))
    if not any(nonzero):
        outs = _bind(program, primals)
        return outs, [ad.Zero(jax.typeof(o).to_tangent_aval()) for o in outs]
    sig = signature_of([jax.typeof(x) for x in primals])
    n_out = len(program.jaxpr(sig).out_avals)
    both = _bind(program.linearize_program(nonzero), primals)
    outs, res = both[:n_out], both[n_out:]
    t_in = [ad.instantiate_zeros(t) for t, nz in zip(tangents, nonzero) if nz]
    t_out = iter(_bind(program.tangent_program(nonzero, sig), [*res, *t_in]))
    return outs, [next(t_out) if _inexact(jax.typeof(o).dtype)
                  else ad.Zero(jax.typeof(o).to_tangent_aval()) for o in outs]


ad.primitive_jvps[hlofuse_call_p] = _jvp


def _transpose(cts, *args, program: Program):
    undefined = [i for i, a in enumerate(args) if ad.is_undefined_primal(a)]
    # a user's function (no derived linear inputs): transposed in the inputs jax asks for
    lin = program.linear or tuple(undefined)
    if any(i not in lin for i in undefined):
        raise NotImplementedError(f"{program.name}: transpose with respect to a non-linear input")
    lin_avals = [a.aval if ad.is_undefined_primal(a) else jax.typeof(a)
                 for i, a in enumerate(args) if i in lin]
    typed = typed_shardings(lin_avals)   # an Explicit mesh: the cotangents' types
    linear_avals = tuple((tuple(a.shape), np.dtype(a.dtype), typed[k] if typed else None,
                          bool(getattr(a, "weak_type", False)))
                         for k, a in enumerate(lin_avals))
    nonlin = [a for i, a in enumerate(args) if i not in lin]
    ct_nonzero = tuple(type(c) is not ad.Zero for c in cts)
    if not any(ct_nonzero):
        return [None] * len(args)
    tp = program.transpose_program(len(args), tuple(lin), linear_avals, ct_nonzero)
    res = iter(_bind(tp, [*nonlin, *[c for c in cts if type(c) is not ad.Zero]]))
    out = [None] * len(args)
    for i in lin:
        r = next(res)
        if ad.is_undefined_primal(args[i]):
            out[i] = r
    return out


ad.primitive_transposes[hlofuse_call_p] = _transpose


def _batch(args, dims, *, program: Program):
    not_mapped = compat.not_mapped
    moved = [a if d is not_mapped else compat.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    bp = program.batched_program(tuple(d is not not_mapped for d in dims))
    outs = _bind(bp, moved)
    return outs, [0] * len(outs)


batching.primitive_batchers[hlofuse_call_p] = _batch


def _jet(primals, series, *, program: Program):
    order = len(series[0]) if series else 0
    n_out = len(program.jaxpr(signature_of([jax.typeof(x) for x in primals])).out_avals)
    outs = _bind(program.jet_program(order), [*primals, *[t for s in series for t in s]])
    return outs[:n_out], [list(outs[n_out + i * order:n_out + (i + 1) * order])
                          for i in range(n_out)]


def _register_jet() -> None:
    """``jax.experimental.jet`` keeps its rules in its own table (importing it: 1 ms)."""
    from jax.experimental import jet as jet_module
    jet_module.jet_rules[hlofuse_call_p] = _jet


_register_jet()


def find_calls(jaxpr) -> list[tuple[Program, Signature]]:
    """The hlofuse programs bound at the top level of a (closed) jaxpr, with their input
    signatures (``hlofuse.jit(...).lower()`` finds its entry this way)."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    return [(e.params["program"], signature_of([v.aval for v in e.invars]))
            for e in jaxpr.eqns if e.primitive is hlofuse_call_p]
