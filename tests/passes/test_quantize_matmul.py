"""``quantize-matmul``: fake-quant dots become int8 x int8 -> int32 dots with the dequant scales
after the sum, weight-only scales move past the dot (golden IR, no-match cases with their
reasons, differential within the ``quantize`` tolerance, idempotence), and the quantized
linear -> GELU -> linear chain as JAX users write it becomes at most 3 kernels with exact
integer matmul results."""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax

import hlofuse
from hlofuse.runtime.execute import run_module
from hlofuse.runtime.testing import assert_same
from tests.fusion_util import kernels
from hlofuse.runtime.testing import ALL_KERNELS

PASS = ["quantize-matmul"]
R = np.random.default_rng(3)
F32 = jnp.float32

# per-tensor activation scale, per-output-channel weight scale (the AQT / qwix fake-quant form)
FAKE = """
func.func @main(%xq: tensor<4x16xi8>, %wq: tensor<16x8xi8>, %sw: tensor<8xf32>) -> tensor<4x8xf32> {
  %x = stablehlo.convert %xq : (tensor<4x16xi8>) -> tensor<4x16xf32>
  %sx = stablehlo.constant dense<0.05> : tensor<4x16xf32>
  %xd = stablehlo.multiply %x, %sx : tensor<4x16xf32>
  %w = stablehlo.convert %wq : (tensor<16x8xi8>) -> tensor<16x8xf32>
  %swb = stablehlo.broadcast_in_dim %sw, dims = [1] : (tensor<8xf32>) -> tensor<16x8xf32>
  %wd = stablehlo.multiply %w, %swb : tensor<16x8xf32>
  %y = stablehlo.dot_general %xd, %wd, contracting_dims = [1] x [0] : (tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}"""

# the weight scale varies along K (the contracting dim): it does not factor out of the sum
ALONG_K = FAKE.replace("%sw: tensor<8xf32>", "%sw: tensor<16xf32>") \
              .replace("dims = [1] : (tensor<8xf32>)", "dims = [0] : (tensor<16xf32>)")

# asymmetric quantization: (convert(q) - zero_point) * s is refused (the dot stays float)
ZERO_POINT = FAKE.replace(
    "%xd = stablehlo.multiply %x, %sx : tensor<4x16xf32>",
    "%zp = stablehlo.constant dense<3.0> : tensor<4x16xf32>\n"
    "  %xz = stablehlo.subtract %x, %zp : tensor<4x16xf32>\n"
    "  %xd = stablehlo.multiply %xz, %sx : tensor<4x16xf32>")

# the dequantized weights are also returned: the float copy would stay live
OTHER_USE = FAKE.replace("-> tensor<4x8xf32> {", "-> (tensor<4x8xf32>, tensor<16x8xf32>) {") \
                .replace("return %y : tensor<4x8xf32>", "return %y, %wd : tensor<4x8xf32>, tensor<16x8xf32>")

# per-token activation scales (one per row of x, a (4,) vector along the lhs free dim)
PER_TOKEN = FAKE.replace("%sw: tensor<8xf32>) ->", "%sw: tensor<8xf32>, %st: tensor<4xf32>) ->").replace(
    "%sx = stablehlo.constant dense<0.05> : tensor<4x16xf32>",
    "%sx = stablehlo.broadcast_in_dim %st, dims = [0] : (tensor<4xf32>) -> tensor<4x16xf32>")

# int4 weights (widened to int8 exactly) against int8 activations
INT4 = FAKE.replace("%wq: tensor<16x8xi8>", "%wq: tensor<16x8xi4>").replace(
    "(tensor<16x8xi8>) -> tensor<16x8xf32>", "(tensor<16x8xi4>) -> tensor<16x8xf32>")

WEIGHT_ONLY = """
func.func @main(%x: tensor<4x16xf32>, %wq: tensor<16x8xi8>, %sw: tensor<8xf32>) -> tensor<4x8xf32> {
  %w = stablehlo.convert %wq : (tensor<16x8xi8>) -> tensor<16x8xf32>
  %swb = stablehlo.broadcast_in_dim %sw, dims = [1] : (tensor<8xf32>) -> tensor<16x8xf32>
  %wd = stablehlo.multiply %swb, %w : tensor<16x8xf32>
  %y = stablehlo.dot_general %x, %wd, contracting_dims = [1] x [0] : (tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}"""


# bf16 dequantization: each q·s is rounded to bf16 (the program's meaning); a scale moved past
# the dot would skip that rounding (off by up to 0.5 on values of 55: adversarial round)
BF16_DEQUANT = WEIGHT_ONLY.replace("f32>", "bf16>").replace("xf32>", "xbf16>")

# f32 operands with an f16 result (preferred_element_type=f16): the unscaled dot of a weight-only
# rewrite would overflow f16 before its scale
WEIGHT_ONLY_F16_OUT = WEIGHT_ONLY.replace(
    "-> tensor<4x8xf32> {", "-> tensor<4x8xf16> {").replace(
    "(tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>",
    "(tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf16>").replace(
    "return %y : tensor<4x8xf32>", "return %y : tensor<4x8xf16>")

# constant scales so large that (qa·sa)(qb·sb) overflows float32 in one form and not the other
HUGE_SCALES = FAKE.replace("dense<0.05>", "dense<1.0e+30>").replace(
    "%swb = stablehlo.broadcast_in_dim %sw, dims = [1] : (tensor<8xf32>) -> tensor<16x8xf32>",
    "%swb = stablehlo.constant dense<1.0e+10> : tensor<16x8xf32>")


def stats(o):
    return next(p.stats for p in o.report.passes if p.name == "quantize-matmul")


def inputs(text):
    """Full-range int8 (int4) values and small signed scales, by the module's argument types."""
    from hlofuse.core import ir as hir
    mod = hir.parse(text, hir.new_context())
    out = []
    for a in hir.main_func(mod).regions[0].blocks[0].arguments:
        info = hir.tensor_type_info(a.type)
        shape = tuple(info.shape)
        if info.dtype in ("i8", "i4"):
            lo = -128 if info.dtype == "i8" else -8
            out.append(R.integers(lo, -lo, shape).astype(hir.np_dtype(info.dtype)))
        else:
            out.append(R.uniform(0.001, 0.02, shape).astype(np.float32) * R.choice([-1, 1], shape))
    return out


@pytest.mark.parametrize("text,pattern", [(FAKE, "fake-quant-dot"), (PER_TOKEN, "fake-quant-dot"),
                                          (INT4, "fake-quant-dot"), (WEIGHT_ONLY, "weight-only-scale")],
                         ids=["per-tensor-x-per-channel", "per-token", "int4-weights", "weight-only"])
def test_rewrites_and_is_idempotent(text, pattern):
    o = hlofuse.optimize(text, pipeline=PASS)
    st = stats(o)
    assert st[pattern] == 1 and st["rewrites"] == 1
    t = o.text
    if pattern == "fake-quant-dot":
        assert "(tensor<4x16xi8>, tensor<16x8xi8>) -> tensor<4x8xi32>" in t
        if text is PER_TOKEN:
            assert "dims = [0] : (tensor<4xf32>) -> tensor<4x8xf32>" in t   # the row scale, after the dot
    else:
        assert "(tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>" in t and "stablehlo.convert" in t
    xs = inputs(text)
    assert_same(run_module(t, xs), run_module(text, xs), "quantize")
    again = hlofuse.optimize(t, pipeline=PASS)
    assert stats(again)["rewrites"] == 0 and again.text == t


@pytest.mark.parametrize("text,reason", [
    (ALONG_K, "refused[scale varies along the contracting dim]"),
    (OTHER_USE, "refused[dequantized operand has other users]"),
    (ZERO_POINT, "refused[zero-point (asymmetric) dequantization]"),
    (BF16_DEQUANT, "refused[bf16 dequantization (each q·s is rounded to 16 bits, which a scale "
                   "moved past the dot would not be)]"),
    (WEIGHT_ONLY_F16_OUT, "refused[f16 result (the unscaled dot would be rounded, or overflow, "
                          "in f16 before its scale)]"),
    (HUGE_SCALES, "refused[constant scales so large that a product or sum could overflow "
                  "float32 (it would in one form and not the other)]"),
], ids=["scale-along-k", "other-users", "zero-point", "bf16-dequant", "f16-result", "huge-scales"])
def test_no_match(text, reason):
    before = hlofuse.optimize(text, pipeline="none").text
    o = hlofuse.optimize(text, pipeline=PASS)
    st = stats(o)
    assert st["rewrites"] == 0 and o.text == before
    refused = {k: v for k, v in st.items() if k.startswith("refused[")}
    assert refused == ({} if reason is None else {reason: 1})
    if reason:
        assert any("left in float" in n for n in o.report.notes)


def test_options_disable_patterns():
    o = hlofuse.optimize(FAKE, pipeline=PASS, options={"quantize-matmul": {"fake_quant": False}})
    assert stats(o)["rewrites"] == 0 and stats(o)["refused[disabled by option]"] == 1


# ---- the quantized MLP as JAX users write it, through the default pipeline ------------------

SX1, SX2 = 0.05, 0.02


def quant(x, s):
    return jnp.clip(jnp.round(x / s), -127, 127).astype(jnp.int8)


def idot(a, b):
    return lax.dot_general(a, b, (((a.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.int32)


def int8_mlp(x, w1, s1, b1, w2, s2, b2):
    h = jax.nn.gelu(idot(quant(x, SX1), w1).astype(F32) * (SX1 * s1) + b1)
    return idot(quant(h, SX2), w2).astype(F32) * (SX2 * s2) + b2


def fake_quant_mlp(x, w1, s1, b1, w2, s2, b2):
    h = jax.nn.gelu((quant(x, SX1).astype(F32) * SX1) @ (w1.astype(F32) * s1) + b1)
    return (quant(h, SX2).astype(F32) * SX2) @ (w2.astype(F32) * s2) + b2


def mlp_args(m=16, k=64, h=128):
    return (R.standard_normal((m, k)).astype(np.float32), R.integers(-127, 128, (k, h)).astype(np.int8),
            R.uniform(1e-3, 1e-2, h).astype(np.float32), R.standard_normal(h).astype(np.float32),
            R.integers(-127, 128, (h, k)).astype(np.int8), R.uniform(1e-3, 1e-2, k).astype(np.float32),
            R.standard_normal(k).astype(np.float32))


@pytest.mark.parametrize("target", ["cpu", "gpu", "tpu"])
def test_quantized_linear_gelu_linear_is_three_kernels(target):
    args = mlp_args()
    for fn in (int8_mlp, fake_quant_mlp):
        f = hlofuse.jit(fn, target=target, autotune=False, options=ALL_KERNELS)
        rep = f.report(*args)
        assert len(kernels(rep)) <= 3 and len(kernels(rep, "matmul_epilogue")) == 2, str(rep)
        assert all(r.kernel for r in rep.regions), str(rep)
        # the first int8 matmul's kernel writes the requantized int8 activations of the second
        assert any(r.outputs == ["i8[16,128]"] for r in kernels(rep, "matmul_epilogue")), str(rep)
        if fn is fake_quant_mlp:
            assert next(p.stats for p in rep.passes if p.name == "quantize-matmul")["fake-quant-dot"] == 2
        if target == "cpu":
            # int8_mlp: the kernels run XLA's own int8 dots and the same epilogue ops: bit for bit
            want = jax.jit(fn)(*args)
            assert_same(f(*args), want, "exact" if fn is int8_mlp else "quantize")


def test_first_layer_int32_accumulation_exact_end_to_end():
    x, w1 = mlp_args()[:2]
    fn = lambda x, w: idot(quant(x, SX1), w)  # noqa: E731   the int32 accumulator itself
    g = lambda x, w: jax.nn.relu(fn(x, w))  # noqa: E731     with an integer epilogue
    f = hlofuse.jit(g, autotune=False)
    assert len(kernels(f.report(x, w1), "matmul_epilogue")) == 1
    exact = np.maximum(np.asarray(quant(x, SX1)).astype(np.int64) @ w1.astype(np.int64), 0)
    assert np.array_equal(np.asarray(f(x, w1)), exact)


def test_quantized_types_are_refused_with_the_reason():
    text = """
func.func @main(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %q = stablehlo.uniform_quantize %x : (tensor<4x8xf32>) -> tensor<4x8x!quant.uniform<i8:f32, 0.05>>
  %d = stablehlo.uniform_dequantize %q : (tensor<4x8x!quant.uniform<i8:f32, 0.05>>) -> tensor<4x8xf32>
  return %d : tensor<4x8xf32>
}"""
    with pytest.raises(hlofuse.core.ir.IRError, match="quant dialect"):
        hlofuse.optimize(text)


def test_int8_transformer_block_fuses_every_int8_linear():
    """A GPT-2-style block with every linear int8 (Q/K/V share their quantized input and
    become one horizontal int8 kernel): no int8 dot is left to XLA; on cpu every kernel but
    the attention's is bit-identical to jax.jit of the same program, and with the fused
    attention (online softmax: reassociated) requantized values may flip by one step, category
    ``requantize`` (bench int8_block S=512: 3 flips, 3.2e-3 relative)."""
    from bench import workloads as W
    params, x = W._int8_block_args(s=16, d=64, ff=128)(np.random.default_rng(0))
    fn = lambda p, x: W.int8_block(p, x, n_heads=2)  # noqa: E731
    f = hlofuse.jit(fn, autotune=False)
    rep = f.report(params, x)
    # nothing int8 refused (int8-dot-unsigned may say it kept the signed dots on this CPU)
    refusals = [n for n in rep.notes if "kept signed x signed" not in n]
    assert not any("integer or boolean matmul" in n or "int8" in n for n in refusals), rep.notes
    mm = [r for r in rep.kernels if r.kind in ("matmul_epilogue", "horizontal")]
    assert len(mm) >= 4 and all(r.kernel for r in rep.regions if r.kind == "horizontal"), str(rep)
    want = jax.jit(fn)(params, x)
    assert_same(f(params, x), want, "requantize")
    g = hlofuse.jit(fn, autotune=False, disable=["fuse-attention"])
    assert len([r for r in g.report(params, x).kernels if r.kind in ("matmul_epilogue", "horizontal")]) == len(mm)
    assert_same(g(params, x), want, "exact")


def _fakeq(xq, wq, sx, sw):
    return (xq.astype(jnp.float32) * sx) @ (wq.astype(jnp.float32) * sw)


def _weight_only(x, wq, sw):
    return x @ (wq.astype(jnp.float32) * sw)


def _nan_inf(got, want):
    got, want = np.asarray(got), np.asarray(want)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    assert_same(got[fin], want[fin], "quantize")


@pytest.mark.parametrize("case", ["sx-inf", "sw-col-inf", "sw-col-nan", "weight-only-inf"])
def test_a_scale_that_is_not_finite_gives_nan_as_the_float_dot_does(case):
    """The float dot multiplies an inf scale by the operand's zeros and sums infinities of both
    signs: NaN. The exact integer sum times inf gave ±inf instead (adversarial round)."""
    r = np.random.default_rng(1)
    xq = jnp.asarray(r.integers(-127, 128, (32, 128)), jnp.int8)
    wq = jnp.asarray(r.integers(-127, 128, (128, 64)), jnp.int8)
    sw = jnp.asarray(r.uniform(0.001, 0.01, 64), jnp.float32)
    sx = jnp.float32(0.02)
    if case == "weight-only-inf":
        x = jnp.asarray(r.standard_normal((32, 128)), jnp.float32)
        args, fn = (x, wq, sw.at[5].set(jnp.inf)), _weight_only
    else:
        if case == "sx-inf":
            sx = jnp.float32(jnp.inf)
        else:
            sw = sw.at[3].set(jnp.inf if case == "sw-col-inf" else jnp.nan)
        args, fn = (xq, wq, sx, sw), _fakeq
    f = hlofuse.jit(fn, target="cpu", tiered=False, autotune=False)
    low = f.lower(*args)
    assert next(p.stats for p in low.report.passes if p.name == "quantize-matmul")["rewrites"] == 1
    _nan_inf(f(*args), jax.jit(fn)(*args))


def test_a_frozen_scale_that_is_not_finite_is_refused():
    r = np.random.default_rng(2)
    xq = jnp.asarray(r.integers(-127, 128, (32, 128)), jnp.int8)
    wq = jnp.asarray(r.integers(-127, 128, (128, 64)), jnp.int8)
    sw = jnp.asarray(r.uniform(0.001, 0.01, 64), jnp.float32).at[7].set(jnp.inf)
    fn = lambda wq, sw, xq: _fakeq(xq, wq, jnp.float32(0.02), sw)   # noqa: E731
    f = hlofuse.jit(fn, freeze_argnums=(0, 1), target="cpu", tiered=False, autotune=False)
    low = f.lower(wq, sw, xq)
    st = next(p.stats for p in low.report.passes if p.name == "quantize-matmul")
    assert st["rewrites"] == 0 and st["refused[scale is not finite (the float dot gives NaN)]"] == 1, st
    _nan_inf(f(wq, sw, xq), jax.jit(fn)(wq, sw, xq))


def test_fake_quant_with_a_16_bit_result_scales_in_f32():
    """``dot(f32(qa)·sa, f32(qb)·sb)`` with an f16 result: the exact int32 sum converted to f16
    first gave inf above 65504 where the program's scaled products were small (K=1024: all but
    a few elements; adversarial round). The scales are applied in f32, then one rounding."""
    text = FAKE.replace("4x16", "4x1024").replace("16x8", "1024x8").replace(
        "-> tensor<4x8xf32> {", "-> tensor<4x8xf16> {").replace(
        "(tensor<4x1024xf32>, tensor<1024x8xf32>) -> tensor<4x8xf32>",
        "(tensor<4x1024xf32>, tensor<1024x8xf32>) -> tensor<4x8xf16>").replace(
        "return %y : tensor<4x8xf32>", "return %y : tensor<4x8xf16>")
    o = hlofuse.optimize(text, pipeline=PASS)
    assert stats(o)["fake-quant-dot"] == 1
    xs = inputs(text)
    xs[0] = np.full_like(xs[0], 127)
    xs[1] = np.full_like(xs[1], 127)                 # the int32 sum: 1024·127² > 65504
    want, got = run_module(text, xs), run_module(o.text, xs)
    assert np.isfinite(np.asarray(want[0], np.float32)).all()
    assert_same(got, want, "quantize")
