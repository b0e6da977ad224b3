"""Region -> Pallas kernel generation and lowering (installed as ``hlofuse.kernels``).

One family per file, each with ``*_kernel`` (body), ``build_*`` (``pallas_call`` builder) and
``*_reference`` (plain jnp). :data:`FAMILIES` maps a region kind to its family, which the
``kernelize`` pass uses.
"""

from __future__ import annotations

import dataclasses

from hlofuse.kernels import elementwise as elementwise
from hlofuse.kernels import attention as attention
from hlofuse.kernels.attention import backward as attention_backward
from hlofuse.kernels import reduction as reduction
from hlofuse.kernels import matmul_epilogue as matmul_epilogue
from hlofuse.kernels import horizontal as horizontal
from hlofuse.kernels import conv_winograd as conv_winograd


@dataclasses.dataclass(frozen=True)
class Family:
    spec_from_func: object   # outlined func.func -> spec (raises EmitError if unsupported)
    build: object            # (spec, target, interpret=..., ...) -> jax function
    reference: object        # spec -> jax function
    # (spec, inputs) -> inputs: makes drawn test inputs consistent where the kernel trusts one
    # input to be derived from others (the backward's forward output and row statistics)
    consistent_inputs: object = None


FAMILIES: dict[str, Family] = {
    "elementwise": Family(elementwise.spec_from_func, elementwise.build_elementwise,
                          elementwise.elementwise_reference),
    "attention": Family(attention.spec_from_func, attention.build_attention,
                        attention.attention_reference),
    # training: the forward returning its logsumexp, and the flash backward (fuse-attention)
    "attention_fwd_lse": Family(attention_backward.fwd_lse_spec_from_func,
                                attention_backward.build_fwd_lse,
                                attention_backward.fwd_lse_reference),
    "attention_bwd": Family(attention_backward.bwd_spec_from_func, attention_backward.build_bwd,
                            attention_backward.bwd_reference, attention_backward.consistent_inputs),
    "reduction": Family(reduction.spec_from_func, reduction.build_reduction,
                        reduction.reduction_reference),
    "matmul_epilogue": Family(matmul_epilogue.spec_from_func, matmul_epilogue.build_matmul_epilogue,
                              matmul_epilogue.matmul_epilogue_reference),
    "horizontal": Family(horizontal.spec_from_func, horizontal.build_horizontal,
                         horizontal.horizontal_reference),
    # cpu: a 3x3 convolution by Winograd F(2x2, 3x3) (conv-winograd)
    "conv_winograd": Family(conv_winograd.spec_from_func, conv_winograd.build_conv_winograd,
                            conv_winograd.conv_winograd_reference),
}
