"""What every kernel family's builder does the same way around its ``pallas_call``.

* :func:`call_options`: the ``compiler_params`` for the target (Triton warps and stages, Mosaic
  dimension semantics) and the interpret default (cpu always interprets; an explicit
  ``interpret`` runs the target's blocks in Pallas interpret mode and sets no compiler params);
* booleans cross the kernel boundary as int32 on gpu/tpu (:func:`int32_bools`,
  :func:`to_kernel`, :func:`from_kernel`);
* :func:`boundary`: the region as ``f(*inputs) -> outputs``: inputs reshaped (free: a bitcast
  in XLA) to the views the kernel tiles, outputs reshaped back;
* :func:`func_avals`: the abstract inputs of an outlined region function, to lower a kernel.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

import jax
import jax.numpy as jnp

from hlofuse.core.target import Target
from hlofuse.core import ir as hir
from hlofuse.core.ops import EmitError

__all__ = ["call_options", "compiler_params", "int32_bools", "to_kernel", "from_kernel",
           "kernel_dtypes", "max_itemsize", "check_tpu_dtypes", "boundary", "func_avals"]


def compiler_params(target: str, blocks):
    """Triton's ``num_warps``/``num_stages`` or Mosaic's ``dimension_semantics`` from ``blocks``
    (every block class of :mod:`hlofuse.kernels.tiling` carries them); None on cpu."""
    target = Target.of(target)
    if target.is_gpu:
        from jax.experimental.pallas import triton as pltriton
        return pltriton.CompilerParams(num_warps=blocks.num_warps, num_stages=blocks.num_stages)
    if target.is_tpu:
        from jax.experimental.pallas import tpu as pltpu
        return pltpu.CompilerParams(dimension_semantics=blocks.dimension_semantics)
    return None


def call_options(target: str, blocks, interpret) -> dict:
    """``compiler_params`` and ``interpret`` for ``pallas_call``.

    ``interpret``: None lowers for the target (cpu always interprets); True runs the target's
    blocks in Pallas interpret mode; a ``pltpu.InterpretParams`` runs TPU interpret mode (with
    ``target='tpu'``). Interpret mode takes no compiler params.
    """
    target = Target.of(target)
    return {"compiler_params": None if interpret is not None else compiler_params(target, blocks),
            "interpret": (True if target.is_cpu and interpret is None else interpret) or False}


def int32_bools(dtypes: Sequence, target: str, interpret) -> tuple:
    """Per array: does it cross the kernel boundary as int32 (a boolean on gpu/tpu, or in TPU
    interpret mode)? Pallas interpret mode on cpu keeps ``i1``."""
    target = Target.of(target)
    boolean = not target.is_cpu or (interpret is not None and interpret is not True)
    return tuple(boolean and np.dtype(d) == np.bool_ for d in dtypes)


def to_kernel(x, as_int32: bool):
    """A value on its way into the kernel (or into an output ref)."""
    return x.astype(jnp.int32) if as_int32 else x


def from_kernel(x, as_int32: bool):
    """A value read from an input ref (or from the kernel's output)."""
    return x != 0 if as_int32 else x


def kernel_dtypes(dtypes: Sequence, as_int32: Sequence) -> list:
    """The dtypes of the arrays the kernel itself reads or writes."""
    return [np.int32 if b else d for d, b in zip(dtypes, as_int32)]


def max_itemsize(dtypes: Sequence) -> int:
    return max([np.dtype(d).itemsize for d in dtypes] or [4])


def check_tpu_dtypes(dtypes: Sequence, target: str) -> None:
    """Mosaic blocks of 8/16-bit values other than bf16 (and booleans, which cross as int32)
    are not supported: raise :class:`~hlofuse.core.ops.EmitError` (the region goes to XLA)."""
    target = Target.of(target)
    if target.is_tpu and any(np.dtype(d).itemsize < 4 and np.dtype(d) != np.bool_ and d != jnp.bfloat16
                               for d in dtypes):
        raise EmitError("8/16-bit integer blocks are not supported by the TPU kernel")


def boundary(call, blocks, name: str, *, in_views: Sequence[tuple], out_shapes: Sequence[tuple],
             bool_in: Sequence[bool] = (), bool_out: Sequence[bool] = ()):
    """The region as ``fused(*inputs) -> outputs`` around ``call`` (a ``pallas_call``).

    Args:
      in_views: per kernel operand, ``(input index, view shape)``: which region input it
        reads (one input may feed several operands) and the shape the kernel sees.
      out_shapes: the region's output shapes (each kernel output is reshaped back).
      bool_in, bool_out: per kernel operand / output, whether it crosses as int32.
    """
    bool_in = tuple(bool_in) or (False,) * len(in_views)
    bool_out = tuple(bool_out) or (False,) * len(out_shapes)

    def fused(*inputs):
        views = [to_kernel(jnp.reshape(inputs[i], shape), b) for (i, shape), b in zip(in_views, bool_in)]
        outs = call(*views)
        return tuple(from_kernel(jnp.reshape(o, s), b) for o, s, b in zip(outs, out_shapes, bool_out))

    fused.blocks = blocks
    fused.kernel_name = name
    return fused


def func_avals(fn_op) -> list:
    """``jax.ShapeDtypeStruct`` per input of an outlined region function."""
    out = []
    for t in hir.function_type(fn_op).inputs:
        info = hir.tensor_type_info(t)
        out.append(jax.ShapeDtypeStruct(info.shape, hir.np_dtype(info.dtype)))
    return out
