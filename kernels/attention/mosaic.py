"""tpu: a Pallas Mosaic kernel. Grid (batch, row group, query block, key block) with scratch
accumulators and scalar-prefetched per-block key ranges (skipped steps re-use the resident
block: no DMA)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from hlofuse.core import ir as hir
from hlofuse.kernels.attention.blocks import AttentionBlocks, tpu_blocks
from hlofuse.kernels.attention.layout import pallas_index, pallas_inputs, pallas_output
from hlofuse.core.ops import transcendentals_in_f32
from hlofuse.kernels.attention.logits import F32, eval_logits
from hlofuse.kernels.attention.online_softmax import online_finish, online_init, online_update
from hlofuse.kernels.attention.skip import key_ranges
from hlofuse.kernels.attention.spec import AttentionSpec

__all__ = ["LANES", "attention_kernel_tpu", "build_tpu"]

LANES = 128   # row statistics are kept lane-replicated: (bq, LANES) scratch


def attention_kernel_tpu(lo_ref, hi_ref, q_ref, k_ref, v_ref, *refs, spec: AttentionSpec,
                         bq: int, bk: int, nk: int, n_side: int, with_lse: bool = False):
    """Mosaic body: one (batch, group, query block, key block) step; scratch accumulators.
    ``with_lse``: also write the (lane-replicated) row statistics m and l."""
    side_refs = refs[:n_side]
    if with_lse:
        o_ref, m_ref, l_ref, m_sc, l_sc, acc_sc = refs[n_side:]
    else:
        o_ref, m_sc, l_sc, acc_sc = refs[n_side:]
    n, g, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        m_sc[...], l_sc[...], acc_sc[...] = online_init(m_sc.shape, acc_sc.shape, spec.m_init)

    @pl.when((j >= lo_ref[i]) & (j < hi_ref[i]))
    def _step():
        q = q_ref[...]
        kb = k_ref[...]
        vb = v_ref[...]
        s = lax.dot_general(q, kb, (((1,), (1,)), ((), ())), preferred_element_type=F32)
        q_pos = i * bq + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
        k_pos = j * bk + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
        sb = [r[...] for r in side_refs]
        with transcendentals_in_f32():   # Mosaic: 16-bit transcendentals in f32
            x = eval_logits(spec, s, sb, pallas_index(spec, n, g, q_pos, k_pos))
        m_sc[...], l_sc[...], acc_sc[...] = online_update(
            (m_sc[...], l_sc[...], acc_sc[...]), jnp.broadcast_to(x, (bq, bk)),
            lambda p: jnp.dot(p.astype(vb.dtype), vb, preferred_element_type=F32),
            m_init=spec.m_init, valid=k_pos < spec.seq_k)

    @pl.when(j == nk - 1)
    def _done():
        o_ref[...] = online_finish(l_sc[...], acc_sc[...]).astype(o_ref.dtype)
        if with_lse:
            m_ref[...] = m_sc[...]
            l_ref[...] = l_sc[...]


def build_tpu(spec: AttentionSpec, blocks: AttentionBlocks | None = None, *, interpret=None,
              name: str | None = None, with_lse: bool = False):
    """The Mosaic forward; ``with_lse``: ``fn`` returns ``(output, stats [N, G, Sqp, 2])``."""
    from jax.experimental.pallas import tpu as pltpu
    blocks = blocks or tpu_blocks(spec)
    bq, bk = blocks.bq, blocks.bk
    nq, nk = -(-spec.seq_q // bq), -(-spec.seq_k // bk)
    lo, hi, skipping = key_ranges(spec, bq, bk)
    name = name or f"hlofuse_attention_{spec.digest}"
    n_side = spec.n_sides

    def fn(*inputs):
        q, k, v, sides = pallas_inputs(spec, inputs, bq, bk, None)
        N, G, sqp, d = q.shape
        dv = v.shape[2]

        def kv_index(n, g, i, j, lo_ref, hi_ref):
            # clamp into the visited range so skipped steps re-use the resident block (no DMA)
            jj = jnp.minimum(jnp.maximum(j, lo_ref[i]), jnp.maximum(hi_ref[i] - 1, lo_ref[i]))
            return (n, jj, 0)

        side_specs = []
        for s in sides:
            bdims = (None, None, bq if s.shape[2] > 1 else 1, bk if s.shape[3] > 1 else 1)
            side_specs.append(pl.BlockSpec(bdims, functools.partial(
                _side_index_tpu, nb=s.shape[0] > 1, ng=s.shape[1] > 1, nq=s.shape[2] > 1,
                nkk=s.shape[3] > 1)))
        o_shape = jax.ShapeDtypeStruct((N, G, sqp, dv), hir.np_dtype(spec.out_dtype))
        o_spec = pl.BlockSpec((None, None, bq, dv), lambda n, g, i, j, lo_r, hi_r: (n, g, i, 0))
        if with_lse:
            st_shape = jax.ShapeDtypeStruct((N, G, sqp, LANES), F32)
            st_spec = pl.BlockSpec((None, None, bq, LANES),
                                   lambda n, g, i, j, lo_r, hi_r: (n, g, i, 0))
            o_shape, o_spec = (o_shape, st_shape, st_shape), (o_spec, st_spec, st_spec)
        grid_spec = pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(N, G, nq, nk),
            in_specs=[pl.BlockSpec((None, None, bq, d), lambda n, g, i, j, lo_r, hi_r: (n, g, i, 0)),
                      pl.BlockSpec((None, bk, d), kv_index),
                      pl.BlockSpec((None, bk, dv), kv_index)] + side_specs,
            out_specs=o_spec,
            scratch_shapes=[pltpu.VMEM((bq, LANES), F32), pltpu.VMEM((bq, LANES), F32),
                            pltpu.VMEM((bq, dv), F32)])
        kernel = functools.partial(attention_kernel_tpu, spec=spec, bq=bq, bk=bk, nk=nk, n_side=n_side,
                                   with_lse=with_lse)
        call = pl.pallas_call(
            kernel,
            out_shape=o_shape,
            grid_spec=grid_spec,
            compiler_params=None if interpret else pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
            interpret=interpret or False,
            name=name,
        )
        o = call(jnp.asarray(lo), jnp.asarray(hi), q, k, v, *sides)
        if with_lse:
            o, m, l = o
            return pallas_output(spec, o), jnp.stack([m[..., 0], l[..., 0]], axis=-1)
        return (pallas_output(spec, o),)

    fn.kernel_name = name
    fn.blocks = f"mosaic {blocks}" + (" +skip" if skipping else "")
    return fn


def _side_index_tpu(n, g, i, j, lo_r, hi_r, *, nb: bool, ng: bool, nq: bool, nkk: bool):
    return (n if nb else 0, g if ng else 0, i if nq else 0, j if nkk else 0)
