"""``fuse-attention`` on training steps (passes/attention/train.py): attention and the backward
``jax.grad`` built for it become a flash forward returning the logsumexp and a flash backward.
Differential: ``hlofuse.jit(jax.value_and_grad(loss))`` against ``jax.jit`` of the same, in the
``grad`` tolerance category, with both kernels built; refusals say which part did not match."""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.runtime.testing import ALL_KERNELS
from hlofuse.runtime.testing import assert_same
from tests.attention_programs import BF16, first_rows_see_no_key, make_args, make_attention


def train_kernels(report) -> list:
    return sorted(r.kind for r in report.regions
                  if r.kind in ("attention_fwd_lse", "attention_bwd") and r.kernel)


def _dpa(q, k, v, b):
    return jax.nn.dot_product_attention(q, k, v, bias=b, is_causal=True)


def _mqa_broadcast_to(q, k, v):
    k, v = jnp.broadcast_to(k, q.shape), jnp.broadcast_to(v, q.shape)
    p = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k) * 0.3, axis=-1)
    return jnp.einsum("bhqk,bhkd->bhqd", p, v)


def _case(name):
    rng = np.random.default_rng(0)
    if name == "bhsd-mqa-broadcast-to-f32":
        # one K/V head broadcast to all: the forward and the backward each get their own copy
        # of the broadcast (generator trees are unshared), both read the one head
        args = [rng.standard_normal(s).astype(np.float32)
                for s in ((2, 4, 16, 8), (2, 1, 16, 8), (2, 1, 16, 8))]
        return _mqa_broadcast_to, args, (0, 1, 2)
    if name == "dpa-causal-learned-bias-bf16":
        args = [rng.standard_normal((1, 24, 4, 8)).astype(BF16) for _ in range(3)]
        args.append(rng.standard_normal((1, 4, 24, 24)).astype(BF16))
        return _dpa, args, (0, 1, 2, 3)
    layout, mask, gqa, softmax, dt = {
        "mqa-bool-f32": ("mqa", "bool", 1, "nn", np.float32),
        "bshd-causal-manual-softmax-f32": ("bshd", "causal", 1, "manual", np.float32),
        "bhsd-gqa-repeat-f16": ("bhsd", "none", 2, "nn", np.float16),
        "bshd-gqa-repeat-causal-f32": ("bshd", "causal", 2, "nn", np.float32),
        # 8 query heads over 2 K/V heads: jnp.einsum puts V first in P·V here
        "bshd-gqa4-repeat-causal-f32": ("bshd", "causal", 4, "nn", np.float32),
        # B=1: jax sums dK/dV over the unit batch dim and the group in one reduce
        "bshd-gqa4-b1-repeat-causal-f32": ("bshd", "causal", 4, "nn", np.float32),
        # MQA as jnp.repeat of one K/V head (Gemma-2B style): dK/dV sum over the unit K/V head
        # dim and the group in one reduce
        "bshd-mqa-repeat-causal-f32": ("bshd", "causal", 4, "nn", np.float32),
    }[name]
    f = make_attention(layout, mask, gqa, softmax, "mul")
    return f, make_args(layout, mask, gqa, dt, 16, 24,
                         h=gqa if "mqa-repeat" in name else max(4, 2 * gqa),
                         b=1 if "-b1-" in name else 2), (0, 1, 2)


@pytest.mark.parametrize("name", ["dpa-causal-learned-bias-bf16", "mqa-bool-f32",
                                  "bshd-causal-manual-softmax-f32", "bhsd-gqa-repeat-f16",
                                  "bshd-gqa-repeat-causal-f32", "bshd-gqa4-repeat-causal-f32",
                                  "bshd-gqa4-b1-repeat-causal-f32", "bshd-mqa-repeat-causal-f32",
                                  "bhsd-mqa-broadcast-to-f32"])
def test_training_step_gets_flash_forward_and_backward(name):
    f, args, argn = _case(name)

    def loss(*a):
        return jnp.sum(f(*a).astype(jnp.float32) ** 2)
    step = jax.value_and_grad(loss, argnums=argn)
    g = hlofuse.jit(step, autotune=False)
    report = g.report(*args)
    assert train_kernels(report) == ["attention_bwd", "attention_fwd_lse"], report
    (stats,) = [p.stats for p in report.passes if p.name == "fuse-attention"]
    assert stats["attention_training"] == 1
    if "gqa" in name or "mqa-broadcast" in name:
        # the K/V repeat is inside both regions: they read the unrepeated K/V (nothing of the
        # repeated size is materialized) and the backward returns dK/dV of that size (dims in
        # the program's order for them, unit dims aside)
        kv = f"{np.dtype(args[1].dtype).name.replace('float', 'f')}[{','.join(map(str, args[1].shape))}]"
        (fwd,) = [r for r in report.regions if r.kind == "attention_fwd_lse"]
        (bwd,) = [r for r in report.regions if r.kind == "attention_bwd"]

        def numel(t):
            return int(np.prod([int(n) for n in t[t.index("[") + 1:-1].split(",")]))
        assert fwd.inputs.count(kv) == 2, fwd
        assert [numel(t) for t in bwd.outputs].count(args[1].size) == 2, bwd
    (val, grads), (val0, grads0) = g(*args), jax.jit(step)(*args)
    assert_same(grads, grads0, "grad")
    # the loss is f32 but carries the attention output's precision
    dt = args[0].dtype
    assert_same(np.asarray(val).astype(dt), np.asarray(val0).astype(dt), "grad")


def _rotary(x, cos, sin):
    x1, x2 = jnp.split(x, 2, axis=-1)
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return jnp.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)


@pytest.mark.parametrize("heads,kv", [(8, 2), (8, 1), (4, 2)])
def test_gqa_with_projections_gets_flash_forward_and_backward(heads, kv):
    """A Llama/Mistral-style layer under ``jax.grad`` of its weights: Q/K/V projected in the
    step, rotary, K/V repeated over groups of 4 query heads (Llama-3, Mistral: 32 over 8), of
    8 (MQA: one K/V head) and of 2. The repeated K/V is a quarter of the logits' operand size
    or less, like a mask broadcast from small values, but it is a product's operand: it stays
    the attention's K/V, not a tree the backward copies down to the projection (before, groups
    of 4 and more were refused: the backward read the projection's result)."""
    s, dh, d = 32, 8, heads * 8
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, s, d)).astype(np.float32)
    w = [(rng.standard_normal((d, n * dh)) / np.sqrt(d)).astype(np.float32)
         for n in (heads, kv, kv)]
    ang = np.arange(s, dtype=np.float32)[:, None] * (0.5 ** np.arange(dh // 2, dtype=np.float32))
    cos, sin = np.cos(ang), np.sin(ang)

    def loss(wq, wk, wv):
        q = _rotary((x @ wq).reshape(2, s, heads, dh), cos, sin)
        k = _rotary((x @ wk).reshape(2, s, kv, dh), cos, sin)
        v = (x @ wv).reshape(2, s, kv, dh)
        k, v = jnp.repeat(k, heads // kv, axis=2), jnp.repeat(v, heads // kv, axis=2)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(dh)
        logits = jnp.where(jnp.tril(jnp.ones((s, s), bool)), logits, -1e30)
        o = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, -1), v)
        return jnp.sum(o ** 2)
    step = jax.value_and_grad(loss, argnums=(0, 1, 2))
    g = hlofuse.jit(step, autotune=False)
    report = g.report(*w)
    assert train_kernels(report) == ["attention_bwd", "attention_fwd_lse"], report
    (val, grads), (val0, grads0) = g(*w), jax.jit(step)(*w)
    assert_same(grads, grads0, "grad")
    assert_same(val, val0, "grad")


def test_weights_in_the_loss_are_not_the_attention_backward():
    """The probabilities also feed the loss: their users are not the attention's gradient.
    Nothing is replaced and the report says which part did not match."""
    def loss(q, k, v):
        p = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k), axis=-1)
        return jnp.sum((p @ v) ** 2) + jnp.sum(p ** 3)
    args = make_args("bhsd", "none", 1, np.float32, 16, 16)
    step = jax.value_and_grad(loss, argnums=(0, 1, 2))
    g = hlofuse.jit(step, autotune=False)
    report = g.report(*args)
    assert train_kernels(report) == []
    notes = [n for n in report.notes if n.startswith("fuse-attention:")]
    assert any("as a training step:" in n for n in notes), notes
    assert_same(g(*args), jax.jit(step)(*args), "grad")


def test_rerunning_the_pipeline_changes_nothing():
    f = make_attention("bhsd", "causal", 1, "nn", "mul")
    args = make_args("bhsd", "causal", 1, np.float32, 16, 16)
    step = jax.value_and_grad(lambda *a: jnp.sum(f(*a) ** 2), argnums=(0, 1, 2))
    exp = jax.export.export(jax.jit(step), platforms=["cpu"])(*args)
    once = hlofuse.optimize(exp.mlir_module())
    assert train_kernels(once.report) == ["attention_bwd", "attention_fwd_lse"]
    twice = hlofuse.optimize(once.text)
    assert train_kernels(twice.report) == [] and twice.text == once.text


@pytest.mark.parametrize("target,marker", [("gpu", "__gpu$xla.gpu.triton"),
                                           ("tpu", "tpu_custom_call")])
def test_training_step_on_gpu_and_tpu_builds_the_pallas_kernels(target, marker):
    """Lowered for gpu/tpu from this machine: the training step gets the Triton/Mosaic forward
    with lse and flash backward (their numerics: tests/kernels/test_attention_backward.py, in
    Pallas interpret mode); f16 on tpu is refused with the reason (the step stays with XLA)."""
    def lowered_text(fn, args, target):
        lo = hlofuse.jit(fn, target=target, autotune=False, options=ALL_KERNELS).lower(*args)
        return lo.as_text(), lo.report
    f, args, argn = _case("bshd-causal-manual-softmax-f32")

    def loss(*a):
        return jnp.sum(f(*a).astype(jnp.float32) ** 2)
    text, report = lowered_text(jax.value_and_grad(loss, argnums=argn), args, target)
    assert train_kernels(report) == ["attention_bwd", "attention_fwd_lse"], report
    assert text.count(marker) >= 3          # forward, dK/dV and dQ kernels
    # GQA with the repeat inside the regions: the kernels take the unrepeated K/V
    f, args, argn = _case("bshd-gqa-repeat-causal-f32")
    text, report = lowered_text(jax.value_and_grad(loss, argnums=argn), args, target)
    assert train_kernels(report) == ["attention_bwd", "attention_fwd_lse"], report
    assert text.count(marker) >= 3
    (fwd,) = [r for r in report.regions if r.kind == "attention_fwd_lse"]
    assert fwd.inputs.count("f32[2,24,2,8]") == 2, fwd
    if target == "tpu":
        f, args, argn = _case("bhsd-gqa-repeat-f16")

        def loss16(*a):
            return jnp.sum(f(*a).astype(jnp.float32) ** 2)
        _, report = lowered_text(jax.value_and_grad(loss16, argnums=argn), args, target)
        assert train_kernels(report) == []
        assert any("f16 is not supported by the TPU flash backward" in n for n in report.notes), \
            report.notes



def test_dots_reading_a_divide_of_no_exp_are_no_candidates():
    """Q projected and scaled by a divide (as Flax and Equinox write it): the projection's
    gradient dot reads ``dQ / c``, a divide of no exp. It is no softmax, so no candidate is
    reported refused (before: 'softmax numerator is not exp'); the inference program's QKᵀ
    dot likewise."""
    def out(x, wq, k, v):
        q = jnp.einsum("bhqe,ed->bhqd", x, wq) / np.float32(np.sqrt(wq.shape[-1]))
        p = jax.nn.softmax(jnp.einsum("bhqd,bhkd->bhqk", q, k), axis=-1)
        return jnp.einsum("bhqk,bhkd->bhqd", p, v)
    args = make_args("bhsd", "none", 1, np.float32, 16, 16)
    args.insert(1, np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32))
    step = jax.value_and_grad(lambda *a: jnp.sum(out(*a) ** 2), argnums=(0, 1, 2, 3))
    for fn, kinds in ((step, ["attention_bwd", "attention_fwd_lse"]), (out, [])):
        g = hlofuse.jit(fn, autotune=False)
        report = g.report(*args)
        assert train_kernels(report) == kinds, report
        assert sum(r.kind == "attention" and bool(r.kernel) for r in report.regions) == \
            (not kinds), report
        assert not [n for n in report.notes if n.startswith("fuse-attention:")], report.notes
        assert_same(g(*args), jax.jit(fn)(*args), "grad" if kinds else "reassociate")


def test_a_failed_training_match_is_reported_at_the_failing_op():
    """The logits' max also feeds the loss: the backward reads a second cotangent. The note is
    at the line that adds it in, not at the attention candidate's line (before: the P·V line)."""
    import inspect

    def loss(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k)
        o = jax.nn.softmax(s, axis=-1) @ v
        return jnp.sum(o ** 2) + jnp.sum(jnp.max(s, -1) * 3.0)
    first = inspect.getsourcelines(loss)[1]
    pv_line, extra_line = first + 2, first + 3
    args = make_args("bhsd", "none", 1, np.float32, 16, 16)
    step = jax.value_and_grad(loss, argnums=(0, 1, 2))
    g = hlofuse.jit(step, autotune=False)
    report = g.report(*args)
    assert train_kernels(report) == []
    (note,) = [n for n in report.notes if "as a training step: the backward reads 2" in n]
    assert f"test_attention_train.py:{extra_line}:" in note, note
    assert f":{pv_line}:" not in note
    assert_same(g(*args), jax.jit(step)(*args), "grad")


def test_a_value_from_outside_the_match_is_named_with_its_producer():
    """_run evaluates the matched ops alone; an operand computed by an op the match did not
    take is refused with that op's name and source line (it was an 'internal' message)."""
    from hlofuse.core import ir as hir
    from hlofuse.passes.attention import train as at
    text = """module {
  func.func @main(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
    %0 = stablehlo.exponential %x : tensor<4x4xf32> loc("model.py":7:3)
    %1 = stablehlo.add %0, %x : tensor<4x4xf32>
    return %1 : tensor<4x4xf32>
  }
}"""
    m = hir.parse(text)
    ops = hir.block_ops(hir.main_func(m).regions[0].blocks[0])
    x = hir.main_func(m).regions[0].blocks[0].arguments[0]
    env = {hir.value_key(x): np.ones((4, 4), np.float32)}
    with pytest.raises(at.TrainNoMatch) as e:
        at._run([ops[1]], env, at._Shrink([x], ()))
    assert "'stablehlo.exponential' at model.py:7" in str(e.value), str(e.value)
    assert "internal" not in str(e.value) and e.value.op == ops[1]


def _scanned_attention_step(remat: bool):
    """A loss over two attention layers scanned over stacked projections (scan over layers),
    with or without ``jax.checkpoint`` around the scanned layer. The output projection's
    gradient reads the attention output, so the remat backward recomputes the whole forward."""
    def layer(x, w):
        q, k, v = (x @ w[i] for i in range(3))
        split = lambda t: t.reshape(2, 24, 2, 8)                      # noqa: E731
        a = jax.nn.dot_product_attention(split(q), split(k), split(v), is_causal=True)
        return x + a.reshape(2, 24, 16) @ w[3]
    body = jax.checkpoint(layer) if remat else layer

    def loss(x, ws):
        return jnp.sum(jax.lax.scan(lambda c, w: (body(c, w), None), x, ws)[0] ** 2)
    rng = np.random.default_rng(0)
    args = (rng.standard_normal((2, 24, 16)).astype(np.float32),
            (rng.standard_normal((2, 4, 16, 16)) * 0.2).astype(np.float32))
    return jax.value_and_grad(loss, argnums=(0, 1)), args


def test_scan_over_layers_gets_both_kernels_with_and_without_remat():
    """Without remat the forward loop saves the probabilities for the backward loop:
    remat-loop-attention recomputes them there, and the forward and backward kernels are built
    in the backward loop (the forward kernel in the forward loop). With that pass disabled no
    rewrite spans the two loops, and the note says what to do. With ``jax.checkpoint`` the
    backward loop recomputes the forward itself."""
    from hlofuse.passes.attention.train import LOOP_RESIDUALS
    step, args = _scanned_attention_step(remat=False)
    g = hlofuse.jit(step, autotune=False)
    report = g.report(*args)
    assert train_kernels(report) == ["attention_bwd", "attention_fwd_lse"], report
    assert not any(LOOP_RESIDUALS in n for n in report.notes), report.notes
    assert_same(g(*args), jax.jit(step)(*args), "grad")
    g = hlofuse.jit(step, autotune=False, disable=("remat-loop-attention",))
    report = g.report(*args)
    assert train_kernels(report) == []
    assert any(LOOP_RESIDUALS in n for n in report.notes), report.notes
    assert_same(g(*args), jax.jit(step)(*args), "grad")

    step, args = _scanned_attention_step(remat=True)
    g = hlofuse.jit(step, autotune=False)
    report = g.report(*args)
    assert train_kernels(report) == ["attention_bwd", "attention_fwd_lse"], report
    assert not any(LOOP_RESIDUALS in n for n in report.notes)
    assert_same(g(*args), jax.jit(step)(*args), "grad")


def _block(p, x):
    """A pre-LN attention block with a GELU MLP (what users wrap in hlofuse.jit)."""
    b, s, d = x.shape
    m = x.mean(-1, keepdims=True)
    h = (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5)
    q, k, v = ((h @ p[i]).reshape(b, s, 2, d // 2) for i in range(3))
    a = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, s, d)
    x = x + a @ p[3]
    return x + jax.nn.gelu(x @ p[4]) @ p[5]


def _programs_kernels(f) -> dict:
    """program name -> sorted attention kernel kinds, over hlofuse.jit ``f``'s programs."""
    out = {}
    for prog in f.all_programs():
        for e in prog.entries():
            out.setdefault(prog.name.split("(")[0], []).extend(
                r.kind for r in e.report.kernels if r.kind.startswith("attention"))
    return {k: sorted(v) for k, v in out.items()}


def test_grad_of_an_hlofuse_jit_block_gets_attention_kernels_in_both_programs(monkeypatch):
    """``jax.grad`` outside ``hlofuse.jit`` (a user who wraps the model, not the step): the
    derived forward saves no probabilities for the derived backward, which recomputes the
    attention from its inputs, so the forward program gets a forward kernel and the backward
    program a flash forward and backward. Before, the probabilities were the residuals between
    the programs and neither got an attention kernel."""
    from hlofuse.runtime.program import GRAD_REMAT_NOTE
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((2, 32, 16)), jnp.float32)
    p = jnp.asarray(rng.standard_normal((6, 16, 16)) * 0.2, jnp.float32)

    def step(block):
        return jax.jit(jax.value_and_grad(lambda p, x: jnp.sum(block(p, block(p, x)) ** 2)))

    blk = hlofuse.jit(_block, autotune=False)
    assert_same(step(blk)(p, x), step(_block)(p, x), "grad")
    # (two derived variants: the first call's input has no tangent, the second's has)
    kinds = _programs_kernels(blk)
    assert kinds["fwd"] == ["attention"] * 2, kinds
    assert kinds["T"] == ["attention_bwd", "attention_bwd", "attention_fwd_lse",
                          "attention_fwd_lse"], kinds
    for fwd in [prog for prog in blk.all_programs() if prog.name.startswith("fwd(")]:
        assert GRAD_REMAT_NOTE in fwd.entries()[0].report.notes

    monkeypatch.setenv("HLOFUSE_GRAD_REMAT", "0")     # as jax.linearize saves them
    blk = hlofuse.jit(_block, autotune=False)
    assert_same(step(blk)(p, x), step(_block)(p, x), "grad")
    kinds = _programs_kernels(blk)
    assert not kinds.get("fwd") and not kinds.get("T"), kinds


def test_grad_of_a_program_without_attention_saves_as_jax_does():
    """No softmax read by a batched product (an MLP; a batched expert matmul whose router
    softmax has other shapes): the derived forward is jax.linearize's, no policy, no note."""
    from hlofuse.runtime.program import GRAD_REMAT_NOTE

    def moe(w, x):
        gate = jax.nn.softmax(x @ w[0], -1)                        # [T, E]
        h = jnp.einsum("td,edf->etf", x, w[1:3].reshape(2, 16, 16))  # 2 experts
        y = jnp.einsum("etf,efd->etd", jax.nn.gelu(h), w[3:5].reshape(2, 16, 16))
        return jnp.sum(jnp.einsum("etd,te->td", y, gate[:, :2]) ** 2)
    rng = np.random.default_rng(1)
    w = jnp.asarray(rng.standard_normal((5, 16, 16)) * 0.2, jnp.float32)
    x = jnp.asarray(rng.standard_normal((8, 16)), jnp.float32)
    f = hlofuse.jit(moe, autotune=False)
    assert_same(jax.grad(f)(w, x), jax.grad(moe)(w, x), "grad")
    notes = [n for prog in f.all_programs() for e in prog.entries() for n in e.report.notes]
    assert GRAD_REMAT_NOTE not in notes


def test_layers_of_one_structure_check_their_backward_with_one_compile(monkeypatch):
    """Each matched backward is checked numerically with an XLA-compiled evaluation. Layers
    of one structure trace to the same HLO (evaluated in an order fixed by their structure,
    not their program order, which differs here for the third layer) and share one
    executable, so a deep model pays for one compile, not one per layer."""
    from hlofuse.passes.attention import train as at
    monkeypatch.setattr(at, "_COMPILED", {})
    compiles = []
    real = at._compiled

    def counting(lowered):
        before = len(at._COMPILED)
        exe = real(lowered)
        compiles.append(len(at._COMPILED) > before)
        return exe
    monkeypatch.setattr(at, "_compiled", counting)
    att = make_attention("bshd", "causal", 1, "nn", "mul")
    rng = np.random.default_rng(0)
    ps = [[rng.standard_normal((16, 16)).astype(np.float32) * 0.1 for _ in range(4)] for _ in range(3)]
    x = rng.standard_normal((2, 24, 16)).astype(np.float32)

    def loss(ps, x):
        for p in ps:
            q, k, v = ((x @ p[i]).reshape(2, 24, 2, 8) for i in range(3))
            x = x + att(q, k, v).reshape(2, 24, 16) @ p[3]
        return jnp.mean(x ** 2)
    step = jax.grad(loss)
    g = hlofuse.jit(step, autotune=False, tiered=False)
    report = g.report(ps, x)
    assert train_kernels(report) == ["attention_bwd"] * 3 + ["attention_fwd_lse"] * 3
    assert compiles == [True, False, False]
    assert_same(g(ps, x), jax.jit(step)(ps, x), "grad")


def _length_masked_loss(q, k, v, n):
    """A key-padding mask from an integer input (the valid length), and a loss whose cotangent
    is not uniform (sin): the backward's gradients are told apart only on draws where ``n``
    leaves at least two keys visible."""
    s = jnp.einsum("BTNH,BSNH->BNTS", q, k)
    s = jnp.where(jnp.arange(q.shape[1]) < n, s, -1e30)
    o = jnp.einsum("BNTS,BSNH->BTNH", jax.nn.softmax(s, -1), v)
    return jnp.sum(jnp.sin(o))


def _length_masked_args():
    rng = np.random.default_rng(3)
    return [jnp.asarray(rng.standard_normal((1, 8, 1, 4)), jnp.float32) for _ in range(3)] + [
        jnp.int32(6)]


@pytest.mark.parametrize("argnums", [(1,), (0, 1, 2)])
def test_a_backward_returning_dk_alone_is_not_taken_for_dq(argnums):
    """``jax.grad`` of an ``hlofuse.jit`` function with a length mask: the derived backward
    program's attention backward returns dK alone (or dQ and dK, both [B, H, S, D]). The
    check that tells which input each result is the gradient of drew the length as 0 or 1,
    which hides every key or all but one: dQ and dK were both zero, and dK was taken for dQ's
    gradient, so the kernel returned dQ in dK's place (found by an adversarial test). A draw
    whose results match several inputs' gradients is drawn again."""
    args = _length_masked_args()
    f = hlofuse.jit(_length_masked_loss, autotune=False)
    got = jax.grad(f, argnums)(*args)
    assert_same(got, jax.grad(jax.jit(_length_masked_loss), argnums)(*args), "grad")
    assert "attention_bwd" in _programs_kernels(f)["T"]        # the rewrite fired


def test_a_backward_whose_gradients_cannot_be_told_apart_stays_with_xla(monkeypatch):
    """Only the degenerate draw (integers 0 or 1): every result matches dQ's and dK's
    gradient, so the match is refused, XLA keeps the backward, and the gradients are right."""
    from hlofuse.passes.attention import train as at
    monkeypatch.setattr(at, "CHECK_INT_RANGES", (2,))
    args = _length_masked_args()
    f = hlofuse.jit(_length_masked_loss, autotune=False)
    got = jax.grad(f, (0, 1, 2))(*args)
    assert_same(got, jax.grad(jax.jit(_length_masked_loss), (0, 1, 2))(*args), "grad")
    assert "attention_bwd" not in _programs_kernels(f).get("T", [])
    notes = [n for prog in f.all_programs() for e in prog.entries() for n in e.report.notes]
    assert any("cannot be told" in n for n in notes), notes


def test_grad_of_a_scanned_attention_layer_optimizes_its_backward_program():
    """``jax.grad`` of an ``hlofuse.jit`` function scanning an attention layer with an output
    projection: flatten-dot-dims left two reshapes of the loop body unread, fuse-reduction
    took their softmax statistics for a region with no outputs, and the whole backward
    program ran unoptimized (a warning; strict raised). Dead ops are erased now."""
    B, T, D = 1, 4, 4

    def layer(x, w):
        q, k, v = (jnp.einsum("btd,de->bte", x, w[i]).reshape(B, T, 1, D) for i in range(3))
        s = jnp.einsum("bthd,bshd->bhts", q, k)
        o = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(s, -1), v).reshape(B, T, D)
        return x + o @ w[3]

    def loss(x, ws):
        return jnp.sum(jnp.sin(jax.lax.scan(lambda x, w: (layer(x, w), None), x, ws)[0]))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((B, T, D)), jnp.float32)
    ws = jnp.asarray(rng.standard_normal((2, 4, D, D)) * 0.3, jnp.float32)
    f = hlofuse.jit(loss, autotune=False, options={"strict": True})
    got = jax.grad(f, (0, 1))(x, ws)
    assert_same(got, jax.grad(jax.jit(loss), (0, 1))(x, ws), "grad")
    assert "attention_bwd" in _programs_kernels(f)["T"]


@pytest.mark.parametrize("chain", ["output-as-query", "output-as-key"])
def test_chained_attentions_in_a_training_step_fuse_one_and_stay_correct(chain):
    """Attention applied to an attention's output, differentiated: both training matches were
    committed, and the second held values the first's commit had replaced (strict: NoMatch
    'a value the logits read is neither a region input nor a region op'; otherwise the whole
    step ran unoptimized; adversarial round). The later match is refused with a reason."""
    b, s, h, d = 1, 128, 2, 32
    r = np.random.default_rng(0)
    q, k, v = (r.standard_normal((b, s, h, d)).astype(np.float32) for _ in range(3))
    causal = np.tril(np.ones((s, s), bool))

    def core(q, k, v):
        x = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(jnp.where(causal, x, -jnp.inf), -1), v)

    def loss(q, k, v):
        if chain == "output-as-query":
            o = core(q, k, v)
            return jnp.sum(jnp.sin(o + core(o, k, v)))
        return jnp.sum(jnp.sin(core(q, core(q, k, v), v)))
    step = jax.value_and_grad(loss, argnums=(0, 1, 2))
    f = hlofuse.jit(step, tiered=False, autotune=False, options={"strict": True})
    kinds = [x.kind for x in f.lower(q, k, v).report.kernels]
    assert kinds.count("attention_bwd") >= 1, kinds
    assert_same(f(q, k, v), jax.jit(step)(q, k, v), "grad")


def test_rows_with_every_key_masked_and_zeroed_get_the_programs_zero_gradient():
    """The user zeroes the NaN rows of an attention whose first rows see no key; jax.jit's
    dQ there is 0 (the mask's select gives the masked logits no gradient), and hlofuse.jit's
    was NaN when the key count is not a multiple of the key block (300 keys: two 256-key
    blocks; adversarial round). Numerics of the kernels alone, on every target:
    tests/kernels/test_attention_backward.py."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 300, 2, 16)).astype(np.float32) for _ in range(3))

    def loss(q, k, v):
        return jnp.sum(first_rows_see_no_key(q, k, v) ** 2)
    step = jax.grad(loss, argnums=(0, 1))
    f = hlofuse.jit(step, autotune=False)
    got = f(q, k, v)
    assert train_kernels(f.report(q, k, v)) == ["attention_bwd", "attention_fwd_lse"]
    assert not np.isnan(np.asarray(got[0])).any() and not np.asarray(got[0])[:, :5].any()
    assert_same(got, jax.jit(step)(q, k, v), "grad")
