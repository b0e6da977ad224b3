"""gpu: a Pallas Triton kernel. Grid (batch, row group, query block); the key loop inside."""

from __future__ import annotations

import functools

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from hlofuse.core import ir as hir
from hlofuse.kernels.attention.blocks import AttentionBlocks, gpu_blocks
from hlofuse.kernels.attention.layout import pad_to, pallas_index, pallas_inputs, pallas_output
from hlofuse.kernels.attention.logits import F32, eval_logits
from hlofuse.kernels.attention.online_softmax import online_finish, online_init, online_update
from hlofuse.kernels.attention.skip import key_ranges
from hlofuse.kernels.attention.spec import AttentionSpec
from hlofuse.kernels.tiling import next_pow2

__all__ = ["attention_kernel_gpu", "build_gpu", "gpu_fwd_blocks"]


def gpu_fwd_blocks(spec: AttentionSpec) -> AttentionBlocks:
    """The forward's blocks: :func:`~.blocks.gpu_blocks`, with 64-row query blocks for f32
    operands of head dim <= 64.

    f32 Q/K/V tiles take twice the registers of 16-bit ones: at bq=128 (4 warps) the kernel used
    255 registers/thread and spilled on H100 (ptxas in the deviceless compile,
    hlofuse.runtime.aot: BERT S=512 with a padding mask 48+48 B, GPT-2 causal 32+32 B). At bq=64
    (4 warps): 170-183 registers, no spills, the same occupancy bound (0.12) on H100 and a higher
    one on A100 (231 registers, 0.12 -> 161, 0.19), twice the programs (B=2 H=12 S=512: 192 for
    132 SMs instead of 96). bq=128 at 8 warps also stops the spills (169 registers) but fits one
    program per SM."""
    b = gpu_blocks(spec)
    d = max(next_pow2(spec.head_dim), next_pow2(spec.v_head_dim))
    q_dtype = spec.in_dtypes[spec.q_arg] if spec.in_dtypes else np.float32
    if d <= 64 and np.dtype(q_dtype).itemsize >= 4 and b.bq > 64:
        return AttentionBlocks(b.target, 64, b.bk, num_warps=4, num_stages=b.num_stages)
    return b


def attention_kernel_gpu(q_ref, k_ref, v_ref, lo_ref, hi_ref, *refs, spec: AttentionSpec,
                         bq: int, bk: int, n_side: int, side_full_k: tuple, with_lse: bool = False):
    """Triton body: one (batch, group, query block) program, loop over key blocks.
    ``with_lse``: also write the row statistics m and l (training: the flash backward reads them)."""
    side_refs, o_ref = refs[:n_side], refs[n_side]
    n, g, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    q = q_ref[...]
    q_pos = i * bq + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
    lo, hi = lo_ref[i], hi_ref[i]
    dv = v_ref.shape[-1]

    def body(j, carry):
        kb = k_ref[pl.ds(j * bk, bk), :]
        vb = v_ref[pl.ds(j * bk, bk), :]
        s = jnp.dot(q, kb.T, preferred_element_type=F32)
        k_pos = j * bk + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
        sb = [r[:, pl.ds(j * bk, bk)] if full else r[...] for r, full in zip(side_refs, side_full_k)]
        x = eval_logits(spec, s, sb, pallas_index(spec, n, g, q_pos, k_pos), upcast_half=True)
        x = jnp.broadcast_to(x, (bq, bk))
        return online_update(carry, x, lambda p: jnp.dot(p.astype(vb.dtype), vb, preferred_element_type=F32),
                             m_init=spec.m_init, valid=k_pos < spec.seq_k)

    m, l, acc = lax.fori_loop(lo, hi, body, online_init((bq,), (bq, dv), spec.m_init))
    o_ref[...] = online_finish(l, acc).astype(o_ref.dtype)
    if with_lse:
        refs[n_side + 1][...] = m
        refs[n_side + 2][...] = l


def build_gpu(spec: AttentionSpec, blocks: AttentionBlocks | None = None, *, interpret=None,
              name: str | None = None, with_lse: bool = False):
    """The Triton forward; ``with_lse``: ``fn`` returns ``(output, stats [N, G, Sqp, 2])``."""
    blocks = blocks or gpu_fwd_blocks(spec)
    bq, bk = blocks.bq, blocks.bk
    dpad = max(16, next_pow2(spec.head_dim))
    dvp = max(16, next_pow2(spec.v_head_dim))
    nq = -(-spec.seq_q // bq)
    lo, hi, skipping = key_ranges(spec, bq, bk, pad_to=next_pow2(nq))
    name = name or f"hlofuse_attention_{spec.digest}"
    n_side = spec.n_sides

    def fn(*inputs):
        q, k, v, sides = pallas_inputs(spec, inputs, bq, bk, dpad)
        v = pad_to(v, 2, max(dvp, v.shape[2]))
        N, G, sqp, _ = q.shape
        skp = k.shape[1]
        full_k = tuple(s.shape[3] > 1 for s in sides)
        side_specs = []
        for s in sides:
            bdims = (None, None, bq if s.shape[2] > 1 else 1, skp if s.shape[3] > 1 else 1)
            side_specs.append(pl.BlockSpec(bdims, functools.partial(
                _side_index, nb=s.shape[0] > 1, ng=s.shape[1] > 1, nq=s.shape[2] > 1)))
        kernel = functools.partial(attention_kernel_gpu, spec=spec, bq=bq, bk=bk, n_side=n_side,
                                   side_full_k=full_k, with_lse=with_lse)
        o_shape = jax.ShapeDtypeStruct((N, G, sqp, dvp), hir.np_dtype(spec.out_dtype))
        o_spec = pl.BlockSpec((None, None, bq, dvp), lambda n, g, i: (n, g, i, 0))
        if with_lse:
            st_shape = jax.ShapeDtypeStruct((N, G, sqp), F32)
            st_spec = pl.BlockSpec((None, None, bq), lambda n, g, i: (n, g, i))
            o_shape, o_spec = (o_shape, st_shape, st_shape), (o_spec, st_spec, st_spec)
        from jax.experimental.pallas import triton as pltriton
        call = pl.pallas_call(
            kernel,
            out_shape=o_shape,
            grid=(N, G, nq),
            in_specs=[pl.BlockSpec((None, None, bq, dpad), lambda n, g, i: (n, g, i, 0)),
                      pl.BlockSpec((None, skp, dpad), lambda n, g, i: (n, 0, 0)),
                      pl.BlockSpec((None, skp, dvp), lambda n, g, i: (n, 0, 0)),
                      pl.BlockSpec((lo.shape[0],), lambda n, g, i: (0,)),
                      pl.BlockSpec((hi.shape[0],), lambda n, g, i: (0,))] + side_specs,
            out_specs=o_spec,
            compiler_params=None if interpret else pltriton.CompilerParams(
                num_warps=blocks.num_warps, num_stages=blocks.num_stages),
            interpret=interpret or False,
            name=name,
        )
        o = call(q, k, v, jnp.asarray(lo), jnp.asarray(hi), *sides)
        if with_lse:
            o, m, l = o
            return pallas_output(spec, o), jnp.stack([m, l], axis=-1)
        return (pallas_output(spec, o),)

    fn.kernel_name = name
    fn.blocks = f"triton {blocks}" + (" +skip" if skipping else "")
    return fn


def _side_index(n, g, i, *rest, nb: bool, ng: bool, nq: bool):
    return (n if nb else 0, g if ng else 0, i if nq else 0, 0)
