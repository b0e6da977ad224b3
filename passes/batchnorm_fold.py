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

Also (``folded_into_next``, option ``fold_into_next``) the other direction: a per-feature
affine map *before* dots with constant weights, LayerNorm's ``* gamma + beta`` (or any chain of
scales and shifts by constants along the last dim) feeding ``(.., K) x (K, N)`` dots::

    z = (n * g + b) @ W          z = n @ (g[:, None] * W) + broadcast(b @ W)

(folded into every dot that reads the value, e.g. the Q/K/V projections after one LayerNorm;
``b @ W`` is computed on the host in float64). Not folded there: a value also read by a non-dot
or as a dot's rhs, runtime weights, dots with batch dims or other contractions.

Not folded: weights that are runtime arguments, producers with other users, chains without a
scale that have fewer than two shifts, ``batch_group_count != 1``, non-float types, scales that
are not finite or a division by zero. Each conv/dot_general whose result feeds such a chain
and is not folded is counted by reason in the statistics (``refused[<reason>]``); a lone bias
add (one shift, no scale) is already the folded form and is not counted.
Preconditions: ``constant-fold`` has run (the per-channel vectors and weights are constants).
Invariant: results within the ``reassociate`` tolerance (the scale is applied to the weights
instead of the output, and shifts are summed). The module verifies; rerunning changes nothing.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo as shlo

from hlofuse.core import ir as hir
from hlofuse.core.pipeline import Pass
from hlofuse.core.report import Refusals
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
    """(weight operand index, weight dim carrying the channel, output channel dim), or a
    string saying why there is none."""
    if op.name == "stablehlo.convolution":
        if "batch_group_count" in op.attributes and ir.IntegerAttr(op.attributes["batch_group_count"]).value != 1:
            return "batch_group_count != 1"
        dn = shlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
        return 1, dn.kernel_output_feature_dimension, dn.output_feature_dimension
    if op.name == "stablehlo.dot_general":
        lb, _, _, _, lhs_free, rhs_free = gu.dot_parts(op)
        if len(rhs_free) != 1:
            return "weight has several output dimensions"  # would need a reshape
        out_dim = len(lb) + len(lhs_free)
        return 1, rhs_free[0], out_dim
    return "not a convolution or dot_general"


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


def _looks_affine(u, y) -> bool:
    """Is ``u`` a chain op whose other operand (not ``y``) is a constant or a broadcast: the
    shape of a per-channel scale or shift, whatever its values?"""
    if u.name not in CHAIN_OPS:
        return False
    other = u.operands[1] if u.operands[0] == y else u.operands[0]
    d = hir.defining_op(other)
    return d is not None and d.name in ("stablehlo.constant", "stablehlo.broadcast_in_dim")


def _why_no_chain(y: ir.Value, dim: int, channels: int) -> str | None:
    """Why the chain after ``y`` is empty, or None when nothing after ``y`` looks like one."""
    us = hir.users(y)
    affine = [u for u in us if _looks_affine(u, y)]
    if not affine:
        return None
    if len(us) != 1 or len(list(y.uses)) != 1:
        return "result has other users"
    u = affine[0]
    other = u.operands[1] if u.operands[0] == y else u.operands[0]
    kind = "scale" if u.name in ("stablehlo.multiply", "stablehlo.divide") else "shift"
    vec = channel_vector(other, dim, channels)
    if vec is None:
        return f"{kind} is not a per-channel constant"
    if u.name == "stablehlo.divide":
        return "divides by the result" if u.operands[0] != y else "divides by zero"
    return None


def _all_finite(a: np.ndarray) -> bool:
    """Whether every value of ``a`` (any float dtype, bf16 and f16 included) is finite: a folded
    constant that overflows its type turns the program's finite (or inf) results into NaN."""
    return bool(np.all(np.isfinite(a.astype(np.float32))))


def fold_one(op, refused: Refusals | None = None) -> bool:
    """Fold the affine chain after ``op``; a candidate (a chain follows) that is not folded is
    added to ``refused`` with why."""
    def refuse(why):
        if refused is not None and why is not None:
            refused.add("conv/dot affine chain", why, hir.op_location(op))
        return False

    def chain_follows():
        return any(_looks_affine(u, op.results[0]) for u in hir.users(op.results[0]))

    spec = _producer_weight(op)
    if isinstance(spec, str):
        return refuse(spec) if chain_follows() else False
    w_index, w_dim, out_dim = spec
    out = gu.info(op.results[0])
    if out is None or out.dtype not in FLOAT_TYPES:
        return refuse("not a float type") if chain_follows() else False
    channels = out.shape[out_dim]
    chain, s, t, n_scale, n_shift = _follow_chain(op.results[0], out_dim, channels)
    if not chain:
        return refuse(_why_no_chain(op.results[0], out_dim, channels))
    if n_scale == 0 and n_shift < 2:
        return False  # one bias add: already the folded form
    w = gu.constant_array(op.operands[w_index])
    if w is None:
        return refuse("weight is not a constant")
    if w.shape[w_dim] != channels:
        return refuse("weight channels differ from the result's")
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(t))):
        return refuse("folded scale or shift is not finite")
    shape = [1] * w.ndim
    shape[w_dim] = channels
    with np.errstate(over="ignore", invalid="ignore"):     # checked just below
        w_new = (w.astype(np.float64) * s.reshape(shape)).astype(w.dtype)
        t_new = t.astype(hir.np_dtype(out.dtype))
    if not (_all_finite(w_new) and _all_finite(t_new)):
        return refuse("folded weight or shift overflows its type")
    last = chain[-1]
    new_w = gu.make_constant(w_new, op.operands[w_index].type, before=op)
    old_w = hir.defining_op(op.operands[w_index])
    op.operands[w_index] = new_w
    gu.erase_if_dead([old_w])
    result = op.results[0]
    if n_shift:
        et = gu.element_type(result)
        vt = gu.tensor_type([channels], et)
        bias = gu.make_constant(t_new, vt, before=last)
        b = gu.make_broadcast(bias, [out_dim], result.type, before=last)
        result = gu.create("stablehlo.add", [op.results[0], b], [result.type],
                           before=last).results[0]
    last.results[0].replace_all_uses_with(result)
    gu.erase_if_dead([last])
    return True


def _pre_chain(x: ir.Value, dim: int, channels: int):
    """Walk the affine chain that produces ``x`` backwards (per-channel constants along
    ``dim``): returns (source, ops, s, t) with ``x == source * s + t``; ``ops`` empty when
    nothing folds. Every value inside the chain has one use (the next op)."""
    s, t = np.ones(channels), np.zeros(channels)
    ops, cur = [], x
    while True:
        p = hir.defining_op(cur)
        if p is None or p.name not in CHAIN_OPS or (ops and len(list(cur.uses)) != 1):
            break
        a, b = p.operands[0], p.operands[1]
        va, vb = channel_vector(a, dim, channels), channel_vector(b, dim, channels)
        if (va is None) == (vb is None):
            break  # both or neither per-channel constants: not a chain step
        data, vec, data_first = (a, vb, True) if vb is not None else (b, va, False)
        if p.name == "stablehlo.multiply":
            s = s * vec
        elif p.name == "stablehlo.add":
            t = t + vec * s
        elif p.name == "stablehlo.subtract":
            if data_first:
                t = t - vec * s
            else:
                t, s = t + vec * s, -s
        else:  # divide: only data / vec, never by zero
            if not data_first or np.any(vec == 0):
                break
            s = s / vec
        ops.append(p)
        cur = data
    return cur, ops, s, t


def _pre_dot(op) -> str | None:
    """Why ``op`` cannot take a folded input affine map (None: it can)."""
    if op.name != "stablehlo.dot_general":
        return "used by a non-dot"
    dn = shlo.DotDimensionNumbers(op.attributes["dot_dimension_numbers"])
    lhs, rhs = gu.info(op.operands[0]), gu.info(op.operands[1])
    if list(dn.lhs_batching_dimensions) or list(dn.lhs_contracting_dimensions) != [len(lhs.shape) - 1] \
            or len(rhs.shape) != 2:
        return "not a plain (.., K) x (K, N) dot"
    if gu.info(op.results[0]).dtype not in FLOAT_TYPES:
        return "not a float type"
    if gu.constant_array(op.operands[1]) is None:
        return "weight is not a constant"
    return None


def fold_into_next(x: ir.Value, refused: Refusals | None = None) -> int:
    """Fold the per-feature affine map producing ``x`` (LayerNorm's ``* gamma + beta``, any
    scale/shift by constants along the last dim) into the constant weights of the dots reading
    ``x``: ``(n * g + b) @ W -> n @ (g[:, None] * W) + b @ W``. Returns the dots rewritten."""
    info = gu.info(x)
    if info is None or not info.shape or info.dtype not in FLOAT_TYPES:
        return 0
    k = info.shape[-1]
    src, ops, s, t = _pre_chain(x, len(info.shape) - 1, k)
    if not ops:
        return 0
    dots = hir.users(x)
    whys = {_pre_dot(d) for d in dots} - {None}
    if not dots or whys or any(d.operands[0] != x for d in dots):
        if refused is not None and dots and any(d.name == "stablehlo.dot_general" for d in dots):
            why = sorted(whys)[0] if whys else "value is also the dot's rhs"
            refused.add("affine map before a dot", why, hir.op_location(ops[0]))
        return 0
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(t))):
        if refused is not None:
            refused.add("affine map before a dot", "folded scale or shift is not finite", hir.op_location(ops[0]))
        return 0
    folded = []
    for d in dots:
        dn = shlo.DotDimensionNumbers(d.attributes["dot_dimension_numbers"])
        rc = list(dn.rhs_contracting_dimensions)[0]
        w0 = gu.constant_array(d.operands[1])
        wk = w0.astype(np.float64) if rc == 0 else w0.astype(np.float64).T     # (K, N)
        with np.errstate(over="ignore", invalid="ignore"):  # checked just below
            w_new = ((wk * s[:, None]) if rc == 0 else (wk * s[:, None]).T).astype(w0.dtype)
            bias = (t @ wk).astype(hir.np_dtype(gu.info(d.results[0]).dtype)) if np.any(t != 0) else None
        if not (_all_finite(w_new) and (bias is None or _all_finite(bias))):
            if refused is not None:
                refused.add("affine map before a dot", "folded weight or shift overflows its type",
                            hir.op_location(ops[0]))
            return 0
        folded.append((d, w_new, bias))
    for d, w_new, bias in folded:
        out = gu.info(d.results[0])
        old_w = hir.defining_op(d.operands[1])
        d.operands[1] = gu.make_constant(w_new, d.operands[1].type, before=d)
        d.operands[0] = src
        gu.erase_if_dead([old_w])
        if bias is not None:
            vt = gu.tensor_type([out.shape[-1]], gu.element_type(d.results[0]))
            c = gu.make_constant(bias, vt, after=d)
            b = gu.make_broadcast(c, [len(out.shape) - 1], d.results[0].type, after=hir.defining_op(c))
            add = gu.create("stablehlo.add", [d.results[0], b], [d.results[0].type], after=hir.defining_op(b))
            d.results[0].replace_all_uses_except(add.results[0], add)
    gu.erase_if_dead(ops[:1])
    return len(dots)


class BatchNormFold(Pass):
    """See the module docstring."""
    name = "batchnorm-fold"

    def run(self, module, ctx):
        folded = folded_next = 0
        refused = Refusals(self.name, outcome="not folded")
        gu.reset_tracking()
        with module.context, ir.Location.unknown():
            for block in program_blocks(module):
                for op in hir.block_ops(block):
                    if gu.alive(op) and op.name in ("stablehlo.convolution", "stablehlo.dot_general"):
                        folded += bool(fold_one(op, refused))
            if self.options.fold_into_next:
                for block in program_blocks(module):
                    for op in hir.block_ops(block):
                        if gu.alive(op) and op.name in CHAIN_OPS and len(op.results) == 1 and any(
                                u.name == "stablehlo.dot_general" for u in hir.users(op.results[0])):
                            folded_next += fold_into_next(op.results[0], refused)
        return {"folded": folded, "folded_into_next": folded_next, **refused.stats()}

    @dataclasses.dataclass(frozen=True)
    class Options:
        fold_into_next: bool = True  # also fold a per-feature scale/shift (LayerNorm gamma/beta) into the next dots
