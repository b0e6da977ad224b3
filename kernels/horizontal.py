"""Horizontal matmul kernels: several dots sharing their lhs (Q/K/V projections) in one kernel.

One kernel per outlined ``horizontal`` region (made by ``fuse-horizontal`` from sibling
matmul-epilogue regions). Each grid step loads one lhs tile (through its prologue) once and
multiplies it with the matching tile of every member's rhs, accumulating one f32 tile per dot;
each member's epilogue then runs on its own accumulator. Against separate kernels this reads
the shared lhs once instead of once per dot. The members must agree on the lhs, its layout and
the result shape (same M, N, K), which ``fuse-horizontal`` guarantees when it groups them.

Tiling is the matmul family's (:class:`~hlofuse.kernels.tiling.MatmulBlocks` with
``members=len(dots)``: the shared-memory / VMEM budget holds one rhs tile and one accumulator
per member). Sibling *elementwise* ops merged by the same pass need no family of their own:
they become one multi-output ``elementwise`` region.

Shape of this file: :func:`horizontal_kernel`, :func:`build_horizontal`
(``pallas_call(name=...)``), :func:`horizontal_reference`.
"""

from __future__ import annotations

from hlofuse.core.ops import EmitError
from hlofuse.kernels import matmul_epilogue as _mm
from hlofuse.kernels.tiling import MatmulBlocks
from hlofuse.core.target import Target

__all__ = ["spec_from_func", "horizontal_kernel", "build_horizontal", "horizontal_reference"]


def spec_from_func(fn_op) -> _mm.MatmulSpec:
    """Read an outlined horizontal region (two or more dots sharing the lhs)."""
    spec = _mm.spec_from_func(fn_op)
    if len(spec.dots) < 2:
        raise EmitError("a horizontal region needs at least two dots")
    return spec


def horizontal_kernel(*refs, spec: _mm.MatmulSpec, plan: dict):
    """Kernel body: one shared lhs tile, one rhs tile and f32 accumulator per member dot, then
    every member's epilogue (the matmul family's body with ``len(spec.dots) > 1``)."""
    return _mm.matmul_epilogue_kernel(*refs, spec=spec, plan=plan)


def build_horizontal(spec: _mm.MatmulSpec, target: Target | str, *, interpret=None, blocks: MatmulBlocks | None = None,
                     name: str | None = None):
    """The region as ``f(*inputs) -> outputs`` around one ``pallas_call`` (see the matmul
    family's builder for ``interpret``)."""
    target = Target.of(target)
    if len(spec.dots) < 2:
        raise EmitError("a horizontal region needs at least two dots")
    return _mm.build_matmul_epilogue(spec, target, interpret=interpret, blocks=blocks,
                                     name=name or f"hlofuse_horizontal_{len(spec.dots)}x_{spec.digest}",
                                     _family="horizontal", _body=horizontal_kernel)


def horizontal_reference(spec: _mm.MatmulSpec):
    """Plain-jnp reference: the region op by op on whole arrays."""
    return _mm.matmul_epilogue_reference(spec)
