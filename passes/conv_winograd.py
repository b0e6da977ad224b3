"""``conv-winograd``: outline 3x3, stride-1 f32 convolutions for Winograd F(2x2, 3x3) (cpu).

Rewrites (cpu only): every ``convolution`` with two spatial dims, a 3x3 filter, stride 1, no
dilation, reversal or grouping, f32 operands and at least ``min_channels`` input and output
channels becomes a region of kind ``conv_winograd`` holding that one op; ``kernelize`` builds
it as :mod:`hlofuse.kernels.conv_winograd` (16 batched matmuls between add-only transforms: 2.25x
fewer multiplies than XLA:CPU's direct convolution). Its BatchNorm scale/shift, activation and
residual stay outside, where ``fuse-elementwise`` and XLA fuse them as before.

Measured on the 2-core host (XLA library fusions off, the setting the ResNet stage's autotune
picks): 56x56x64->64 1.19-1.20 ms against XLA's 1.46-1.47 ms; the ResNet-50 conv2_x stage
(three such layers) 0.462 of jax.jit's time against 0.552 without the rewrite (interleaved,
median of 25 rounds, /work notes in the commit). Small channel counts spend their time in the
transforms (an RGB stem, Ci=3), so they stay with XLA; per region the measured decisions
(``hlofuse.runtime.autotune``) keep XLA's convolution wherever the kernel measures slower.
gpu/tpu: nothing to do (cuDNN and the TPU emitter choose their own algorithms, Winograd
included); ``disable=["conv-winograd"]`` or
``HLOFUSE_DISABLE_PASSES=conv-winograd`` keeps every convolution direct.

Refusals of 3x3 convolutions go to the report (stride 2, bf16, few channels...); other filter
sizes are not this pass's (``conv1x1-to-dot`` notes them).

Preconditions: calls inlined; after ``batchnorm-fold`` and ``layout-assignment`` (which fold the
scale into the filter and move channels-first convolutions to NHWC on cpu), before
``conv1x1-to-dot``. Invariant: the module verifies; the convolution's sums, reordered (within
``reassociate``).
"""

from __future__ import annotations

import dataclasses

from jaxlib.mlir.dialects import stablehlo

from hlofuse.core.pipeline import Pass
from hlofuse.kernels.conv_winograd import winograd_reason
from hlofuse.kernels.support import conv_filter_size, value_info
from hlofuse.passes.fusion import cost as cost_model
from hlofuse.passes.fusion.anchored import Grown, fuse_anchored
from hlofuse.passes.fusion.commit import LeftToXla

KIND = "conv_winograd"


class _Refused3x3(LeftToXla):
    """Refusal notes for 3x3 convolutions only (other sizes are ``conv1x1-to-dot``'s to note)."""

    def add(self, what, op, reason):
        if op is not None and conv_filter_size(op) == (3, 3):
            super().add(what, op, reason)


def check_anchor(op, min_channels: int) -> str | None:
    why = winograd_reason(op)
    if why is not None:
        return why
    w = value_info(op.operands[1])
    dn = stablehlo.ConvDimensionNumbers(op.attributes["dimension_numbers"])
    ci, co = w.shape[dn.kernel_input_feature_dimension], w.shape[dn.kernel_output_feature_dimension]
    if min(ci, co) < min_channels:
        return (f"{ci} -> {co} channels (< min_channels={min_channels}: the transforms would "
                "cost more than the multiplies saved)")
    return None


def grow(graph, anchor, tried) -> Grown:
    return Grown([anchor], lambda cost: cost_model.Decision(True), dict(
        tolerance="reassociate", algorithm="winograd F(2x2,3x3)"))


class ConvWinograd(Pass):
    """See the module docstring."""
    name = "conv-winograd"

    @dataclasses.dataclass(frozen=True)
    class Options:
        # fewer input or output channels than this: XLA's direct convolution
        min_channels: int = 16

    def run(self, module, ctx):
        if not ctx.target.is_cpu:
            return {"regions": 0}
        left = _Refused3x3(self.name)
        counts = fuse_anchored(module, ctx, kind=KIND, anchor_name="stablehlo.convolution",
                               check_anchor=lambda op, target: check_anchor(op, self.options.min_channels),
                               grow=grow, left=left, what="3x3 convolution(s)")
        left.flush(ctx)
        return counts
