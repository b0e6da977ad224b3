"""gpu/tpu: the flash attention backward as Pallas kernels (Triton and Mosaic).

The same arithmetic as the cpu loops (:func:`~.backward.build_cpu_bwd`), per ``[bq, bk]`` block::

    x = logits(Q·Kᵀ, sides)   p = exp(x - m) / l   dP = dO·Vᵀ   dx = p·(dP - delta)  (0 where p == 1: logit_grad)
    dS, dSides = vjp(logits)(dx)   dQ += dS·K   dK += dSᵀ·Q   dV += pᵀ·dO

with ``m``, ``l`` the forward's row statistics and ``delta = rowsum(dO·O)`` (computed once,
outside). Accumulation in f32; the products read their operands in the inputs' dtype (bf16/f16
in, f32 out). Two kernels per target, as in JAX's own Pallas ops:

* **dK/dV** — one program (Triton) or one grid column (Mosaic) per (batch, key block); it visits
  every row group (``G``: heads sharing the K/V head, so GQA/MQA groups too) and the query blocks
  that see the key block (block skipping for position masks, the inverse of the forward's
  table);
* **dQ** (+ the learned sides' gradients) — per (batch, group, query block), over key blocks.

Learned side inputs (a bias that gets a gradient): each (group, query block, key block) step
writes its own gradient block (``[.., bq|1, bk|1]``, f32, summed over the side's broadcast dims
outside the kernel), so no step accumulates into another's output. Block skipping is off for
the dQ kernel then (visiting a masked block adds exact zeros). K/V broadcast over a batch label
(MQA without a head dim) are materialized per program by :func:`pallas_inputs`; their gradients
are summed back outside. The padding rows/keys of the tiles are masked (p = 0 there).
"""

from __future__ import annotations

import functools

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from hlofuse.kernels.attention.blocks import AttentionBlocks
from hlofuse.kernels.attention.layout import (_flatten_group, canonical_inputs, pad_to,
                                              pallas_index, pallas_inputs)
from hlofuse.core.ops import transcendentals_in_f32
from hlofuse.kernels.attention.logits import F32, eval_logits
from hlofuse.kernels.attention.online_softmax import (logit_grad, needs_own_stats, online_init,
                                                      online_stats)
from hlofuse.kernels.attention.skip import key_ranges
from hlofuse.kernels.attention.spec import AttentionSpec
from hlofuse.kernels.tiling import next_pow2

__all__ = ["LANES", "pallas_stats", "query_ranges", "bwd_prepare", "bwd_finish",
           "build_gpu_bwd", "build_tpu_bwd"]

LANES = 128


def pallas_stats(spec: AttentionSpec, stats):
    """[N, G, Sqp, 2] row statistics -> canonical ``[batch.., rows.., Sq, 2]``."""
    sizes = spec.sizes
    stats = stats[:, :, :spec.seq_q]
    return stats.reshape([sizes[b] for b in spec.batch] + [sizes[r] for r in spec.rows_other]
                         + [spec.seq_q, 2])


def query_ranges(lo, hi, nk: int, pad: int | None = None):
    """Inverse of the key-block table: per key block j, [qlo, qhi) covering every query block i
    with lo[i] <= j < hi[i] (blocks in between that do not see j add exact zeros)."""
    qlo = np.zeros(nk, np.int32)
    qhi = np.zeros(nk, np.int32)
    for j in range(nk):
        rows = np.nonzero((lo <= j) & (j < hi))[0]
        if rows.size:
            qlo[j], qhi[j] = rows.min(), rows.max() + 1
    if pad:
        qlo, qhi = np.pad(qlo, (0, pad - nk)), np.pad(qhi, (0, pad - nk))
    return qlo, qhi


def _flat(spec, x):
    """canonical [batch.., rows.., Sq, ...] -> [N, G, Sq, ...]."""
    sizes = spec.sizes
    return _flatten_group(_flatten_group(x, 0, spec.batch, sizes), 1, spec.rows_other, sizes)


def bwd_prepare(spec: AttentionSpec, inputs, o, do, stats, bq: int, bk: int, dpad, dvp):
    """Kernel operands: q [N, G, Sqp, D'], k [N, Skp, D'], v/do [N, .., Dv'], m/l/delta
    [N, G, Sqp] f32 (l = 1, m = 0 on padding rows), sides as for the forward."""
    q, k, v, sides = pallas_inputs(spec, inputs, bq, bk, dpad)
    sqp = q.shape[2]
    delta = jnp.sum(do.astype(F32) * o.astype(F32), axis=-1)
    do = pad_to(_flat(spec, do).astype(v.dtype), 2, sqp)
    if dvp is not None:
        v = pad_to(v, 2, max(dvp, v.shape[2]))
        do = pad_to(do, 3, max(dvp, do.shape[3]))
    delta = pad_to(_flat(spec, delta), 2, sqp)
    m = pad_to(_flat(spec, stats[..., 0]), 2, sqp)
    l = _flat(spec, stats[..., 1])
    if l.shape[2] != sqp:
        l = jnp.pad(l, [(0, 0), (0, 0), (0, sqp - l.shape[2])], constant_values=1.0)
    return q, k, v, do, m, l, delta, sides


def bwd_finish(spec: AttentionSpec, inputs, learned, dq, dk, dv, dsides):
    """Kernel results -> canonical gradients ``{input position: array}`` (see _grad_layout)."""
    sizes = spec.sizes
    cq, ck, cv, csides = canonical_inputs(spec, inputs)
    bshape = [sizes[b] for b in spec.batch]
    rshape = [sizes[r] for r in spec.rows_other]
    dq = dq[:, :, :spec.seq_q, :spec.head_dim].reshape(bshape + rshape + [spec.seq_q, spec.head_dim])
    dk = dk[:, :spec.seq_k, :spec.head_dim].reshape(bshape + [spec.seq_k, spec.head_dim])
    dv = dv[:, :spec.seq_k, :spec.v_head_dim].reshape(bshape + [spec.seq_k, spec.v_head_dim])
    grads = {spec.q_arg: dq, spec.k_arg: _sum_to(dk, ck.shape), spec.v_arg: _sum_to(dv, cv.shape)}
    side_pos = [a for a, _ in spec.side_args]
    for i, g in zip(learned, dsides):
        want = csides[i].shape
        rank = len(want)
        g = g.reshape(([sizes[b] for b in spec.batch] if g.shape[0] > 1 else [1] * len(spec.batch))
                      + ([sizes[r] for r in spec.rows_other] if g.shape[1] > 1
                         else [1] * len(spec.rows_other)) + list(g.shape[2:]))
        if want[rank - 2] == 1:
            g = jnp.sum(g, axis=rank - 2, keepdims=True)
        else:
            g = g[..., :spec.seq_q, :]
        if want[rank - 1] == 1:
            g = jnp.sum(g, axis=rank - 1, keepdims=True)
        else:
            g = g[..., :spec.seq_k]
        grads[side_pos[i]] = _sum_to(g, want)
    return grads


def _sum_to(x, shape):
    axes = tuple(a for a, (n, w) in enumerate(zip(x.shape, shape)) if w == 1 and n != 1)
    x = jnp.sum(x, axis=axes, keepdims=True) if axes else x
    return x.reshape(shape)


def _block_logits(spec, learned, n, g, q_pos, k_pos, q, kb, sb, *, upcast_half: bool,
                  key_valid):
    """One [bq, bk] block's logits in f32 (padding keys -inf) and the vjp of the logit chain
    in (Q·Kᵀ, the ``learned`` sides). The backward kernels and their own row statistics
    (:func:`_gpu_stats_kernel`, :func:`_tpu_stats_kernel`) compute them alike, so
    ``p = exp(x - m) / l`` is exact against statistics taken from them."""
    s = lax.dot_general(q, kb, (((1,), (1,)), ((), ())), preferred_element_type=F32)
    index = pallas_index(spec, n, g, q_pos, k_pos)
    bshape = s.shape

    def logits(s_, *ls):
        sb2 = list(sb)
        for i, x in zip(learned, ls):
            sb2[i] = x
        with transcendentals_in_f32():   # Mosaic (Triton: upcast_half converts every op)
            x = eval_logits(spec, s_, sb2, index, upcast_half=upcast_half)
        return jnp.broadcast_to(x, bshape).astype(F32)
    x, vjp = jax.vjp(logits, s, *[sb[i] for i in learned])
    return jnp.where(key_valid, x, -jnp.inf), vjp


def _block_grads(spec, learned, n, g, q_pos, k_pos, q, kb, vb, do, m, l, delta, sb, *,
                 upcast_half: bool, row_valid, key_valid):
    """One [bq, bk] block: (p, dS, side gradients) in f32."""
    x, vjp = _block_logits(spec, learned, n, g, q_pos, k_pos, q, kb, sb,
                           upcast_half=upcast_half, key_valid=key_valid)
    p = jnp.exp(x - m) / l
    p = jnp.where(row_valid, p, 0.0)
    dp = lax.dot_general(do, vb, (((1,), (1,)), ((), ())), preferred_element_type=F32)
    dx = logit_grad(p, dp, delta)
    padded = spec.seq_k % kb.shape[0] != 0
    if padded:
        # padding keys get no gradient: a row with every key masked has p = NaN there, and a
        # padding key's mask entry may pass (see build_cpu_bwd)
        dx = jnp.where(key_valid, dx, 0.0)
    ds, *dls = vjp(dx)
    if padded:
        ds = jnp.where(key_valid, ds, 0.0)
    return p, ds, [d.astype(F32) for d in dls]


def _tdot(a, dtype, b):
    """aᵀ·b in f32, aᵀ read in ``dtype`` (transposed in f32 first, as JAX's TPU flash
    backward does)."""
    return lax.dot(a.T.astype(dtype), b, preferred_element_type=F32)


# ---------------------------------------------------------------------------------------------
# Triton
# ---------------------------------------------------------------------------------------------

def _gpu_stats_kernel(q_ref, k_ref, lo_ref, hi_ref, *refs, spec, bq, bk, n_side, side_full_k):
    """The row statistics (max, sum) of one (batch, group, query block) from the backward's own
    logits, over the key blocks the forward visits (:func:`~.online_softmax.needs_own_stats`)."""
    side_refs = refs[:n_side]
    m_ref, l_ref = refs[n_side:]
    n, g, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    q = q_ref[...]
    q_pos = i * bq + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)

    def body(j, st):
        kb = k_ref[pl.ds(j * bk, bk), :]
        k_pos = j * bk + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
        sb = [r[:, pl.ds(j * bk, bk)] if full else r[...] for r, full in zip(side_refs, side_full_k)]
        x, _ = _block_logits(spec, (), n, g, q_pos, k_pos, q, kb, sb, upcast_half=True,
                             key_valid=k_pos < spec.seq_k)
        return online_stats(st, x, m_init=spec.m_init)

    m, l = lax.fori_loop(lo_ref[i], hi_ref[i], body, online_init((bq,), (), spec.m_init)[:2])
    m_ref[...] = m
    l_ref[...] = l


def _gpu_dkv_kernel(q_ref, k_ref, v_ref, do_ref, m_ref, l_ref, dd_ref, qlo_ref, qhi_ref, *refs,
                    spec, bq, bk, G, sqp, n_side, side_rows):
    side_refs = refs[:n_side]
    dk_ref, dv_ref = refs[n_side:]
    n, j = pl.program_id(0), pl.program_id(1)
    kb, vb = k_ref[...], v_ref[...]
    k_pos = j * bk + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)

    def group(g, carry):
        def body(i, carry):
            dk, dv = carry
            rows = pl.ds(g * sqp + i * bq, bq)
            q = q_ref[rows, :]
            do = do_ref[rows, :]
            m, l, dd = m_ref[rows], l_ref[rows], dd_ref[rows]
            q_pos = i * bq + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
            sb = []
            for r, (g_full, q_full) in zip(side_refs, side_rows):
                start = (g * (sqp if q_full else 1) if g_full else 0) + (i * bq if q_full else 0)
                sb.append(r[pl.ds(start, bq if q_full else 1), :])
            p, ds, _ = _block_grads(spec, (), n, g, q_pos, k_pos, q, kb, vb, do, m[:, None],
                                    l[:, None], dd[:, None], sb, upcast_half=True,
                                    row_valid=q_pos < spec.seq_q, key_valid=k_pos < spec.seq_k)
            dk = dk + _tdot(ds, q.dtype, q)
            dv = dv + _tdot(p, vb.dtype, do)
            return dk, dv
        return lax.fori_loop(qlo_ref[j], qhi_ref[j], body, carry)

    dk, dv = lax.fori_loop(0, G, group, (jnp.zeros(dk_ref.shape, F32), jnp.zeros(dv_ref.shape, F32)))
    dk_ref[...] = dk
    dv_ref[...] = dv


def _gpu_dq_kernel(q_ref, k_ref, v_ref, do_ref, m_ref, l_ref, dd_ref, lo_ref, hi_ref, *refs,
                   spec, bq, bk, n_side, side_full_k, learned):
    side_refs = refs[:n_side]
    dq_ref = refs[n_side]
    ds_refs = refs[n_side + 1:]
    n, g, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    q, do = q_ref[...], do_ref[...]
    m, l, dd = m_ref[...][:, None], l_ref[...][:, None], dd_ref[...][:, None]
    q_pos = i * bq + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
    sum_k = [not side_full_k[s] for s in learned]   # key-broadcast gradients: summed over j

    def body(j, carry):
        dq, acc = carry
        kb = k_ref[pl.ds(j * bk, bk), :]
        vb = v_ref[pl.ds(j * bk, bk), :]
        k_pos = j * bk + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
        sb = [r[:, pl.ds(j * bk, bk)] if full else r[...] for r, full in zip(side_refs, side_full_k)]
        p, ds, dls = _block_grads(spec, learned, n, g, q_pos, k_pos, q, kb, vb, do, m, l, dd, sb,
                                  upcast_half=True, row_valid=q_pos < spec.seq_q,
                                  key_valid=k_pos < spec.seq_k)
        dq = dq + jnp.dot(ds.astype(kb.dtype), kb, preferred_element_type=F32)
        new = []
        for r, a, d, summed in zip(ds_refs, acc, dls, sum_k):
            if summed:
                new.append(a + d)
            else:
                r[:, pl.ds(j * bk, bk)] = d
                new.append(a)
        return dq, tuple(new)

    acc0 = tuple(jnp.zeros((r.shape[0], 1), F32) for r in ds_refs)
    dq, acc = lax.fori_loop(lo_ref[i], hi_ref[i], body, (jnp.zeros(dq_ref.shape, F32), acc0))
    dq_ref[...] = dq
    for r, a, summed in zip(ds_refs, acc, sum_k):
        if summed:
            r[...] = a


def build_gpu_bwd(spec: AttentionSpec, learned: tuple, blocks: AttentionBlocks, *, interpret=None,
                  name: str):
    """``fn(inputs, o, do, stats) -> (dq, dk, dv, dsides)`` in the canonical layout."""
    from jax.experimental.pallas import triton as pltriton
    bq, bk = blocks.bq, blocks.bk
    dpad = max(16, next_pow2(spec.head_dim))
    dvp = max(16, next_pow2(spec.v_head_dim))
    nq, nk = -(-spec.seq_q // bq), -(-spec.seq_k // bk)
    lo, hi, skipping = key_ranges(spec, bq, bk)
    qlo, qhi = query_ranges(lo, hi, nk, pad=next_pow2(nk))
    pad = lambda a: np.pad(a, (0, next_pow2(nq) - nq))  # noqa: E731
    flo, fhi = pad(lo), pad(hi)       # the forward's key blocks: the own statistics visit them
    if learned:   # every (i, j) gradient block of a side is written: visit them all
        lo, hi = pad(np.zeros(nq, np.int32)), pad(np.full(nq, nk, np.int32))
    else:
        lo, hi = flo, fhi
    params = None if interpret else pltriton.CompilerParams(num_warps=blocks.num_warps,
                                                            num_stages=blocks.num_stages)

    def fn(inputs, o, do, stats):
        q, k, v, do, m, l, dd, sides = bwd_prepare(spec, inputs, o, do, stats, bq, bk, dpad, dvp)
        N, G, sqp, _ = q.shape
        skp = k.shape[1]
        n_side = len(sides)
        full_k = tuple(s.shape[3] > 1 for s in sides)
        qb = lambda w: pl.BlockSpec((None, None, bq, w), lambda n, g, i: (n, g, i, 0))  # noqa: E731
        sb = pl.BlockSpec((None, None, bq), lambda n, g, i: (n, g, i))
        tb = pl.BlockSpec((lo.shape[0],), lambda n, g, i: (0,))
        q_side_specs = []
        for s in sides:
            bdims = (None, None, bq if s.shape[2] > 1 else 1, skp if s.shape[3] > 1 else 1)
            q_side_specs.append(pl.BlockSpec(bdims, functools.partial(
                _dq_side_index, nb=s.shape[0] > 1, ng=s.shape[1] > 1, nq=s.shape[2] > 1)))

        def own_stats():
            st = pl.pallas_call(
                functools.partial(_gpu_stats_kernel, spec=spec, bq=bq, bk=bk, n_side=n_side,
                                  side_full_k=full_k),
                out_shape=(jax.ShapeDtypeStruct((N, G, sqp), F32),) * 2,
                grid=(N, G, nq),
                in_specs=[qb(dpad), pl.BlockSpec((None, skp, dpad), lambda n, g, i: (n, 0, 0)),
                          tb, tb] + q_side_specs,
                out_specs=(sb, sb),
                compiler_params=params, interpret=interpret or False, name=name + "_stats")
            return st(q, k, jnp.asarray(flo), jnp.asarray(fhi), *sides)
        m, l = lax.cond(needs_own_stats(q, k), own_stats, lambda: (m, l))
        # dK/dV: per (batch, key block); rows flattened to [N, G*Sqp, ..]
        side_rows = tuple((s.shape[1] > 1, s.shape[2] > 1) for s in sides)
        flat_sides = [s.reshape(s.shape[0], s.shape[1] * s.shape[2], s.shape[3]) for s in sides]
        row_spec = lambda w: pl.BlockSpec((None, G * sqp, w), lambda n, j: (n, 0, 0))  # noqa: E731
        vec_spec = pl.BlockSpec((None, G * sqp), lambda n, j: (n, 0))
        tab_spec = pl.BlockSpec((qlo.shape[0],), lambda n, j: (0,))
        side_specs = [pl.BlockSpec((None, s.shape[1], bk if s.shape[2] > 1 else 1),
                                   functools.partial(_dkv_side_index, nb=s.shape[0] > 1,
                                                     nk=s.shape[2] > 1)) for s in flat_sides]
        dkv = pl.pallas_call(
            functools.partial(_gpu_dkv_kernel, spec=spec, bq=bq, bk=bk, G=G, sqp=sqp,
                              n_side=n_side, side_rows=side_rows),
            out_shape=(jax.ShapeDtypeStruct((N, skp, dpad), F32),
                       jax.ShapeDtypeStruct((N, skp, dvp), F32)),
            grid=(N, nk),
            in_specs=[row_spec(dpad), pl.BlockSpec((None, bk, dpad), lambda n, j: (n, j, 0)),
                      pl.BlockSpec((None, bk, dvp), lambda n, j: (n, j, 0)), row_spec(dvp),
                      vec_spec, vec_spec, vec_spec, tab_spec, tab_spec] + side_specs,
            out_specs=(pl.BlockSpec((None, bk, dpad), lambda n, j: (n, j, 0)),
                       pl.BlockSpec((None, bk, dvp), lambda n, j: (n, j, 0))),
            compiler_params=params, interpret=interpret or False, name=name + "_dkv")
        flat = lambda a: a.reshape((N, G * sqp) + a.shape[3:])  # noqa: E731
        dk, dv = dkv(flat(q), k, v, flat(do), flat(m), flat(l), flat(dd), jnp.asarray(qlo),
                     jnp.asarray(qhi), *flat_sides)
        # dQ (+ learned side gradients): per (batch, group, query block)
        ds_shapes, ds_specs = [], []
        for si in learned:
            s = sides[si]
            r = bq if s.shape[2] > 1 else 1
            c = skp if s.shape[3] > 1 else 1
            ds_shapes.append(jax.ShapeDtypeStruct((N, G, nq * r, c), F32))
            ds_specs.append(pl.BlockSpec((None, None, r, c), lambda n, g, i: (n, g, i, 0)))
        dqc = pl.pallas_call(
            functools.partial(_gpu_dq_kernel, spec=spec, bq=bq, bk=bk, n_side=n_side,
                              side_full_k=full_k, learned=tuple(learned)),
            out_shape=(jax.ShapeDtypeStruct((N, G, sqp, dpad), F32), *ds_shapes),
            grid=(N, G, nq),
            in_specs=[qb(dpad), pl.BlockSpec((None, skp, dpad), lambda n, g, i: (n, 0, 0)),
                      pl.BlockSpec((None, skp, dvp), lambda n, g, i: (n, 0, 0)), qb(dvp),
                      sb, sb, sb, tb, tb] + q_side_specs,
            out_specs=(qb(dpad), *ds_specs),
            compiler_params=params, interpret=interpret or False, name=name + "_dq")
        dq, *dsides = dqc(q, k, v, do, m, l, dd, jnp.asarray(lo), jnp.asarray(hi), *sides)
        return dq, dk, dv, dsides

    fn.blocks = f"triton {blocks}" + (" +skip" if skipping else "")
    return fn


def _dkv_side_index(n, j, *, nb: bool, nk: bool):
    return (n if nb else 0, 0, j if nk else 0)


def _dq_side_index(n, g, i, *, nb: bool, ng: bool, nq: bool):
    return (n if nb else 0, g if ng else 0, i if nq else 0, 0)


# ---------------------------------------------------------------------------------------------
# Mosaic (TPU)
# ---------------------------------------------------------------------------------------------

def _tpu_stats_kernel(lo_ref, hi_ref, q_ref, k_ref, *refs, spec, bq, bk, nk, n_side):
    """:func:`_gpu_stats_kernel` on Mosaic: one (batch, group, query block, key block) step,
    the statistics lane-replicated in scratch."""
    side_refs = refs[:n_side]
    m_ref, l_ref, m_sc, l_sc = refs[n_side:]
    n, g, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        m_sc[...], l_sc[...], _ = online_init(m_sc.shape, (), spec.m_init)

    @pl.when((j >= lo_ref[i]) & (j < hi_ref[i]))
    def _step():
        q_pos = i * bq + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
        k_pos = j * bk + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
        x, _ = _block_logits(spec, (), n, g, q_pos, k_pos, q_ref[...], k_ref[...],
                             [r[...] for r in side_refs], upcast_half=False,
                             key_valid=k_pos < spec.seq_k)
        m_sc[...], l_sc[...] = online_stats((m_sc[...], l_sc[...]), x, m_init=spec.m_init)

    @pl.when(j == nk - 1)
    def _done():
        m_ref[...] = m_sc[...]
        l_ref[...] = l_sc[...]


def _tpu_dkv_kernel(lo_ref, hi_ref, q_ref, k_ref, v_ref, do_ref, m_ref, l_ref, dd_ref, *refs,
                    spec, bq, bk, G, nq, n_side):
    side_refs = refs[:n_side]
    dk_ref, dv_ref, dk_sc, dv_sc = refs[n_side:]
    n, j, g, i = pl.program_id(0), pl.program_id(1), pl.program_id(2), pl.program_id(3)

    @pl.when((g == 0) & (i == 0))
    def _init():
        dk_sc[...] = jnp.zeros(dk_sc.shape, F32)
        dv_sc[...] = jnp.zeros(dv_sc.shape, F32)

    @pl.when((j >= lo_ref[i]) & (j < hi_ref[i]))
    def _step():
        q, do = q_ref[...], do_ref[...]
        q_pos = i * bq + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
        k_pos = j * bk + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
        p, ds, _ = _block_grads(spec, (), n, g, q_pos, k_pos, q, k_ref[...], v_ref[...], do,
                                m_ref[...][:, :1], l_ref[...][:, :1], dd_ref[...][:, :1],
                                [r[...] for r in side_refs], upcast_half=False,
                                row_valid=q_pos < spec.seq_q, key_valid=k_pos < spec.seq_k)
        dk_sc[...] += _tdot(ds, q.dtype, q)
        dv_sc[...] += _tdot(p, do.dtype, do)

    @pl.when((g == G - 1) & (i == nq - 1))
    def _done():
        dk_ref[...] = dk_sc[...]
        dv_ref[...] = dv_sc[...]


def _tpu_dq_kernel(lo_ref, hi_ref, q_ref, k_ref, v_ref, do_ref, m_ref, l_ref, dd_ref, *refs,
                   spec, bq, bk, nk, n_side, learned):
    side_refs = refs[:n_side]
    dq_ref = refs[n_side]
    ds_refs = refs[n_side + 1:n_side + 1 + len(learned)]
    dq_sc = refs[-1]
    n, g, i, j = pl.program_id(0), pl.program_id(1), pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        dq_sc[...] = jnp.zeros(dq_sc.shape, F32)

    run = (j >= lo_ref[i]) & (j < hi_ref[i])

    @pl.when(run)
    def _step():
        q, kb = q_ref[...], k_ref[...]
        q_pos = i * bq + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
        k_pos = j * bk + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
        p, ds, dls = _block_grads(spec, learned, n, g, q_pos, k_pos, q, kb, v_ref[...],
                                  do_ref[...], m_ref[...][:, :1], l_ref[...][:, :1],
                                  dd_ref[...][:, :1], [r[...] for r in side_refs],
                                  upcast_half=False, row_valid=q_pos < spec.seq_q,
                                  key_valid=k_pos < spec.seq_k)
        dq_sc[...] += jnp.dot(ds.astype(kb.dtype), kb, preferred_element_type=F32)
        for r, d in zip(ds_refs, dls):
            r[...] = d

    if ds_refs:
        @pl.when(jnp.logical_not(run))
        def _skipped():
            for r in ds_refs:
                r[...] = jnp.zeros(r.shape, F32)

    @pl.when(j == nk - 1)
    def _done():
        dq_ref[...] = dq_sc[...]


def build_tpu_bwd(spec: AttentionSpec, learned: tuple, blocks: AttentionBlocks, *, interpret=None,
                  name: str):
    """``fn(inputs, o, do, stats) -> (dq, dk, dv, dsides)`` in the canonical layout."""
    from jax.experimental.pallas import tpu as pltpu
    bq, bk = blocks.bq, blocks.bk
    nq, nk = -(-spec.seq_q // bq), -(-spec.seq_k // bk)
    lo, hi, skipping = key_ranges(spec, bq, bk)

    def fn(inputs, o, do, stats):
        q, k, v, do, m, l, dd, sides = bwd_prepare(spec, inputs, o, do, stats, bq, bk, None, None)
        N, G, sqp, d = q.shape
        dv_ = v.shape[2]
        lanes = lambda a: jnp.broadcast_to(a[..., None], a.shape + (LANES,))  # noqa: E731
        m, l, dd = lanes(m), lanes(l), lanes(dd)
        n_side = len(sides)
        kw = dict(interpret=interpret or False)
        # dQ's grid (batch, group, query block, key block); own statistics and dQ share it
        qs = lambda w: pl.BlockSpec((None, None, bq, w),  # noqa: E731
                                    lambda n, g, i, j, lo_r, hi_r: (n, g, i, 0))
        ks = lambda w: pl.BlockSpec((None, bk, w), lambda n, g, i, j, lo_r, hi_r: (n, j, 0))  # noqa: E731
        q_side_specs = _tpu_side_specs(sides, bq, bk, _tpu_side_index_q)
        q_params = None if interpret else pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"))

        def own_stats():
            st_shape = jax.ShapeDtypeStruct((N, G, sqp, LANES), F32)
            st = pl.pallas_call(
                functools.partial(_tpu_stats_kernel, spec=spec, bq=bq, bk=bk, nk=nk,
                                  n_side=n_side),
                out_shape=(st_shape, st_shape),
                grid_spec=pltpu.PrefetchScalarGridSpec(
                    num_scalar_prefetch=2, grid=(N, G, nq, nk),
                    in_specs=[qs(d), ks(d)] + q_side_specs,
                    out_specs=(qs(LANES), qs(LANES)),
                    scratch_shapes=[pltpu.VMEM((bq, LANES), F32), pltpu.VMEM((bq, LANES), F32)]),
                compiler_params=q_params, name=name + "_stats", **kw)
            return st(jnp.asarray(lo), jnp.asarray(hi), q, k, *sides)
        m, l = lax.cond(needs_own_stats(q, k), own_stats, lambda: (m, l))
        # dK/dV: grid (batch, key block, group, query block); the last two accumulate
        kqs = lambda w: pl.BlockSpec((None, None, bq, w),  # noqa: E731
                                     lambda n, j, g, i, lo_r, hi_r: (n, g, i, 0))
        kks = lambda w: pl.BlockSpec((None, bk, w), lambda n, j, g, i, lo_r, hi_r: (n, j, 0))  # noqa: E731
        side_specs = _tpu_side_specs(sides, bq, bk, _tpu_side_index_kv)
        dkv = pl.pallas_call(
            functools.partial(_tpu_dkv_kernel, spec=spec, bq=bq, bk=bk, G=G, nq=nq, n_side=n_side),
            out_shape=(jax.ShapeDtypeStruct((N, k.shape[1], d), F32),
                       jax.ShapeDtypeStruct((N, k.shape[1], dv_), F32)),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=2, grid=(N, nk, G, nq),
                in_specs=[kqs(d), kks(d), kks(dv_), kqs(dv_), kqs(LANES), kqs(LANES), kqs(LANES)]
                + side_specs,
                out_specs=(kks(d), kks(dv_)),
                scratch_shapes=[pltpu.VMEM((bk, d), F32), pltpu.VMEM((bk, dv_), F32)]),
            compiler_params=None if interpret else pltpu.CompilerParams(
                dimension_semantics=("parallel", "parallel", "arbitrary", "arbitrary")),
            name=name + "_dkv", **kw)
        dk, dv = dkv(jnp.asarray(lo), jnp.asarray(hi), q, k, v, do, m, l, dd, *sides)
        # dQ (+ learned side gradients): grid (batch, group, query block, key block)
        lo2, hi2 = ((np.zeros(nq, np.int32), np.full(nq, nk, np.int32)) if learned else (lo, hi))
        ds_shapes, ds_specs = [], []
        for si in learned:
            s = sides[si]
            r = bq if s.shape[2] > 1 else 1
            c = bk if s.shape[3] > 1 else 1
            ds_shapes.append(jax.ShapeDtypeStruct((N, G, nq * r, nk * c), F32))
            ds_specs.append(pl.BlockSpec((None, None, r, c),
                                         lambda n, g, i, j, lo_r, hi_r: (n, g, i, j)))
        dqc = pl.pallas_call(
            functools.partial(_tpu_dq_kernel, spec=spec, bq=bq, bk=bk, nk=nk, n_side=n_side,
                              learned=tuple(learned)),
            out_shape=(jax.ShapeDtypeStruct((N, G, sqp, d), F32), *ds_shapes),
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=2, grid=(N, G, nq, nk),
                in_specs=[qs(d), ks(d), ks(dv_), qs(dv_), qs(LANES), qs(LANES), qs(LANES)]
                + q_side_specs,
                out_specs=(qs(d), *ds_specs),
                scratch_shapes=[pltpu.VMEM((bq, d), F32)]),
            compiler_params=q_params,
            name=name + "_dq", **kw)
        dq, *dsides = dqc(jnp.asarray(lo2), jnp.asarray(hi2), q, k, v, do, m, l, dd, *sides)
        return dq, dk, dv, dsides

    fn.blocks = f"mosaic {blocks}" + (" +skip" if skipping else "")
    return fn


def _tpu_side_specs(sides, bq: int, bk: int, index):
    """Block specs of the side inputs ``[B|1, G|1, Sq|1, Sk|1]``: a (bq, bk) block, 1 along
    a broadcast dim; ``index``: the grid's index map (:func:`_tpu_side_index_kv` or
    :func:`_tpu_side_index_q`)."""
    return [pl.BlockSpec((None, None, bq if s.shape[2] > 1 else 1, bk if s.shape[3] > 1 else 1),
                         functools.partial(index, nb=s.shape[0] > 1, ng=s.shape[1] > 1,
                                           nq=s.shape[2] > 1, nkk=s.shape[3] > 1))
            for s in sides]


def _tpu_side_index_kv(n, j, g, i, lo_r, hi_r, *, nb, ng, nq, nkk):
    return (n if nb else 0, g if ng else 0, i if nq else 0, j if nkk else 0)


def _tpu_side_index_q(n, g, i, j, lo_r, hi_r, *, nb, ng, nq, nkk):
    return (n if nb else 0, g if ng else 0, i if nq else 0, j if nkk else 0)
