"""``depthwise-conv-taps``: on cpu, a depthwise (or other grouped) convolution becomes the sum
of its taps, one strided slice of the padded input times one weight vector per filter position
(and input channel of a group).

Why: XLA:CPU runs a depthwise convolution (``feature_group_count`` = channels, one filter per
channel: MobileNet, EfficientNet, ConvNeXt) in a slow generic loop. Written as ``kh * kw``
elementwise products summed, XLA fuses the whole filter, with the BatchNorm and activation
after it, into one vectorized loop over the channels. Measured on a 2-core Sapphire Rapids
(3x3 with ReLU6, NHWC, batch 1, interleaved medians): 112x112x32 9.45 -> 0.57 ms, stride 2
112x112x96 7.32 -> 0.75 ms, 56x56x144 10.1 -> 0.58 ms, 28x28x192 3.51 -> 0.19 ms, 7x7x960
1.32 -> 0.15 ms (``python -m bench.depthwise_cpu``).

Rewrites (target cpu only):
- a grouped ``convolution`` (``feature_group_count`` G > 1: depthwise when G is the input
  channels; ResNeXt's 32 groups of 4-8 channels; channel multipliers) with at most
  ``max_taps`` products per output element (filter positions x input channels per group, Cg),
  no window reversal, non-negative padding, float operands, any layout, strides, filter
  dilation and input dilation. It becomes ``pad`` (the convolution's padding, and
  ``lhs_dilation - 1`` interior zeros: a strided convolution's input gradient), then for each
  filter position ``k`` (row-major over the spatial dims) and group channel ``i``
  ``slice(x_padded, k * dilation, stride; channels i, i + Cg, ...)``, repeated for each of a
  group's Og outputs, ``* broadcast(w[k, i, :])``, summed left to right, transposed to the
  output's layout when that differs from the input's. jax's input gradient of such a
  convolution is one too (of the flipped filter). 3x3 ResNeXt layers (batch 1, with ReLU):
  56x56x128 in 32 groups 9.28 -> 1.93 ms, 28x28x256 2.57 -> 1.32 ms; 16 channels per group
  (144 products) measured 6x slower as taps and stays XLA's.
- its filter gradient as jax writes it (``batch_group_count`` = channels, one lhs batch element
  per group: the channels; the examples as the lhs features, the output gradient as the
  filter): per filter position ``k``, the strided window of the padded input at ``k * stride``
  times the output gradient (moved into the input's layout), reduced over examples and window
  to a channel vector; the vectors concatenated into the output's layout. A training step
  through a 56x56x144 depthwise layer (batch 8, forward and both gradients) ran 367 -> 51 ms.
bf16/f16 convolutions are computed in f32 and rounded once at the end (as XLA:CPU computes
them), f64 in f64.

Not rewritten: other targets (cuDNN and the TPU emitter have grouped kernels of their own),
groups of many channels (past ``max_taps``), filter gradients of groups of several channels or
of channel multipliers (XLA's), window reversal, negative padding, integer convolutions; each
candidate left gets a report note.
``disable=["depthwise-conv-taps"]`` turns the pass off.

Preconditions: calls inlined; after ``batchnorm-fold`` (which folds a frozen BatchNorm's scale
into the filter) and ``layout-assignment``, and after the last ``constant-fold`` (a frozen
filter's broadcast tap vectors would otherwise be folded into activation-sized constants);
before ``propagate-shardings`` (which annotates the new ops in a sharded program).
Invariant: the module verifies; each output element is the same sum of the same products, in
a fixed order (``reassociate``). Rerunning changes nothing (no convolution is left to match).
Statistics: ``rewritten`` (convolutions), ``filter_gradients`` (of those, filter gradients),
``refused[<reason>]``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.core import ir as hir
from hlofuse.core.pipeline import Pass
from hlofuse.core.report import Refusals
from hlofuse.kernels.support import conv_groups, conv_padding, value_info
from hlofuse.passes import graph_util as gu
from hlofuse.passes.fusion.outline import program_blocks

FLOATS = ("bf16", "f16", "f32", "f64")


def _ints(op, key: str, n: int) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes[key])) if key in op.attributes else [1] * n


def is_grouped(op) -> bool:
    """A grouped convolution (``feature_group_count`` > 1): depthwise when the groups are its
    input channels; with :func:`is_filter_grad`, the candidates this pass looks at."""
    if op.name != "stablehlo.convolution":
        return False
    return conv_groups(op)[0] > 1


def is_filter_grad(op) -> bool:
    """A depthwise convolution's filter gradient as jax writes it: ``batch_group_count`` groups,
    one per channel, each of one lhs batch element (the channel; the lhs features are the
    examples, and the window slides over the input with the output gradient as the filter)."""
    if op.name != "stablehlo.convolution":
        return False
    x = value_info(op.operands[0])
    if x is None:
        return False
    dn = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    fg, bg = conv_groups(op)
    return bg > 1 and fg == 1 and x.shape[dn.input_batch_dimension] == bg


def _infos(op) -> tuple:
    return tuple(value_info(v) for v in (op.operands[0], op.operands[1], op.results[0]))


def _common_reason(op) -> str | None:
    """Why neither form of the convolution ``op`` is rewritten, whichever it is, or None."""
    x, w, out = _infos(op)
    if x is None or w is None or out is None:
        return "dynamic shape"
    if any(t.dtype not in FLOATS for t in (x, w, out)):
        return "not a float convolution"
    if "window_reversal" in op.attributes and any(
            bool(v) for v in ir.DenseBoolArrayAttr(op.attributes["window_reversal"])):
        return "window reversal"
    if any(p < 0 for p in conv_padding(op)):
        return "negative padding"
    return None


def _taps_reason(extents, max_taps: int) -> str | None:
    taps = math.prod(extents)
    return f"{taps} filter positions (max_taps={max_taps})" if taps > max_taps else None


def filter_grad_reason(op, max_taps: int) -> str | None:
    """None when the filter gradient ``op`` (:func:`is_filter_grad`) is rewritten, else why not."""
    why = _common_reason(op)
    if why is not None:
        return why
    x, dy, out = _infos(op)
    dn = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    g = conv_groups(op)[1]
    if (dy.shape[dn.kernel_output_feature_dimension] != g
            or out.shape[dn.output_batch_dimension] != 1
            or dy.shape[dn.kernel_input_feature_dimension] != x.shape[dn.input_feature_dimension]):
        return "not a per-channel filter gradient"
    if any(d != 1 for d in _ints(op, "lhs_dilation", len(dn.input_spatial_dimensions))):
        return "lhs_dilation != 1"
    return _taps_reason([out.shape[d] for d in dn.output_spatial_dimensions], max_taps)


def taps_reason(op, max_taps: int) -> str | None:
    """None when the grouped convolution ``op`` is rewritten, else why not: at most
    ``max_taps`` products per output element (filter positions x input channels per group)."""
    why = _common_reason(op)
    if why is not None:
        return why
    x, w, _ = _infos(op)
    dn = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    extents = [w.shape[d] for d in dn.kernel_spatial_dimensions]
    cg = w.shape[dn.kernel_input_feature_dimension]
    if math.prod(extents) * cg > max_taps:
        return (f"{math.prod(extents)} filter positions x {cg} channel(s) per group "
                f"(max_taps={max_taps})")
    return None


def rewrite(op, filter_grad: bool) -> ir.Value:
    """Replace the grouped convolution or (``filter_grad``) filter gradient ``op`` (its reason
    None) by the sum of its taps; returns the value that replaced its result."""
    with op.context, op.location:
        new = _filter_grad(op) if filter_grad else _depthwise(op)
        if gu.element_type(new) != gu.element_type(op.results[0]):
            new = gu.create("stablehlo.convert", [new], [op.results[0].type], before=op).results[0]
        op.results[0].replace_all_uses_with(new)
        hir.safe_erase(op)
        return new


def _compute_type(op) -> ir.Type:
    """f64 when any operand or the result is f64, else f32 (bf16/f16 rounded once at the end)."""
    types = [value_info(v).dtype for v in (op.operands[0], op.operands[1], op.results[0])]
    return ir.F64Type.get() if "f64" in types else ir.F32Type.get()


def _widened(op, v, cty) -> ir.Value:
    if ir.RankedTensorType(v.type).element_type == cty:
        return v
    return gu.create("stablehlo.convert", [v], [gu.tensor_type(value_info(v).shape, cty)],
                     before=op).results[0]


@dataclasses.dataclass(frozen=True)
class _Conv:
    """What both rewrites read of a convolution: its dimension numbers, the spatial dims of its
    input, kernel and output, window strides and filter dilation, the type it is computed in,
    and its input widened to that type and padded."""
    dn: stablehlo.ConvDimensionNumbers
    sp_in: list
    sp_k: list
    sp_out: list
    strides: list
    dil: list
    cty: ir.Type
    xp: ir.Value

    @classmethod
    def of(cls, op) -> "_Conv":
        dn = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
        n = len(dn.input_spatial_dimensions)
        cty = _compute_type(op)
        return cls(dn, list(dn.input_spatial_dimensions), list(dn.kernel_spatial_dimensions),
                   list(dn.output_spatial_dimensions), _ints(op, "window_strides", n),
                   _ints(op, "rhs_dilation", n), cty,
                   _padded_input(op, _widened(op, op.operands[0], cty), cty))


def _padded_input(op, x, cty) -> ir.Value:
    """The convolution's lhs with its padding and ``lhs_dilation`` (as interior zeros)."""
    dn = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    sp = list(dn.input_spatial_dimensions)
    pad, ldil = conv_padding(op), _ints(op, "lhs_dilation", len(sp))
    rank = len(value_info(x).shape)
    lo, hi, inner = [0] * rank, [0] * rank, [0] * rank
    for i, d in enumerate(sp):
        lo[d], hi[d], inner[d] = pad[2 * i], pad[2 * i + 1], ldil[i] - 1
    if not (any(lo) or any(hi) or any(inner)):
        return x
    zero = gu.make_splat(0, cty, [], before=op)
    with ir.InsertionPoint(op):
        return stablehlo.PadOp(x, zero, lo, hi, inner).result


def _window(op, xp, sp, starts, extents, steps) -> ir.Value:
    """The strided window of ``xp`` along its dims ``sp``: from ``starts``, ``extents``
    elements ``steps`` apart; whole along the other dims."""
    shape = list(value_info(xp).shape)
    start, limit, step = [0] * len(shape), list(shape), [1] * len(shape)
    for d, a, n, st in zip(sp, starts, extents, steps):
        start[d], limit[d], step[d] = a, a + (n - 1) * st + 1, st
    out = [(hi - lo + st - 1) // st for lo, hi, st in zip(start, limit, step)]
    return gu.create("stablehlo.slice", [xp], [gu.tensor_type(out, gu.element_type(xp))],
                     {"start_indices": ir.DenseI64ArrayAttr.get(start),
                      "limit_indices": ir.DenseI64ArrayAttr.get(limit),
                      "strides": ir.DenseI64ArrayAttr.get(step)}, before=op).results[0]


def _depthwise(op) -> ir.Value:
    """``y[..., o] = sum over filter positions k and group channels i of x_pad[k, g(o) * Cg +
    i] * w[k, i, o]`` with ``g(o) = o // Og``: per (k, i) one strided window of the padded
    input, its channels ``i, i + Cg, ...`` (one per group), repeated ``Og`` times when a group
    has several outputs, times the weight vector ``w[k, i, :]``."""
    xi, wi, oi = _infos(op)
    cv = _Conv.of(op)
    dn, sp_in, sp_k, sp_out, cty = cv.dn, cv.sp_in, cv.sp_k, cv.sp_out, cv.cty
    feat = dn.input_feature_dimension
    wc = _widened(op, op.operands[1], cty)
    g = conv_groups(op)[0]
    cg = wi.shape[dn.kernel_input_feature_dimension]
    o = wi.shape[dn.kernel_output_feature_dimension]
    og = o // g
    rank = len(xi.shape)
    p_shape = list(xi.shape)           # a product: the input's layout, the output's extents
    for i, d in enumerate(sp_in):
        p_shape[d] = oi.shape[sp_out[i]]
    p_shape[feat] = o
    p_type = gu.tensor_type(p_shape, cty)
    extents = [p_shape[d] for d in sp_in] + [g]
    acc = None
    for k in itertools.product(*[range(wi.shape[d]) for d in sp_k]):
        starts = [k[i] * cv.dil[i] for i in range(len(sp_in))]
        for ch in range(cg):
            # the window at k, and channel ch of every group
            tap = _window(op, cv.xp, sp_in + [feat], starts + [ch], extents, cv.strides + [cg])
            if og > 1:                            # each group's channel for its og outputs
                ext = p_shape[:feat] + [g, og] + p_shape[feat + 1:]
                dims = [d if d <= feat else d + 1 for d in range(rank)]
                tap = gu.make_broadcast(tap, dims, gu.tensor_type(ext, cty), before=op)
                tap = gu.create("stablehlo.reshape", [tap], [p_type], before=op).results[0]
            ones = [1] * (len(sp_k) + 1)       # w[k, ch, :]
            wk = _window(op, wc, sp_k + [dn.kernel_input_feature_dimension], list(k) + [ch],
                         ones, ones)
            vec = gu.create("stablehlo.reshape", [wk], [gu.tensor_type([o], cty)],
                            before=op).results[0]
            wb = gu.make_broadcast(vec, [feat], p_type, before=op)
            prod = gu.create("stablehlo.multiply", [tap, wb], [p_type], before=op).results[0]
            acc = prod if acc is None else gu.create("stablehlo.add", [acc, prod], [p_type],
                                                     before=op).results[0]
    # input layout -> output layout: output dim p holds the input's dim of the same role
    role_in = {dn.input_batch_dimension: "b", feat: "f", **{d: i for i, d in enumerate(sp_in)}}
    by_role = {r: d for d, r in role_in.items()}
    role_out = {dn.output_batch_dimension: "b", dn.output_feature_dimension: "f",
                **{d: i for i, d in enumerate(sp_out)}}
    perm = [by_role[role_out[p]] for p in range(rank)]
    return acc if perm == list(range(rank)) else gu.make_transpose(acc, perm, before=op)


def _filter_grad(op) -> ir.Value:
    """``out[k, c] = sum over examples and window positions j of x_pad[k * stride + j *
    dilation, c] * dy[j, c]``: per filter position ``k`` one strided window of the padded input
    times the output gradient, reduced to a channel vector; the vectors concatenated into the
    output's layout."""
    xi, di, oi = _infos(op)
    cv = _Conv.of(op)
    dn, sp_in, sp_k, sp_out, cty = cv.dn, cv.sp_in, cv.sp_k, cv.sp_out, cv.cty
    # dy in the lhs's layout: channels where the lhs has its batch (the groups), examples where
    # it has its features, the window where it has its spatial dims
    role = {dn.input_batch_dimension: dn.kernel_output_feature_dimension,
            dn.input_feature_dimension: dn.kernel_input_feature_dimension,
            **{d: sp_k[i] for i, d in enumerate(sp_in)}}
    perm = [role[p] for p in range(len(xi.shape))]
    dyc = _widened(op, op.operands[1], cty)
    if perm != list(range(len(perm))):
        dyc = gu.make_transpose(dyc, perm, before=op)
    extents = [di.shape[d] for d in sp_k]
    c = xi.shape[dn.input_batch_dimension]
    vec_t = gu.tensor_type([c], cty)
    zero = gu.make_splat(0, cty, [], before=op)
    red_dims = [d for d in range(len(xi.shape)) if d != dn.input_batch_dimension]
    one = [1] * len(oi.shape)
    one[dn.output_feature_dimension] = c
    pieces = []
    for k in itertools.product(*[range(oi.shape[d]) for d in sp_out]):
        win = _window(op, cv.xp, sp_in, [k[i] * cv.strides[i] for i in range(len(sp_in))],
                      extents, cv.dil)
        prod = gu.create("stablehlo.multiply", [win, dyc], [win.type], before=op).results[0]
        vec = gu.make_reduce(prod, zero, red_dims, vec_t, before=op)
        pieces.append(gu.create("stablehlo.reshape", [vec], [gu.tensor_type(one, cty)],
                                before=op).results[0])
    return _concat(op, pieces, [oi.shape[d] for d in sp_out], sp_out)


def _concat(op, pieces, extents, dims) -> ir.Value:
    """``pieces`` (row-major over ``extents``) joined along ``dims``, the first the slowest."""
    if not extents:
        return pieces[0]
    step = len(pieces) // extents[0]
    parts = [_concat(op, pieces[i * step:(i + 1) * step], extents[1:], dims[1:])
             for i in range(extents[0])]
    if len(parts) == 1:
        return parts[0]
    shape = list(value_info(parts[0]).shape)
    shape[dims[0]] *= len(parts)
    out_t = gu.tensor_type(shape, gu.element_type(parts[0]))
    return gu.create("stablehlo.concatenate", parts, [out_t],
                     {"dimension": ir.IntegerAttr.get(ir.IntegerType.get_signless(64), dims[0])},
                     before=op).results[0]


class DepthwiseConvTaps(Pass):
    """See the module docstring."""
    name = "depthwise-conv-taps"

    @dataclasses.dataclass(frozen=True)
    class Options:
        # products per output element (filter positions x input channels per group) above
        # which a convolution stays XLA's: a 7x7 ConvNeXt filter is 49, a 3x3 ResNeXt group of
        # 8 channels 72 (3.3x faster than XLA's); 16 channels per group (144) was 6x slower
        max_taps: int = 72

    def run(self, module, ctx):
        if not ctx.target.is_cpu:
            return {"rewritten": 0, "filter_gradients": 0}
        refused = Refusals(self.name, outcome="left to XLA")
        n = grads = 0
        for block in program_blocks(module):
            for op in list(hir.block_ops(block)):
                grad = is_filter_grad(op)
                if not (grad or is_grouped(op)):
                    continue
                why = (filter_grad_reason if grad else taps_reason)(op, self.options.max_taps)
                if why is not None:
                    what = "depthwise filter gradient(s)" if grad else "grouped convolution(s)"
                    refused.add(what, why, hir.op_location(op))
                    continue
                rewrite(op, grad)
                n += 1
                grads += grad
        refused.flush(ctx)
        return {"rewritten": n, "filter_gradients": grads, **refused.stats()}
