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

from hlofuse.target import Target


@contextlib.contextmanager
def target_context(target: Target):
    """TPU kernels that query hardware info need an abstract TPU device to lower from CPU:
    the device kind of the target's chip."""
    target = Target.of(target)
    if not target.is_tpu:
        yield
        return
    ad = jax.sharding.AbstractDevice(device_kind=target.chip.device_kind, num_cores=1,
                                     platform="tpu")
    mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=ad)
    with jax.sharding.use_abstract_mesh(mesh):
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
    from jax._src.interpreters import mlir
    from jax._src.pallas import hlo_interpreter
    from jax._src.pallas import pallas_call as pc

    def rule(ctx, *in_nodes, interpret, **params):
        if interpret is True:
            if params["jaxpr"].constvars:
                raise ValueError("Cannot lower a pallas_call with constants.")
            impl = partial(hlo_interpreter.pallas_call_hlo_interpret, **params)
            return mlir.lower_fun(impl, multiple_results=True)(ctx, *in_nodes)
        return pc._pallas_call_lowering(ctx, *in_nodes, interpret=interpret, **params)

    mlir.register_lowering(pc.pallas_call_p, rule, platform="cpu")
    _CPU_RULE_REGISTERED = True


def lower_to_text(fn: Callable, in_avals: Sequence[jax.ShapeDtypeStruct], target) -> str:
    """StableHLO text (with locations) of ``jax.jit(fn)`` lowered for ``target``."""
    target = Target.of(target)
    if target.is_cpu:
        _register_cpu_interpret_rule()
    with target_context(target):
        lowered = jax.jit(fn).trace(*in_avals).lower(lowering_platforms=(target.platform,))
    return lowered.as_text(debug_info=True)
