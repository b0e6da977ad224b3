"""Row-reduction kernels: elementwise producers, row reductions and their epilogue in one kernel.

One kernel per outlined ``reduction`` region (softmax, log-softmax, layernorm, rmsnorm, sum of
squares, mean/variance, ... whatever ops the region holds). The region's domain ``D`` (the
shape its reductions read) is viewed as ``(rows, cols) = (prod(D[:-1]), D[-1])``; every block
holds whole rows, so every reduction finishes inside one grid step and its result never leaves
the chip: the grid runs over row blocks only.

Inputs are reshaped outside the kernel (free) to their class's view: ``full`` (rows, cols),
``row`` (rows, 1), ``col`` (1, cols), ``scalar`` (1, 1); outputs are ``full`` or ``row``.
The body is :func:`~hlofuse.kernels.blockeval.eval_block` over the region's ops. Boolean values
cross the kernel boundary as int32 on gpu/tpu.

Shape of this file (as every kernel family): :func:`reduction_kernel`, :func:`build_reduction`
(``pallas_call(name=...)``), :func:`reduction_reference`.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from hlofuse.core.target import Target
from hlofuse.core import ir as hir
from hlofuse.core.ir import value_key
from hlofuse.core.ops import EmitError
from hlofuse.kernels.blockeval import eval_block
from hlofuse.kernels.interpret import bind, eval_reference
from hlofuse.kernels.common import (boundary, call_options, check_tpu_dtypes, from_kernel, int32_bools,
                                    kernel_dtypes, max_itemsize, to_kernel)
from hlofuse.kernels.tiling import RowBlocks, TiledRowBlocks, row_blocks
from hlofuse.kernels.row_tiled import build_tiled, is_tiled
from hlofuse.kernels.support import (COL, FULL, ROW, SCALAR, ClassError, View, is_column_reduce,
                                     reduce_info, view_classes)
from hlofuse.kernels.interpret import reduce_with_init

__all__ = ["ReductionSpec", "spec_from_func", "reduction_kernel", "build_reduction",
           "reduction_reference", "pattern_name"]


@dataclasses.dataclass(frozen=True)
class ReductionSpec:
    """What the kernel needs, read from the outlined region function."""
    domain: tuple
    rows: int
    cols: int
    in_shapes: tuple
    in_dtypes: tuple
    in_classes: tuple
    out_shapes: tuple
    out_dtypes: tuple
    out_classes: tuple
    pattern: str
    body_text: str
    col_outputs: tuple   # indices of outputs that are column reductions (per-block partials)
    func_op: object = dataclasses.field(compare=False, hash=False, repr=False)
    classes: dict = dataclasses.field(compare=False, hash=False, repr=False, default=None)

    @property
    def digest(self) -> str:
        return hashlib.sha1(self.body_text.encode()).hexdigest()[:10]


def pattern_name(ops) -> str:
    """A label for the report, from the region's structure (not its exact op sequence)."""
    kinds = sorted(reduce_info(o)[0] for o in ops
                   if o.name == "stablehlo.reduce" and reduce_info(o) and not is_column_reduce(o))
    names = {o.name for o in ops}
    squares = any(o.name == "stablehlo.multiply" and o.operands[0] == o.operands[1] for o in ops)
    if "max" in kinds and "sum" in kinds and "stablehlo.exponential" in names:
        return "log-softmax" if "stablehlo.log" in names else "softmax"
    if kinds.count("sum") >= 2 and names & {"stablehlo.rsqrt", "stablehlo.sqrt"}:
        return "layernorm"
    if kinds.count("sum") == 1 and names & {"stablehlo.rsqrt", "stablehlo.sqrt"}:
        return "rmsnorm"
    if kinds.count("sum") >= 2:
        return "mean-variance"
    if kinds == ["sum"] and squares:
        return "sum-of-squares"
    return f"row-{'-'.join(kinds)}" if kinds else "rows"


def _entry(fn_op):
    return fn_op.regions[0].blocks[0]


def spec_from_func(fn_op) -> ReductionSpec:
    """Read an outlined reduction region (``func.func``) into a :class:`ReductionSpec`."""
    entry = _entry(fn_op)
    ops = [o.operation for o in entry.operations]
    reduces = [o for o in ops if o.name == "stablehlo.reduce"]
    if not reduces:
        raise EmitError("reduction region without a reduce")
    domain = hir.tensor_type_info(reduces[0].operands[0].type).shape
    view = View.of(domain)
    try:
        classes = view_classes(ops, view)
    except ClassError as e:
        raise EmitError(f"region values have no consistent row/col view: {e}") from None
    ret = ops[-1]
    ins = [hir.tensor_type_info(a.type) for a in entry.arguments]
    outs = [hir.tensor_type_info(v.type) for v in ret.operands]
    if any(i is None for i in ins + outs):
        raise EmitError("dynamic shapes")
    in_classes = tuple(classes.get(a, SCALAR if ins[i].size == 1 else None) for i, a in enumerate(entry.arguments))
    if None in in_classes:
        raise EmitError("region input without a view class")
    out_classes = tuple(classes[v] for v in ret.operands)
    col_outputs = []
    for k, (v, c) in enumerate(zip(ret.operands, out_classes)):
        d = hir.defining_op(v)
        if c == COL and d is not None and d.name == "stablehlo.reduce" and is_column_reduce(d):
            col_outputs.append(k)
        elif c not in (FULL, ROW):
            raise EmitError(f"region outputs must be full rows, per-row values or column reductions, "
                            f"got {out_classes}")
    for o in reduces:
        if is_column_reduce(o):
            if any(u.name != "func.return" for u in hir.users(o.results[0])):
                raise EmitError("a column reduction is read inside the region (complete only after "
                                "the last row block)")
            if not hir.tensor_type_info(o.results[0].type).dtype.startswith(("f", "bf")):
                raise EmitError("column reduction of a non-float value")
    body = hir.ops_text(ops)
    return ReductionSpec(tuple(domain), view.rows, view.cols,
                         tuple(i.shape for i in ins), tuple(hir.np_dtype(i.dtype) for i in ins), in_classes,
                         tuple(o.shape for o in outs), tuple(hir.np_dtype(o.dtype) for o in outs), out_classes,
                         pattern_name(ops), body, tuple(col_outputs), fn_op, classes)


def _view_shape(cls: str, rows: int, cols: int) -> tuple:
    return {FULL: (rows, cols), ROW: (rows, 1), COL: (1, cols), SCALAR: (1, 1)}[cls]


def _block_shape(cls: str, blocks: RowBlocks) -> tuple:
    return _view_shape(cls, blocks.br, blocks.bc)


def _spec_for(cls: str, blocks: RowBlocks) -> pl.BlockSpec:
    shape = _block_shape(cls, blocks)
    if cls in (FULL, ROW):
        return pl.BlockSpec(shape, lambda i: (i, 0))
    return pl.BlockSpec(shape, lambda i: (0, 0))


def reduction_kernel(*refs, spec: ReductionSpec, n_in: int, shapes: dict, bool_in: tuple,
                     bool_out: tuple, cols: int, padded: bool, f32_math: bool, rows: int = 0):
    """Kernel body: load the row blocks, evaluate the region, store full/row outputs and the
    column reductions' partials of this row block. ``rows``: the real row count when the last
    row block is partial (its extra rows are masked out of column reductions), else 0."""
    in_refs, out_refs = refs[:n_in], refs[n_in:]
    entry = _entry(spec.func_op)
    env = bind(entry, [from_kernel(r[...], b) for r, b in zip(in_refs, bool_in)])
    valid = None
    if padded:
        valid = lax.broadcasted_iota(jnp.int32, shapes[FULL], 1) < cols
    row_valid = None
    if rows:
        br = shapes[ROW][0]
        row_valid = pl.program_id(0) * br + lax.broadcasted_iota(jnp.int32, shapes[ROW], 0) < rows
    ops = [o.operation for o in entry.operations]
    eval_block(ops, env, spec.classes, shapes, valid=valid, f32_math=f32_math, row_valid=row_valid)
    ret = ops[-1]
    for r, v, cls, b in zip(out_refs, ret.operands, spec.out_classes, bool_out):
        r[...] = jnp.broadcast_to(to_kernel(env[value_key(v)], b), shapes[cls]).astype(r.dtype)


def build_reduction(spec: ReductionSpec, target: Target | str, *, interpret=None, blocks: RowBlocks | None = None,
                    name: str | None = None):
    """The region as ``f(*inputs) -> outputs`` around one ``pallas_call``.

    ``interpret``: see :func:`~hlofuse.kernels.common.call_options`. A row longer than the
    target's row budget (or ``blocks`` a :class:`~hlofuse.kernels.tiling.TiledRowBlocks`) is
    walked in column tiles (:mod:`hlofuse.kernels.row_tiled`).
    """
    target = Target.of(target)
    if isinstance(blocks, TiledRowBlocks) or (blocks is None and is_tiled(spec, target)):
        return build_tiled(spec, target, interpret=interpret, blocks=blocks, name=name)
    bool_in = int32_bools(spec.in_dtypes, target, interpret)
    bool_out = int32_bools(spec.out_dtypes, target, interpret)
    n_full = sum(c == FULL for c in spec.in_classes + spec.out_classes)
    try:
        blocks = blocks or row_blocks(spec.rows, spec.cols, target=target,
                                      itemsize=max_itemsize(spec.in_dtypes + spec.out_dtypes),
                                      n_arrays=max(2, n_full + 2))
    except ValueError as e:
        if target.is_cpu:
            raise EmitError(str(e)) from None
        # whole rows do not fit the chip (a tpu row within max_row_elems may still exceed VMEM
        # once all the region's arrays are double-buffered): walk the rows in column tiles
        return build_tiled(spec, target, interpret=interpret, name=name)
    check_tpu_dtypes(spec.in_dtypes + spec.out_dtypes, target)
    shapes = {c: _block_shape(c, blocks) for c in (FULL, ROW, COL, SCALAR)}
    name = name or f"hlofuse_reduction_{spec.pattern.replace('-', '_')}_{spec.digest}"
    out_dtypes = kernel_dtypes(spec.out_dtypes, bool_out)
    cols_out = set(spec.col_outputs)
    partial_rows = spec.rows if (cols_out and spec.rows % blocks.br) else 0
    kernel = functools.partial(reduction_kernel, spec=spec, n_in=len(spec.in_dtypes), shapes=shapes,
                               bool_in=bool_in, bool_out=bool_out, cols=spec.cols, padded=blocks.padded,
                               f32_math=not target.is_cpu, rows=partial_rows)
    n_blocks = blocks.grid[0]

    def out_struct(k, c, d):
        if k in cols_out:   # one partial per row block: (grid, 1, cols), 16-bit floats as f32
            pd = np.float32 if np.dtype(d) in (np.dtype(jnp.bfloat16), np.dtype(jnp.float16)) else d
            return jax.ShapeDtypeStruct((n_blocks, 1, spec.cols), pd)
        return jax.ShapeDtypeStruct(_view_shape(c, spec.rows, spec.cols), d)

    def out_spec(k, c):
        if k in cols_out:
            return pl.BlockSpec((None, 1, blocks.bc), lambda i: (i, 0, 0))
        return _spec_for(c, blocks)

    call = pl.pallas_call(
        kernel,
        out_shape=[out_struct(k, c, d) for k, (c, d) in enumerate(zip(spec.out_classes, out_dtypes))],
        grid=blocks.grid,
        in_specs=[_spec_for(c, blocks) for c in spec.in_classes],
        out_specs=[out_spec(k, c) for k, c in enumerate(spec.out_classes)],
        **call_options(target, blocks, interpret),
        name=name,
    )
    if cols_out:
        ret = [o.operation for o in _entry(spec.func_op).operations][-1]
        col_ops = {k: hir.defining_op(ret.operands[k]) for k in cols_out}
        kernel_call = call

        def call(*views):
            # the column reductions' partials combined over the row blocks, init applied once
            outs = list(kernel_call(*views))
            for k, op in col_ops.items():
                outs[k] = reduce_with_init(op, outs[k][:, 0, :], axis=0).astype(out_dtypes[k])
            return outs
    return boundary(call, blocks, name,
                    in_views=[(i, _view_shape(c, spec.rows, spec.cols)) for i, c in enumerate(spec.in_classes)],
                    out_shapes=spec.out_shapes, bool_in=bool_in, bool_out=bool_out)


def reduction_reference(spec: ReductionSpec):
    """Plain-jnp reference: the region evaluated op by op on whole arrays, no Pallas."""
    def ref(*inputs):
        return tuple(eval_reference(spec.func_op, inputs))
    return ref
