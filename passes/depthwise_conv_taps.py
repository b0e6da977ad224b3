"""``depthwise-conv-taps``: on cpu, a depthwise convolution becomes the sum of its taps, one
strided slice of the padded input times one weight vector per filter position.

Why: XLA:CPU runs a depthwise convolution (``feature_group_count`` = channels, one filter per
channel: MobileNet, EfficientNet, ConvNeXt) in a slow generic loop. Written as ``kh * kw``
elementwise products summed, XLA fuses the whole filter, with the BatchNorm and activation
after it, into one vectorized loop over the channels. Measured on a 2-core Sapphire Rapids
(3x3 with ReLU6, NHWC, batch 1, interleaved medians): 112x112x32 9.45 -> 0.57 ms, stride 2
112x112x96 7.32 -> 0.75 ms, 56x56x144 10.1 -> 0.58 ms, 28x28x192 3.51 -> 0.19 ms, 7x7x960
1.32 -> 0.15 ms (``python -m bench.depthwise_cpu``).

Rewrites (target cpu only): a ``convolution`` whose groups are its input channels, one input
feature per group and as many output features as input features (channel multiplier 1), no
input dilation (``lhs_dilation``: a strided convolution's input gradient), no window reversal,
non-negative padding, float operands, any layout, strides and filter dilation, at most
``max_taps`` filter positions. It becomes ``pad`` (the convolution's padding, zeros), then for
each filter position ``k`` (row-major over the spatial dims) ``slice(x_padded, k * dilation,
stride) * broadcast(w[k, 0, :])`` summed left to right, transposed to the output's layout when
that differs from the input's. bf16/f16 convolutions are computed in f32 and rounded once at
the end (as XLA:CPU computes them), f64 in f64.

Not rewritten: other targets (cuDNN and the TPU emitter have depthwise kernels of their own),
grouped convolutions with several channels per group, filter gradients (``batch_group_count``
groups: not depthwise in this sense), channel multipliers above 1, ``lhs_dilation``, window
reversal, negative padding, integer convolutions; each depthwise candidate left gets a report
note. ``enabled=False``
turns the pass off.

Preconditions: calls inlined; after ``batchnorm-fold`` (which folds a frozen BatchNorm's scale
into the filter) and ``layout-assignment``, and after the last ``constant-fold`` (a frozen
filter's broadcast tap vectors would otherwise be folded into activation-sized constants);
before ``propagate-shardings`` (which annotates the new ops in a sharded program).
Invariant: the module verifies; each output element is the same sum of the same products, in
a fixed order (``reassociate``). Rerunning changes nothing (no convolution is left to match).
Statistics: ``rewritten`` (convolutions), ``refused[<reason>]``.
"""

from __future__ import annotations

import dataclasses
import itertools

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse import ir as hir
from hlofuse.pipeline import Pass, register_pass
from hlofuse.report import Refusals
from hlofuse.kernels.support import conv_groups, conv_padding, value_info
from hlofuse.passes import graph_util as gu
from hlofuse.passes.fusion.outline import program_blocks

FLOATS = ("bf16", "f16", "f32", "f64")


def _ints(op, key: str, n: int) -> list[int]:
    return list(ir.DenseI64ArrayAttr(op.attributes[key])) if key in op.attributes else [1] * n


def is_depthwise(op) -> bool:
    """A convolution with one group per input channel (the candidates this pass looks at)."""
    if op.name != "stablehlo.convolution":
        return False
    x = value_info(op.operands[0])
    if x is None:
        return False
    dn = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    c = x.shape[dn.input_feature_dimension]
    return c > 1 and conv_groups(op)[0] == c


def taps_reason(op, max_taps: int) -> str | None:
    """None when the depthwise convolution ``op`` is rewritten, else why not."""
    x, w, out = value_info(op.operands[0]), value_info(op.operands[1]), value_info(op.results[0])
    if x is None or w is None or out is None:
        return "dynamic shape"
    if any(t.dtype not in FLOATS for t in (x, w, out)):
        return "not a float convolution"
    dn = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    if w.shape[dn.kernel_input_feature_dimension] != 1:
        return "several input channels per group"
    if w.shape[dn.kernel_output_feature_dimension] != x.shape[dn.input_feature_dimension]:
        return "channel multiplier above 1"
    n = len(dn.input_spatial_dimensions)
    if any(d != 1 for d in _ints(op, "lhs_dilation", n)):
        return "lhs_dilation != 1 (a strided convolution's input gradient)"
    if "window_reversal" in op.attributes and any(
            bool(v) for v in ir.DenseBoolArrayAttr(op.attributes["window_reversal"])):
        return "window reversal"
    if any(p < 0 for p in conv_padding(op)):
        return "negative padding"
    taps = 1
    for d in dn.kernel_spatial_dimensions:
        taps *= w.shape[d]
    if taps > max_taps:
        return f"{taps} filter positions (max_taps={max_taps})"
    return None


def rewrite(op) -> ir.Value:
    """Replace the depthwise convolution ``op`` (:func:`taps_reason` is None) by the sum of its
    taps; returns the value that replaced its result."""
    with op.context, op.location:
        return _rewrite(op)


def _rewrite(op) -> ir.Value:
    x, w = op.operands[0], op.operands[1]
    xi, wi, oi = value_info(x), value_info(w), value_info(op.results[0])
    dn = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    sp_in, sp_k, sp_out = (list(dn.input_spatial_dimensions), list(dn.kernel_spatial_dimensions),
                           list(dn.output_spatial_dimensions))
    n = len(sp_in)
    strides, dil = _ints(op, "window_strides", n), _ints(op, "rhs_dilation", n)
    pad = conv_padding(op)
    feat = dn.input_feature_dimension
    cty = ir.F64Type.get() if "f64" in (xi.dtype, wi.dtype, oi.dtype) else ir.F32Type.get()
    out_elem = ir.RankedTensorType(op.results[0].type).element_type

    def widened(v, info):
        if ir.RankedTensorType(v.type).element_type == cty:
            return v
        return gu.create("stablehlo.convert", [v], [gu.tensor_type(info.shape, cty)],
                         before=op).results[0]

    xc, wc = widened(x, xi), widened(w, wi)
    rank = len(xi.shape)
    lo, hi = [0] * rank, [0] * rank
    for i, d in enumerate(sp_in):
        lo[d], hi[d] = pad[2 * i], pad[2 * i + 1]
    if any(lo) or any(hi):
        zero = gu.make_splat(0, cty, [], before=op)
        padded = [s + lo[d] + hi[d] for d, s in enumerate(xi.shape)]
        with ir.InsertionPoint(op):
            xc = stablehlo.PadOp(xc, zero, lo, hi, [0] * rank).result
        assert list(ir.RankedTensorType(xc.type).shape) == padded
    # the taps' shape: the input's layout with the output's spatial extents
    t_shape = list(xi.shape)
    for i, d in enumerate(sp_in):
        t_shape[d] = oi.shape[sp_out[i]]
    t_type = gu.tensor_type(t_shape, cty)
    c = xi.shape[feat]
    acc = None
    for k in itertools.product(*[range(wi.shape[d]) for d in sp_k]):
        start = [0] * rank
        limit = list(ir.RankedTensorType(xc.type).shape)
        step = [1] * rank
        for i, d in enumerate(sp_in):
            start[d] = k[i] * dil[i]
            limit[d] = start[d] + (t_shape[d] - 1) * strides[i] + 1
            step[d] = strides[i]
        tap = gu.create("stablehlo.slice", [xc], [t_type],
                        {"start_indices": ir.DenseI64ArrayAttr.get(start),
                         "limit_indices": ir.DenseI64ArrayAttr.get(limit),
                         "strides": ir.DenseI64ArrayAttr.get(step)}, before=op).results[0]
        w_start = [0] * len(wi.shape)
        w_limit = list(wi.shape)
        for i, d in enumerate(sp_k):
            w_start[d], w_limit[d] = k[i], k[i] + 1
        w_shape = [hi_ - lo_ for lo_, hi_ in zip(w_start, w_limit)]
        wk = gu.create("stablehlo.slice", [wc], [gu.tensor_type(w_shape, cty)],
                       {"start_indices": ir.DenseI64ArrayAttr.get(w_start),
                        "limit_indices": ir.DenseI64ArrayAttr.get(w_limit),
                        "strides": ir.DenseI64ArrayAttr.get([1] * len(w_shape))},
                       before=op).results[0]
        vec = gu.create("stablehlo.reshape", [wk], [gu.tensor_type([c], cty)], before=op).results[0]
        wb = gu.make_broadcast(vec, [feat], t_type, before=op)
        prod = gu.create("stablehlo.multiply", [tap, wb], [t_type], before=op).results[0]
        acc = prod if acc is None else gu.create("stablehlo.add", [acc, prod], [t_type],
                                                 before=op).results[0]
    # input layout -> output layout: output dim p holds the input's dim of the same role
    role_in = {dn.input_batch_dimension: "b", feat: "f", **{d: i for i, d in enumerate(sp_in)}}
    by_role = {r: d for d, r in role_in.items()}
    role_out = {dn.output_batch_dimension: "b", dn.output_feature_dimension: "f",
                **{d: i for i, d in enumerate(sp_out)}}
    perm = [by_role[role_out[p]] for p in range(rank)]
    if perm != list(range(rank)):
        acc = gu.make_transpose(acc, perm, before=op)
    if ir.RankedTensorType(acc.type).element_type != out_elem:
        acc = gu.create("stablehlo.convert", [acc], [op.results[0].type], before=op).results[0]
    op.results[0].replace_all_uses_with(acc)
    hir.safe_erase(op)
    return acc


@register_pass
class DepthwiseConvTaps(Pass):
    """See the module docstring."""
    name = "depthwise-conv-taps"

    @dataclasses.dataclass(frozen=True)
    class Options:
        enabled: bool = True  # False: leave depthwise convolutions to XLA
        max_taps: int = 64    # larger filters stay convolutions (a 7x7 ConvNeXt filter is 49)

    def run(self, module, ctx):
        if not ctx.target.is_cpu or not self.options.enabled:
            return {"rewritten": 0}
        refused = Refusals(self.name, outcome="left to XLA")
        n = 0
        for block in program_blocks(module):
            for op in [o for o in hir.block_ops(block) if is_depthwise(o)]:
                why = taps_reason(op, self.options.max_taps)
                if why is not None:
                    refused.add("depthwise convolution(s)", why, hir.op_location(op))
                    continue
                rewrite(op)
                n += 1
        refused.flush(ctx)
        return {"rewritten": n, **refused.stats()}
