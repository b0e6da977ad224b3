"""The online-softmax (flash) update, written once for every execution.

Per row, over key blocks, in f32::

    m' = max(m, rowmax(x));  m* = m' if finite else 0;  a = exp(m - m*);  p = exp(x - m*)
    l = a·l + rowsum(p);     acc = a·acc + p·V;  out = acc / l     (all -inf row: 0/0 = NaN)

``m`` starts at the original max-reduce's init (``-inf`` for ``jax.nn.softmax``); keys that
are padding get ``-inf`` (``valid``). The row statistics ``m`` and ``l`` come in one of two
forms: *reduced* (``[..., rows]``, the cpu loops and the Triton kernel) or *columns*
(``[..., rows, w]``, every column equal: the Mosaic kernel keeps them lane-replicated in
``(rows, 128)`` scratch). The arithmetic is the same in both.
"""

from __future__ import annotations

import math
from typing import Callable

import jax.numpy as jnp

F32 = jnp.float32

__all__ = ["online_init", "online_update", "online_only", "online_stats", "online_finish",
           "logit_grad", "OWN_STATS_BOUND", "needs_own_stats"]


def _col(stat, x):
    """``stat`` as a column broadcastable against the block ``x`` [..., rows, bk]."""
    return stat[..., :1] if stat.ndim == x.ndim else stat[..., None]


def online_init(stat_shape, acc_shape, m_init: float):
    """(m, l, acc) before the first key block."""
    return jnp.full(stat_shape, m_init, F32), jnp.zeros(stat_shape, F32), jnp.zeros(acc_shape, F32)


def _online_step(m, l, x, m_init: float, valid):
    """(m', a, p, l') of one block: the new row max, the old sum's factor, the block's
    ``exp(x - m*)`` and the new row sum."""
    xf = x.astype(F32)
    if valid is not None:
        xf = jnp.where(valid, xf, -jnp.inf)
    keep = m.ndim == x.ndim
    m_new = jnp.maximum(m, jnp.max(xf, axis=-1, keepdims=keep))
    m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) if m_init == -math.inf else m_new
    alpha = jnp.exp(m - m_use)
    p = jnp.exp(xf - _col(m_use, x))
    return m_new, alpha, p, alpha * l + jnp.sum(p, axis=-1, keepdims=keep)


def online_update(carry, x, pv: Callable, *, m_init: float, valid=None):
    """One step on a logits block ``x`` [..., rows, bk]; ``pv(p)`` is ``p @ V_block`` in f32.

    ``valid``: a mask broadcastable to ``x`` (False for padded keys) or None.
    """
    m, l, acc = carry
    m_new, alpha, p, l = _online_step(m, l, x, m_init, valid)
    return m_new, l, _col(alpha, x) * acc + pv(p)


def online_only(x, pv: Callable, *, m_init: float, valid=None):
    """``(m, l, acc)`` (the reduced form) of a row's only key block: :func:`online_update` from
    :func:`online_init` without the carry (``a·l`` and ``a·acc`` are zero) and without the
    guard for an all ``-inf`` row (``m* = 0``), which only keeps such a row from poisoning
    *later* blocks. Here there are none, and the row's output is ``0/0 = NaN`` either way, as
    ``jax.nn.softmax``'s; its ``l`` is NaN rather than 0.

    Same arithmetic per element as the first step of :func:`online_update`, in a form XLA:CPU
    (jax 0.12) hands to YNNPACK as *one* library fusion, dot, row max, exp, row sum and the
    second dot together (``kind=kCustom``, measured): the guard's select split it into four,
    with the ``[.., rows, Sk]`` logits written out between them.
    """
    xf = x.astype(F32)
    if valid is not None:
        xf = jnp.where(valid, xf, -jnp.inf)
    m = jnp.max(xf, axis=-1, keepdims=True)
    if m_init != -math.inf:
        m = jnp.maximum(m, jnp.asarray(m_init, F32))
    p = jnp.exp(xf - m)
    return m[..., 0], jnp.sum(p, axis=-1), pv(p)


def online_stats(carry, x, *, m_init: float, valid=None):
    """:func:`online_update` without the output: ``(m, l)`` after the block ``x`` (the flash
    backward's own row statistics, see :func:`needs_own_stats`)."""
    m_new, _, _, l = _online_step(*carry, x, m_init, valid)
    return m_new, l


# The flash backward subtracts the forward's row max from logits it computes again, with its
# own block sizes and dot form (cpu: Q·Kᵀ with K's head dim last; the forward's dot reads Kᵀ:
# faster there, 1.4x slower here: measured). Its logits may round otherwise
# than the forward's did (cpu, measured: one 300-key block against two of 256; a 40x40 block,
# dot form against dot form; on gpu/tpu the forward may have other blocks, or be XLA's own code
# when a measured decision kept it), by up to an ulp of Σ|q_d·k_d| <= |q|·|k|. Then
# ``p = exp(x - m) / l`` is off by exp of that: a one-hot row (p = 1, exact zero gradients) got
# e^±1 at logits of 1e7. Where max|q_i|·max|k_j| reaches this bound (an ulp of 2^-9 and up;
# below it the error is of the size of the f32 logits' own rounding, which jax.jit's gradients
# have too), every backward (cpu loops, Triton, Mosaic) first computes the row statistics from
# its own logits (one more Q·Kᵀ per block, behind a cond: only such inputs pay), so p is exact
# against its own logits.
OWN_STATS_BOUND = 2.0 ** 14


def needs_own_stats(q, k):
    """Whether ``max_i |q_i| · max_j |k_j|`` (the rows' norms over the last dim, the head
    dim; any leading dims, zero padding allowed) reaches :data:`OWN_STATS_BOUND` (a bound on
    the logits' magnitude before any scale, Cauchy-Schwarz): a traced bool."""
    qn = jnp.max(jnp.sum(jnp.square(q.astype(F32)), axis=-1))
    kn = jnp.max(jnp.sum(jnp.square(k.astype(F32)), axis=-1))
    return qn * kn >= OWN_STATS_BOUND ** 2


def online_finish(l, acc):
    """``acc / l``: the output block in f32 (a row that saw no key: 0/0 = NaN)."""
    return acc / _col(l, acc)


def logit_grad(p, dp, delta):
    """The softmax backward of one block, ``dx = p·(dP - delta)``, with ``delta`` the row's
    ``rowsum(dO·O)`` (FlashAttention-2's form: computed once, from the output) and ``delta``,
    ``p`` broadcast against the block.

    ``rowsum(dO·O)`` equals ``rowsum(p·dP)`` only up to rounding (a reduce of ``dO·O`` against
    the matmul that computes ``dP``). Where a row's softmax is one-hot (``p == 1`` exactly: the
    other keys' ``exp`` sum to less than half an f32 ulp of 1, each logit ~17 or more below
    the max),
    ``dx`` is zero, but ``dP - delta`` is that rounding, and ``dQ = dx·K`` scales it by ``|K|``.
    With logits of 1e7 and more (unnormalized toy stacks) that made weight gradients 1e3 of
    their size off (measured; XLA's ``p·dP - p·rowsum(p·dP)`` cancels exactly). ``p == 1``
    gets the exact 0 where ``dP - delta`` is finite; elsewhere a row has a second ``p`` above the
    ulp and the rounding is small against its true gradient. A NaN or inf there (a non-finite
    cotangent) is kept: XLA's form propagates it, and the 0 hid it from dQ/dK (adversarial
    round). Zeroing by the difference's size instead (rounding only) failed where ``dO·V``
    cancels and the rounding is the whole of ``dP``; what it would have kept is a row one-hot
    in f32 whose keys below the ulp carry values of 1e8 (jax.jit's 10.06 against 0 here)."""
    d = dp - delta
    return jnp.where((p == 1.0) & jnp.isfinite(d), 0.0, p * d)
