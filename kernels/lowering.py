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


def lower_to_text(fn: Callable, in_avals: Sequence[jax.ShapeDtypeStruct], target) -> str:
    """StableHLO text (with locations) of ``jax.jit(fn)`` lowered for ``target``."""
    target = Target.of(target)
    with target_context(target):
        lowered = jax.jit(fn).trace(*in_avals).lower(lowering_platforms=(target.platform,))
    return lowered.as_text(debug_info=True)
