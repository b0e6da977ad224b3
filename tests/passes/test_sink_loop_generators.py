"""``sink-loop-generators``: masks generated from iotas outside a ``while`` loop (carried
unchanged, or read from outside the body) are generated again inside it, bit-exactly; the
attention in a scanned training step then takes no ``[.., Sq, Sk]`` mask input."""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.core import ir as hir
from hlofuse.kernels.support import is_splat_constant
from hlofuse.runtime.testing import assert_same
from tests.fusion_util import eval_modules

# a loop of 3 steps: x <- select(tril, x * 2, fill) + bias. The tril mask is generated outside
# and carried unchanged (operand 2); the fill is generated outside and read from the body
# directly (an implicit capture); the bias depends on the argument (not generated); the small
# mask (operand 4, 16 elements) is below the size threshold.
LOOP = """
func.func @main(%x: tensor<64x64xf32>, %b: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %i0 = stablehlo.iota dim = 0 : tensor<64x64xi32>
  %i1 = stablehlo.iota dim = 1 : tensor<64x64xi32>
  %tril = stablehlo.compare GE, %i0, %i1, SIGNED : (tensor<64x64xi32>, tensor<64x64xi32>) -> tensor<64x64xi1>
  %c = stablehlo.constant dense<-1.0e+30> : tensor<f32>
  %fill = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<64x64xf32>
  %s0 = stablehlo.iota dim = 0 : tensor<4x4xi32>
  %s1 = stablehlo.iota dim = 1 : tensor<4x4xi32>
  %small = stablehlo.compare LT, %s0, %s1, SIGNED : (tensor<4x4xi32>, tensor<4x4xi32>) -> tensor<4x4xi1>
  %zero = stablehlo.constant dense<0> : tensor<i32>
  %r:5 = stablehlo.while(%it = %zero, %acc = %x, %m = %tril, %bias = %b, %sm = %small)
      : tensor<i32>, tensor<64x64xf32>, tensor<64x64xi1>, tensor<64x64xf32>, tensor<4x4xi1>
   cond {
    %three = stablehlo.constant dense<3> : tensor<i32>
    %lt = stablehlo.compare LT, %it, %three, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  } do {
    %one = stablehlo.constant dense<1> : tensor<i32>
    %two = stablehlo.constant dense<2.0> : tensor<64x64xf32>
    %n = stablehlo.add %it, %one : tensor<i32>
    %y = stablehlo.multiply %acc, %two : tensor<64x64xf32>
    %z = stablehlo.select %m, %y, %fill : tensor<64x64xi1>, tensor<64x64xf32>
    %w = stablehlo.add %z, %bias : tensor<64x64xf32>
    %sw = stablehlo.not %sm : tensor<4x4xi1>
    %sw2 = stablehlo.not %sw : tensor<4x4xi1>
    stablehlo.return %n, %w, %m, %bias, %sw2 : tensor<i32>, tensor<64x64xf32>, tensor<64x64xi1>, tensor<64x64xf32>, tensor<4x4xi1>
  }
  func.return %r#1 : tensor<64x64xf32>
}
"""


def _body_ops(text: str) -> list:
    module = hir.parse(text)
    loop = next(op for op in hir.all_ops(module) if op.name == "stablehlo.while")
    return [op.name for op in hir.block_ops(loop.regions[1].blocks[0])]


def test_generated_values_are_regenerated_in_the_loop_bit_exactly():
    opt = hlofuse.optimize(LOOP, pipeline=["sink-loop-generators"])
    assert opt.report.passes[0].stats == {"sunk": 2, "loops": 1}
    body = _body_ops(opt.text)
    assert body.count("stablehlo.iota") == 2 and "stablehlo.broadcast_in_dim" in body
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((64, 64)).astype(np.float32) for _ in range(2)]
    got, want = eval_modules([opt.text, LOOP], args)
    np.testing.assert_array_equal(got[0], want[0])
    # rerunning changes nothing: the body reads its own copies now
    again = hlofuse.optimize(opt.text, pipeline=["sink-loop-generators"])
    assert again.report.passes[0].stats == {"sunk": 0, "loops": 0}
    assert again.text == opt.text


def test_a_loop_carrying_a_token_is_left_as_it_is():
    """A while carrying a ``!stablehlo.token`` (ordered effects) has a carried value with no
    tensor type, carried unchanged and read in the body: the pass reads no size from it (it
    failed with an AttributeError)."""
    text = """
func.func @main(%x: tensor<64x64xf32>, %t: !stablehlo.token) -> (tensor<64x64xf32>, !stablehlo.token) {
  %zero = stablehlo.constant dense<0> : tensor<i32>
  %r:3 = stablehlo.while(%i = %zero, %acc = %x, %tok = %t) : tensor<i32>, tensor<64x64xf32>, !stablehlo.token
   cond {
    %three = stablehlo.constant dense<3> : tensor<i32>
    %lt = stablehlo.compare LT, %i, %three, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  } do {
    %one = stablehlo.constant dense<1> : tensor<i32>
    %n = stablehlo.add %i, %one : tensor<i32>
    %tok2 = stablehlo.after_all %tok : !stablehlo.token
    %y = stablehlo.tanh %acc : tensor<64x64xf32>
    stablehlo.return %n, %y, %tok : tensor<i32>, tensor<64x64xf32>, !stablehlo.token
  }
  func.return %r#1, %r#2 : tensor<64x64xf32>, !stablehlo.token
}
"""
    opt = hlofuse.optimize(text, pipeline=["sink-loop-generators"])
    assert opt.report.passes[0].stats == {"sunk": 0, "loops": 0}


def test_disable_turns_it_off():
    opt = hlofuse.optimize(LOOP, pipeline=["sink-loop-generators"],
                           disable=["sink-loop-generators"])
    assert opt.report.passes[0].disabled
    assert "stablehlo.iota" not in _body_ops(opt.text)


def _scanned_causal_step():
    """Two causal attention layers under ``lax.scan`` with remat, as a training step: jax's
    partial evaluation of the scan hoists the causal mask out of the loops."""
    b, s, h, d = 1, 64, 2, 8

    def layer(x, w):
        q, k, v = (x @ w[i] for i in range(3))
        split = lambda t: t.reshape(b, s, h, d)                        # noqa: E731
        a = jax.nn.dot_product_attention(split(q), split(k), split(v), is_causal=True)
        return x + a.reshape(b, s, h * d) @ w[3]
    body = jax.checkpoint(layer)

    def loss(x, ws):
        return jnp.sum(jax.lax.scan(lambda c, w: (body(c, w), None), x, ws)[0] ** 2)
    rng = np.random.default_rng(0)
    args = (rng.standard_normal((b, s, h * d)).astype(np.float32),
            (rng.standard_normal((2, 4, h * d, h * d)) * 0.2).astype(np.float32))
    return jax.value_and_grad(loss, argnums=(0, 1)), args, s


def test_scanned_causal_attention_takes_no_materialized_mask():
    step, args, s = _scanned_causal_step()
    g = hlofuse.jit(step, autotune=False)
    report = g.report(*args)
    (stats,) = [p.stats for p in report.passes if p.name == "sink-loop-generators"]
    assert stats["sunk"] >= 1, stats
    att = [r for r in report.kernels if r.kind.startswith("attention")]
    assert sorted(r.kind for r in att) == ["attention", "attention_bwd", "attention_fwd_lse"]
    square = f",{s},{s}]"
    assert not [t for r in att for t in r.inputs if t.endswith(square)], [r.inputs for r in att]
    assert_same(g(*args), jax.jit(step)(*args), "grad")

    without = hlofuse.jit(step, autotune=False, disable=("sink-loop-generators",)).report(*args)
    assert [t for r in without.kernels if r.kind.startswith("attention")
            for t in r.inputs if t.endswith(square)], "the test no longer shows a hoisted mask"


def test_a_large_dense_constant_is_data_and_stays_outside():
    """A 64x64 f32 table read in the loop is not a generator (larger than the 4 KiB constant-fold
    materializes of an iota-generated mask): copying it into the body would duplicate 16 KiB of
    data in the module."""
    table = ", ".join(f"[{', '.join(str(float(i * 64 + j)) for j in range(64))}]" for i in range(64))
    text = LOOP.replace("%c = stablehlo.constant dense<-1.0e+30> : tensor<f32>\n"
                        "  %fill = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<64x64xf32>",
                        f"%fill = stablehlo.constant dense<[{table}]> : tensor<64x64xf32>")
    assert text != LOOP
    opt = hlofuse.optimize(text, pipeline=["sink-loop-generators"])
    assert opt.report.passes[0].stats == {"sunk": 1, "loops": 1}      # the tril mask only
    module = hir.parse(opt.text)      # kept alive while its ops are read
    tables = [op for op in hir.all_ops(module) if op.name == "stablehlo.constant"
              and not is_splat_constant(op)]
    assert len(tables) == 1
