"""Block skipping for position-only masks (causal and friends).

When the logits are ``select(pred, logits, F)`` with ``pred`` built from iotas only
(:func:`~hlofuse.kernels.attention.logits.mask_select`) and ``F = -inf`` (or
``F <= SKIP_FILL_LIMIT`` with no fully masked row), ``pred`` is evaluated once at trace time
and each query block visits only the key blocks where some entry is visible: a skipped block
would add exact zeros.
"""

from __future__ import annotations

import functools
import math

import numpy as np

import jax

from hlofuse.core.ops import EmitError
from hlofuse.kernels.attention.layout import const_sides
from hlofuse.kernels.attention.logits import F32, eval_logits
from hlofuse.kernels.attention.spec import AttentionSpec

__all__ = ["SKIP_FILL_LIMIT", "SKIP_TABLE_MAX", "skip_info", "skip_table", "key_ranges"]

SKIP_FILL_LIMIT = -1e30       # finite fills at or below this make skipped blocks exact zeros
SKIP_TABLE_MAX = 1 << 26      # evaluate position-only masks statically up to Sq*Sk elements


def skip_info(spec: AttentionSpec):
    """(predicate, fill) when whole key blocks may be skipped, else None."""
    sel = spec.mask_select
    if sel is None or spec.seq_q * spec.seq_k > SKIP_TABLE_MAX:
        return None
    _, fill = sel
    if not (fill == -math.inf or fill <= SKIP_FILL_LIMIT):
        return None
    return sel


def skip_table(spec: AttentionSpec, bq: int, bk: int):
    """Static per-query-block key-block ranges [lo, hi) from a position-only mask, or None."""
    info = skip_info(spec)
    if info is None:
        return None
    pred, fill = info
    sq, sk = spec.seq_q, spec.seq_k
    rank = len(spec.order)

    def index(lab):
        shape = [1] * rank
        if lab == spec.sq:
            shape[rank - 2] = sq
            return np.arange(sq).reshape(shape)
        if lab == spec.key:
            shape[rank - 1] = sk
            return np.arange(sk).reshape(shape)
        raise EmitError("position mask depends on another label")

    consts = const_sides(spec)

    def predicate(s):
        return eval_logits(spec, s, [None] * len(spec.side_args) + consts, index, upto=pred)
    # one jitted evaluation (one XLA compile of a first call), not one eager compile per op;
    # position-only predicates are integer/boolean ops, exact however XLA fuses them
    try:
        m = np.asarray(jax.jit(predicate)(np.zeros([1] * rank, F32)))
    except EmitError:
        return None
    m = m.reshape((1,) * (rank - m.ndim) + m.shape)
    m = np.broadcast_to(m, m.shape[:-2] + (sq, sk)).reshape(-1, sq, sk)
    if not (m == m[:1]).all():
        return None    # a dense constant that differs between heads/batches: no one table
    m = m[0]
    if fill != -math.inf and not m.any(axis=1).all():
        return None    # a fully masked row must see every key's fill (uniform weights)
    nq, nk = -(-sq // bq), -(-sk // bk)
    padded = np.zeros((nq * bq, nk * bk), bool)
    padded[:sq, :sk] = m
    need = padded.reshape(nq, bq, nk, bk).any(axis=(1, 3))
    lo = np.where(need.any(1), need.argmax(1), 0).astype(np.int32)
    hi = np.where(need.any(1), nk - need[:, ::-1].argmax(1), 0).astype(np.int32)
    if (lo == 0).all() and (hi == nk).all():
        return None
    return lo, hi


@functools.lru_cache(maxsize=64)
def skip_table_cached(spec: AttentionSpec, bq: int, bk: int):
    return skip_table(spec, bq, bk)


def key_ranges(spec: AttentionSpec, bq: int, bk: int, pad_to: int | None = None):
    """(lo, hi, skipping): per query block, the key blocks to visit (all when not skipping)."""
    nq, nk = -(-spec.seq_q // bq), -(-spec.seq_k // bk)
    table = skip_table_cached(spec, bq, bk)
    lo, hi = (table if table is not None else (np.zeros(nq, np.int32), np.full(nq, nk, np.int32)))
    if pad_to:
        lo = np.pad(lo, (0, pad_to - nq))
        hi = np.pad(hi, (0, pad_to - nq))
    return lo, hi, table is not None
