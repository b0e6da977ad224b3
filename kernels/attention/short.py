"""cpu, short sequences: the whole attention as one straight-line expression, no loops.

When the logits of every batch/head row fit one step block (``Sq·Sk·batch`` at most
:data:`CPU_SHORT_MAX_ELEMS` elements, ``Sk`` at most :data:`CPU_SHORT_MAX_K`), the flash loops
of :mod:`~hlofuse.kernels.attention.cpu` degenerate to one query chunk and one key block, and
their online bookkeeping (running max guarded by a select, rescale factors, zero-initialized
accumulators, the chunk ``map``) is pure overhead. This path writes the softmax once::

    x = logits(Q·Kᵀ);  m = max(m_init, rowmax(x));  p = exp(x - m);  out = (p·V) / rowsum(p)

which is the original region's arithmetic with the normalization moved after P·V (the same
reassociation the loops make). It contains only dots, elementwise ops XLA:CPU's library
fusion accepts (no select) and row reductions, so XLA:CPU can fuse it into one library
fusion (the logits block never makes a separate round trip through memory).

A row whose logits are all ``-inf`` gives NaN, as the original softmax does (``exp(-inf -
-inf)``); the loops give NaN too (``0/0``).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

from hlofuse.core import ir as hir
from hlofuse.kernels.attention.blocks import CPU_SKIP_BLOCK
from hlofuse.kernels.attention.cpu import block_index, lax_precision
from hlofuse.kernels.attention.layout import canonical_inputs, output
from hlofuse.kernels.attention.logits import F32, eval_logits, folded_scale
from hlofuse.kernels.attention.online_softmax import online_finish, online_only
from hlofuse.kernels.attention.skip import skip_info
from hlofuse.kernels.attention.spec import AttentionSpec
from hlofuse.kernels.naming import named_kernel

__all__ = ["CPU_SHORT_MAX_ELEMS", "CPU_SHORT_MAX_K", "short_fits", "build_cpu_short"]

# Whole-logits elements (batch x heads x Sq x Sk) up to which the loop-free path is used:
# 4M f32 = 16 MiB, e.g. BERT-base at S=512 (12 x 512 x 512 = 3M). Measured on the shared
# 2-core host (load 4-5 from other jobs, so preliminary), H=12 S=512 d=64 with a padding mask,
# heads-major inputs, jax.jit of each form timed interleaved, 150 rounds: this form (one
# XLA:CPU library fusion) min 8.8 ms, median 12.9 ms; the loops' form (4 chunks of 128 rows)
# min 11.3 ms, median 11.9 ms; one head per step (lax.map) min 10.7, median 11.2. The fastest
# quiet-machine time (the minima) is this form's; under heavy load the smaller steps hold up
# better. With BSHD inputs (transposes included): min 13.4 ms against the loops' 14.3 ms.
# In the whole BERT-base layer the steady-state difference is within the noise of that host;
# the first call is shorter (no while loop to lower and compile): bert_s512 1.05 s against
# 1.34 s with the loops (median of 3 fresh compilations each, alternated, module cache off).
CPU_SHORT_MAX_ELEMS = 4 * 1024 * 1024
CPU_SHORT_MAX_K = 1024


def short_fits(spec: AttentionSpec) -> bool:
    """Whether the loop-free path applies: the whole logits array is one small step block,
    and no position mask lets the loops skip whole key blocks (causal: they compute about half
    the blocks; kept there until measured otherwise)."""
    if skip_info(spec) is not None and spec.seq_k > CPU_SKIP_BLOCK:
        return False
    elems = spec.n_batch * spec.n_group * spec.seq_q * spec.seq_k
    return spec.seq_k <= CPU_SHORT_MAX_K and elems <= CPU_SHORT_MAX_ELEMS


def build_cpu_short(spec: AttentionSpec):
    """The region as ``f(*inputs) -> (output,)``: one QKᵀ dot, the softmax, one P·V dot."""
    pre = folded_scale(spec)
    sq, sk = spec.seq_q, spec.seq_k
    nb = len(spec.batch)
    out_dtype = hir.np_dtype(spec.out_dtype)
    qk_prec = lax_precision(spec.precision[0])
    pv_prec = lax_precision(spec.precision[1])
    p_dtype = hir.np_dtype(spec.p_dtype)
    index = functools.partial(block_index, spec, sq, sk)(0, 0)
    batch_dims = (tuple(range(nb)), tuple(range(nb)))

    def fn(*inputs):
        q, k, v, sides = canonical_inputs(spec, inputs)
        if pre is not None:
            q = q * jnp.asarray(pre[0], q.dtype)
        kt = jnp.swapaxes(k, -1, -2)                                     # [.., D, Sk]: NN dot
        s = lax.dot_general(q, kt, (((q.ndim - 1,), (nb,)), batch_dims),
                            preferred_element_type=F32, precision=qk_prec)
        seed = {pre[1]: s.astype(hir.np_dtype(spec.s_dtype))} if pre is not None else None
        x = jnp.broadcast_to(eval_logits(spec, s, sides, index, seed=seed), s.shape).astype(F32)
        def pv(p):
            return lax.dot_general(p.astype(p_dtype), v, (((p.ndim - 1,), (nb,)), batch_dims),
                                   preferred_element_type=F32, precision=pv_prec)
        _, l, o = online_only(x, pv, m_init=spec.m_init)
        return (output(spec, online_finish(l, o).astype(out_dtype)),)

    fn = named_kernel(fn, f"hlofuse_attention_cpu_{spec.digest}")
    fn.blocks = f"cpu whole rows bq={sq} bk={sk} (no loop)"
    return fn
