"""``batchnorm-fold``: fold per-channel affine chains (inference BatchNorm) into weights.

Rewrites::

    y = conv(x, W)                              y = conv(x, W * s)       (W' folded on the host)
    z = ((y - mean) * rsqrt(var+eps)) * g + b   z = y + broadcast(t)     (one bias add, or none)

More generally: starting at a ``stablehlo.convolution`` or ``stablehlo.dot_general`` whose
weight operand is a constant, it follows the single-use chain of ``add``, ``subtract``,
``multiply`` and ``divide`` ops whose other operand is a per-output-channel constant (a splat,
a ``broadcast_in_dim`` of a constant such as ``tensor<1xCx1x1>`` that only varies along the
channel dimension, or a full constant of that form). The chain is the affine map
``z = y * s + t`` (``s``, ``t`` per channel, accumulated in float64); ``s`` is multiplied into
the weight's output-channel dimension and ``t`` becomes one broadcast bias add. This is how
JAX/flax emit BatchNorm with ``use_running_average=True`` once ``constant-fold`` has folded
``rsqrt(var + eps) * gamma`` of frozen parameters (``hlofuse.jit(..., freeze_argnums=...)``).

Not folded: weights that are runtime arguments, producers with other users, chains without a
scale that have fewer than two shifts, ``batch_group_count != 1``, non-float types, scales that
are not finite or a division by zero.
Preconditions: ``constant-fold`` has run (the per-channel vectors and weights are constants).
Invariant: results within the ``reassociate`` tolerance (the scale is applied to the weights
instead of the output, and shifts are summed). The module verifies; rerunning changes nothing.
"""

from __future__ import annotations

import numpy as np

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo as shlo

from hlofuse import ir as hir
from hlofuse.pipeline import Pass, register_pass
from hlofuse.passes import graph_util as gu
from hlofuse.passes.fusion.outline import program_blocks

CHAIN_OPS = ("stablehlo.add", "stablehlo.subtract", "stablehlo.multiply", "stablehlo.divide")
FLOAT_TYPES = ("f16", "bf16", "f32", "f64")


def channel_vector(v: ir.Value, dim: int, channels: int) -> np.ndarray | None:
    """The per-channel float64 vector ``v`` broadcasts along ``dim`` (length ``channels``), or
    None when ``v`` is not a constant that varies only along ``dim``."""
    out = gu.info(v)
    if out is None:
        return None
    rank = len(out.shape)
    op = hir.defining_op(v)
    if op is None:
        return None
    if op.name == "stablehlo.constant":
        arr = gu.constant_array(v)
        if arr is None:
            return None
    elif op.name == "stablehlo.broadcast_in_dim":
        src = gu.constant_array(op.operands[0])
        if src is None:
            return None
        dims = gu.i64_array(op, "broadcast_dimensions")
        order = np.argsort(dims)
        expanded = [1] * rank
        for k, d in enumerate(dims):
            expanded[d] = src.shape[k]
        arr = np.transpose(src, order).reshape(expanded)
    else:
        return None
    arr = arr.astype(np.float64)
    for ax in range(rank):  # must be constant along every non-channel axis
        if ax != dim and arr.shape[ax] > 1:
            first = np.take(arr, [0], axis=ax)
            if not np.array_equal(arr, np.broadcast_to(first, arr.shape), equal_nan=True):
                return None
            arr = first
    vec = arr.reshape(-1)
    if vec.size == 1:
        return np.full(channels, vec[0])
    return vec if vec.size == channels else None


def _producer_weight(op):
    """(weight operand index, weight dim carrying the channel, output channel dim) or None."""
    if op.name == "stablehlo.convolution":
        if "batch_group_count" in op.attributes and ir.IntegerAttr(op.attributes["batch_group_count"]).value != 1:
            return None
        dn = shlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
        return 1, dn.kernel_output_feature_dimension, dn.output_feature_dimension
    if op.name == "stablehlo.dot_general":
        dn = shlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
        lhs_rank = len(gu.info(op.operands[0]).shape)
        rhs_rank = len(gu.info(op.operands[1]).shape)
        lb, lc = list(dn.lhs_batching_dimensions), list(dn.lhs_contracting_dimensions)
        rb, rc = list(dn.rhs_batching_dimensions), list(dn.rhs_contracting_dimensions)
        lhs_free = [d for d in range(lhs_rank) if d not in lb + lc]
        rhs_free = [d for d in range(rhs_rank) if d not in rb + rc]
        if len(rhs_free) != 1:
            return None  # one channel dim; several rhs free dims would need a reshape
        out_dim = len(lb) + len(lhs_free)
        return 1, rhs_free[0], out_dim
    return None


def _follow_chain(y: ir.Value, dim: int, channels: int):
    """Walk the affine chain from ``y``; returns (ops, scale, shift, n_scale, n_shift)."""
    s = np.ones(channels)
    t = np.zeros(channels)
    ops, n_scale, n_shift = [], 0, 0
    cur = y
    while True:
        us = hir.users(cur)
        if len(us) != 1 or us[0].name not in CHAIN_OPS or len(list(cur.uses)) != 1:
            break
        u = us[0]
        a, b = u.operands[0], u.operands[1]
        cur_is_a = a == cur
        other = b if cur_is_a else a
        vec = channel_vector(other, dim, channels)
        if vec is None:
            break
        if u.name == "stablehlo.add":
            t = t + vec
            n_shift += 1
        elif u.name == "stablehlo.subtract":
            if cur_is_a:
                t = t - vec
            else:
                s, t = -s, vec - t
            n_shift += 1
        elif u.name == "stablehlo.multiply":
            s, t = s * vec, t * vec
            n_scale += 1
        else:  # divide
            if not cur_is_a or np.any(vec == 0):
                break
            s, t = s / vec, t / vec
            n_scale += 1
        ops.append(u)
        cur = u.results[0]
    return ops, s, t, n_scale, n_shift


def fold_one(op) -> bool:
    spec = _producer_weight(op)
    if spec is None:
        return False
    w_index, w_dim, out_dim = spec
    out = gu.info(op.results[0])
    if out is None or out.dtype not in FLOAT_TYPES:
        return False
    w = gu.constant_array(op.operands[w_index])
    if w is None:
        return False
    channels = out.shape[out_dim]
    if w.shape[w_dim] != channels:
        return False
    chain, s, t, n_scale, n_shift = _follow_chain(op.results[0], out_dim, channels)
    if not chain or (n_scale == 0 and n_shift < 2):
        return False
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(t))):
        return False
    shape = [1] * w.ndim
    shape[w_dim] = channels
    w_new = (w.astype(np.float64) * s.reshape(shape)).astype(w.dtype)
    last = chain[-1]
    new_w = gu.make_constant(w_new, op.operands[w_index].type, before=op)
    old_w = hir.defining_op(op.operands[w_index])
    op.operands[w_index] = new_w
    gu.erase_if_dead([old_w])
    result = op.results[0]
    if n_shift:
        et = gu.element_type(result)
        vt = gu.tensor_type([channels], et)
        bias = gu.make_constant(t.astype(hir.np_dtype(out.dtype)), vt, before=last)
        b = gu.make_broadcast(bias, [out_dim], result.type, before=last)
        result = gu.create("stablehlo.add", [op.results[0], b], [result.type],
                           before=last).results[0]
    last.results[0].replace_all_uses_with(result)
    gu.erase_if_dead([last])
    return True


@register_pass
class BatchNormFold(Pass):
    """See the module docstring."""
    name = "batchnorm-fold"

    def run(self, module, ctx):
        folded = 0
        gu.reset_tracking()
        with module.context, ir.Location.unknown():
            for block in program_blocks(module):
                for op in hir.block_ops(block):
                    if gu.alive(op) and op.name in ("stablehlo.convolution", "stablehlo.dot_general"):
                        folded += bool(fold_one(op))
        return {"folded": folded}
