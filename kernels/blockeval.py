"""Evaluate a region's StableHLO ops on kernel blocks (shared by the reduction, matmul-epilogue
and horizontal families) or on whole arrays (their plain-jnp references).

In a kernel every value has a view class (:mod:`hlofuse.kernels.support`): ``full``
blocks are ``(br, bc)``, ``row`` blocks ``(br, 1)``, ``col`` blocks ``(1, bc)``, ``scalar``
values ``(1, 1)`` (or ``()`` for rank-0 values), optionally with a leading batch dim. So:

* ``broadcast_in_dim`` becomes ``broadcast_to`` the result class's block shape,
* ``reshape`` is the identity (it never leaves its class's view),
* a row ``reduce`` reduces the block's last axis (``keepdims``), masking lanes past the real
  row length when the block is padded (Triton blocks are powers of two),
* splat constants become literals of the class's block shape,
* every other op comes from the op rule table (:mod:`hlofuse.ops`), operands of a smaller
  class broadcast to the result's block first.

Optionally (``f32_math``, gpu/tpu) arithmetic on 16-bit floats runs in f32 and rounds back
after every op (Triton has no bf16/f16 divide/exp/log/...), and 16-bit row reductions
accumulate in f32 -- within the ``kernel``/``reassociate`` tolerance for 16-bit types.
"""

from __future__ import annotations

import numpy as np

import jax.numpy as jnp
from jax import lax

from hlofuse.ops import EmitError, const_value, emit_op
from hlofuse.kernels.elementwise import splat_scalar
from hlofuse.kernels.support import REDUCERS, ROW, SCALAR, reduce_info

__all__ = ["eval_block", "eval_reference", "reduce_rows"]

_JNP_REDUCE = {"sum": jnp.sum, "max": jnp.max, "min": jnp.min, "prod": jnp.prod,
               "all": jnp.all, "any": jnp.any}
_COMBINE = {"sum": jnp.add, "max": jnp.maximum, "min": jnp.minimum, "prod": jnp.multiply,
            "all": jnp.logical_and, "any": jnp.logical_or}


def _init_value(op):
    _, init_op, _ = reduce_info(op)
    return const_value(init_op).reshape(())


def _is_identity(kind: str, init) -> bool:
    ident = {k: v for k, v in REDUCERS.values()}[kind]
    v = np.asarray(init)
    if v.dtype == np.bool_:
        return bool(v) == bool(ident)
    with np.errstate(invalid="ignore"):
        return bool(v.astype(np.float64) == ident)


def reduce_rows(op, x, *, valid=None, f32_math: bool = False):
    """A row reduce over the last axis of block ``x`` (keepdims), lanes outside ``valid``
    replaced by the init value first; 16-bit floats accumulate in f32 with ``f32_math``."""
    kind, _, _ = reduce_info(op)
    init = _init_value(op)
    dt = x.dtype
    if f32_math and dt in _LOW:
        x = x.astype(jnp.float32)
    if valid is not None:
        x = jnp.where(valid, x, jnp.asarray(init, x.dtype))
    r = _JNP_REDUCE[kind](x, axis=-1, keepdims=True)
    if not _is_identity(kind, init):
        r = _COMBINE[kind](jnp.asarray(init, x.dtype), r)
    return r.astype(dt)


_NO_UPCAST = {"stablehlo.convert", "stablehlo.select", "stablehlo.bitcast_convert", "stablehlo.and",
              "stablehlo.or", "stablehlo.xor", "stablehlo.not"}
_LOW = (jnp.bfloat16, jnp.float16)


def _upcast_math(op, args):
    """Compute an op on 16-bit floats in f32 and round the result back (Triton has no 16-bit
    divide/exp/log/...); None when the op needs no upcast."""
    if op.name in _NO_UPCAST or not any(getattr(a, "dtype", None) in _LOW for a in args):
        return None
    from hlofuse import ir as hir
    res_dt = hir.np_dtype(hir.tensor_type_info(op.results[0].type).dtype)
    outs = emit_op(op, [a.astype(jnp.float32) if getattr(a, "dtype", None) in _LOW else a for a in args])
    return [o.astype(res_dt) for o in outs]


def eval_block(ops, env: dict, classes: dict, shapes: dict, *, valid=None, f32_math: bool = False) -> dict:
    """Evaluate ``ops`` (program order) on blocks; ``env`` maps input ``ir.Value`` -> block.

    Args:
      ops: region ops (``func.return`` and ops already in ``env`` are skipped).
      env: values known so far (updated in place and returned).
      classes: view class of every value (:func:`~hlofuse.kernels.support.view_classes`).
      shapes: block shape per class, e.g. ``{'full': (br, bc), 'row': (br, 1), ...}``.
      valid: optional boolean block of the ``full`` shape marking real (unpadded) lanes.
      f32_math: run 16-bit transcendental ops in f32.
    """
    for op in ops:
        name = op.name
        if name in ("func.return", "stablehlo.return") or (len(op.results) and op.results[0] in env):
            continue
        res = op.results[0]
        cls = classes.get(res, SCALAR)
        shape = shapes[cls] if not (cls == SCALAR and not _rank(res)) else ()
        if name == "stablehlo.constant":
            c = splat_scalar(op)  # one element, whatever the IR shape (never materialized)
            if c is None:
                c = const_value(op).reshape(-1)[0]
            val = jnp.full(shape, c, dtype=c.dtype)
        elif name == "stablehlo.broadcast_in_dim":
            val = jnp.broadcast_to(env[op.operands[0]], shape)
        elif name == "stablehlo.reshape":
            x = env[op.operands[0]]
            val = x if cls != SCALAR else jnp.reshape(x, shape)
        elif name == "stablehlo.reduce":
            if cls != ROW:
                raise EmitError("only row reductions are evaluated in a block view")
            val = reduce_rows(op, env[op.operands[0]], valid=valid, f32_math=f32_math)
        else:
            args = []
            for v in op.operands:
                a = env[v]
                if hasattr(a, "shape") and tuple(a.shape) != tuple(shape) and name != "stablehlo.select":
                    a = jnp.broadcast_to(a, shape) if shape != () else jnp.reshape(a, ())
                args.append(a)
            out = _upcast_math(op, args) if f32_math else None
            val = (out or emit_op(op, args))[0]
        env[res] = val
    return env


def _shape(v) -> tuple:
    from hlofuse import ir as hir
    return hir.tensor_type_info(v.type).shape


def _rank(v) -> int:
    from hlofuse import ir as hir
    info = hir.tensor_type_info(v.type)
    return len(info.shape) if info else 0


def eval_reference(fn_op, args) -> list:
    """Evaluate an outlined region function on whole arrays with plain jnp (the reference)."""
    entry = fn_op.regions[0].blocks[0]
    env = {a: jnp.asarray(x) for a, x in zip(entry.arguments, args)}
    for op in entry.operations:
        op = op.operation
        if op.name == "func.return":
            return [env[v] for v in op.operands]
        if op.name == "stablehlo.constant" and (c := splat_scalar(op)) is not None:
            env[op.results[0]] = jnp.full(_shape(op.results[0]), c)
        elif op.name == "stablehlo.reduce":
            kind, _, dims = reduce_info(op)
            x = env[op.operands[0]]
            init = _init_value(op)
            r = _JNP_REDUCE[kind](x, axis=tuple(dims))
            if not _is_identity(kind, init):
                r = _COMBINE[kind](jnp.asarray(init, x.dtype), r)
            env[op.results[0]] = r.astype(x.dtype)
        elif op.name == "stablehlo.dot_general":
            env[op.results[0]] = _dot_reference(op, env[op.operands[0]], env[op.operands[1]])
        elif op.name == "stablehlo.reshape":
            from hlofuse import ir as hir
            env[op.results[0]] = jnp.reshape(env[op.operands[0]], hir.tensor_type_info(op.results[0].type).shape)
        else:
            for j, r in enumerate(emit_op(op, [env[v] for v in op.operands])):
                env[op.results[j]] = r
    raise EmitError("region has no return")


def _dot_reference(op, a, b):
    from jaxlib.mlir.dialects import stablehlo
    from hlofuse import ir as hir
    dn = stablehlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    dims = ((tuple(dn.lhs_contracting_dimensions), tuple(dn.rhs_contracting_dimensions)),
            (tuple(dn.lhs_batching_dimensions), tuple(dn.rhs_batching_dimensions)))
    out_dt = hir.np_dtype(hir.tensor_type_info(op.results[0].type).dtype)
    return lax.dot_general(a, b, dims, preferred_element_type=jnp.float32).astype(out_dt)
