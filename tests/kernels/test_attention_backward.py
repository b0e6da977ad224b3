"""The training kernels of the attention package (kernels/attention/backward.py): the forward
returning its logsumexp and the flash backward, each against the region function it replaces
compiled by XLA (the program's own forward and backward), with whole and small blocks (padding,
several query chunks and key blocks, causal block skipping), and against the plain-jnp
reference (``jax.vjp`` of the forward reference)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse

from hlofuse.kernels import FAMILIES
from hlofuse.kernels.attention import AttentionBlocks
from hlofuse.kernels.attention.backward import build_cpu_bwd, build_fwd_lse, build_bwd
from hlofuse.kernels.attention.cpu import cpu_split
from hlofuse.kernels.common import func_avals
from hlofuse.core.ops import EmitError
from hlofuse.runtime.testing import assert_same, random_inputs
from tests.attention_programs import BF16, first_rows_see_no_key, make_args, make_attention
from tests.fusion_util import outline, run_region

from hlofuse.core import ir as hir
import re

_KEEP = []


def _text(fn):
    name = hir.func_name(fn)
    text = fn.operation.get_asm(large_elements_limit=1 << 30)
    text = text.replace(f"@{name}", "@main").replace("func.func private", "func.func public")
    return "module {\n" + re.sub(r" attributes \{hlofuse.*\} \{$", " {", text, count=1,
                                  flags=re.M) + "\n}"


def _regions(layout, mask, dtype, sq, sk, learned=False, softmax="nn", gqa=1, b=2):
    f = make_attention(layout, mask, gqa, softmax, "mul")
    args = make_args(layout, mask, gqa, dtype, sq, sk, h=max(4, 2 * gqa), b=b)
    return _step_regions(f, args, tuple(range(len(args))) if learned else (0, 1, 2))


def _step_regions(f, args, argn=(0, 1, 2), passes="fuse-attention"):
    """The (forward-with-lse, backward) functions ``fuse-attention`` (after ``passes``' others)
    outlines from the training step ``value_and_grad(sum(f(*args)**2))``."""
    def loss(*a):
        return jnp.sum(f(*a).astype(jnp.float32) ** 2)
    out = outline(jax.value_and_grad(loss, argnums=argn), args, passes)
    _KEEP.append(out)
    (ffn,) = out.funcs("attention_fwd_lse")
    (bfn,) = out.funcs("attention_bwd")
    return ffn, bfn


def _inputs(ffn, bfn, seed=1):
    fwd_in = random_inputs(func_avals(ffn), seed)
    for a in fwd_in:
        if a.dtype == np.bool_:
            a[..., 0] = True
    o_lse = run_region(_text(ffn), fwd_in)
    fs = FAMILIES["attention_fwd_lse"].spec_from_func(ffn)
    o, lse = o_lse[fs.o_index], o_lse[1 - fs.o_index]
    do_aval = func_avals(bfn)[-1]
    rng = np.random.default_rng(seed + 1)
    do = rng.standard_normal(do_aval.shape).astype(do_aval.dtype)
    return fs, fwd_in, [np.asarray(o), np.asarray(lse), do], o_lse


CASES = [(("bshd", "causal", np.float32, False), (8, 16)),
         (("bhsd", "bias", np.float32, True), (8, 16)),
         (("bshd", "causal", np.float32, False, 2), (8, 16)),      # GQA, repeat in the region
         (("bhsd", "bias", np.float32, True, 2), None)]


@pytest.mark.parametrize("case,blocks", CASES, ids=lambda c: (
    f"{c[0]}-{c[1]}-{np.dtype(c[2]).name}" + ("-learned" if c[3] else "")
    + (f"-gqa{c[4]}" if len(c) > 4 else "")) if isinstance(c, tuple)
    and len(c) >= 4 else (f"blocks{c[0]}x{c[1]}" if c else "whole"))
def test_flash_backward_matches_the_program(case, blocks):
    layout, mask, dt, learned = case[:4]
    gqa = case[4] if len(case) > 4 else 1
    ffn, bfn = _regions(layout, mask, dt, 20, 24, learned, gqa=gqa)
    if gqa > 1:
        # the K/V heads are repeated inside the regions: both read the unrepeated K/V and the
        # backward returns their gradients (summed over each group of query heads)
        fspec = FAMILIES["attention_fwd_lse"].spec_from_func(ffn).fwd
        assert fspec.repeat is not None and fspec.repeat.groups == gqa
        kv_shape = tuple(func_avals(ffn)[fspec.k_arg].shape)
        assert kv_shape in [tuple(r.shape) for r in func_avals(bfn)]
        assert [tuple(t.shape) for t in bfn.type.results].count(kv_shape) == 2
    fs, fwd_in, extra, o_lse = _inputs(ffn, bfn)
    bl = AttentionBlocks("cpu", *blocks) if blocks else None
    # the forward: output and logsumexp
    got = build_fwd_lse(fs, "cpu", blocks=bl)(*fwd_in)
    o_i = fs.o_index
    assert_same(np.asarray(got[o_i]), np.asarray(o_lse[o_i]), "reassociate")
    # lse is f32; the program's own (the fallback) has the logits' precision
    x_dt = np.dtype(hir.np_dtype(fs.fwd.x_dtype))
    assert_same(np.asarray(got[1 - o_i]).astype(x_dt), np.asarray(o_lse[1 - o_i]).astype(x_dt),
                "reassociate")
    # the backward
    bs = FAMILIES["attention_bwd"].spec_from_func(bfn)
    ins = list(fwd_in) + extra
    truth = run_region(_text(bfn), ins)
    # split into independent loops along the largest batch axis (3 parts: uneven; a bias that
    # broadcasts along that axis gets the sum of the parts' gradients)
    kernel = build_cpu_bwd(bs, bl, parts=3)
    assert f" x{len(cpu_split(bs.fwd, 3)[1])}" in kernel.blocks
    if mask == "causal" and blocks:
        assert "+skip" in kernel.blocks       # key blocks above the diagonal are skipped
    got = kernel(*ins)
    assert len(got) == len(truth) == (4 if learned else 3)
    assert_same([np.asarray(g) for g in got], [np.asarray(t) for t in truth], "grad")
    ref = FAMILIES["attention_bwd"].reference(bs)(*ins)
    assert_same([np.asarray(g) for g in ref], [np.asarray(t) for t in truth], "grad")


def test_fully_masked_rows_with_a_finite_fill():
    """Rows whose keys are all masked with a finite fill get uniform weights; their gradients
    match the program's (a -inf fill gives NaN rows in both, checked end to end)."""
    f = make_attention("bhsd", "bool_full", 1, "nn", "mul", "-1e9")
    args = make_args("bhsd", "bool_full", 1, np.float32, 16, 16)
    args[3][0, 3, :] = False
    ffn, bfn = _step_regions(f, args)
    fs, fwd_in, extra, _ = _inputs(ffn, bfn)
    (mask_in,) = [a for a in fwd_in if a.dtype == np.bool_]
    mask_in[...] = args[3].reshape(mask_in.shape)
    o_lse = run_region(_text(ffn), fwd_in)
    extra[0], extra[1] = np.asarray(o_lse[fs.o_index]), np.asarray(o_lse[1 - fs.o_index])
    bs = FAMILIES["attention_bwd"].spec_from_func(bfn)
    ins = list(fwd_in) + extra
    got = build_cpu_bwd(bs, AttentionBlocks("cpu", 8, 8))(*ins)
    assert_same([np.asarray(g) for g in got], [np.asarray(t) for t in run_region(_text(bfn), ins)],
                "grad")



@pytest.mark.parametrize("target,seq", [("cpu", 300), ("gpu", 40), ("tpu", 136)])
def test_rows_with_every_key_masked_get_no_nan_from_padding_keys(target, seq):
    """A row with every key masked has p = exp(-inf - -inf) = NaN at every key, and a padding
    key (past Sk, up to the block size) passes the position mask (its side values are 0):
    the backward must give it no gradient, so dQ of that row is the program's 0, not NaN
    (adversarial round: dQ was NaN for those rows when Sk was not a multiple of the key
    block; cpu: two 256-key blocks for 300 keys)."""
    from jax.experimental.pallas import tpu as pltpu
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((1, seq, 2, 16)).astype(np.float32) for _ in range(3)]
    # (constant-fold first, as the pipeline does: the mask's positions become a constant)
    ffn, bfn = _step_regions(first_rows_see_no_key, args, passes="constant-fold,fuse-attention")
    fs, fwd_in, extra, _ = _inputs(ffn, bfn)
    (pos,) = [i for i, a in enumerate(fwd_in) if a.dtype == np.int32]   # the folded j + 5
    fwd_in[pos] = (np.arange(seq, dtype=np.int32) + 5).reshape(fwd_in[pos].shape)
    interp = {"cpu": None, "gpu": True, "tpu": pltpu.InterpretParams()}[target]
    blocks = None if target == "cpu" else _pallas_blocks(target, seq)
    o_lse = jax.jit(build_fwd_lse(fs, target, interpret=interp, blocks=blocks))(*fwd_in)
    extra[0], extra[1] = np.asarray(o_lse[fs.o_index]), np.asarray(o_lse[1 - fs.o_index])
    bs = FAMILIES["attention_bwd"].spec_from_func(bfn)
    ins = list(fwd_in) + extra
    truth = [np.asarray(t) for t in run_region(_text(bfn), ins)]
    kernel = build_bwd(bs, target, interpret=interp, blocks=blocks)
    if target == "cpu":
        assert "bk=256" in kernel.blocks
    got = [np.asarray(g) for g in jax.jit(kernel)(*ins)]
    dq = got[dict((g, i) for i, (g, _) in enumerate(bs.outs))[fs.fwd.q_arg]]
    assert not np.isnan(dq).any() and not np.take(dq, range(5), axis=dq.shape.index(seq)).any()
    assert_same(got, truth, "grad")


@pytest.mark.parametrize("target,seq,mask,shifted", [
    ("cpu", 40, "causal", False), ("cpu", 300, "none", False), ("gpu", 40, "causal", False),
    ("tpu", 40, "causal", False), ("cpu", 40, "causal", True), ("gpu", 40, "causal", True),
    ("tpu", 40, "causal", True)])
def test_one_hot_softmax_rows_get_exact_zero_gradients(target, seq, mask, shifted):
    """Q and K scaled so each row's logits are ~1e7 apart: every softmax row is one-hot, and
    the gradients of Q and K are exactly zero (XLA's ``p·dP - p·rowsum(p·dP)`` cancels).

    Two things must hold for the flash backward to get the same zeros. Its ``dP -
    rowsum(dO·O)`` is a rounding there, which ``dQ = dS·K`` scales by ``|K|``:
    :func:`~hlofuse.kernels.attention.online_softmax.logit_grad` gives those rows 0 (dQ 5e-3
    off before). And its logits must round as the forward's did, whose row max it subtracts:
    an ulp of 1e7 is 1, and ``exp(±1)`` is no rounding (dQ 0.13 off when it computed QKᵀ in
    another dot form than the forward). The kernels run with the blocks a program gets (cpu:
    the forward's and the backward's own plans; at S=300 they differ: one 300-key block and
    two 256-key blocks).

    ``shifted``: the forward's row max one ulp up, as a forward that rounds its logits
    otherwise gives it (other blocks or dot form; XLA's own forward, where a measured decision
    kept it). Every backward then takes its statistics from its own logits
    (:func:`~hlofuse.kernels.attention.online_softmax.needs_own_stats`); before, the Triton and
    Mosaic kernels read the forward's and were off by e^-1 there."""
    from jax.experimental.pallas import tpu as pltpu
    ffn, bfn = _regions("bshd", mask, np.float32, seq, seq)
    fs, fwd_in, extra, _ = _inputs(ffn, bfn)
    for a in (fs.fwd.q_arg, fs.fwd.k_arg):
        fwd_in[a] = fwd_in[a] * np.float32(3000.0)
    bs = FAMILIES["attention_bwd"].spec_from_func(bfn)
    interp = {"cpu": None, "gpu": True, "tpu": pltpu.InterpretParams()}[target]
    blocks = None if target == "cpu" else _pallas_blocks(target, seq)
    o_lse = jax.jit(build_fwd_lse(fs, target, interpret=interp, blocks=blocks))(*fwd_in)
    extra[0], extra[1] = np.asarray(o_lse[fs.o_index]), np.asarray(o_lse[1 - fs.o_index])
    ins = list(fwd_in) + extra
    truth = [np.asarray(t) for t in run_region(_text(bfn), ins)]
    if shifted:
        stats = np.array(ins[bs.lse_arg])
        assert stats.shape[-1] == 2 and np.abs(stats[..., 0]).max() > 1e6
        stats[..., 0] = np.nextafter(stats[..., 0], np.float32(np.inf))
        ins[bs.lse_arg] = stats
    kernel = build_bwd(bs, target, interpret=interp, blocks=blocks)
    if target == "cpu" and seq == 300:
        assert "bk=256" in kernel.blocks and "bk=256" not in build_fwd_lse(fs, "cpu").blocks
    got = [np.asarray(g) for g in jax.jit(kernel)(*ins)]
    grads = {g: i for i, (g, _) in enumerate(bs.outs)}
    for arg in (fs.fwd.q_arg, fs.fwd.k_arg):
        assert not truth[grads[arg]].any()
        np.testing.assert_array_equal(got[grads[arg]], truth[grads[arg]])
    v = grads[fs.fwd.v_arg]
    assert np.abs(truth[v]).max() > 0.1          # dV = pᵀ·dO is not zero: the rows are one-hot
    assert_same(got[v], truth[v], "grad")


def test_own_statistics_bound():
    """The backward computes its own row statistics where max|q_i|·max|k_j| reaches
    ``OWN_STATS_BOUND`` (2^14), and reads the forward's below it."""
    from hlofuse.kernels.attention.online_softmax import (OWN_STATS_BOUND as _OWN_STATS_BOUND,
                                                          needs_own_stats as _needs_own_stats)
    q = np.zeros((2, 3, 8, 16), np.float32)
    k = np.zeros((2, 8, 16), np.float32)
    q[1, 2, 5, 3], k[0, 7, 9] = 128.0, 127.0          # 16256: below
    assert 128.0 * 127.0 < _OWN_STATS_BOUND and not bool(_needs_own_stats(q, k))
    k[1, 2, 0] = 128.0                                # 16384: reached
    assert bool(_needs_own_stats(q, k))

PALLAS_CASES = [("bshd", "causal", np.float32, False), ("bhsd", "bias", np.float32, True),
                ("mqa", "bool", np.float32, False), ("bhsd", "causal", BF16, False),
                ("bshd", "causal", np.float32, False, 2),
                # B=1, 8 query heads over 2 K/V heads: jax sums dK/dV over the unit batch dim
                # and the group in one reduce, so the region's dK/dV have no batch dim
                ("bshd", "causal", np.float32, False, 4, 1)]


def _pallas_blocks(target, sk):
    return (AttentionBlocks("gpu", 16, 16) if target == "gpu"
            else AttentionBlocks("tpu", 8, 128))


@pytest.mark.parametrize("target", ["gpu", "tpu"])
@pytest.mark.parametrize("case", PALLAS_CASES, ids=lambda c: f"{c[0]}-{c[1]}-{np.dtype(c[2]).name}"
                         + ("-learned" if c[3] else "") + (f"-gqa{c[4]}" if len(c) > 4 else "")
                         + (f"-b{c[5]}" if len(c) > 5 else ""))
def test_pallas_training_kernels_in_interpret_mode(case, target):
    """The Triton (Pallas interpret mode) and Mosaic (TPU interpret mode) forward-with-lse and
    flash backward against the program's own regions (compiled by XLA): padding rows and keys
    (Sq=20, Sk=24), several query and key blocks on gpu, causal skipping, a learned bias
    broadcast over the batch (its gradient summed back), MQA (K/V without a head dim), bf16,
    GQA with the K/V repeat inside the regions (dK/dV summed over each group's query heads)."""
    from jax.experimental.pallas import tpu as pltpu
    layout, mask, dt, learned = case[:4]
    gqa = case[4] if len(case) > 4 else 1
    ffn, bfn = _regions(layout, mask, dt, 20, 24, learned, gqa=gqa, b=case[5] if len(case) > 5 else 2)
    assert (FAMILIES["attention_fwd_lse"].spec_from_func(ffn).fwd.repeat is not None) == (gqa > 1)
    fs, fwd_in, extra, o_lse = _inputs(ffn, bfn)
    interp = True if target == "gpu" else pltpu.InterpretParams()
    bl = _pallas_blocks(target, 24)
    fwd = build_fwd_lse(fs, target, interpret=interp, blocks=bl)
    got = jax.jit(fwd)(*fwd_in)
    o_i = fs.o_index
    assert_same(np.asarray(got[o_i]), np.asarray(o_lse[o_i]), "reassociate")
    x_dt = np.dtype(hir.np_dtype(fs.fwd.x_dtype))
    assert_same(np.asarray(got[1 - o_i]).astype(x_dt), np.asarray(o_lse[1 - o_i]).astype(x_dt),
                "reassociate")
    bs = FAMILIES["attention_bwd"].spec_from_func(bfn)
    ins = list(fwd_in) + extra
    truth = run_region(_text(bfn), ins)
    kernel = build_bwd(bs, target, interpret=interp, blocks=bl)
    assert kernel.kernel_name.startswith("hlofuse_attention_bwd_")
    if mask == "causal" and target == "gpu":
        assert "+skip" in kernel.blocks
    got = jax.jit(kernel)(*ins)
    assert len(got) == len(truth) == (4 if learned else 3)
    assert_same([np.asarray(g) for g in got], [np.asarray(t) for t in truth], "grad")


def test_tpu_backward_skips_key_blocks_above_the_diagonal():
    """Sq=Sk=136: two 128-key blocks, and query blocks of rows < 128 skip the second one in
    both Mosaic kernels (dK/dV over query blocks, dQ over key blocks)."""
    from jax.experimental.pallas import tpu as pltpu
    ffn, bfn = _regions("bhsd", "causal", np.float32, 136, 136)
    fs, fwd_in, extra, _ = _inputs(ffn, bfn)
    bs = FAMILIES["attention_bwd"].spec_from_func(bfn)
    ins = list(fwd_in) + extra
    kernel = build_bwd(bs, "tpu", interpret=pltpu.InterpretParams(),
                       blocks=AttentionBlocks("tpu", 64, 128))
    assert "+skip" in kernel.blocks
    assert_same([np.asarray(g) for g in jax.jit(kernel)(*ins)],
                [np.asarray(t) for t in run_region(_text(bfn), ins)], "grad")


def test_pallas_backward_lowers_for_gpu_and_tpu():
    """The kernels lower to a Triton / Mosaic custom call from this machine (the compile proof
    at S=8192 is the deviceless matrix, .ci/aot_matrix.py)."""
    from hlofuse.kernels.lowering import lower_to_text
    ffn, bfn = _regions("bhsd", "causal", np.float32, 256, 256)
    bs = FAMILIES["attention_bwd"].spec_from_func(bfn)
    fs = FAMILIES["attention_fwd_lse"].spec_from_func(ffn)
    for target, marker in (("gpu", "__gpu$xla.gpu.triton"), ("tpu", "tpu_custom_call")):
        assert lower_to_text(build_bwd(bs, target), func_avals(bfn), target).count(marker) >= 2
        assert marker in lower_to_text(build_fwd_lse(fs, target), func_avals(ffn), target)


def test_f16_on_tpu_is_refused():
    """f16 has no TPU kernel: the build says so (the region stays with XLA)."""
    ffn, bfn = _regions("mqa", "bool", np.float16, 16, 16)
    bs = FAMILIES["attention_bwd"].spec_from_func(bfn)
    with pytest.raises(EmitError, match="f16"):
        build_bwd(bs, "tpu")
    fs, fwd_in, extra, _ = _inputs(ffn, bfn)
    ins = list(fwd_in) + extra
    assert_same([np.asarray(g) for g in build_bwd(bs, "cpu")(*ins)],
                [np.asarray(t) for t in run_region(_text(bfn), ins)], "grad")


def test_cpu_backward_plans_a_smaller_step_block_than_the_forward():
    """The backward's own cost-model rule (``cpu_bwd_plan``): at S=1024 the forward plan is
    512-key blocks, the backward's key blocks are :data:`CPU_BWD_MAX_BLOCK_K` and its step
    block is smaller than the forward's; its query chunks are at least
    :data:`CPU_BWD_MIN_BLOCK_Q` rows however many heads share a step; it is the plan
    ``build_cpu_bwd`` uses by default; the gradients match the program's with it."""
    from hlofuse.kernels.attention import blocks as B
    ffn, bfn = _regions("bshd", "none", np.float32, 1024, 1024)
    bs = FAMILIES["attention_bwd"].spec_from_func(bfn)
    fwd_budget, bwd_budget = B.cpu_budgets()
    fwd, bwd = B.cpu_plan(bs.fwd, budget=fwd_budget), B.cpu_bwd_plan(bs.fwd)
    per_row = bs.fwd.n_batch * bs.fwd.n_group
    assert per_row * bwd.bq * bwd.bk < per_row * fwd.bq * fwd.bk
    assert per_row * bwd.bq * bwd.bk <= max(bwd_budget, per_row * B.CPU_BWD_MIN_BLOCK_Q * bwd.bk)
    assert bwd.bk == B.CPU_BWD_MAX_BLOCK_K < fwd.bk == 512
    assert bwd.bq >= min(B.CPU_BWD_MIN_BLOCK_Q, 1024)
    many = dataclasses.replace(bs.fwd, label_sizes=tuple(
        (lb, 64 if lb in bs.fwd.batch else n) for lb, n in bs.fwd.label_sizes))
    assert B.cpu_bwd_plan(many).bq == B.CPU_BWD_MIN_BLOCK_Q      # the budget alone: 1..4 rows
    kernel = build_cpu_bwd(bs, parts=1)
    assert kernel.blocks == f"cpu loops {bwd}"
    two = B.cpu_bwd_plan(bs.fwd, parts=2)          # 2 loops over 2 of the 4 heads: per loop
    assert two.bq >= bwd.bq
    assert build_cpu_bwd(bs, parts=2).blocks == f"cpu loops {two} x2"
    fs, fwd_in, extra, _ = _inputs(ffn, bfn)
    ins = list(fwd_in) + extra
    assert_same([np.asarray(g) for g in jax.jit(kernel)(*ins)],
                [np.asarray(t) for t in run_region(_text(bfn), ins)], "grad")


def _dot_kinds(hlo: str) -> list:
    """Per ``dot`` of a compiled XLA:CPU module: True when it runs in the YNNPACK library (its
    computation is called by a ``__ynn_fusion``), False for a bare (Eigen) dot."""
    calls = {}
    for m in re.finditer(r"^\s*(?:ROOT )?%\S+ = .*? fusion\(.*?calls=%([\w.\-]+)(.*)$", hlo, re.M):
        calls[m.group(1)] = '"__ynn_fusion"' in m.group(2)
    kinds = []
    for m in re.finditer(r"^%(\S+) \(.*?\) -> .*? \{\n(.*?)\n\}", hlo, re.S | re.M):
        kinds += [calls.get(m.group(1), False)] * len(re.findall(r" dot\(", m.group(2)))
    return kinds


@pytest.mark.parametrize("mask,gqa", [("none", 1), ("causal", 2)])
def test_cpu_loop_dots_are_library_dots(mask, gqa):
    """Every per-block dot of the cpu forward and backward loops is lhs [B.., M, K] ·
    rhs [B.., K, N] (or an rhs XLA:CPU's YNNPACK takes transposed), so XLA runs each as a
    library dot (``__ynn_fusion``), not an Eigen dot thunk: QKᵀ with Kᵀ built once, and the
    backward's dKᵀ = Qᵀ·dS, dVᵀ = dOᵀ·P (module docstring of kernels/attention/backward.py).
    Shapes where YNN applies (f32, blocks of 32, d=16, GQA rows contracted with the query rows).
    Without GQA the TN form (dSᵀ·Q, Pᵀ·dO) had two bare dots; with GQA XLA copied the lhs into
    the NN form per block (a transpose per dot), which the NN form has no need for."""
    f = make_attention("bshd", mask, gqa, "nn", "mul")
    args = make_args("bshd", mask, gqa, np.float32, 64, 64, h=4, d=16)
    ffn, bfn = _step_regions(f, args)
    bl = AttentionBlocks("cpu", 32, 32)
    fs = FAMILIES["attention_fwd_lse"].spec_from_func(ffn)
    bs = FAMILIES["attention_bwd"].spec_from_func(bfn)
    for kernel, fn in ((build_fwd_lse(fs, "cpu", blocks=bl), ffn),
                       (build_cpu_bwd(bs, bl, parts=1), bfn)):
        avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in func_avals(fn)]
        kinds = _dot_kinds(jax.jit(kernel).lower(*avals).compile().as_text())
        assert kinds and all(kinds), (kernel.kernel_name, kinds)


def _causal_vjp_case(s=128, d=32):
    r = np.random.default_rng(0)
    q, k, v = (r.standard_normal((1, s, 2, d)).astype(np.float32) for _ in range(3))
    causal = np.tril(np.ones((s, s), bool))

    def attn(q, k, v):
        x = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(jnp.where(causal, x, -jnp.inf), -1), v)

    def vj(q, k, v, ct):
        o, f = jax.vjp(attn, q, k, v)
        return f(ct) + (o,)
    return r, q, k, v, vj


@pytest.mark.parametrize("case", ["nan-cotangent", "inf-cotangent", "nan-masked-value",
                                  "one-hot-rows-cancelling-cotangent"])
def test_one_hot_rows_keep_non_finite_gradients_and_exact_zeros(case):
    """A row whose softmax is exactly one-hot (causal row 0) got ``dx = 0``: a NaN or inf
    cotangent there vanished from dQ/dK (adversarial round); it is kept now. The exact 0 stays
    for finite values, also where ``dO·V`` cancels and the rounding of ``dP - delta`` is all
    there is (every row one-hot, each cotangent row orthogonal to its key's value: jax.jit's
    dQ is 0, a size-based test of that rounding gave 0.0086; found by review)."""
    r, q, k, v, vj = _causal_vjp_case()
    ct = r.standard_normal(q.shape).astype(np.float32)
    if case == "nan-cotangent":
        ct[0, 0, 0, 0] = np.nan
    elif case == "inf-cotangent":
        ct[0, 0, 0, 0] = np.inf
    elif case == "nan-masked-value":
        v[0, -1, 0, 0] = np.nan
    else:
        s, d = q.shape[1], q.shape[-1]
        q[:] = 0.0
        q[..., 0] = 1.0
        k = (k * 0.01).astype(np.float32)
        k[0, :, :, 0] = (np.arange(s) * 1e3)[:, None]     # row i's largest logit is key i's
        c64, v64 = ct.astype(np.float64), v.astype(np.float64)
        ct = (c64 - np.sum(c64 * v64, -1, keepdims=True) / np.sum(v64 * v64, -1, keepdims=True)
              * v64).astype(np.float32)
    h = hlofuse.jit(vj, tiered=False, autotune=False)
    kinds = sorted(x.kind for x in h.lower(q, k, v, ct).report.kernels)
    assert "attention_bwd" in kinds, kinds
    for got, want in zip(h(q, k, v, ct), jax.jit(vj)(q, k, v, ct)):
        got, want = np.asarray(got), np.asarray(want)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        fin = np.isfinite(want)
        scale = np.max(np.abs(want[fin])) if fin.any() else 1.0
        np.testing.assert_allclose(got[fin], want[fin], rtol=2e-5, atol=2e-5 * scale)
