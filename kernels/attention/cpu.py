"""cpu: the flash algorithm as plain JAX loops.

``lax.map`` over query chunks, ``lax.fori_loop`` over key blocks: only the current logits block
``[batch.., rows.., bq, bk]`` is live, never the ``[.., Sq, Sk]`` logits nor whole-array carries.
Chunk sizes come from :func:`~hlofuse.kernels.attention.blocks.cpu_fwd_plan`: whole rows (one
key block per query chunk, no loop over keys,
:func:`~hlofuse.kernels.attention.online_softmax.online_only`: one YNNPACK library fusion per
chunk on jax 0.12) where they fit and this release compiles them well, else
:func:`~hlofuse.kernels.attention.blocks.cpu_plan` with the forward's step budget for this
host (:func:`~hlofuse.kernels.attention.blocks.cpu_budgets`).

Splitting (opt-in): the loops can be split along a batch axis (heads, batch) into
:data:`CPU_PARTS` independent loops (:func:`cpu_split`), meant as one per core: XLA's thunk
executor runs independent while loops concurrently (each part gets its own sliced K/V buffers;
loops that share one read-only buffer were run one after the other). Measured on the shared
2-core host: a standalone copy of these loops (B=1 H=8 d=64 S=4096, plain jax.jit) ran in
261 ms split in two (1.87 cores busy) against 316 ms as one loop (1.56); but the kernel itself,
A/B'd with ``python -m bench.attention_parts`` (fresh builds, interleaved, load 2-3), was
neutral: two loops / one loop 1.04, 1.03 at S=4096 and 0.98 at S=2048 (one loop already keeps
~1.8 cores busy when both are free: YNN threads its block dots). So the default stays one
loop; ``HLOFUSE_CPU_ATTENTION_PARTS=N`` turns the split on, for an A/B on a quiet machine
(:func:`cpu_parts`).
"""

from __future__ import annotations

import functools
import os

from hlofuse.core import config

import jax
import jax.numpy as jnp
from jax import lax

from hlofuse.core import ir as hir
from hlofuse.kernels.attention.blocks import CPU_MAX_BLOCK_K, AttentionBlocks, cpu_fwd_plan
from hlofuse.kernels.attention.layout import canonical_inputs, output, pad_axis, pad_to
from hlofuse.kernels.attention.logits import F32, eval_logits, folded_scale
from hlofuse.kernels.attention.online_softmax import (online_finish, online_init, online_only,
                                                      online_update)
from hlofuse.kernels.attention.skip import skip_table_cached
from hlofuse.kernels.attention.spec import AttentionSpec
from hlofuse.kernels.naming import named_kernel

__all__ = ["CPU_K_TRANSPOSED", "CPU_PARTS", "build_cpu", "cpu_parts", "cpu_split", "split_parts"]

CPU_K_TRANSPOSED = True       # K as [.., D, Sk]: QKᵀ per block is an NN matmul (measured faster)


def _usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


#: independent loops per attention kernel on cpu when set (an A/B harness sets it); None: from
#: ``HLOFUSE_CPU_ATTENTION_PARTS`` (:func:`cpu_parts`)
CPU_PARTS: int | None = None


def cpu_parts() -> int:
    """Independent loops per cpu attention kernel in effect now: :data:`CPU_PARTS` when set,
    else ``HLOFUSE_CPU_ATTENTION_PARTS`` (an integer, ``cores`` for the usable cores; default
    1, measured neutral, see the module docstring). Part of both module-cache keys."""
    if CPU_PARTS is not None:
        return CPU_PARTS
    v = config.get("HLOFUSE_CPU_ATTENTION_PARTS")
    return _usable_cores() if v == "cores" else max(1, v)


def cpu_split(spec: AttentionSpec, parts: int | None = None) -> tuple:
    """``(axis, bounds)``: the canonical batch axis the cpu loops are split along and the
    ``[start, stop)`` ranges of its parts (at most ``parts``, default :data:`CPU_PARTS`, near
    equal). The largest batch axis (Q, K, V, the sides and the output all carry it, and rows
    of different batch entries never meet); ``(None, ((0, 1),))`` when there is nothing to
    split (one part: the loops as they were)."""
    parts = cpu_parts() if parts is None else parts
    sizes = [spec.sizes[b] for b in spec.batch]
    if parts < 2 or not sizes or max(sizes) < 2:
        return None, ((0, 1),)
    ax = sizes.index(max(sizes))
    n = sizes[ax]
    parts = min(parts, n)
    cuts = [n * i // parts for i in range(parts + 1)]
    return ax, tuple((a, b) for a, b in zip(cuts, cuts[1:]))


def split_parts(ax, bounds, *arrays):
    """Per part, the arrays sliced along ``ax`` (an array of size 1 there broadcasts and is
    passed whole)."""
    if ax is None:
        return [list(arrays)]

    def cut(x, a, b):
        if x is None or x.shape[ax] == 1:
            return x
        idx = [slice(None)] * x.ndim
        idx[ax] = slice(a, b)
        return x[tuple(idx)]
    return [[cut(x, a, b) for x in arrays] for a, b in bounds]


def lax_precision(p: str):
    """The ``lax.Precision`` of a spec's dot precision name (None: the default)."""
    return {"HIGHEST": lax.Precision.HIGHEST, "HIGH": lax.Precision.HIGH}.get(p)


def build_cpu(spec: AttentionSpec, blocks: AttentionBlocks | None = None, *,
              k_transposed: bool = CPU_K_TRANSPOSED,
              with_lse: bool = False, parts: int | None = None, budget_scale: float = 1.0,
              whole_rows: bool | None = None):
    """The region as ``f(*inputs) -> (output,)`` made of XLA loops.

    ``with_lse``: return ``(output, stats)``, the row statistics ``[m, l]`` (max and sum, f32)
    in the canonical row layout ``[batch.., rows.., Sq, 2]``, for the flash backward.

    A power-of-two logit scale of at most 1 (:func:`~hlofuse.kernels.attention.logits.prescale`)
    scales Q once, a larger one every logits block as the program does
    (:func:`~hlofuse.kernels.attention.logits.folded_scale` says why).
    ``k_transposed``: keep K as
    ``[.., D, Sk]`` (built by one transpose of the input, :func:`canonical_inputs`) so QKᵀ
    is a plain (NN) matmul per block. ``parts``: independent loops
    (default :data:`CPU_PARTS`, see :func:`cpu_split`). ``budget_scale``: the step budget
    times this (:func:`~hlofuse.kernels.attention.blocks.cpu_budgets`; without ``blocks``).
    ``whole_rows``: one key block per query chunk where it fits, or never (default: where this
    release fuses it, :func:`~hlofuse.kernels.attention.blocks.cpu_fwd_plan`; never with
    ``with_lse``).
    """
    ax, bounds = cpu_split(spec, parts)
    if whole_rows is None and with_lse:
        # the training forward also returns the row statistics, a second output the library
        # fusion does not take: measured (bench.attention_parts --rows, attn_train_s2048,
        # 2-core Zen 4, jax 0.12.1) the whole step ran 1.07x slower with whole rows
        whole_rows = False
    blocks = blocks or cpu_fwd_plan(spec, parts=len(bounds), scale=budget_scale,
                                    whole_rows=whole_rows)
    pre = folded_scale(spec)
    bq, bk = blocks.bq, blocks.bk
    sq, sk = spec.seq_q, spec.seq_k
    nq, nk = -(-sq // bq), -(-sk // bk)
    nb = len(spec.batch)
    rank = len(spec.order)
    sq_ax, k_ax = rank - 2, rank - 1
    table = skip_table_cached(spec, bq, bk)
    out_dtype = hir.np_dtype(spec.out_dtype)
    qk_prec = lax_precision(spec.precision[0])
    pv_prec = lax_precision(spec.precision[1])
    p_dtype = hir.np_dtype(spec.p_dtype)

    def fn(*inputs):
        q, k, v, sides = canonical_inputs(spec, inputs, k_transposed=k_transposed)
        if pre is not None:
            q = q * jnp.asarray(pre[0], q.dtype)
        q = pad_to(q, sq_ax, nq * bq)
        k = pad_to(k, k.ndim - 1 if k_transposed else nb, nk * bk)
        v = pad_to(v, nb, nk * bk)
        sides = [pad_axis(pad_axis(s, k_ax, nk * bk), sq_ax, nq * bq) for s in sides]
        res = [run_part(qp, kp, vp, sp, None if ax is None else (spec.batch[ax], a, b - a))
               for (qp, kp, vp, *sp), (a, b) in zip(split_parts(ax, bounds, q, k, v, *sides),
                                                    bounds)]
        res = res[0] if len(res) == 1 else jax.tree.map(
            lambda *xs: jnp.concatenate(xs, axis=ax), *res)
        res = jax.tree.map(lambda a: lax.slice_in_dim(a, 0, sq, axis=sq_ax), res)
        if with_lse:
            return output(spec, res[0]), res[1]
        return (output(spec, res),)

    def run_part(q, k, v, sides, part):
        """The loops over one part (``part``: its (batch label, start, size), or None)."""
        index_fn = functools.partial(block_index, spec, bq, bk, part=part)
        acc_shape = list(q.shape[:-1]) + [v.shape[-1]]
        acc_shape[sq_ax] = bq

        def run_chunk(c):
            qc = lax.dynamic_slice_in_dim(q, c * bq, bq, axis=sq_ax) if nq > 1 else q
            sc = [lax.dynamic_slice_in_dim(s, c * bq, bq, axis=sq_ax) if nq > 1 and s.shape[sq_ax] > 1
                  else s for s in sides]

            def body(j, carry, only=False):
                k_axis = k.ndim - 1 if k_transposed else nb
                kb = lax.dynamic_slice_in_dim(k, j * bk, bk, axis=k_axis) if nk > 1 else k
                vb = lax.dynamic_slice_in_dim(v, j * bk, bk, axis=nb) if nk > 1 else v
                sb = [lax.dynamic_slice_in_dim(s, j * bk, bk, axis=k_ax) if nk > 1 and s.shape[k_ax] > 1
                      else s for s in sc]
                kc = nb if k_transposed else kb.ndim - 1
                s_blk = lax.dot_general(qc, kb, (((qc.ndim - 1,), (kc,)),
                                                 (tuple(range(nb)), tuple(range(nb)))),
                                        preferred_element_type=F32, precision=qk_prec)
                seed = None
                if pre is not None:
                    seed = {pre[1]: s_blk.astype(hir.np_dtype(spec.s_dtype))}
                x = eval_logits(spec, s_blk, sb, index_fn(c, j), seed=seed)
                x = jnp.broadcast_to(x, s_blk.shape)
                valid = None
                if nk * bk != sk:
                    valid = (j * bk + jnp.arange(bk, dtype=jnp.int32)) < sk

                def pv(p):
                    return lax.dot_general(p.astype(p_dtype), vb,
                                           (((p.ndim - 1,), (nb,)), (tuple(range(nb)), tuple(range(nb)))),
                                           preferred_element_type=F32, precision=pv_prec)
                if only:
                    return online_only(x, pv, m_init=spec.m_init, valid=valid)
                return online_update(carry, x, pv, m_init=spec.m_init, valid=valid)

            init = online_init(acc_shape[:-1], acc_shape, spec.m_init)
            if table is not None:
                lo, hi = jnp.asarray(table[0])[c], jnp.asarray(table[1])[c]
                m, l, acc = lax.fori_loop(lo, hi, body, init)
            elif nk == 1:
                m, l, acc = body(0, None, only=True)
            else:
                m, l, acc = lax.fori_loop(0, nk, body, init)
            o = online_finish(l, acc).astype(out_dtype)
            return (o, jnp.stack([m, l], axis=-1)) if with_lse else o

        if nq == 1:
            return run_chunk(0)
        res = lax.map(run_chunk, jnp.arange(nq, dtype=jnp.int32))       # [nq, .., bq, (dv)]
        res = jax.tree.map(lambda a: jnp.moveaxis(a, 0, sq_ax), res)      # [.., nq, bq, (dv)]
        return jax.tree.map(
            lambda a: a.reshape(a.shape[:sq_ax] + (nq * bq,) + a.shape[sq_ax + 2:]), res)

    fn = named_kernel(fn, f"hlofuse_attention_cpu_{spec.digest}")
    rows = nk == 1 and sk > CPU_MAX_BLOCK_K       # one key block where key blocks would be
    fn.blocks = (f"cpu {'row loops' if rows else 'loops'} {blocks}"
                 + (f" x{len(bounds)}" if len(bounds) > 1 else "")
                 + (" +skip" if table is not None else ""))
    return fn


def block_index(spec: AttentionSpec, bq: int, bk: int, c, j, *, part=None):
    """``index(label)``: the positions of one (query chunk ``c``, key block ``j``) block along
    a label, as an int32 array broadcastable over the canonical block (the iotas of the
    region's logit ops, evaluated blockwise by the forward and the backward loops).
    ``part``: ``(label, start, size)`` when the loops run over a slice of a batch axis
    (:func:`cpu_split`): that label's positions are ``start + arange(size)``."""
    rank = len(spec.order)
    sq_ax, k_ax = rank - 2, rank - 1
    rep = spec.repeat

    def index(lab):
        shape = [1] * rank
        if lab == spec.sq:
            shape[sq_ax] = bq
            return (c * bq + jnp.arange(bq, dtype=jnp.int32)).reshape(shape)
        if lab == spec.key:
            shape[k_ax] = bk
            return (j * bk + jnp.arange(bk, dtype=jnp.int32)).reshape(shape)
        if rep is not None and lab == rep.label:
            return index(rep.kv) * rep.groups + index(rep.g)
        if part is not None and lab == part[0]:
            shape[spec.order.index(lab)] = part[2]
            return (part[1] + jnp.arange(part[2], dtype=jnp.int32)).reshape(shape)
        shape[spec.order.index(lab)] = spec.sizes[lab]
        return jnp.arange(spec.sizes[lab], dtype=jnp.int32).reshape(shape)
    return index
