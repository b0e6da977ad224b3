"""Lower a JAX function (typically a ``pallas_call`` wrapper) to StableHLO text for a target.

From this CPU machine every target lowers: ``cpu`` (Pallas interpret mode: plain StableHLO),
``gpu`` (Triton: ``__gpu$xla.gpu.triton`` custom call) and ``tpu`` (Mosaic: ``tpu_custom_call``).
We use ``jax.jit(...).trace(...).lower(lowering_platforms=...)`` rather than ``jax.export``:
export refuses Triton custom calls (no compatibility guarantee, facts §3) and we splice the
result into a module that is exported as a whole later anyway.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Sequence

import jax

from hlofuse.core import compat
from hlofuse.core.target import Target


def isolated():
    """A context free of the caller's ambient mesh, abstract (a ``shard_map`` body's manual
    axes) and concrete (``jax.set_mesh``, an ``Explicit`` mesh a sharded program is traced
    under). Kernels lower on their own one-device mesh: a kernel's body must not carry
    sharding ops of the program it was first built for (kernels are cached per region and
    reused in every program), and a program traced while a ``shard_map`` body is lowered is
    cached per signature and reused everywhere. Closed-over constants are embedded in the
    module (:func:`compat.embedded_constants`)."""
    stack = contextlib.ExitStack()
    stack.enter_context(compat.use_abstract_mesh(compat.empty_abstract_mesh))
    stack.enter_context(compat.use_concrete_mesh(compat.empty_concrete_mesh))
    stack.enter_context(compat.check_vma(False))
    stack.enter_context(compat.embedded_constants())   # a self-contained module (jax 0.12.1)
    return stack


@contextlib.contextmanager
def target_context(target: Target):
    """Lowering from this CPU host for a chip: an abstract device of the target's chip on a
    one-device mesh with ``Auto`` axes. TPU kernels query hardware info from it; Pallas Triton
    needs an abstract GPU device to lower without one (jax 0.11+). On cpu, nothing."""
    target = Target.of(target)
    if target.is_tpu:
        device = jax.sharding.AbstractDevice(device_kind=target.chip.device_kind, num_cores=1,
                                             platform="tpu")
    elif target.is_gpu:
        device = compat.gpu_abstract_device(target.chip.title)
    else:
        yield
        return
    with compat.use_abstract_mesh(compat.abstract_mesh(device)), \
            compat.quiet_triton_deprecation():
        yield


_CPU_RULE_REGISTERED = False


def _register_cpu_interpret_rule() -> None:
    """Lower ``pallas_call(interpret=True)`` on cpu without importing the TPU and GPU
    interpret modules.

    jax 0.10.2's ``_pallas_call_lowering`` imports ``pallas.mosaic.interpret`` and
    ``pallas.mosaic_gpu.interpret`` on every interpret lowering only to test ``isinstance``
    against their parameter classes; the Mosaic GPU import alone costs 0.25-1.9 s of a cold
    first call. When ``interpret`` is the plain ``True`` neither test can succeed, so this
    cpu rule calls the same ``pallas_call_hlo_interpret`` through the same ``mlir.lower_fun``
    (identical StableHLO) and hands every other case to jax's own rule unchanged."""
    global _CPU_RULE_REGISTERED
    if _CPU_RULE_REGISTERED:
        return
    from functools import partial
    pl = compat.pallas()

    def rule(ctx, *in_nodes, interpret, **params):
        if interpret is True:
            if params["jaxpr"].constvars:
                raise ValueError("Cannot lower a pallas_call with constants.")
            impl = _one_step_impl(**params) or partial(pl.hlo_interpret, **params)
            return compat.lower_fun(impl, multiple_results=True)(ctx, *in_nodes)
        return pl.pallas_call_lowering(ctx, *in_nodes, interpret=interpret, **params)

    compat.register_lowering(pl.pallas_call_p, rule, platform="cpu")
    _CPU_RULE_REGISTERED = True


def _plain_dtypes(jaxpr) -> bool:
    """No extended dtype (PRNG keys, semaphores) anywhere in ``jaxpr``, its refs and sub-jaxprs:
    the kernel needs none of the interpreter's physical-type resolution."""
    abstract_ref = compat.pallas().AbstractRef

    def plain(aval) -> bool:
        aval = aval.inner_aval if isinstance(aval, abstract_ref) else aval
        dtype = getattr(aval, "dtype", None)
        return dtype is None or not jax.dtypes.issubdtype(dtype, jax.dtypes.extended)

    if not all(plain(v.aval) for v in jaxpr.invars):
        return False
    for eqn in jaxpr.eqns:
        if not all(plain(v.aval) for v in eqn.outvars):
            return False
        if not all(_plain_dtypes(compat.jaxpr_body(j))
                   for j in compat.jaxprs_in_params(eqn.params)):
            return False
    return True


def _zero_at_first_step(index_map) -> bool:
    """Does ``index_map`` return block index 0 on every axis at program ids all 0? Proven
    without evaluating it: each output is the literal 0 or a program id itself."""
    ids = set(index_map.invars)
    return all((isinstance(v, compat.Literal) and v.val == 0) or v in ids
               for v in index_map.outvars)


def _one_step_impl(*, jaxpr, grid_mapping, input_output_aliases, **_):
    """The interpret-mode evaluation of a ``pallas_call`` whose grid has one step and whose
    every block is its whole array at offset 0 (every cpu kernel: cpu blocks are whole
    arrays), or None when the call is not such a one.

    ``pallas_call_hlo_interpret`` would re-trace the kernel to resolve physical types, then
    trace a one-iteration while loop that slices every block out of its array and writes it
    back; XLA removes that loop and those slices again. Here the discharged kernel is
    evaluated once on the whole arrays: the same values (outputs start from the same
    ``uninitialized_value`` or their aliased input), at about a third of the lowering time,
    which is most of ``kernelize``'s share of a cold first call."""
    pl = compat.pallas()
    gm = grid_mapping
    if (gm.num_dynamic_grid_bounds or gm.num_index_operands or gm.vmapped_dims
            or gm.local_grid_env is not None or any(int(g) != 1 for g in gm.grid)):
        return None
    for bm in gm.block_mappings:
        if not (all(isinstance(b, pl.Blocked) for b in bm.block_shape)
                and tuple(b.block_size for b in bm.block_shape) == tuple(bm.array_aval.shape)
                and _zero_at_first_step(bm.index_map_jaxpr.jaxpr)):
            return None
    if not _plain_dtypes(jaxpr):
        return None
    with gm.trace_env():
        discharged = pl.discharge_state(jaxpr)
    n_in, n_out = gm.num_inputs, gm.num_outputs

    def impl(*args):
        outs = pl.initialize_output_vals(gm.block_mappings_output, args, input_output_aliases)
        scratch = [pl.uninitialized_value(a.shape, a.dtype)
                   for a in gm.scratch_avals]
        env = tuple(pl.GridAxis(jax.numpy.int32(0), 1) for _ in gm.grid)
        with pl.grid_env(env):
            res = compat.eval_jaxpr(compat.jaxpr_body(discharged), compat.jaxpr_consts(discharged), *args, *outs, *scratch)
        return res[n_in:n_in + n_out]

    return impl


def lower_to_text(fn: Callable, in_avals: Sequence[jax.ShapeDtypeStruct], target) -> str:
    """StableHLO text (with locations) of ``jax.jit(fn)`` lowered for ``target``."""
    target = Target.of(target)
    if target.is_cpu:
        _register_cpu_interpret_rule()
    with isolated(), target_context(target):
        lowered = jax.jit(fn).trace(*in_avals).lower(lowering_platforms=(target.platform,))
    return lowered.as_text(debug_info=True)
