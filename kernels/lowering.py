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

PLATFORMS = {"cpu": "cpu", "gpu": "cuda", "tpu": "tpu"}


def platform_for(target: str) -> str:
    try:
        return PLATFORMS[target]
    except KeyError:
        raise ValueError(f"unknown target {target!r}; expected one of {sorted(PLATFORMS)}") from None


@contextlib.contextmanager
def target_context(target: str):
    """TPU kernels that query hardware info need an abstract TPU device to lower from CPU:
    the device kind of the chip in force (:mod:`hlofuse.chips`, default v5e)."""
    if target != "tpu":
        yield
        return
    from hlofuse import chips
    kind = chips.resolve("tpu").device_kind
    ad = jax.sharding.AbstractDevice(device_kind=kind, num_cores=1, platform="tpu")
    mesh = jax.sharding.AbstractMesh((1,), ("x",), abstract_device=ad)
    with jax.sharding.use_abstract_mesh(mesh):
        yield


def lower_to_text(fn: Callable, in_avals: Sequence[jax.ShapeDtypeStruct], target: str) -> str:
    """StableHLO text (with locations) of ``jax.jit(fn)`` lowered for ``target``."""
    with target_context(target):
        lowered = jax.jit(fn).trace(*in_avals).lower(lowering_platforms=(platform_for(target),))
    return lowered.as_text(debug_info=True)
