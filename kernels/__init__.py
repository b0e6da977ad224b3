"""Region -> Pallas kernel generation and lowering (installed as ``hlofuse.kernels``).

One family per file, each with ``*_kernel`` (body), ``build_*`` (``pallas_call`` builder) and
``*_reference`` (plain jnp). :data:`FAMILIES` maps a region kind to its family, which the
``kernelize`` pass uses.
"""

from __future__ import annotations

import dataclasses

from hlofuse.kernels import elementwise as elementwise


@dataclasses.dataclass(frozen=True)
class Family:
    spec_from_func: object   # outlined func.func -> spec (raises EmitError if unsupported)
    build: object            # (spec, target, interpret=..., ...) -> jax function
    reference: object        # spec -> jax function


FAMILIES: dict[str, Family] = {
    "elementwise": Family(elementwise.spec_from_func, elementwise.build_elementwise,
                          elementwise.elementwise_reference),
}
