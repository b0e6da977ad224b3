"""``fold-dot-repeats``: products reading K/V repeated to the query heads (GQA) read them
unrepeated, with jax.jit's numbers (``reassociate``: XLA may block products of other shapes
differently); repeats along other dims are left alone."""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.core import ir as hir
from hlofuse.runtime.execute import run_module
from hlofuse.runtime.testing import assert_same
from tests.fusion_util import eval_modules

B, S, H, KV, D = 2, 64, 8, 2, 16
G = H // KV


def _repeat(k):
    return jnp.repeat(k, G, axis=2)          # head i*G + g reads KV head i (Flax, Keras, HF)


def _tile(k):
    return jnp.tile(k, (1, 1, G, 1))         # head g*KV + i reads KV head i


def _attention(rep, dropout=False):
    def f(q, k, v, pos):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, rep(k)) / np.sqrt(D)
        s = jnp.where(jnp.arange(k.shape[1])[None, None, None, :] <= pos, s, -1e30)
        p = jax.nn.softmax(s, -1)
        if dropout:   # fuse-attention refuses it: the products are XLA's
            keep = jax.random.bernoulli(jax.random.key(0), 0.9, p.shape)
            p = jnp.where(keep, p / 0.9, 0.0)
        return jnp.einsum("bhqk,bkhd->bqhd", p, rep(v))
    return f


def _args(sq):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((B, sq, H, D), np.float32),
            rng.standard_normal((B, S, KV, D), np.float32),
            rng.standard_normal((B, S, KV, D), np.float32), np.int32(40))


def _folded(report) -> int:
    (stats,) = [p.stats for p in report.passes if p.name == "fold-dot-repeats"]
    return stats.get("folded", 0)   # (a disabled pass records no statistics)


def _repeated_dot_operands(text: str) -> int:
    """dot_general operands that are a reshape of a broadcast (a repeat)."""
    module = hir.parse(text)
    n = 0
    for op in hir.all_ops(module):
        if op.name != "stablehlo.dot_general":
            continue
        for v in op.operands:
            d = hir.defining_op(v)
            if d is not None and d.name == "stablehlo.reshape":
                e = hir.defining_op(d.operands[0])
                n += e is not None and e.name == "stablehlo.broadcast_in_dim"
    return n


@pytest.mark.parametrize("rep", [_repeat, _tile], ids=["repeat", "tile"])
@pytest.mark.parametrize("sq,dropout", [(1, False), (16, True)], ids=["decode", "dropout"])
def test_gqa_products_read_kv_unrepeated(rep, sq, dropout):
    f = _attention(rep, dropout)
    args = _args(sq)
    text = jax.jit(f).lower(*args).as_text()
    assert _repeated_dot_operands(text) == 2      # QKᵀ reads K repeated (rhs), P·V V (lhs)
    opt = hlofuse.optimize(text, pipeline=["inline-calls", "canonicalize", "cse",
                                           "fold-dot-repeats"])
    assert _folded(opt.report) == 2
    assert _repeated_dot_operands(opt.text) == 0
    # the same numbers as the unrewritten module: by the StableHLO reference interpreter (an
    # oracle independent of XLA) for the first case; the others by XLA (the interpreter takes
    # 2 s on these programs, 5 s on the dropout programs' random bits)
    if (rep, sq) == (_repeat, 1):
        got, want = eval_modules([opt.text, text], list(args))
    else:
        got, want = run_module(opt.text, list(args)), run_module(text, list(args))
    assert_same(got, want, "reassociate")
    # rerunning changes nothing
    again = hlofuse.optimize(opt.text, pipeline=["fold-dot-repeats"])
    assert _folded(again.report) == 0 and again.text == opt.text
    # and through hlofuse.jit, with the rest of the pipeline
    g = hlofuse.jit(f, autotune=False)
    assert _folded(g.report(*args)) == 2
    assert_same(g(*args), jax.jit(f)(*args), "reassociate")


def test_multi_query_attention_broadcast_to():
    """One KV head given to every query head with ``jnp.broadcast_to`` (no reshape)."""
    def f(q, k, v):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, jnp.broadcast_to(k, (B, S, H, D)))
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), jnp.broadcast_to(v, (B, S, H, D)))
    rng = np.random.default_rng(2)
    args = (rng.standard_normal((B, 1, H, D), np.float32),
            *(rng.standard_normal((B, S, 1, D), np.float32) for _ in range(2)))
    g = hlofuse.jit(f, autotune=False)
    assert _folded(g.report(*args)) == 2
    assert _repeated_dot_operands(g.lower(*args).as_text()) == 0
    assert "tensor<2x64x8x16xf32>" not in g.lower(*args).as_text()   # no broadcast K/V left
    assert_same(g(*args), jax.jit(f)(*args), "reassociate")


def test_training_step_of_unfused_gqa_attention():
    """The gradient of the dropout attention: the forward products and the backward's product
    reading V repeated are folded; gradients match jax.jit's."""
    f = _attention(_repeat, dropout=True)
    q, k, v, pos = _args(16)
    step = jax.grad(lambda q, k, v: jnp.sum(f(q, k, v, pos) ** 2), argnums=(0, 1, 2))
    g = hlofuse.jit(step, autotune=False)
    assert _folded(g.report(q, k, v)) >= 3
    assert_same(g(q, k, v), jax.jit(step)(q, k, v), "grad")


def test_repeat_along_a_contracting_dim_is_left_alone():
    def f(x, w):
        return x @ jnp.repeat(w, 2, axis=0)       # contracting dim repeated: not a batch dim
    rng = np.random.default_rng(0)
    args = (rng.standard_normal((8, 64), np.float32), rng.standard_normal((32, 16), np.float32))
    g = hlofuse.jit(f, autotune=False)
    assert _folded(g.report(*args)) == 0
    assert_same(g(*args), jax.jit(f)(*args), "exact")


def test_disable_turns_it_off():
    f = _attention(_repeat)
    args = _args(1)
    g = hlofuse.jit(f, autotune=False, disable=["fold-dot-repeats"])
    assert _folded(g.report(*args)) == 0


def test_decode_loop_with_a_kv_cache():
    """Greedy decoding under ``fori_loop`` with a GQA KV cache updated in place: the products
    in the loop body are folded and the tokens are jax.jit's."""
    rng = np.random.default_rng(1)
    wq, wk, wv = (rng.standard_normal((64, n * D), np.float32) * 0.1 for n in (H, KV, KV))
    wo = rng.standard_normal((H * D, 64), np.float32) * 0.1
    emb = jnp.asarray(rng.standard_normal((50, 64), np.float32))

    def generate(tok, cache_k, cache_v):
        def body(t, st):
            tok, ck, cv = st
            x = emb[tok]                                               # [B, 64]
            q = (x @ wq).reshape(B, 1, H, D)
            ck = jax.lax.dynamic_update_slice(ck, (x @ wk).reshape(B, 1, KV, D), (0, t, 0, 0))
            cv = jax.lax.dynamic_update_slice(cv, (x @ wv).reshape(B, 1, KV, D), (0, t, 0, 0))
            o = _attention(_repeat)(q, ck, cv, t).reshape(B, H * D)
            return jnp.argmax((o @ wo) @ emb.T, -1).astype(jnp.int32), ck, cv
        return jax.lax.fori_loop(0, 8, body, (tok, cache_k, cache_v))[0]
    args = (np.arange(B, dtype=np.int32), np.zeros((B, S, KV, D), np.float32),
            np.zeros((B, S, KV, D), np.float32))
    g = hlofuse.jit(generate, autotune=False)
    report = g.report(*args)
    assert _folded(report) == 2
    # fuse-attention says why the step's attention is XLA's
    assert any(n.startswith("fuse-attention:") and "one query row" in n for n in report.notes)
    np.testing.assert_array_equal(g(*args), jax.jit(generate)(*args))


def test_off_on_tpu_unless_asked():
    """tpu: folding measured more memory in a GQA training step (bench --memory, v5e), so the
    pass leaves tpu programs alone unless ``on_tpu=true``; gpu and cpu fold as before."""
    import jax
    import jax.numpy as jnp
    import hlofuse

    def f(q, k):   # a GQA product: K repeated from 2 to 8 heads
        return jnp.einsum("bhqd,bhkd->bhqk", q, jnp.repeat(k, 4, axis=1))
    q = jax.ShapeDtypeStruct((1, 8, 1, 64), jnp.float32)
    k = jax.ShapeDtypeStruct((1, 2, 128, 64), jnp.float32)

    def folded(target, options=None):
        rep = hlofuse.jit(f, target=target, options=options).lower(q, k).report
        (s,) = [p.stats for p in rep.passes if p.name == "fold-dot-repeats"]
        return s
    assert folded("gpu")["folded"] == 1 and folded("cpu")["folded"] == 1
    assert folded("tpu") == {"folded": 0, "skipped": "tpu (on_tpu=true folds there)"}
    assert folded("tpu", {"fold-dot-repeats": {"on_tpu": True}})["folded"] == 1
