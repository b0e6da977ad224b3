"""``conv1x1-to-dot``: a 1x1 convolution is a matmul over channels; rewrite it to one.

Rewrites (cpu; gpu and tpu with ``on_gpu=true`` / ``on_tpu=true``, see ``Options``): a 1x1, stride-1, unpadded, ungrouped NHWC/HWIO convolution *is* a
matmul over the channel dim; it is rewritten to ``reshape(kernel)`` + ``dot_general`` (same
sums) so its BatchNorm scale/shift, activation and residual fuse as the dot's epilogue. Other
convolutions stay with XLA (its conv emitters / cuDNN); their elementwise epilogue is left to
``fuse-elementwise``. On cpu the dot is never slower than the convolution under the same XLA
options: with XLA's library fusions off XLA:CPU rewrites the 1x1 convolution to the very same
dot itself, and with them on (its default) the library *dot* beats the library *convolution*
(min of 40 interleaved rounds, 1x56x56 NHWC f32, 2-core Zen4: 64->256 0.61 vs 1.13 ms,
256->64 0.60 vs 1.26 ms; XLA's own dot with library fusions off 0.71 / 0.69 ms, its 3x3
convolution 1.81 ms vs 2.36 ms in the library). Having dots also lets the XLA-option
autotune try ``ynn-individual-dot`` (library dots, XLA's own convolutions), the fastest mix
of the two on the ResNet stage. (An earlier note measured the dot 1.13x-1.7x slower at
64->256; that compared against XLA's convolution under other options.) Every convolution
left alone gets a report note saying why. ``conv1x1_as_dot=False`` keeps them on cpu.

The dots it makes carry ``hlofuse.conv1x1`` until ``fuse-matmul-epilogue``, which runs next,
drops the marker and labels their regions (``extra['conv1x1']``).

Preconditions: calls inlined; after ``fuse-attention``, right before ``fuse-matmul-epilogue``.
Invariant: the module verifies; the same sums (a dot accumulates the channels as the
convolution does, within ``reassociate``).
"""

from __future__ import annotations

import dataclasses

from jaxlib.mlir import ir
from jaxlib.mlir.dialects import stablehlo

from hlofuse.core import ir as hir
from hlofuse.core.pipeline import Pass
from hlofuse.kernels.support import value_info
from hlofuse.passes.fusion.commit import LeftToXla
from hlofuse.passes.op_forms import CONV1X1_ATTR, conv1x1_as_dot_reason
from hlofuse.passes.fusion.outline import program_blocks

def conv1x1_to_dot(op):
    """Replace a 1x1 convolution by ``dot_general(x, reshape(w, [Ci, Co]))``; returns the dot."""
    x, w = op.operands[0], op.operands[1]
    wi = value_info(w)
    rank = len(value_info(x).shape)
    ci, co = wi.shape[-2], wi.shape[-1]
    with op.context, op.location, ir.InsertionPoint(op):
        wt = ir.RankedTensorType.get([ci, co], ir.RankedTensorType(w.type).element_type)
        w2 = stablehlo.ReshapeOp(wt, w).result
        dn = stablehlo.DotDimensionNumbers.get(lhs_batching_dimensions=[], rhs_batching_dimensions=[],
                                               lhs_contracting_dimensions=[rank - 1],
                                               rhs_contracting_dimensions=[0])
        kw = {}
        if "precision_config" in op.attributes:
            kw["precision_config"] = op.attributes["precision_config"]
        dot = stablehlo.DotGeneralOp(op.results[0].type, x, w2, dn, **kw)
    op.results[0].replace_all_uses_with(dot.result)
    hir.safe_erase(op)
    return dot.operation


def handle_convolutions(ctx, block, left, as_dot_on_cpu: bool) -> int:
    """Rewrite 1x1 convolutions to dots on gpu/tpu (marked :data:`CONV1X1_ATTR`); note every
    other convolution's fate."""
    rewritten = 0
    for op in [o for o in hir.block_ops(block) if o.name == "stablehlo.convolution"]:
        why = conv1x1_as_dot_reason(op)
        if why is None and (not ctx.target.is_cpu or as_dot_on_cpu):
            dot = conv1x1_to_dot(op)
            with dot.context:
                dot.attributes[CONV1X1_ATTR] = ir.UnitAttr.get()
            rewritten += 1
            continue
        if why is None:
            left.add("1x1 convolution(s)", op, "conv1x1_as_dot=False: on cpu XLA's convolution is kept")
        else:
            left.add("convolution(s)", op, f"{why}; the elementwise epilogue is fused separately")
    return rewritten


class Conv1x1ToDot(Pass):
    """See the module docstring."""
    name = "conv1x1-to-dot"

    @dataclasses.dataclass(frozen=True)
    class Options:
        conv1x1_as_dot: bool = True  # on cpu (on gpu and tpu see on_gpu, on_tpu)
        # gpu: off unless asked. Compiled for H100 and A100 (bench --memory), the ResNet-50
        # stage's training step (batch 64) needed 2599 / 2980 MiB with its 1x1 convolutions
        # as dots and 2477 / 2526 without (jax.jit 2477 / 2526): XLA:GPU's convolutions keep
        # less live.
        on_gpu: bool = False
        # tpu: off unless asked. The same step on v5e needed 2564 MiB with the dots and 2416
        # without (jax.jit 2416); v6e 2565 with, 2613 without (jax.jit 2614). (An earlier
        # figure, 2563 vs 2612 on v5e, was taken while cse merged BatchNorm's x - mean, which
        # cost the 196 MiB on its own; see passes/cse.py.) Off: never above jax.jit on either.
        on_tpu: bool = False

    def run(self, module, ctx):
        if ctx.target.is_gpu and not self.options.on_gpu:
            return {"conv1x1_as_dot": 0, "skipped": "gpu (on_gpu=true rewrites there)"}
        if ctx.target.kind == "tpu" and not self.options.on_tpu:
            return {"conv1x1_as_dot": 0, "skipped": "tpu (on_tpu=true rewrites there)"}
        left = LeftToXla(self.name)
        n = sum(handle_convolutions(ctx, block, left, self.options.conv1x1_as_dot)
                for block in program_blocks(module))
        left.flush(ctx)
        return {"conv1x1_as_dot": n}
