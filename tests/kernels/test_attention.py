"""Attention kernel family: every execution of the flash algorithm against the region itself.

A region is produced by the ``fuse-attention`` pass from a function in
``tests/attention_programs.py``; the outlined function, compiled by XLA on its own, is
the ground truth. Each build (cpu loops with several block shapes, the Triton kernel in Pallas
interpret mode, the Mosaic kernel in TPU interpret mode) and :func:`attention_reference` must
match it within the ``reassociate`` tolerance.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jaxlib.mlir import ir

import hlofuse
from hlofuse.core import hostcpu
from hlofuse.core import ir as hir
from hlofuse.kernels import attention as A
from hlofuse.kernels.attention.cpu import block_index, cpu_split
from hlofuse.core.ops import EmitError
from hlofuse.runtime.testing import assert_same
from tests.attention_programs import make_args, make_attention
from tests.attention_regions import (_KEEP, CASES, bench_spec as _bench_spec, region as _region,
                                     region_of, strict_causal_region)
from tests.fusion_util import run_region


@pytest.mark.parametrize("case", list(CASES))
def test_cpu_loops_match_the_region(case):
    spec, text, ins = _region(case)
    want = run_region(text, ins)
    assert_same(jax.jit(A.attention_reference(spec))(*ins), want, "reassociate")
    # padded, several blocks, one; split into 1, 3 (uneven) and 2 independent loops per batch axis
    for (bq, bk), parts in [((8, 8), 1), ((16, 32), 3), ((spec.seq_q, spec.seq_k), 2)]:
        fn = A.build_cpu(spec, A.AttentionBlocks("cpu", bq, bk), parts=parts)
        n = len(cpu_split(spec, parts)[1])
        assert n == min(parts, max(spec.sizes[b] for b in spec.batch))
        assert (f" x{n}" in fn.blocks) == (n > 1)
        assert_same(jax.jit(fn)(*ins), want, "reassociate")
    fn = A.build_attention(spec, "cpu")                            # the cost model's blocks
    assert_same(jax.jit(fn)(*ins), want, "reassociate")


@pytest.mark.parametrize("case", ["plain-odd-cross", "causal-gqa", "bool-full-finite",
                                  "bias-gqa", "causal-bf16"])
def test_triton_kernel_in_interpret_mode(case):
    spec, text, ins = _region(case)
    fn = A.build_attention(spec, "gpu", interpret=True, blocks=A.AttentionBlocks("gpu", 16, 16))
    assert fn.kernel_name.startswith("hlofuse_attention_")
    assert_same(jax.jit(fn)(*ins), run_region(text, ins), "reassociate")


@pytest.mark.parametrize("case", ["plain-odd-cross", "causal-gqa", "additive", "causal-bf16"])
def test_tpu_kernel_in_interpret_mode(case):
    spec, text, ins = _region(case)
    fn = A.build_attention(spec, "tpu", interpret=pltpu.InterpretParams(),
                           blocks=A.AttentionBlocks("tpu", 16, 128))
    assert_same(jax.jit(fn)(*ins), run_region(text, ins), "reassociate")


def test_tpu_kernel_skips_blocks_above_the_diagonal():
    """Sk = 160 > one 128-key block: query blocks below row 128 skip the second key block."""
    spec, text, ins = region_of(make_attention("bhsd", "causal", 1, "nn", "div", "-inf"),
                                make_args("bhsd", "causal", 1, np.float32, 160, 160, b=1, h=1))
    fn = A.build_attention(spec, "tpu", interpret=pltpu.InterpretParams(),
                           blocks=A.AttentionBlocks("tpu", 64, 128))
    assert "+skip" in fn.blocks
    assert_same(jax.jit(fn)(*ins), run_region(text, ins), "reassociate")


# ---------------------------------------------------------------------------------------------
# block skipping
# ---------------------------------------------------------------------------------------------

def test_causal_skip_table():
    spec, _, _ = _region("causal-gqa")            # 37 x 37, j <= i, -inf fill
    lo, hi = A.skip_table(spec, 8, 8)
    np.testing.assert_array_equal(lo, [0, 0, 0, 0, 0])
    np.testing.assert_array_equal(hi, [1, 2, 3, 4, 5])


def test_folded_mask_builds_its_skip_table_in_one_compile():
    """A causal mask constant-fold made a dense constant: aligning it to the logits is numpy
    (the same bits as the jax ops, no compile) and the skip table one jitted evaluation, not
    one XLA compile per op (each a visible part of a cold first call)."""
    from hlofuse.kernels.attention.layout import const_sides, to_canonical
    from hlofuse.kernels.attention.logits import const_arrays

    def f(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k)
        s = jnp.where(jnp.tril(jnp.ones((24, 24), bool)), s, -jnp.inf)
        return jax.nn.softmax(s, axis=-1) @ v
    args = make_args("bhsd", "none", 1, np.float32, 24, 24)
    exp = jax.export.export(jax.jit(f), platforms=["cpu"])(*args)
    opt = hlofuse.optimize(exp.mlir_module(), pipeline=["inline-calls", "canonicalize", "cse",
                                                         "constant-fold", "fuse-attention"])
    (fn,) = [fo for fo in hir.funcs(opt.module) if hir.func_name(fo).startswith("hlofuse_attention")]
    spec = A.spec_from_func(fn)
    assert spec.const_sides   # the folded mask
    compiles = []
    listener = (lambda ev, secs, **kw: compiles.append(ev)
                if ev.endswith("backend_compile_duration") else None)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        sides = const_sides(spec)
        n_sides = len(compiles)
        lo, hi = A.skip_table(spec, 8, 8)
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert n_sides == 0 and len(compiles) == 1
    np.testing.assert_array_equal(lo, [0, 0, 0])
    np.testing.assert_array_equal(hi, [1, 2, 3])
    with jax.ensure_compile_time_eval():   # what the sides were computed with before
        want = [np.asarray(to_canonical(a, dims, spec.order, spec.repeat))
                for a, (_, dims) in zip(const_arrays(spec), spec.const_sides)]
    for got, w in zip(sides, want):
        assert got.dtype == w.dtype and got.shape == w.shape and (got == w).all()


def test_no_skipping_with_a_small_finite_fill_or_an_input_mask():
    for case in ("causal-finite-fill", "bool-padding", "plain-odd-cross"):  # -1e9: not exact
        spec, _, _ = _region(case)
        assert A.skip_table(spec, 8, 8) is None, case


def test_skipping_keeps_fully_masked_rows_nan():
    """Strict causal (j < i) with -inf: row 0 sees nothing. Its key blocks are all skipped and
    0/0 gives NaN, as the original does."""
    spec, text, ins = strict_causal_region()
    want = run_region(text, ins)
    assert np.isnan(want[0][:, :, 0]).all()
    fn = A.build_attention(spec, "cpu", blocks=A.AttentionBlocks("cpu", 8, 8))
    assert "+skip" in fn.blocks
    assert_same(jax.jit(fn)(*ins), want, "reassociate")


def test_no_skipping_when_a_finite_fill_row_is_fully_masked():
    """Same strict mask with finfo.min: row 0 must average *all* values, so nothing is skipped."""
    def f(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k)
        s = jnp.where(jnp.arange(24)[:, None] > jnp.arange(24)[None, :], s, jnp.finfo(s.dtype).min)
        return jax.nn.softmax(s, axis=-1) @ v
    spec, text, ins = region_of(f, make_args("bhsd", "none", 1, np.float32, 24, 24))
    assert A.skip_table(spec, 8, 8) is None
    fn = A.build_attention(spec, "cpu", blocks=A.AttentionBlocks("cpu", 8, 8))
    assert_same(jax.jit(fn)(*ins), run_region(text, ins), "reassociate")


# ---------------------------------------------------------------------------------------------
# plans, blocks, spec
# ---------------------------------------------------------------------------------------------

def test_cpu_plan_keeps_the_step_block_within_budget():
    spec = _bench_spec(4096)
    plan = A.cpu_plan(spec)
    assert plan.bk == A.CPU_MAX_BLOCK_K and plan.bq < 4096
    assert spec.n_batch * plan.bq * plan.bk <= A.CPU_STEP_BUDGET
    small = _bench_spec(64)
    assert (A.cpu_plan(small).bq, A.cpu_plan(small).bk) == (64, 64)  # one block: no loop


def test_cpu_forward_plans_with_its_own_step_budget():
    spec = _bench_spec(4096)
    budget = A.cpu_budgets()[0]                                # this host's forward budget
    fwd = A.cpu_plan(spec, budget=budget)
    assert spec.n_batch * fwd.bq * fwd.bk <= budget
    assert fwd.bk == A.CPU_MAX_BLOCK_K and fwd.bq < 4096       # several chunks and key blocks
    # the forward uses it (in key blocks; whole rows: test_cpu_forward_runs_whole_rows)
    assert A.build_cpu(spec, parts=1, whole_rows=False).blocks == f"cpu loops {fwd}"
    # split over the 8 heads into 2 loops: the budget is per loop (4 heads)
    two = A.cpu_plan(spec, budget=budget, parts=2)
    assert spec.n_batch // 2 * two.bq * two.bk <= budget and two.bq == 2 * fwd.bq
    assert A.build_cpu(spec, parts=2, whole_rows=False).blocks == f"cpu loops {two} x2"


@pytest.mark.parametrize("l2,fwd,bwd", [
    (2 << 20, 2 << 20, 512 << 10),     # the reference host (2 MiB L2): the measured budgets
    (1 << 20, 1 << 20, 256 << 10),     # Zen 4 (1 MiB): half
    (1280 << 10, 1 << 20, 256 << 10),  # Ice Lake server (1.25 MiB): the power of two below
    (256 << 10, 512 << 10, 128 << 10), # a small L2: at most a quarter of the reference's
    (32 << 20, 4 << 20, 1 << 20),      # a huge one: at most twice
])
def test_cpu_budgets_scale_with_the_hosts_l2(monkeypatch, l2, fwd, bwd):
    assert A.cpu_budgets(l2) == (fwd, bwd)
    monkeypatch.setattr(hostcpu, "l2_per_core", lambda: l2)
    assert A.cpu_budgets() == (fwd, bwd)
    spec = _bench_spec(4096)
    plan = A.cpu_plan(spec, budget=fwd, min_block_q=A.CPU_FWD_MIN_BLOCK_Q)
    assert A.build_cpu(spec, parts=1, whole_rows=False).blocks == f"cpu loops {plan}"
    monkeypatch.setattr(A.blocks, "CPU_BUDGETS", (123, 45))   # an A/B harness's setting wins
    assert A.cpu_budgets() == (123, 45)


def test_cpu_forward_runs_whole_rows():
    """Where at least CPU_ROW_MIN_BLOCK_Q rows of all keys fit in CPU_ROW_BUDGET and no position
    mask skips blocks: one key block per query chunk (blocks.py: one library fusion per chunk
    on jax 0.12, measured 0.34 against 0.43 of jax.jit's time at S=4096)."""
    spec = _bench_spec(4096)                          # B=1 H=8: 32M / (8 x 4096) = 1024 rows
    rows = A.cpu_fwd_plan(spec, whole_rows=True)
    assert (rows.bq, rows.bk) == (1024, 4096)
    assert A.build_cpu(spec, parts=1, whole_rows=True).blocks == "cpu row loops bq=1024 bk=4096"
    assert A.cpu_fwd_plan(spec, whole_rows=False).bk == A.CPU_MAX_BLOCK_K
    # the training forward (with the row statistics) keeps key blocks unless told (measured)
    assert A.build_cpu(spec, parts=1, with_lse=True).blocks.startswith("cpu loops bq=")
    assert A.build_cpu(spec, parts=1, with_lse=True, whole_rows=True).blocks.startswith(
        "cpu row loops")
    assert A.cpu_fwd_plan(_bench_spec(2048), whole_rows=True) == A.AttentionBlocks("cpu", 2048, 2048)
    assert A.cpu_fwd_plan(_bench_spec(8192), whole_rows=True) == A.AttentionBlocks("cpu", 512, 8192)
    # 32M / (8 x 16384) = 256 rows: too few (XLA split such a chunk, measured): key blocks
    assert A.cpu_fwd_plan(_bench_spec(16384), whole_rows=True).bk == A.CPU_MAX_BLOCK_K
    causal = _bench_spec(4096, causal=True)         # blocks above the diagonal are skipped
    assert A.cpu_fwd_plan(causal, whole_rows=True).bk == A.CPU_SKIP_BLOCK
    # the default follows what this release compiles well
    from hlofuse.core import compat
    assert A.cpu_fwd_plan(spec) == A.cpu_fwd_plan(spec, whole_rows=compat.cpu_fuses_attention_rows())


def test_whole_rows_keep_fully_masked_rows_nan():
    """One key block per row (``online_only``, no guard for an all ``-inf`` row): a row an
    input mask hides entirely is NaN (0/0 before, exp(nan) now), as the original's; the other
    rows match."""
    def f(q, k, v, mask):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * 0.125
        return jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1) @ v
    sq, sk = 24, 600
    rng = np.random.default_rng(0)
    args = [jnp.asarray(rng.standard_normal(s), jnp.float32)
            for s in ((1, 2, sq, 64), (1, 2, sk, 64), (1, 2, sk, 64))]
    mask = np.ones((1, 1, sq, sk), bool)
    mask[..., 3, :] = False                             # row 3 sees no key
    mask[..., 5, 100:] = False
    spec, text, ins = region_of(f, args + [jnp.asarray(mask)])
    ins = [jnp.asarray(mask) if x.dtype == jnp.bool_ else x for x in ins]
    want = run_region(text, ins)
    out = np.asarray(want[0]).reshape(2, sq, 64)       # [heads, rows, d] in either layout
    assert np.isnan(out[:, 3]).all() and not np.isnan(np.delete(out, 3, 1)).any()
    fn = A.build_attention(spec, "cpu", blocks=A.AttentionBlocks("cpu", 8, sk))
    assert fn.blocks == f"cpu row loops bq=8 bk={sk}"
    assert_same(jax.jit(fn)(*ins), want, "reassociate")


def test_cpu_forward_keeps_query_chunks_long_with_many_heads():
    """B=4 H=16: the step budget alone would give 64-row chunks (2M / (64 x 512)); the forward
    keeps them at :data:`CPU_FWD_MIN_BLOCK_Q` rows (measured 0.55x the time, blocks.py)."""
    spec = _bench_spec(1024, b=4, h=16)
    assert A.cpu_budgets()[0] // (spec.n_batch * A.CPU_MAX_BLOCK_K) < A.CPU_FWD_MIN_BLOCK_Q
    fwd = A.build_cpu(spec, parts=1, whole_rows=False).blocks
    assert fwd == f"cpu loops bq={A.CPU_FWD_MIN_BLOCK_Q} bk={A.CPU_MAX_BLOCK_K}", fwd
    # whole rows: 32M / (64 x 1024) = 512 rows (measured 0.46 of jax.jit against 0.68)
    assert A.build_cpu(spec, parts=1, whole_rows=True).blocks == "cpu row loops bq=512 bk=1024"
    assert A.cpu_plan(spec).bq < A.CPU_FWD_MIN_BLOCK_Q       # no minimum by default


def test_split_loops_see_their_own_batch_positions():
    """A part of the split loops (``cpu_split``) evaluates iotas over the split batch axis at
    its own positions (``block_index(part=...)``), the rest as before."""
    spec = _bench_spec(64)                       # B=1, H=8: split along the heads
    ax, bounds = cpu_split(spec, 2)
    assert spec.sizes[spec.batch[ax]] == 8 and bounds == ((0, 4), (4, 8))
    lab = spec.batch[ax]
    whole = block_index(spec, 64, 64, 0, 0)
    part = block_index(spec, 64, 64, 0, 0, part=(lab, 4, 4))
    assert np.asarray(part(lab)).ravel().tolist() == [4, 5, 6, 7]
    assert np.asarray(part(lab)).shape[ax] == 4
    for other in (spec.sq, spec.key):
        assert np.array_equal(np.asarray(part(other)), np.asarray(whole(other)))
    assert cpu_split(spec, 1) == (None, ((0, 1),))   # one part: the loops as they were


def test_cpu_plan_uses_skip_blocks_for_causal():
    spec = _bench_spec(1024, causal=True)
    plan = A.cpu_plan(spec)
    assert plan.bk == A.CPU_SKIP_BLOCK and plan.bq <= A.CPU_SKIP_BLOCK
    assert "+skip" in A.build_attention(spec, "cpu").blocks


@pytest.mark.parametrize("target,bq,bk", [("gpu", 24, 16), ("gpu", 8, 16), ("tpu", 12, 128),
                                          ("tpu", 16, 100), ("cpu", 0, 8)])
def test_invalid_blocks_are_rejected(target, bq, bk):
    with pytest.raises(ValueError):
        A.AttentionBlocks(target, bq, bk)


def test_spec_describes_gqa_and_layout():
    spec, _, _ = _region("causal-gqa")
    assert spec.gqa_groups == 2 and spec.seq_q == spec.seq_k == 37
    assert spec.head_dim == spec.v_head_dim == 8
    assert "gqa=2" in spec.describe()


def test_spec_is_recorded_on_the_region_and_round_trips():
    """The pass matched once and wrote the spec on the function: text and bytecode keep it, and
    reading it back gives the same hashable, IR-free spec (the kernel never matches again)."""
    spec, _, _ = _region("causal-gqa")
    hash(spec)
    assert spec.mask_select is not None and spec.repeat == A.Repeat(spec.repeat.label, 2)
    opt = _KEEP[-1]
    for data in (hir.to_text(opt.module), hir.to_bytecode(opt.module)):
        mod = hir.parse(data)
        (fn,) = [f for f in hir.funcs(mod) if hir.func_name(f).startswith("hlofuse_attention")]
        again = A.spec_from_func(fn)
        assert dataclasses.replace(again, func_text="") == dataclasses.replace(spec, func_text="")
        assert again.digest == spec.digest


def test_region_without_or_disagreeing_with_its_spec_is_not_built():
    spec, _, _ = _region("plain-odd-cross")
    (fn,) = [f for f in hir.funcs(_KEEP[-1].module) if hir.func_name(f).startswith("hlofuse_attention")]
    bad = dataclasses.replace(spec, q_arg=7)
    with fn.context:
        fn.attributes[A.SPEC_ATTR] = ir.StringAttr.get(bad.to_attr())
    with pytest.raises(EmitError, match="does not agree"):
        A.spec_from_func(fn)
    del fn.attributes[A.SPEC_ATTR]
    with pytest.raises(EmitError, match="without a hlofuse.attention"):
        A.spec_from_func(fn)


@pytest.mark.parametrize("dtype,a,b", [(np.float32, 1e19, 1e19), (np.float16, 2e4, 1.0)])
def test_a_scale_above_1_is_applied_where_the_program_applies_it(dtype, a, b):
    """×4 on logits of 1e38 - 1e38 = 0: taken into Q, ``(4a)·b`` overflowed and every output
    was NaN where the program's is finite (f32 and f16; adversarial round). A scale above 1
    is not folded: every cpu build (loop-free, whole rows, key blocks) scales QKᵀ as the
    program does."""
    spec, text, ins = _overflow_region(4.0, dtype, a, b)
    want = run_region(text, ins)
    assert not np.isnan(np.asarray(want[0], np.float32)).any()
    assert A.prescale(spec)[0] == 4.0
    for fn in _cpu_builds(spec):
        assert_same(jax.jit(fn)(*ins), want, "reassociate")


def test_a_scale_of_at_most_1_is_folded_and_where_qk_overflows_gives_the_finite_logits():
    """/8 (1/sqrt(64)) is taken into Q: exact wherever the program's logits do not overflow.
    Where ``Q·Kᵀ`` itself overflows float32 (|q| = |k| = 3e18, D = 64) the program's logits are
    inf and its outputs NaN; the folded logits are the finite products, and the outputs those
    of the attention computed in float64 (the documented difference: guarding it cost 23% more
    peak memory in a training step, see ``folded_scale``)."""
    spec, text, ins = _overflow_region(0.125, np.float32, 3e18, 3e18)
    assert A.prescale(spec)[0] == 0.125
    want = run_region(text, ins)
    assert np.isnan(np.asarray(want[0])).all()
    q, k, v = (np.asarray(ins[i], np.float64) for i in (spec.q_arg, spec.k_arg, spec.v_arg))
    logits = q.reshape(128, 64) @ k.reshape(128, 64).T / 8.0
    p = np.exp(logits - logits.max(-1, keepdims=True))
    exact = (p / p.sum(-1, keepdims=True)) @ v.reshape(128, 64)
    for fn in _cpu_builds(spec):
        got = np.asarray(jax.jit(fn)(*ins)[0], np.float64).reshape(128, 64)
        np.testing.assert_allclose(got, exact, rtol=2e-5, atol=2e-5)


def _overflow_region(scale, dtype, a, b):
    def f(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * jnp.asarray(scale, q.dtype)
        return jax.nn.softmax(s, axis=-1) @ v
    q = np.zeros((1, 1, 128, 64), dtype)
    k = np.zeros((1, 1, 128, 64), dtype)
    if scale > 1:                                   # each logit a·b - a·b = 0, (4a)·b overflows
        q[..., 0], q[..., 1], k[..., 0], k[..., 1] = a, -a, b, b
    else:                                           # Σ a·b overflows, Σ (a/8)·b does not
        q[...], k[...] = a, b
    v = np.random.default_rng(0).standard_normal((1, 1, 128, 64)).astype(dtype)
    spec, text, ins = region_of(f, [jnp.asarray(x) for x in (q, k, v)])
    for i, x in ((spec.q_arg, q), (spec.k_arg, k), (spec.v_arg, v)):
        ins[i] = x.reshape(spec.in_shapes[i])
    return spec, text, ins


def _cpu_builds(spec):
    return [A.build_attention(spec, "cpu"),
            A.build_cpu(spec, A.AttentionBlocks("cpu", 32, 32), parts=1, whole_rows=False),
            A.build_cpu(spec, parts=1, whole_rows=True)]


def test_scale_that_is_not_a_power_of_two_is_not_folded():
    spec, _, _ = region_of(make_attention("bhsd", "none", 1, "nn", "div"),
                           make_args("bhsd", "none", 1, np.float32, 8, 8, d=8))
    assert A.prescale(spec) is None     # sqrt(8) is not a power of two
