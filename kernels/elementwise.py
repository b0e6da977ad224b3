"""Elementwise (loop) fusion kernels: one Pallas kernel for a whole outlined elementwise region.

Shape of this file (as every kernel family): :func:`elementwise_kernel` is the kernel body,
:func:`build_elementwise` builds the ``pallas_call`` (``name=...``) for a target,
:func:`elementwise_reference` is the plain-jnp reference.

The region's iteration domain ``D`` is viewed as 2-D ``(R, C) = (prod(D[:-1]), D[-1])``; every
input is reshaped outside the kernel (free: a bitcast in XLA) to one of four block classes:

  full   (R, C)  tiled (br, bc)      operands with the domain's shape
  col    (1, C)  tiled (1, bc)       broadcast along the last dim (a bias vector)
  row    (R, 1)  tiled (br, 1)       broadcast along the leading dims (per-row statistics)
  scalar (1, 1)  whole               rank-0 values

Inside the kernel ``broadcast_in_dim`` becomes ``broadcast_to`` of the block shape, splat
constants become literals, and every other op is emitted from the op rule table
(:mod:`hlofuse.core.ops`). Boolean inputs/outputs cross the kernel boundary as int32 on gpu/tpu.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math

import numpy as np

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jaxlib.mlir import ir

from hlofuse.core import ir as hir
from hlofuse.core.ops import EmitError, const_value, emit_op, splat_scalar
from hlofuse.kernels.blockeval import emit_f32, round_by_floor
from hlofuse.kernels.interpret import eval_reference, run_region
from hlofuse.kernels.common import (boundary, call_options, check_tpu_dtypes, from_kernel, int32_bools,
                                    kernel_dtypes, max_itemsize, to_kernel)
from hlofuse.kernels.support import broadcast_class
from hlofuse.kernels.tiling import Blocks2D, elementwise_blocks
from hlofuse.core.target import Target

__all__ = ["ElementwiseSpec", "spec_from_func", "elementwise_kernel", "build_elementwise",
           "elementwise_reference", "splat_scalar"]


def _broadcast_class(op) -> str:
    c = broadcast_class(op)
    if c is None:
        raise EmitError("broadcast pattern not expressible in the kernel's block view")
    return c


@dataclasses.dataclass(frozen=True)
class ElementwiseSpec:
    """Everything the kernel needs, extracted from the outlined region function."""
    domain: tuple
    in_shapes: tuple
    in_dtypes: tuple          # numpy dtypes
    in_classes: tuple         # 'full' | 'col' | 'row' | 'scalar'
    out_dtypes: tuple
    body_text: str            # the region's ops, for hashing and error messages
    func_op: object = dataclasses.field(compare=False, hash=False, repr=False)

    @property
    def rows(self) -> int:
        return int(math.prod(self.domain[:-1])) if len(self.domain) > 1 else 1

    @property
    def cols(self) -> int:
        return int(self.domain[-1]) if self.domain else 1

    @property
    def digest(self) -> str:
        return hashlib.sha1(self.body_text.encode()).hexdigest()[:10]


def _class_of_value(arg: ir.Value, domain: tuple) -> str:
    classes = set()
    for u in arg.uses:
        owner = u.owner
        if owner.name == "stablehlo.broadcast_in_dim":
            classes.add(_broadcast_class(owner.operation))
        else:
            info = hir.tensor_type_info(arg.type)
            classes.add("full" if info.shape == domain else "scalar" if info.shape == () else "?")
    if len(classes) != 1 or "?" in classes:
        raise EmitError(f"region input used with inconsistent block classes {sorted(classes)}")
    return classes.pop()


def spec_from_func(fn_op) -> ElementwiseSpec:
    """Read an outlined elementwise region (``func.func``) into an :class:`ElementwiseSpec`."""
    ftype = hir.function_type(fn_op)
    outs = [hir.tensor_type_info(t) for t in ftype.results]
    ins = [hir.tensor_type_info(t) for t in ftype.inputs]
    if any(i is None for i in outs + ins):
        raise EmitError("dynamic shapes")
    domain = outs[0].shape
    if any(o.shape != domain for o in outs):
        raise EmitError("outputs of different shapes")
    entry = fn_op.regions[0].blocks[0]
    classes = tuple(_class_of_value(a, domain) for a in entry.arguments)
    body = hir.ops_text(entry.operations)
    return ElementwiseSpec(domain, tuple(i.shape for i in ins), tuple(hir.np_dtype(i.dtype) for i in ins),
                           classes, tuple(hir.np_dtype(o.dtype) for o in outs), body, fn_op)


def block_rules(block_shape: tuple, *, floor_round: bool = False) -> dict:
    """The elementwise block view for the region interpreter (:mod:`hlofuse.kernels.interpret`):
    broadcasts produce the block shape and splat constants become literals of it (rank-0 ones
    stay scalars); every other op is emitted as it is, but with ``floor_round`` (gpu/tpu) the
    round ops, which Triton cannot lower, come exactly from floor (:func:`round_by_floor`)."""
    def broadcast(op, args):
        return [jnp.broadcast_to(args[0], block_shape)]

    def constant(op, args):
        s = splat_scalar(op)   # one scalar, never materialized at its IR shape on the host
        if s is not None:
            return [jnp.asarray(s) if not _shape(op.results[0]) else jnp.full(block_shape, s)]
        c = const_value(op)    # not a splat: only rank-0 ones are inlined into a kernel region
        if c.ndim:
            raise EmitError(f"non-splat constant {c.dtype}{list(c.shape)} inside an elementwise kernel")
        return [jnp.asarray(c)]

    rules = {"stablehlo.broadcast_in_dim": broadcast, "stablehlo.constant": constant}
    if floor_round:
        rules["stablehlo.round_nearest_even"] = lambda op, args: [round_by_floor(args[0])]
        rules["stablehlo.round_nearest_afz"] = lambda op, args: [round_by_floor(args[0], ties_even=False)]
    return rules


def _shape(v) -> tuple:
    return tuple(ir.RankedTensorType(v.type).shape)


def elementwise_kernel(*refs, fn_op, n_in: int, bool_in: tuple, bool_out: tuple, block_shape: tuple,
                       accelerator: bool = False):
    """Kernel body: load every block, evaluate the region, store every output block.
    ``accelerator`` (gpu/tpu): round ops come from floor, and arithmetic on 16-bit floats runs
    in f32 with each op's result rounded back to its type (Triton has no bf16 or f16 divide:
    a bf16 ``x / y`` or sigmoid failed to build and stayed XLA's)."""
    in_refs, out_refs = refs[:n_in], refs[n_in:]
    vals = [from_kernel(r[...], b) for r, b in zip(in_refs, bool_in)]
    outs = run_region(fn_op, vals, rules=block_rules(block_shape, floor_round=accelerator),
                      emit=emit_f32 if accelerator else emit_op)
    for r, v, b in zip(out_refs, outs, bool_out):
        r[...] = jnp.broadcast_to(to_kernel(v, b), block_shape).astype(r.dtype)


def _view_shape(cls: str, rows: int, cols: int) -> tuple:
    return {"full": (rows, cols), "col": (1, cols), "row": (rows, 1), "scalar": (1, 1)}[cls]


def _in_spec(cls: str, blocks: Blocks2D) -> pl.BlockSpec:
    br, bc = blocks.br, blocks.bc
    if cls == "full":
        return pl.BlockSpec((br, bc), lambda i, j: (i, j))
    if cls == "col":
        return pl.BlockSpec((1, bc), lambda i, j: (0, j))
    if cls == "row":
        return pl.BlockSpec((br, 1), lambda i, j: (i, 0))
    return pl.BlockSpec((1, 1), lambda i, j: (0, 0))


def build_elementwise(spec: ElementwiseSpec, target: Target | str, *, interpret=None,
                      blocks: Blocks2D | None = None, name: str | None = None):
    """The region as a JAX function ``f(*inputs) -> outputs`` around one ``pallas_call``.

    ``interpret``: see :func:`~hlofuse.kernels.common.call_options`.
    """
    target = Target.of(target)
    rows, cols = spec.rows, spec.cols
    bool_in = int32_bools(spec.in_dtypes, target, interpret)
    bool_out = int32_bools(spec.out_dtypes, target, interpret)
    blocks = blocks or elementwise_blocks(rows, cols, target=target,
                                          itemsize=max_itemsize(spec.in_dtypes + spec.out_dtypes),
                                          n_arrays=len(spec.in_dtypes) + len(spec.out_dtypes))
    check_tpu_dtypes(spec.in_dtypes + spec.out_dtypes, target)
    name = name or f"hlofuse_elementwise_{spec.digest}"
    block_shape = (blocks.br, blocks.bc)
    out_dtypes = kernel_dtypes(spec.out_dtypes, bool_out)
    kernel = functools.partial(elementwise_kernel, fn_op=spec.func_op, n_in=len(spec.in_dtypes),
                               bool_in=bool_in, bool_out=bool_out, block_shape=block_shape,
                               accelerator=not target.is_cpu)
    call = pl.pallas_call(
        kernel,
        out_shape=[jax.ShapeDtypeStruct((rows, cols), d) for d in out_dtypes],
        grid=blocks.grid,
        in_specs=[_in_spec(c, blocks) for c in spec.in_classes],
        out_specs=[pl.BlockSpec(block_shape, lambda i, j: (i, j)) for _ in out_dtypes],
        **call_options(target, blocks, interpret),
        name=name,
    )
    return boundary(call, blocks, name,
                    in_views=[(i, _view_shape(c, rows, cols)) for i, c in enumerate(spec.in_classes)],
                    out_shapes=[spec.domain] * len(out_dtypes), bool_in=bool_in, bool_out=bool_out)


def elementwise_reference(spec: ElementwiseSpec):
    """Plain-jnp reference: the region evaluated op by op, no Pallas."""
    def ref(*inputs):
        return tuple(eval_reference(spec.func_op, inputs))
    return ref
