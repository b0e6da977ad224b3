"""Attention kernels: one online-softmax (flash) algorithm, three executions.

The ``fuse-attention`` pass matches attention once and records an :class:`AttentionSpec` (pure
data) on the outlined region; :func:`spec_from_func` reads it back, :func:`build_attention`
builds it for a target, :func:`attention_reference` is the plain-jnp reference. The package:

* :mod:`.spec` — the spec, its func attribute, :func:`spec_from_func`;
* :mod:`.logits` — the region's logit ops evaluated blockwise, and facts about them
  (:func:`mask_select`: position masks; :func:`prescale`: a power-of-two scale);
* :mod:`.layout` — the canonical label order every execution sees, outside the kernel;
* :mod:`.online_softmax` — the online-softmax update, written once;
* :mod:`.skip` — key-block ranges for position-only masks (causal);
* :mod:`.blocks` — block sizes per target (validated) and the cpu cost model;
* :mod:`.cpu` (XLA loops), :mod:`.triton` (gpu), :mod:`.mosaic` (tpu), :mod:`.reference`.
"""

from __future__ import annotations

import numpy as np

from hlofuse.core.ops import EmitError
from hlofuse.kernels.attention.blocks import (CPU_MAX_BLOCK_K as CPU_MAX_BLOCK_K,
                                              CPU_SKIP_BLOCK as CPU_SKIP_BLOCK,
                                              CPU_STEP_BUDGET as CPU_STEP_BUDGET,
                                              CPU_FWD_STEP_BUDGET as CPU_FWD_STEP_BUDGET,
                                              CPU_FWD_MIN_BLOCK_Q as CPU_FWD_MIN_BLOCK_Q,
                                              AttentionBlocks as AttentionBlocks,
                                              cpu_budgets as cpu_budgets,
                                              cpu_fwd_plan as cpu_fwd_plan,
                                              CPU_ROW_BUDGET as CPU_ROW_BUDGET,
                                              CPU_ROW_MIN_BLOCK_Q as CPU_ROW_MIN_BLOCK_Q,
                                              cpu_plan as cpu_plan, gpu_blocks as gpu_blocks,
                                              tpu_blocks as tpu_blocks)
from hlofuse.kernels.attention.cpu import build_cpu as build_cpu
from hlofuse.kernels.attention.short import (CPU_SHORT_MAX_ELEMS as CPU_SHORT_MAX_ELEMS,
                                             build_cpu_short as build_cpu_short,
                                             short_fits as short_fits)
from hlofuse.kernels.attention.logits import mask_select as mask_select, prescale as prescale
from hlofuse.kernels.attention.mosaic import attention_kernel_tpu as attention_kernel_tpu
from hlofuse.kernels.attention.mosaic import build_tpu as build_tpu
from hlofuse.kernels.attention.reference import attention_reference as attention_reference
from hlofuse.kernels.attention.skip import skip_table as skip_table
from hlofuse.kernels.attention.spec import (SPEC_ATTR as SPEC_ATTR, AttentionSpec as AttentionSpec,
                                            LogitStep as LogitStep, Repeat as Repeat,
                                            Splat as Splat, spec_from_func as spec_from_func)
from hlofuse.kernels.attention.triton import attention_kernel_gpu as attention_kernel_gpu
from hlofuse.kernels.attention.triton import build_gpu as build_gpu
from hlofuse.core.target import Target


def build_attention(spec: AttentionSpec, target: Target | str, *, interpret=None,
                    blocks: AttentionBlocks | None = None, name: str | None = None,
                    budget_scale: float = 1.0, whole_rows: bool | None = None):
    """The region as a JAX function ``f(*inputs) -> (output,)``.

    cpu: the loop implementation (:func:`build_cpu`), or for short sequences without given
    ``blocks`` the loop-free one (:func:`build_cpu_short`). gpu / tpu: the Pallas kernel for that
    target; with ``interpret=True`` (gpu) or a ``pltpu.InterpretParams`` (tpu) it runs on CPU
    in Pallas interpret mode for verification. ``budget_scale``: cpu loops' step budget
    times this (the short path and gpu/tpu blocks do not depend on it); ``whole_rows``: the
    cpu loops' forward in whole rows or not (default: where this release fuses them,
    :func:`~hlofuse.kernels.attention.blocks.cpu_fwd_plan`).
    """
    target = Target.of(target)
    if target.is_cpu:
        if interpret is not None:
            raise ValueError("the cpu attention path is plain JAX; interpret the gpu/tpu kernels")
        if blocks is None and short_fits(spec):
            return build_cpu_short(spec)   # short sequences: no loops (kernels/attention/short.py)
        return build_cpu(spec, blocks, budget_scale=budget_scale, whole_rows=whole_rows)
    if target.is_gpu:
        return build_gpu(spec, blocks, interpret=interpret, name=name)
    if target.is_tpu:
        if spec.x_dtype == "f16" or any(np.dtype(d) == np.float16 for d in spec.in_dtypes):
            raise EmitError("f16 is not supported by the TPU kernel")
        return build_tpu(spec, blocks, interpret=interpret, name=name)
    raise ValueError(f"unknown target {target!r}")
