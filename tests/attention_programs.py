"""Attention written the ways models write it, and arguments for it: shared by the
``fuse-attention`` pass tests and the attention kernel tests (a helper, not a test module)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

import jax
import jax.numpy as jnp

BF16 = ml_dtypes.bfloat16


# ---------------------------------------------------------------------------------------------
# attention written the ways models write it
# ---------------------------------------------------------------------------------------------

def make_attention(layout="bshd", mask="none", gqa=1, softmax="nn", scale="div", fill="-inf"):
    """layout: bshd (q [B,S,H,D]) | bhsd (q [B,H,S,D]) | mqa (q [B,H,S,D], k/v [B,S,D]);
    mask: none | causal (iota compare) | tril | bool ([B,Sk] arg) | bool_full ([B,Sq,Sk] arg) |
    additive ([B,Sk] 0/1 arg, BERT style) | bias ([H,Sq,Sk] arg); gqa: K/V heads repeated with
    jnp.repeat; softmax: nn (jax.nn.softmax) | f32 (softmax in f32 of bf16 logits) | manual;
    scale: div | mul (after QKᵀ) | pre (Q scaled) | none; fill: -inf | -1e9."""
    def f(q, k, v, *extra):
        d = q.shape[-1]
        if layout in ("bshd", "bhsd") and gqa > 1:
            axis = 2 if layout == "bshd" else 1
            k, v = jnp.repeat(k, gqa, axis=axis), jnp.repeat(v, gqa, axis=axis)
        if scale == "pre":
            q = q * np.asarray(1 / math.sqrt(d), q.dtype)
        eq = {"bshd": "bqhd,bkhd->bhqk", "bhsd": "bhqd,bhkd->bhqk", "mqa": "bhqd,bkd->bhqk"}[layout]
        s = jnp.einsum(eq, q, k)
        if scale == "div":
            s = s / np.asarray(math.sqrt(d), s.dtype)
        elif scale == "mul":
            s = s * np.asarray(1 / math.sqrt(d), s.dtype)
        sq, sk = s.shape[-2], s.shape[-1]
        fv = -jnp.inf if fill == "-inf" else -1e9
        if mask == "causal":
            s = jnp.where(jnp.arange(sq)[:, None] >= jnp.arange(sk)[None, :], s, fv)
        elif mask == "tril":
            s = jnp.where(jnp.tril(jnp.ones((sq, sk), bool)), s, fv)
        elif mask == "bool":
            s = jnp.where(extra[0][:, None, None, :], s, fv)
        elif mask == "bool_full":
            s = jnp.where(extra[0][:, None, :, :], s, fv)
        elif mask == "additive":
            s = s + (1.0 - extra[0][:, None, None, :].astype(s.dtype)) * -10000.0
        elif mask == "bias":
            s = s + extra[0][None].astype(s.dtype)
        if softmax == "nn":
            p = jax.nn.softmax(s, axis=-1)
        elif softmax == "f32":
            p = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(v.dtype)
        else:
            e = jnp.exp(s - s.max(-1, keepdims=True))
            p = e / e.sum(-1, keepdims=True)
        out = {"bshd": "bhqk,bkhd->bqhd", "bhsd": "bhqk,bhkd->bhqd", "mqa": "bhqk,bkd->bhqd"}[layout]
        return jnp.einsum(out, p, v)
    return f


def make_args(layout, mask, gqa, dtype, sq, sk, *, b=2, h=4, d=8, seed=0):
    rng = np.random.default_rng(seed)
    hk = h // gqa
    shapes = {"bshd": [(b, sq, h, d), (b, sk, hk, d), (b, sk, hk, d)],
              "bhsd": [(b, h, sq, d), (b, hk, sk, d), (b, hk, sk, d)],
              "mqa": [(b, h, sq, d), (b, sk, d), (b, sk, d)]}[layout]
    args = [rng.standard_normal(s).astype(dtype) for s in shapes]
    if mask == "bool":
        m = rng.random((b, sk)) < 0.7
        m[:, 0] = True
        args.append(m)
    elif mask == "bool_full":
        m = rng.random((b, sq, sk)) < 0.6
        m[..., 0] = True
        args.append(m)
    elif mask == "additive":
        args.append((rng.random((b, sk)) < 0.7).astype(dtype))
    elif mask == "bias":
        args.append(rng.standard_normal((h, sq, sk)).astype(dtype))
    return args


def first_rows_see_no_key(q, k, v):
    """bshd attention whose first 5 query rows have every key masked with -inf (their softmax
    is NaN), zeroed by the program afterwards."""
    t = q.shape[1]
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / 4
    i, j = jnp.arange(t)[:, None], jnp.arange(t)[None, :]
    s = jnp.where(i >= j + 5, s, -jnp.inf)
    o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
    return jnp.where(jnp.isnan(o), 0.0, o)
