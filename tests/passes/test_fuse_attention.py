"""``fuse-attention``: attention written many ways is recognized, rewritten and still correct.

Each differential test runs the function with ``hlofuse.jit`` and with ``jax.jit``, compares the
results (``reassociate``: the flash kernel reassociates the softmax sums) and gradients
(``grad``), and asserts the report has an ``attention`` region that became a kernel.

CI runs a curated slice of the matrix layouts x mask kinds x dtypes x MHA/MQA/GQA x sequence
lengths. The full cross product runs with ``HLOFUSE_ATTENTION_FULL=1`` (a few minutes)::

    HLOFUSE_ATTENTION_FULL=1 python -m pytest tests/passes/test_fuse_attention.py -q
"""

from __future__ import annotations

import itertools
import math
import os

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.runtime.testing import ALL_KERNELS
from hlofuse.runtime.testing import assert_same
from tests.attention_programs import BF16, make_args, make_attention

FULL = os.environ.get("HLOFUSE_ATTENTION_FULL", "") not in ("", "0")


def attention_regions(report):
    return [r for r in report.regions if r.kind == "attention"]


def check(f, args, *, grad=True, n_kernels=1, fwd="reassociate"):
    """Differential test: forward (and grad) of hlofuse.jit(f) vs jax.jit(f); the rewrite fired."""
    g = hlofuse.jit(f, autotune=False)
    report = g.report(*args)
    regions = attention_regions(report)
    assert len(regions) == n_kernels, report
    assert all(r.kernel for r in regions), [r.reason for r in regions]
    assert_same(g(*args), jax.jit(f)(*args), fwd)
    if grad:
        rng = np.random.default_rng(1)
        out = jax.eval_shape(f, *args)
        w = rng.standard_normal(out.shape).astype(np.float32)
        diff = tuple(i for i, a in enumerate(args[:3]))

        def loss(fn):
            return lambda *a: jnp.sum(fn(*a).astype(jnp.float32) * w)
        assert_same(jax.grad(loss(g), argnums=diff)(*args),
                    jax.grad(loss(f), argnums=diff)(*args), "grad")
    return report


# ---------------------------------------------------------------------------------------------
# the matrix
# ---------------------------------------------------------------------------------------------

# (layout, mask, gqa, softmax, scale, fill, dtype, sq, sk, grad): every axis value appears at
# least once; odd lengths, cross attention (sq != sk), bf16 with f32 and bf16 softmax. Gradients
# (a second, backward program per case) on a subset to keep CI fast; all of them in the full run.
CURATED = [
    ("bshd", "none", 1, "nn", "div", "-inf", np.float32, 16, 16, True),
    ("bhsd", "none", 1, "manual", "mul", "-inf", np.float32, 13, 29, False),
    ("bhsd", "none", 1, "nn", "pre", "-inf", np.float32, 9, 9, False),
    ("bshd", "tril", 2, "manual", "mul", "-inf", np.float32, 16, 16, True),
    ("bshd", "causal", 2, "nn", "div", "-1e9", np.float32, 37, 37, False),
    ("mqa", "causal", 1, "nn", "none", "-1e9", np.float32, 16, 16, True),
    ("bshd", "bool", 1, "nn", "div", "-inf", np.float32, 16, 24, False),
    ("bhsd", "bool_full", 1, "nn", "div", "-1e9", np.float32, 9, 11, False),
    ("bshd", "additive", 1, "nn", "div", "-inf", np.float32, 16, 16, True),
    ("bhsd", "bias", 2, "manual", "div", "-inf", np.float32, 16, 16, False),
    ("bshd", "none", 1, "nn", "div", "-inf", BF16, 16, 16, False),
    ("bshd", "causal", 2, "f32", "div", "-inf", BF16, 31, 31, True),
    ("mqa", "bool", 1, "f32", "mul", "-1e9", BF16, 17, 23, False),
]

LAYOUTS = [("bshd", 1), ("bshd", 2), ("bhsd", 1), ("bhsd", 4), ("mqa", 1)]
MASKS = ["none", "causal", "tril", "bool", "bool_full", "additive", "bias"]
FULL_MATRIX = [(lay, m, g, "nn" if dt == np.float32 else "f32", "div", fill, dt, s, s, True)
               for (lay, g), m, dt, s, fill in itertools.product(
                   LAYOUTS, MASKS, [np.float32, BF16], [16, 37], ["-inf", "-1e9"])
               if not (lay == "mqa" and m == "bias")]


def _case_id(c):
    lay, m, g, sm, sc, fill, dt, sq, sk, _ = c
    return f"{lay}-{m}-gqa{g}-{sm}-{sc}-{fill}-{np.dtype(dt).name}-{sq}x{sk}"


@pytest.mark.parametrize("case", FULL_MATRIX if FULL else CURATED, ids=_case_id)
def test_attention_matrix_forward_and_grad(case):
    lay, m, g, sm, sc, fill, dt, sq, sk, grad = case
    args = make_args(lay, m, g, dt, sq, sk)
    check(make_attention(lay, m, g, sm, sc, fill), args, grad=grad)


def test_gqa_repeat_is_taken_into_the_region():
    """jnp.repeat of K/V joins the region: the kernel reads the unrepeated K/V."""
    f = make_attention("bshd", "none", 4)
    args = make_args("bshd", "none", 4, np.float32, 16, 16)
    report = check(f, args, grad=False)
    (r,) = attention_regions(report)
    assert r.extra["gqa_groups"] == 4
    assert sorted(r.inputs) == ["f32[2,16,1,8]", "f32[2,16,1,8]", "f32[2,16,4,8]"]  # K, V, Q


def test_kv_heads_broadcast_from_one_head_are_taken_into_the_region():
    """MQA written as jnp.broadcast_to of a single K/V head: the kernel reads the one head."""
    def f(q, k, v):
        shape = k.shape[:2] + (q.shape[2],) + k.shape[3:]
        k, v = jnp.broadcast_to(k, shape), jnp.broadcast_to(v, shape)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / 4.0
        s = jnp.where(jnp.tril(jnp.ones((s.shape[-2], s.shape[-1]), bool)), s, -jnp.inf)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(2, 19, 4, 16), (2, 19, 1, 16),
                                                                   (2, 19, 1, 16)]]
    (r,) = attention_regions(check(f, args, grad=False))
    assert r.extra["gqa_groups"] == 4 and sorted(r.inputs) == [
        "f32[2,19,1,16]", "f32[2,19,1,16]", "f32[2,19,4,16]"]


def test_dot_product_attention_xla_implementation():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 20, 4, 8)).astype(np.float32)
    kv = rng.standard_normal((2, 20, 2, 8)).astype(np.float32)
    for causal in (False, True):
        f = lambda q, k, v, c=causal: jax.nn.dot_product_attention(q, k, v, is_causal=c)
        check(f, [q, kv, kv * 0.5], grad=causal)


# ---------------------------------------------------------------------------------------------
# numerics corner cases
# ---------------------------------------------------------------------------------------------

def test_fully_masked_rows_give_nan_like_the_original_with_minus_inf_fill():
    f = make_attention("bhsd", "bool_full", 1, "nn", "div", "-inf")
    args = make_args("bhsd", "bool_full", 1, np.float32, 12, 10)
    args[3][:, 3, :] = False           # query row 3 sees no key
    want = np.asarray(jax.jit(f)(*args))
    assert np.isnan(want[:, :, 3]).all() and not np.isnan(np.delete(want, 3, axis=2)).any()
    check(f, args, grad=False)


def test_fully_masked_rows_give_uniform_weights_with_finite_fill():
    f = make_attention("bhsd", "bool_full", 1, "nn", "div", "-1e9")
    args = make_args("bhsd", "bool_full", 1, np.float32, 12, 10)
    args[3][:, 3, :] = False
    want = np.asarray(jax.jit(f)(*args))
    np.testing.assert_allclose(want[:, :, 3], np.broadcast_to(args[2].mean(axis=2), want[:, :, 3].shape),
                               rtol=1e-5, atol=1e-5)
    check(f, args, grad=False)


@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=["f32", "bf16"])
def test_very_large_logits(dtype):
    f = make_attention("bhsd", "causal", 1, "nn", "none", "-inf")
    args = make_args("bhsd", "causal", 1, dtype, 20, 20)
    args[0] = (args[0].astype(np.float32) * 300).astype(dtype)   # logits ~ 1e3, exp overflows unshifted
    check(f, args, grad=False)


def test_causal_block_skipping_with_minus_inf_and_strict_mask():
    """x = where(i > j) excludes the diagonal: row 0 is fully masked (NaN), others are not."""
    def f(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k)
        s = jnp.where(jnp.arange(40)[:, None] > jnp.arange(40)[None, :], s, -jnp.inf)
        return jax.nn.softmax(s, axis=-1) @ v
    args = make_args("bhsd", "none", 1, np.float32, 40, 40)
    want = np.asarray(jax.jit(f)(*args))
    assert np.isnan(want[:, :, 0]).all()
    check(f, args, grad=False)


# ---------------------------------------------------------------------------------------------
# model blocks
# ---------------------------------------------------------------------------------------------

def _dense(rng, n, m):
    return (rng.standard_normal((n, m)) / math.sqrt(n)).astype(np.float32)


def bert_block(p, x, mask):
    """BERT-style encoder layer: fused QKV, additive padding mask, post-LN, GELU FFN."""
    b, s, dm = x.shape
    h = 4
    qkv = x @ p["wqkv"]
    q, k, v = [t.reshape(b, s, h, dm // h) for t in jnp.split(qkv, 3, axis=-1)]
    sc = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(dm // h)
    sc = sc + (1.0 - mask[:, None, None, :]) * -10000.0
    a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(sc, axis=-1), v).reshape(b, s, dm)
    x = x + a @ p["wo"]
    x = (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-12)
    return x + jax.nn.gelu(x @ p["w1"]) @ p["w2"]


def gpt2_block(p, x):
    """GPT-2-style decoder block: pre-LN, causal mask with finfo.min fill."""
    b, s, dm = x.shape
    h = 4
    y = (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5)
    q, k, v = [(y @ p[w]).reshape(b, s, h, dm // h) for w in ("wq", "wk", "wv")]
    sc = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (1.0 / math.sqrt(dm // h))
    sc = jnp.where(jnp.tril(jnp.ones((s, s), bool)), sc, jnp.finfo(sc.dtype).min)
    a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(sc, axis=-1), v).reshape(b, s, dm)
    x = x + a @ p["wo"]
    return x + jax.nn.gelu(x @ p["w1"]) @ p["w2"]


def test_bert_style_block():
    rng = np.random.default_rng(0)
    dm = 32
    p = {"wqkv": _dense(rng, dm, 3 * dm), "wo": _dense(rng, dm, dm),
         "w1": _dense(rng, dm, 4 * dm), "w2": _dense(rng, 4 * dm, dm)}
    x = rng.standard_normal((2, 24, dm)).astype(np.float32)
    mask = (rng.random((2, 24)) < 0.8).astype(np.float32)
    g = hlofuse.jit(bert_block, autotune=False)
    (r,) = attention_regions(g.report(p, x, mask))
    assert r.kernel and r.extra["mask"] == "additive"
    assert_same(g(p, x, mask), jax.jit(bert_block)(p, x, mask), "grad")  # whole layer: other kernels too


def test_gpt2_style_block():
    rng = np.random.default_rng(0)
    dm = 32
    p = {w: _dense(rng, dm, dm) for w in ("wq", "wk", "wv", "wo")}
    p.update(w1=_dense(rng, dm, 4 * dm), w2=_dense(rng, 4 * dm, dm))
    x = rng.standard_normal((1, 40, dm)).astype(np.float32)
    g = hlofuse.jit(gpt2_block, autotune=False)
    (r,) = attention_regions(g.report(p, x))
    assert r.kernel and r.extra["mask"].startswith("select(positions)")
    assert_same(g(p, x), jax.jit(gpt2_block)(p, x), "grad")


@pytest.mark.parametrize("name", ["bert_s128", "gpt2_block", "llama_block"])
def test_benchmark_blocks_are_rewritten(name):
    """The rewrite fires on the benchmark's transformer blocks (report only: they are big)."""
    from bench.workloads import get
    w = get(name)
    args = w.make_args(np.random.default_rng(0))
    regions = attention_regions(hlofuse.jit(w.fn, autotune=False).report(*args))
    assert len(regions) == 1 and regions[0].kernel, [r.reason for r in regions]
    if name == "gpt2_block":
        assert "+skip" in regions[0].block     # causal: key blocks above the diagonal skipped


# ---------------------------------------------------------------------------------------------
# left alone
# ---------------------------------------------------------------------------------------------

def _softmax_alone(q, k, v):
    return jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k), axis=-1)


def _weights_returned(q, k, v):
    p = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k), axis=-1)
    return p @ v, p


def _softmax_over_queries(q, k, v):
    p = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k), axis=-2)
    return p @ v


def _dropout(q, k, v):
    p = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k), axis=-1)
    keep = jax.random.bernoulli(jax.random.key(0), 0.9, p.shape)
    return (jnp.where(keep, p / 0.9, 0.0)) @ v


def attention_refusals(report) -> dict:
    """fuse-attention's ``refused[<reason>]`` statistics of ``report`` (reason -> count)."""
    (stats,) = [p.stats for p in report.passes if p.name == "fuse-attention"]
    return {k[len("refused["):-1]: v for k, v in stats.items() if k.startswith("refused[")}


@pytest.mark.parametrize("f,reason", [
    (_softmax_alone, None),  # one dot_general: not even a candidate
    (_weights_returned, "softmax probabilities are used outside the P·V product; as a training "
                        "step: no op reads them but the program's return (returned attention weights)"),
    (_softmax_over_queries, "P·V does not contract the key dim"),
    (_dropout, "no dot_general reads a softmax (exp normalized by its sum) of a QKᵀ product"),
], ids=lambda f: f.__name__.strip("_") if callable(f) else "")
def test_not_attention_is_left_alone(f, reason):
    args = make_args("bhsd", "none", 1, np.float32, 16, 16)
    g = hlofuse.jit(f, autotune=False)
    report = g.report(*args)
    assert attention_regions(report) == []
    notes = [n for n in report.notes if n.startswith("fuse-attention:")]
    if reason is None:
        assert attention_refusals(report) == {} and notes == []
    else:
        assert attention_refusals(report) == {reason: 1}
        assert len(notes) == 1 and notes[0].endswith(": " + reason), notes
    assert_same(g(*args), jax.jit(f)(*args), "grad")


def test_cross_entropy_step_is_no_attention_candidate():
    """A classifier's training step has an exp and dots but no softmax a dot reads as
    probabilities (log-softmax, its gradient ``g - exp(logp)·Σg``): no fuse-attention note."""
    def loss(w1, w2, x, y):
        logp = jax.nn.log_softmax(jnp.tanh(x @ w1) @ w2)
        return -jnp.take_along_axis(logp, y[:, None], axis=-1).mean()
    step = jax.value_and_grad(loss, argnums=(0, 1))
    rng = np.random.default_rng(0)
    args = (rng.standard_normal((32, 64), np.float32), rng.standard_normal((64, 100), np.float32),
            rng.standard_normal((16, 32), np.float32), np.arange(16, dtype=np.int32) * 5)
    g = hlofuse.jit(step, autotune=False)
    report = g.report(*args)
    assert any(r.kernel for r in report.regions)   # the step is fused, just not as attention
    assert attention_refusals(report) == {}
    assert not [n for n in report.notes if n.startswith("fuse-attention:")]
    assert_same(g(*args), jax.jit(step)(*args), "grad")


def test_grad_program_gets_flash_forward_and_backward():
    """jax.grad of an attention function: the backward reads the probabilities, so the
    forward alone is refused; forward and backward are matched together instead
    (tests/passes/test_attention_train.py has the cases)."""
    f = make_attention("bhsd", "causal", 1, "nn", "div", "-inf")
    args = make_args("bhsd", "causal", 1, np.float32, 16, 16)
    loss = lambda q, k, v: jnp.sum(f(q, k, v) ** 2)
    gl = hlofuse.jit(jax.grad(loss, argnums=(0, 1, 2)), autotune=False)
    report = gl.report(*args)
    kinds = sorted(r.kind for r in report.regions if r.kind.startswith("attention") and r.kernel)
    assert kinds == ["attention_bwd", "attention_fwd_lse"]
    assert attention_refusals(report) == {}
    assert_same(gl(*args), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*args), "grad")


def _head_mask(q, k, v, hm):
    p = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k) / 8.0, axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p * hm[None, :, None, None], v)   # Flax BERT


def _head_mask_einsum(q, k, v, hm):
    # Transformers' Flax BERT: the head mask as a contraction-free einsum (a dot_general that
    # algebraic-simplify makes a multiply), P·V with V the einsum's second operand, BSHD
    p = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k) / 8.0, axis=-1)
    p = jnp.einsum("...hqk,h->...hqk", p, hm)
    return jnp.einsum("...hqk,...khd->...qhd", p, jnp.transpose(v, (0, 2, 1, 3)))


def _head_mask_of_ones(q, k, v):
    # head_mask=None in Transformers' Flax BERT: a mask of ones, gone as x * 1
    return _head_mask_einsum(q, k, v, jnp.ones((q.shape[1],), q.dtype))


def _transposed_numerator(q, k, v):
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / 8.0
    e = jnp.exp(s - jax.lax.stop_gradient(s.max(-1, keepdims=True)))
    t = jnp.transpose(e, (0, 2, 1, 3))                   # [b, q, h, k]: what layout-assignment
    l = jnp.transpose(e.sum(-1), (0, 2, 1))[..., None]   # leaves between exp and the divide
    return jnp.einsum("bqhk,bhkd->bqhd", t / l, v)


@pytest.mark.parametrize("f,extra,moved", [(_head_mask, True, 1), (_head_mask_einsum, True, 1),
                                           (_head_mask_of_ones, False, 0),
                                           (_transposed_numerator, False, 0)],
                         ids=["head_mask", "head_mask_einsum", "head_mask_of_ones",
                              "transposed_numerator"])
def test_matches_after_head_mask_and_transposed_numerator(f, extra, moved):
    """A multiplier on the probabilities that does not vary along the key (a head mask) moves
    after P·V; a transpose between exp and the divide is a layout of the numerator."""
    args = make_args("bhsd", "none", 1, np.float32, 16, 16)
    if extra:
        args.append(np.linspace(0.5, 1.5, 4).astype(np.float32))
    g = hlofuse.jit(f, autotune=False)
    report = g.report(*args)
    assert len([r for r in attention_regions(report) if r.kernel]) == 1
    (stats,) = [p.stats for p in report.passes if p.name == "fuse-attention"]
    assert stats["row_multipliers_moved"] == moved and attention_refusals(report) == {}
    assert_same(g(*args), jax.jit(f)(*args), "reassociate")


def test_matched_attention_reports_no_refusal():
    """A fused attention adds no statistics and no notes beyond its region."""
    f = make_attention("bhsd", "causal", 1, "nn", "div", "-inf")
    report = hlofuse.jit(f, autotune=False).report(*make_args("bhsd", "causal", 1, np.float32, 16, 16))
    assert len(attention_regions(report)) == 1 and attention_refusals(report) == {}
    assert not [n for n in report.notes if n.startswith("fuse-attention:")]


# ---------------------------------------------------------------------------------------------
# targets and pipeline
def _padding_masked(form):
    """BERT-style attention with a [B, S] padding mask read as the key-side mask and as the
    query-side one (Transformers/Flax ``mask[:, None, None, :]``, Flax
    ``make_attention_mask(keep, keep)``, Haiku's ``keep[:, None, None, :] & keep[:, None, :, None]``)."""
    def f(q, k, v, keep):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.float32(math.sqrt(q.shape[-1]))
        if form == "key":
            m = keep[:, None, None, :] > 0
        elif form == "product":
            m = keep[:, None, :, None] * keep[:, None, None, :] > 0
        else:  # "and" of a bool mask, and an additive key-side bias from it as well
            m = keep[:, None, :, None] & keep[:, None, None, :]
            s = s + jnp.where(keep, 0.0, -1e4).astype(s.dtype)[:, None, None, :]
        s = jnp.where(m, s, jnp.finfo(s.dtype).min)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v)
    return f


@pytest.mark.parametrize("form,dtype", [("key", np.float32), ("product", np.float32),
                                        ("and", np.float32), ("product", BF16)])
def test_padding_mask_read_as_query_and_key_mask(form, dtype):
    """One [B, S] mask in two layouts (query rows and key): the region takes it once per layout
    (two arguments, the same value at the call), never a materialized [B, 1, S, S] mask."""
    rng = np.random.default_rng(0)
    b, s, h, d = 3, 16, 2, 8
    q, k, v = [rng.standard_normal((b, s, h, d)).astype(dtype) for _ in range(3)]
    keep = np.arange(s)[None, :] < np.array([[s], [s // 2], [3]])     # row 2: 3 positions kept
    keep = keep if form == "and" else keep.astype(dtype)
    report = check(_padding_masked(form), (q, k, v, keep), grad=form == "product" and dtype != BF16)
    (r,) = attention_regions(report)
    n_mask = 1 if form == "key" else 2
    mask_t = ("i1" if form == "and" else ("bf16" if dtype == BF16 else "f32")) + f"[{b},{s}]"
    assert r.inputs.count(mask_t) == n_mask, r.inputs
    qkv = [i for i in r.inputs if i.endswith(f"[{b},{s},{h},{d}]")]
    assert len(qkv) == 3 and len(r.inputs) == 3 + n_mask, r.inputs    # no [B, 1, S, S] mask


def test_mask_shared_by_two_layers_is_rematerialized_per_region():
    """A [B, 1, S, S] mask built once and read by two attention layers (CSE shares it): each
    region gets its own copy of the cheap chain and reads the [B, S] mask, not the broadcast."""
    def f(q, k, v, keep):
        m = keep[:, None, :, None] & keep[:, None, None, :]

        def layer(x):
            s = jnp.einsum("bqhd,bkhd->bhqk", x, k) / 4.0
            s = jnp.where(m, s, -1e9)
            return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), v)
        return layer(layer(q))
    rng = np.random.default_rng(0)
    b, s, h, d = 2, 16, 2, 8
    q, k, v = [rng.standard_normal((b, s, h, d)).astype(np.float32) for _ in range(3)]
    keep = np.arange(s)[None, :] < np.array([[s], [5]])
    report = check(f, (q, k, v, keep), grad=False, n_kernels=2)
    for r in attention_regions(report):
        assert r.inputs.count(f"i1[{b},{s}]") == 2 and len(r.inputs) == 5, r.inputs
    (st,) = [p.stats for p in report.passes if p.name == "fuse-attention"]
    assert st["side_chains_rematerialized"] >= 1


def test_causal_mask_shared_by_two_layers_is_a_position_mask_in_each():
    """jax.nn.dot_product_attention(is_causal=True) with GQA in two layers: the causal mask is
    one folded constant, broadcast once, read by both (CSE) and transposed after the select
    (the grouped layout). Each region takes its own copy of the constant and reads it as a
    position mask: key blocks above the diagonal are skipped."""
    def f(q, k, v):
        x = jax.nn.dot_product_attention(q, k, v, is_causal=True)
        return jax.nn.dot_product_attention(x, k, v, is_causal=True)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 384, 4, 8)).astype(np.float32)
    k, v = [rng.standard_normal((1, 384, 2, 8)).astype(np.float32) for _ in range(2)]
    report = check(f, (q, k, v), grad=False, n_kernels=2)
    for r in attention_regions(report):
        assert r.extra["mask"] == "select(positions)" and "+skip" in r.block, (r.extra, r.block)
        assert len(r.inputs) == 3, r.inputs      # Q, K, V: no materialized [B, H, S, S] mask


def test_constant_mask_differing_between_heads_is_not_skipped_by_one_table():
    """A captured [H, S, S] mask, causal in head 0 and banded in head 1: a position mask, but no
    single skip table fits both heads, so no block is skipped and the results stay exact."""
    s_len = 384
    i, j = np.arange(s_len)[:, None], np.arange(s_len)[None, :]
    mask = np.stack([i >= j, abs(i - j) < 200])

    def f(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k)
        s = jnp.where(mask[None], s, -jnp.inf)
        return jax.nn.softmax(s, axis=-1) @ v
    args = make_args("bhsd", "none", 1, np.float32, s_len, s_len, h=2, d=8)
    (r,) = attention_regions(check(f, args, grad=False))
    assert r.extra["mask"] == "select(positions)" and "+skip" not in r.block, r.block


# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target,marker", [("gpu", "__gpu$xla.gpu.triton"), ("tpu", "tpu_custom_call")])
@pytest.mark.parametrize("case", [("bshd", "causal", 2, "nn", "div", "-inf", np.float32, 64, 64),
                                  ("bshd", "bool", 1, "f32", "div", "-inf", BF16, 64, 64)],
                         ids=["causal-gqa-f32", "bool-bf16"])
def test_gpu_and_tpu_kernels_lower_from_cpu(target, marker, case):
    lay, m, g, sm, sc, fill, dt, sq, sk = case
    args = make_args(lay, m, g, dt, sq, sk, d=64)
    low = hlofuse.jit(make_attention(lay, m, g, sm, sc, fill), target=target, autotune=False,
                      options={"strict": True, **ALL_KERNELS}).lower(*args)
    (r,) = attention_regions(low.report)
    assert r.kernel and marker in low.as_text()



@pytest.mark.parametrize("target,marker", [("gpu", "__gpu$xla.gpu.triton"), ("tpu", "tpu_custom_call")])
def test_padding_mask_in_two_layouts_lowers_for_gpu_and_tpu(target, marker):
    rng = np.random.default_rng(0)
    q, k, v = [rng.standard_normal((2, 64, 2, 64)).astype(np.float32) for _ in range(3)]
    keep = (np.arange(64)[None, :] < np.array([[64], [9]])).astype(np.float32)
    low = hlofuse.jit(_padding_masked("product"), target=target, autotune=False,
                      options={"strict": True, **ALL_KERNELS}).lower(q, k, v, keep)
    (r,) = attention_regions(low.report)
    assert r.kernel and marker in low.as_text() and r.inputs.count("f32[2,64]") == 2

def test_pass_is_registered_in_the_default_pipeline():
    names = [n for n, _ in hlofuse.PIPELINES["default"]]
    i = names.index("fuse-attention")
    assert "cse" in names[:i] and "fuse-elementwise" in names[i + 1:]


def test_rerunning_the_pass_changes_nothing():
    f = make_attention("bshd", "additive", 1)
    args = make_args("bshd", "additive", 1, np.float32, 16, 16)
    exp = jax.export.export(jax.jit(f), platforms=["cpu"])(*args)
    steps = ["inline-calls", "canonicalize", "cse", "fuse-attention"]
    once = hlofuse.optimize(exp.mlir_module(), pipeline=steps)
    twice = hlofuse.optimize(once.text, pipeline=["fuse-attention"])
    assert len(attention_regions(once.report)) == 1 and attention_regions(twice.report) == []
    assert twice.text == once.text
