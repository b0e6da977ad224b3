"""Evaluate a region's StableHLO ops on kernel blocks (shared by the reduction, matmul-epilogue
and horizontal families) or on whole arrays (their plain-jnp references).

In a kernel every value has a view class (:mod:`hlofuse.kernels.support`): ``full``
blocks are ``(br, bc)``, ``row`` blocks ``(br, 1)``, ``col`` blocks ``(1, bc)``, ``scalar``
values ``(1, 1)`` (or ``()`` for rank-0 values), optionally with a leading batch dim. So:

* ``broadcast_in_dim`` becomes ``broadcast_to`` the result class's block shape,
* ``reshape`` is the identity (it never leaves its class's view),
* a row ``reduce`` reduces the block's last axis (``keepdims``), masking lanes past the real
  row length when the block is padded (Triton blocks are powers of two); a column ``reduce``
  (over every row) gives the block's partial ``(1, bc)``, which the kernel writes per row block,
* splat constants become literals of the class's block shape,
* every other op comes from the op rule table (:mod:`hlofuse.core.ops`), operands of a smaller
  class broadcast to the result's block first.

Optionally (``f32_math``, gpu/tpu) arithmetic on 16-bit floats runs in f32 and rounds back
after every op (Triton has no bf16/f16 divide/exp/log/...), and 16-bit row reductions
accumulate in f32 -- within the ``kernel``/``reassociate`` tolerance for 16-bit types; the
round ops are computed exactly from floor (:func:`round_by_floor`: Triton has no round).
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from hlofuse.core import ir as hir
from hlofuse.core.ir import value_key
from hlofuse.core.ops import EmitError, OpClass, const_value, emit_op, rule_for, splat_scalar
from hlofuse.kernels.interpret import Rule, eval_reference, interpret, reduce_init, reduce_with_init
from hlofuse.kernels.support import COL, REDUCERS, ROW, SCALAR, reduce_info

__all__ = ["block_rules", "emit_f32", "eval_block", "eval_reference", "reduce_rows", "reduce_cols_partial"]


def reduce_rows(op, x, *, valid=None, f32_math: bool = False):
    """A row reduce over the last axis of block ``x`` (keepdims), lanes outside ``valid``
    replaced by the init value first; 16-bit floats accumulate in f32 with ``f32_math``."""
    init = reduce_init(op)
    dt = x.dtype
    if f32_math and dt in _LOW:
        x = x.astype(jnp.float32)
    if valid is not None:
        x = jnp.where(valid, x, jnp.asarray(init, x.dtype))
    return reduce_with_init(op, x, axis=-1, keepdims=True).astype(dt)


def reduce_cols_partial(op, x, *, row_valid=None):
    """A column reduce's partial result over the rows of block ``x``: ``(1, bc)``, reduced with
    the reducer's identity (the init is combined once, after the last block; see
    :func:`~hlofuse.kernels.reduction.build_reduction`), rows outside ``row_valid`` (past the
    last real row of a partial last block) masked out; 16-bit floats accumulate in f32 and the
    partial stays f32."""
    kind, _, _ = reduce_info(op)
    ident = {k: v for k, v in REDUCERS.values()}[kind]
    if x.dtype in _LOW:
        x = x.astype(jnp.float32)
    if row_valid is not None:
        x = jnp.where(row_valid, x, jnp.asarray(ident, x.dtype))
    fn = {"sum": jnp.sum, "max": jnp.max, "min": jnp.min, "prod": jnp.prod, "all": jnp.all,
          "any": jnp.any}[kind]
    # every axis but the last (a cpu matmul block keeps its batch dim: (1, M, N))
    return fn(x, axis=tuple(range(x.ndim - 1)), keepdims=True)


_NO_UPCAST = {"stablehlo.convert", "stablehlo.select", "stablehlo.bitcast_convert", "stablehlo.and",
              "stablehlo.or", "stablehlo.xor", "stablehlo.not"}
_LOW = (jnp.bfloat16, jnp.float16)


def round_by_floor(x, *, ties_even: bool = True):
    """``round_nearest_even`` (or ``_afz``) from floor, compares and selects, exactly.

    Triton has no ``round`` primitive (found lowering int8 requantization); these ops lower
    everywhere. For finite ``|x| < 2^23`` (f32; every larger float is an integer) ``f =
    floor(x)`` and ``d = x - f`` are exact, ties go to the even neighbour (or away from zero),
    a zero result takes ``x``'s sign (``round(-0.3) == -0.0``); NaN and infinities pass
    through. 16-bit floats round in f32 (the rounded integer is representable in their type).
    """
    dt = x.dtype
    if dt in _LOW:
        return round_by_floor(x.astype(jnp.float32), ties_even=ties_even).astype(dt)
    if ties_even:
        f = jnp.floor(x)
        d = x - f
        odd = (f - 2.0 * jnp.floor(f * 0.5)) == 1.0
        r = jnp.where(d > 0.5, f + 1.0, jnp.where(d < 0.5, f, jnp.where(odd, f + 1.0, f)))
    else:
        a = jnp.abs(x)
        t = jnp.floor(a)
        t = jnp.where(a - t >= 0.5, t + 1.0, t)
        r = jnp.where(x < 0, -t, t)
    r = jnp.where(r == 0, x * 0.0, r)
    return jnp.where(jnp.abs(x) < 2.0 ** 23, r, x)


_ROUNDS = {"stablehlo.round_nearest_even": True, "stablehlo.round_nearest_afz": False}


def emit_f32(op, args) -> list:
    """Emit ``op``; on 16-bit floats in f32, its result rounded back (:func:`_upcast_math`)."""
    return _upcast_math(op, args) or emit_op(op, args)


def _upcast_math(op, args):
    """Compute an op on 16-bit floats in f32 and round the result back (Triton has no 16-bit
    divide/exp/log/...); None when the op needs no upcast. Exact for add, subtract, multiply,
    divide and sqrt: f32 has more than twice bf16's and f16's precision plus two bits, so
    rounding the f32 result again gives the correctly rounded 16-bit one."""
    if op.name in _NO_UPCAST or not any(getattr(a, "dtype", None) in _LOW for a in args):
        return None
    res_dt = hir.np_dtype(hir.tensor_type_info(op.results[0].type).dtype)
    outs = emit_op(op, [a.astype(jnp.float32) if getattr(a, "dtype", None) in _LOW else a for a in args])
    return [o.astype(res_dt) for o in outs]


def _rank(v) -> int:
    info = hir.tensor_type_info(v.type)
    return len(info.shape) if info else 0


def _to_shape(a, shape: tuple):
    if not hasattr(a, "shape") or tuple(a.shape) == tuple(shape):
        return a
    return jnp.broadcast_to(a, shape) if shape != () else jnp.reshape(a, ())


def block_rules(classes: dict, shapes: dict, *, valid=None, f32_math: bool = False,
                row_valid=None) -> tuple[dict, Rule]:
    """The block view of :func:`eval_block` as interpreter ``(rules, emit)``
    (see :mod:`hlofuse.kernels.interpret`)."""
    def cls_of(op):
        return classes.get(op.results[0], SCALAR)

    def shape_of(op):
        res = op.results[0]
        cls = classes.get(res, SCALAR)
        return shapes[cls] if not (cls == SCALAR and not _rank(res)) else ()

    def constant(op, args):
        c = splat_scalar(op)  # one element, whatever the IR shape (never materialized)
        if c is None:
            c = const_value(op).reshape(-1)[0]
        _note(op, c)
        return [jnp.full(shape_of(op), c, dtype=c.dtype)]

    def broadcast(op, args):
        if value_key(op.operands[0]) in splats:
            _note(op, splats[value_key(op.operands[0])])
        return [jnp.broadcast_to(args[0], shape_of(op))]

    def reshape(op, args):
        if value_key(op.operands[0]) in splats:
            _note(op, splats[value_key(op.operands[0])])
        return [args[0] if cls_of(op) != SCALAR else jnp.reshape(args[0], shape_of(op))]

    def reduce(op, args):
        if cls_of(op) == COL:
            return [reduce_cols_partial(op, args[0], row_valid=row_valid)]
        if cls_of(op) != ROW:
            raise EmitError("only row reductions are evaluated in a block view")
        return [reduce_rows(op, args[0], valid=valid, f32_math=f32_math)]

    # splat values computed from constants only: value key -> numpy scalar. jax 0.10.2 keeps a
    # splat constant as a jaxpr literal, and Triton's unary rules (negate's ``_minus``) take no
    # literal operand: an elementwise op of constants is folded here, on scalars, instead.
    splats: dict = {}

    def _note(op, c):
        splats[value_key(op.results[0])] = np.asarray(c)

    def emit(op, args):
        keys = [value_key(v) for v in op.operands]
        if (keys and len(op.results) == 1 and all(k in splats for k in keys)
                and rule_for(op.name).cls is OpClass.ELEMENTWISE):
            with jax.ensure_compile_time_eval():
                c = np.asarray(emit_op(op, [jnp.asarray(splats[k]) for k in keys])[0])
            _note(op, c)
            return [jnp.full(shape_of(op), c, dtype=c.dtype)]
        return _emit(op, args)

    def _emit(op, args):
        shape = shape_of(op)
        if op.name != "stablehlo.select":   # operands of a smaller class: to the result's block
            args = [_to_shape(a, shape) for a in args]
        if f32_math and op.name in _ROUNDS:  # gpu/tpu kernels: Triton has no round primitive
            return [round_by_floor(args[0], ties_even=_ROUNDS[op.name])]
        if f32_math and op.name == "stablehlo.select" and any(getattr(a, "dtype", None) in _LOW for a in args[1:]):
            # exact in f32; Mosaic (v5e) cannot relayout an i1 mask made beside 32-bit values
            # ((8, 128) tiles) to the (16, 128) tiles of a 16-bit select ("Invalid relayout")
            dt = args[1].dtype
            return [x.astype(dt) for x in emit_op(op, [args[0]] + [a.astype(jnp.float32) for a in args[1:]])]
        return emit_f32(op, args) if f32_math else emit_op(op, args)

    rules = {"stablehlo.constant": constant, "stablehlo.broadcast_in_dim": broadcast,
             "stablehlo.reshape": reshape, "stablehlo.reduce": reduce}
    return rules, emit


def eval_block(ops, env: dict, classes: dict, shapes: dict, *, valid=None, f32_math: bool = False,
               row_valid=None) -> dict:
    """Evaluate ``ops`` (program order) on blocks; ``env`` maps input value keys
    (:func:`hlofuse.core.ir.value_key`) -> block.

    Args:
      ops: region ops (stops at a ``func.return``; ops already in ``env`` are skipped).
      env: values known so far (updated in place and returned).
      classes: view class of every value (:func:`~hlofuse.kernels.support.view_classes`).
      shapes: block shape per class, e.g. ``{'full': (br, bc), 'row': (br, 1), ...}``.
      valid: optional boolean block of the ``full`` shape marking real (unpadded) lanes.
      f32_math: run 16-bit transcendental ops in f32.
      row_valid: optional boolean ``(br, 1)`` block marking real rows (column reductions of a
        partial last row block mask the others).
    """
    rules, emit = block_rules(classes, shapes, valid=valid, f32_math=f32_math, row_valid=row_valid)
    interpret(ops, env, rules=rules, emit=emit)
    return env
