"""``batchnorm-fold``: inference BatchNorm chains after constant-weight conv/dot_general are
folded into the weights plus one bias add (golden IR, no-match cases, differential within the
``reassociate`` tolerance, idempotence)."""

from __future__ import annotations

import numpy as np
import pytest

import hlofuse
from hlofuse.runtime.testing import assert_same
from hlofuse.runtime.execute import run_module

PASS = ["batchnorm-fold"]
RNG = np.random.default_rng(0)


def lit(a: np.ndarray) -> str:
    a = np.ascontiguousarray(a, np.float32)
    return f'dense<"0x{a.tobytes().hex().upper()}"> : tensor<{"x".join(map(str, a.shape))}xf32>'


def vec(c=2, lo=-1.0, hi=1.0) -> np.ndarray:
    return RNG.uniform(lo, hi, (1, c, 1, 1)).astype(np.float32)


W = RNG.standard_normal((2, 3, 1, 1)).astype(np.float32)   # OIHW, 3 -> 2 channels
ACT = "tensor<2x2x4x4xf32>"
CONV = (f"%y = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], "
        f"window = {{}} {{batch_group_count = 1 : i64, feature_group_count = 1 : i64}} : "
        f"(tensor<2x3x4x4xf32>, tensor<2x3x1x1xf32>) -> {ACT}")


def bcast(name, src):
    return f"  %{name} = stablehlo.broadcast_in_dim %{src}, dims = [0, 1, 2, 3] : (tensor<1x2x1x1xf32>) -> {ACT}"


def conv_bn(weight_arg=False, extra_use=False, runtime_shift=False) -> str:
    """conv -> (y - mean) * rsqrt(var + eps) * gamma + beta, constants as JAX/flax emit them
    once rsqrt(var + eps) of frozen parameters has been folded."""
    args = "%x: tensor<2x3x4x4xf32>" + (", %w: tensor<2x3x1x1xf32>" if weight_arg else "") + \
        (", %s: tensor<1x2x1x1xf32>" if runtime_shift else "")
    lines = [] if weight_arg else [f"  %w = stablehlo.constant {lit(W)}"]
    lines += [f"  {CONV}",
              f"  %m = stablehlo.constant {lit(vec())}" if not runtime_shift else "  %m = stablehlo.negate %s : tensor<1x2x1x1xf32>",
              f"  %is = stablehlo.constant {lit(vec(lo=0.5, hi=2.0))}",
              f"  %g = stablehlo.constant {lit(vec())}",
              f"  %b = stablehlo.constant {lit(vec())}",
              bcast("mb", "m"), f"  %0 = stablehlo.subtract %y, %mb : {ACT}",
              bcast("isb", "is"), f"  %1 = stablehlo.multiply %0, %isb : {ACT}",
              bcast("gb", "g"), f"  %2 = stablehlo.multiply %1, %gb : {ACT}",
              bcast("bb", "b"), f"  %3 = stablehlo.add %2, %bb : {ACT}"]
    ret, rtype = "%3", ACT
    if extra_use:
        ret, rtype = "%3, %y", f"{ACT}, {ACT}"
    return f"func.func @main({args}) -> ({rtype}) {{\n" + "\n".join(lines) + \
        f"\n  return {ret} : {rtype}\n}}"


WD = RNG.standard_normal((8, 5)).astype(np.float32)
DOT_BN = f"""
func.func @main(%x: tensor<3x8xf32>) -> tensor<3x5xf32> {{
  %w = stablehlo.constant {lit(WD)}
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<3x8xf32>, tensor<8x5xf32>) -> tensor<3x5xf32>
  %s = stablehlo.constant {lit(RNG.uniform(0.5, 2, (5,)))}
  %t = stablehlo.constant {lit(RNG.uniform(-1, 1, (5,)))}
  %sb = stablehlo.broadcast_in_dim %s, dims = [1] : (tensor<5xf32>) -> tensor<3x5xf32>
  %tb = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<5xf32>) -> tensor<3x5xf32>
  %two = stablehlo.constant dense<2.0> : tensor<3x5xf32>
  %0 = stablehlo.divide %y, %two : tensor<3x5xf32>
  %1 = stablehlo.multiply %sb, %0 : tensor<3x5xf32>
  %2 = stablehlo.subtract %tb, %1 : tensor<3x5xf32>
  return %2 : tensor<3x5xf32>
}}"""

# conv + bias only: one shift, nothing to fold
CONV_BIAS = f"""
func.func @main(%x: tensor<2x3x4x4xf32>) -> {ACT} {{
  %w = stablehlo.constant {lit(W)}
  {CONV}
  %b = stablehlo.constant {lit(vec())}
{bcast("bb", "b")}
  %0 = stablehlo.add %y, %bb : {ACT}
  return %0 : {ACT}
}}"""


def stats(o):
    return next(p.stats for p in o.report.passes if p.name == "batchnorm-fold")


def inputs(text):
    from tests.module_args import edge_args  # shapes from the module
    return [RNG.standard_normal(a.shape).astype(np.float32) for a in edge_args(text)]


@pytest.mark.parametrize("text,n_add", [(conv_bn(), 1), (DOT_BN, 1)], ids=["conv-nchw", "dot"])
def test_folds_into_weights(text, n_add):
    o = hlofuse.optimize(text, pipeline=PASS)
    assert stats(o)["folded"] == 1
    t = o.text
    assert "stablehlo.subtract" not in t and "stablehlo.multiply" not in t and "stablehlo.divide" not in t
    assert t.count("stablehlo.add") == n_add
    xs = inputs(text)
    assert_same(run_module(t, xs), run_module(text, xs), "reassociate")
    again = hlofuse.optimize(t, pipeline=PASS)
    assert stats(again)["folded"] == 0 and again.text == t
    assert refusals(o) == {} and refusals(again) == {}


def test_scale_only_needs_no_bias():
    text = conv_bn().replace("%3 = stablehlo.add %2, %bb", "%3 = stablehlo.multiply %2, %bb") \
                    .replace("%0 = stablehlo.subtract %y, %mb", "%0 = stablehlo.multiply %y, %mb")
    o = hlofuse.optimize(text, pipeline=PASS)
    assert stats(o)["folded"] == 1
    assert "stablehlo.multiply" not in o.text and "stablehlo.add" not in o.text
    xs = inputs(text)
    assert_same(run_module(o.text, xs), run_module(text, xs), "reassociate")


def refusals(o) -> dict:
    return {k: v for k, v in stats(o).items() if k.startswith("refused[")}


@pytest.mark.parametrize("text,reason", [
    (conv_bn(weight_arg=True), "weight is not a constant"),
    (conv_bn(extra_use=True), "result has other users"),
    (conv_bn(runtime_shift=True), "shift is not a per-channel constant"),
    (CONV_BIAS, None),  # one bias add is already the folded form: nothing refused
], ids=["weights-are-arguments", "conv-output-used-twice", "runtime-shift", "bias-only"])
def test_no_match(text, reason):
    before = hlofuse.optimize(text, pipeline="none").text
    o = hlofuse.optimize(text, pipeline=PASS)
    assert stats(o)["folded"] == 0 and o.text == before
    assert refusals(o) == ({} if reason is None else {f"refused[{reason}]": 1})


def test_flax_style_batchnorm_with_frozen_params():
    """JAX-emitted BN (x - mean) * rsqrt(var + eps) * scale + bias over a dense layer's output:
    after freezing, the cleanup passes leave one dot_general and one add."""
    import jax
    import jax.numpy as jnp

    w = RNG.standard_normal((8, 6)).astype(np.float32)
    p = {"mean": RNG.standard_normal(6).astype(np.float32),
         "var": RNG.uniform(0.5, 2, 6).astype(np.float32),
         "scale": RNG.standard_normal(6).astype(np.float32),
         "bias": RNG.standard_normal(6).astype(np.float32)}

    def layer(params, x):
        w, bn = params
        y = x @ w
        mul = jax.lax.rsqrt(bn["var"] + 1e-5) * bn["scale"]
        return (y - bn["mean"]) * mul + bn["bias"]

    x = RNG.standard_normal((4, 8)).astype(np.float32)
    f = hlofuse.jit(layer, freeze_argnums=0, target="cpu",
                    pipeline=["inline-calls", "canonicalize", "cse", "constant-fold",
                              "algebraic-simplify", "batchnorm-fold", "cse", "canonicalize"])
    low = f.lower((w, p), x)
    text = low.as_text()
    assert text.count("stablehlo.dot_general") == 1
    assert "stablehlo.multiply" not in text and "stablehlo.subtract" not in text
    assert text.count("stablehlo.add") == 1
    assert next(q.stats for q in low.report.passes if q.name == "batchnorm-fold")["folded"] == 1
    assert_same(f((w, p), x), jax.jit(layer)((w, p), x), "reassociate")


def _layernorm_qkv(params, x):
    """Pre-LN block head: LayerNorm (gamma, beta) feeding the Q/K/V projections, and the same
    normalized value once more into an MLP dot: every reader is a dot with frozen weights."""
    import jax.numpy as jnp
    mu = jnp.mean(x, axis=-1, keepdims=True)
    n = (x - mu) * jax_rsqrt(jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True) + 1e-5)
    y = n * params["g"] + params["b"]
    return tuple(y @ params[k] for k in ("q", "k", "v"))


def jax_rsqrt(v):
    import jax
    return jax.lax.rsqrt(v)


def test_layernorm_scale_shift_folds_into_the_next_dots():
    import jax
    p = {"g": RNG.uniform(0.5, 1.5, 16).astype(np.float32), "b": RNG.standard_normal(16).astype(np.float32),
         **{k: RNG.standard_normal((16, 8)).astype(np.float32) for k in ("q", "k", "v")}}
    x = RNG.standard_normal((4, 16)).astype(np.float32)
    f = hlofuse.jit(_layernorm_qkv, freeze_argnums=0, target="cpu",
                    pipeline=["inline-calls", "canonicalize", "cse", "constant-fold", "algebraic-simplify",
                              "batchnorm-fold", "cse", "canonicalize"])
    low = f.lower(p, x)
    st = next(q.stats for q in low.report.passes if q.name == "batchnorm-fold")
    assert st["folded_into_next"] == 3
    text = low.as_text()
    plain = hlofuse.jit(_layernorm_qkv, freeze_argnums=0, target="cpu", disable=["batchnorm-fold"],
                        pipeline=["inline-calls", "canonicalize", "cse", "constant-fold", "algebraic-simplify",
                                  "batchnorm-fold", "cse", "canonicalize"]).lower(p, x).as_text()
    # gamma's multiply and beta's add are gone from the (M, K) side; one (M, N) bias add per dot
    assert text.count("stablehlo.multiply") == plain.count("stablehlo.multiply") - 1
    assert text.count("stablehlo.add") == plain.count("stablehlo.add") - 1 + 3
    assert_same(f(p, x), jax.jit(_layernorm_qkv)(p, x), "reassociate")
    again = hlofuse.optimize(text, pipeline=PASS)
    assert stats(again)["folded_into_next"] == 0 and again.text == hlofuse.optimize(text, pipeline="none").text


def test_affine_before_a_runtime_weight_is_refused():
    text = """
func.func @main(%x: tensor<3x4xf32>, %w: tensor<4x2xf32>) -> tensor<3x2xf32> {
  %g = stablehlo.constant dense<[1.5, 0.5, 2.0, 1.0]> : tensor<4xf32>
  %gb = stablehlo.broadcast_in_dim %g, dims = [1] : (tensor<4xf32>) -> tensor<3x4xf32>
  %y = stablehlo.multiply %x, %gb : tensor<3x4xf32>
  %z = stablehlo.dot_general %y, %w, contracting_dims = [1] x [0] : (tensor<3x4xf32>, tensor<4x2xf32>) -> tensor<3x2xf32>
  return %z : tensor<3x2xf32>
}"""
    before = hlofuse.optimize(text, pipeline="none").text
    o = hlofuse.optimize(text, pipeline=PASS)
    assert stats(o)["folded_into_next"] == 0 and o.text == before
    assert refusals(o) == {"refused[weight is not a constant]": 1}


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_a_fold_that_overflows_the_weights_type_is_refused(dtype):
    """A scale that is finite but makes ``w * s`` overflow the weights' type (f16: a dead
    channel's rsqrt(0 + 1e-5) = 316 times gamma 40 times |w| up to 8; f32: gamma 1e36) turned
    jax.jit's finite (f16) or inf (f32) results into NaN everywhere (adversarial round)."""
    import jax
    import jax.numpy as jnp

    def dense_bn(params, x):
        w, mean, inv, g, b = params
        return ((x @ w - mean) * inv) * g + b

    k = n = 64
    g = np.full(n, 40.0 if dtype == "float16" else 1e36)
    params = tuple(jnp.asarray(a, dtype) for a in (RNG.uniform(-8, 8, (k, n)), np.zeros(n),
                                                   np.full(n, 316.0), g, np.zeros(n)))
    x = jnp.asarray(RNG.uniform(-0.01, 0.01, (16, k)), dtype)
    f = hlofuse.jit(dense_bn, freeze_argnums=0, target="cpu", tiered=False, autotune=False)
    low = f.lower(params, x)
    assert refusals(low) == {"refused[folded weight or shift overflows its type]": 1}
    assert stats(low)["folded"] == 0
    got = np.asarray(f(params, x), np.float64)
    want = np.asarray(jax.jit(dense_bn)(params, x), np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))


def test_an_affine_map_whose_fold_overflows_the_next_dots_weights_is_refused():
    """``fold_into_next`` checks the folded weights and bias in their types too."""
    import jax
    p = {"g": np.full(16, 1e36, np.float32), "b": RNG.standard_normal(16).astype(np.float32),
         **{k: RNG.standard_normal((16, 8)).astype(np.float32) for k in ("q", "k", "v")}}
    p["k"][3, 5] = 1000.0                       # 1e39 after the fold: f32's maximum is 3.4e38
    x = RNG.standard_normal((4, 16)).astype(np.float32) * 1e-3
    f = hlofuse.jit(_layernorm_qkv, freeze_argnums=0, target="cpu", tiered=False, autotune=False,
                    pipeline=["inline-calls", "canonicalize", "cse", "constant-fold",
                              "algebraic-simplify", "batchnorm-fold", "cse", "canonicalize"])
    low = f.lower(p, x)
    assert refusals(low) == {"refused[folded weight or shift overflows its type]": 1}
    assert stats(low)["folded_into_next"] == 0
    for got, want in zip(f(p, x), jax.jit(_layernorm_qkv)(p, x)):
        got, want = np.asarray(got), np.asarray(want)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
