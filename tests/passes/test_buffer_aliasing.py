"""``buffer-aliasing``: donated arguments aliased to outputs (golden IR, XLA's alias bytes), the
donation auditor's warnings, the liveness-based memory plan, idempotence, and the in-place
update acceptance test through ``hlofuse.jit``."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import hlofuse
from hlofuse.passes.buffer_aliasing import DonationWarning
from hlofuse.runtime.testing import assert_same
from hlofuse.runtime.execute import run_module
from hlofuse.runtime.testing import ALL_KERNELS

PASS = ["buffer-aliasing"]

# output 0 is unrelated to %x, output 1 updates %x in place: the donation goes to output 1
UPDATE = """
func.func @main(%x: tensor<4x8xf32>, %y: tensor<3xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<f32>) {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %i = stablehlo.constant dense<1> : tensor<i32>
  %row = stablehlo.constant dense<7.0> : tensor<1x8xf32>
  %e = stablehlo.exponential %x : tensor<4x8xf32>
  %u = stablehlo.dynamic_update_slice %x, %row, %i, %i : (tensor<4x8xf32>, tensor<1x8xf32>, tensor<i32>, tensor<i32>) -> tensor<4x8xf32>
  %s = stablehlo.reduce(%y init: %z) applies stablehlo.add across dimensions = [0] : (tensor<3xf32>, tensor<f32>) -> tensor<f32>
  return %e, %u, %s : tensor<4x8xf32>, tensor<4x8xf32>, tensor<f32>
}"""

# 1 KiB argument, two 1 KiB temporaries, 1 KiB output: peak 4 KiB, 3 KiB when x is aliased
CHAIN = """
func.func @main(%x: tensor<256xf32>) -> tensor<256xf32> {
  %a = stablehlo.exponential %x : tensor<256xf32>
  %b = stablehlo.exponential %a : tensor<256xf32>
  %c = stablehlo.add %a, %b : tensor<256xf32>
  return %c : tensor<256xf32>
}"""


def optimize(text, donated=(), **kw):
    return hlofuse.optimize(text, pipeline=PASS, donated_args=donated, **kw)


def stats(o):
    return next(p.stats for p in o.report.passes if p.name == "buffer-aliasing")


def alias_bytes(text) -> int:
    import jax.extend as jex
    be = jex.backend.get_backend("cpu")
    exe = be.compile_and_load(text, [be.local_devices()[0]],
                              jex.backend.get_compile_options(num_replicas=1, num_partitions=1))
    return exe.get_compiled_memory_stats().alias_size_in_bytes


def test_donated_argument_aliases_the_in_place_output():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DonationWarning)
        o = optimize(UPDATE, donated=(0,))
    assert "%arg0: tensor<4x8xf32> {tf.aliasing_output = 1 : i32}" in o.text
    assert [{k: v for k, v in r.items() if k != "name"} for r in o.report.aliases] == [
        {"output": 1, "argument": 0, "bytes": 128, "type": "f32[4,8]"}]
    assert o.report.aliases[0]["name"].startswith("argument 0")
    assert stats(o)["aliases_added"] == 1
    assert alias_bytes(o.text) == 128 and alias_bytes(UPDATE) == 0
    xs = [np.arange(32, dtype=np.float32).reshape(4, 8), np.ones(3, np.float32)]
    assert_same(run_module(o.text, xs), run_module(UPDATE, xs), "exact")


def test_no_donation_no_attributes():
    o = optimize(UPDATE)
    assert "tf.aliasing_output" not in o.text and o.report.aliases == []
    assert o.report.memory["peak_live_bytes_before"] == o.report.memory["peak_live_bytes_after"]


def test_memory_plan_peak():
    plain = optimize(CHAIN).report.memory
    donated = optimize(CHAIN, donated=(0,)).report.memory
    assert plain["peak_live_bytes_after"] == 4096 and plain["argument_bytes"] == 1024
    assert donated["peak_live_bytes_before"] == 4096
    assert donated["peak_live_bytes_after"] == 3072  # the output lives in x's buffer
    assert donated["alias_bytes"] == 1024


def test_auditor_warns_when_no_output_matches():
    with pytest.warns(DonationWarning, match=r"argument 1 .*f32\[3\].*no output has the same shape"):
        o = optimize(UPDATE, donated=(1,))
    assert "tf.aliasing_output" not in o.text
    assert any("argument 1" in n and "cannot be used" in n for n in o.report.notes)
    assert stats(o)["donations_unusable"] == 1


def test_auditor_warns_when_outputs_are_taken():
    text = CHAIN.replace("%x: tensor<256xf32>", "%x: tensor<256xf32>, %y: tensor<256xf32>")
    with pytest.warns(DonationWarning, match=r"argument 1 .*already aliased \(output 0 by argument 0\)"):
        o = optimize(text, donated=(0, 1))
    assert o.text.count("tf.aliasing_output") == 1


def test_auditor_warns_on_bad_index():
    with pytest.warns(DonationWarning, match="out of range"):
        optimize(CHAIN, donated=(5,))


def test_idempotent_and_keeps_existing_aliases():
    once = optimize(UPDATE, donated=(0,))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DonationWarning)
        twice = optimize(once.text, donated=(0,))
    assert twice.text == once.text and stats(twice)["aliases_added"] == 0
    assert twice.report.aliases == once.report.aliases


def test_jit_in_place_update_aliases_all_output_bytes():
    """Acceptance: an in-place update with donation; XLA's alias bytes equal the output bytes."""
    import jax
    import jax.numpy as jnp

    def step(x, g):
        return x.at[3].set(0.0) - 0.1 * g

    f = hlofuse.jit(step, donate_argnums=0, target="cpu")
    x = jnp.arange(64 * 64, dtype=jnp.float32).reshape(64, 64)
    g = jnp.ones((64, 64), jnp.float32)
    low = f.lower(x, g)
    assert [{k: v for k, v in r.items() if k != "name"} for r in low.report.aliases] == [
        {"output": 0, "argument": 0, "bytes": x.nbytes, "type": "f32[64,64]"}]
    mem = low.compile().memory_analysis()
    assert mem.alias_size_in_bytes == mem.output_size_in_bytes == x.nbytes
    ref = jax.jit(step)(x, g)
    out = f(x, g)
    assert x.is_deleted()
    assert_same(out, ref, "kernel")


def test_jit_unusable_donation_warns():
    def f(x, y):
        return (x * y).sum()

    g = hlofuse.jit(f, donate_argnums=1, target="cpu")
    with pytest.warns(DonationWarning, match=r"argument 1 .*cannot be used"):
        g.lower(np.ones(8, np.float32), np.ones(8, np.float32))


# %d (a dot result) dies at the elementwise kernel: the kernel may write its output over it
EPILOGUE = """
func.func @main(%x: tensor<64x32xf32>, %w: tensor<32x128xf32>) -> tensor<64x128xf32> {
  %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<64x32xf32>, tensor<32x128xf32>) -> tensor<64x128xf32>
  %c = stablehlo.constant dense<2.0> : tensor<64x128xf32>
  %m = stablehlo.multiply %d, %c : tensor<64x128xf32>
  %y = stablehlo.tanh %m : tensor<64x128xf32>
  return %y : tensor<64x128xf32>
}"""
KERNEL_PIPE = ["fuse-elementwise", "kernelize", "symbol-dce", "canonicalize", "buffer-aliasing"]
ALIAS_ATTR = "output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = [], operand_index = 0"


@pytest.mark.parametrize("target,call", [("gpu", "__gpu$xla.gpu.triton"), ("tpu", "tpu_custom_call")])
def test_in_place_elementwise_kernel(target, call):
    o = hlofuse.optimize(EPILOGUE, target=target, pipeline=KERNEL_PIPE, options=ALL_KERNELS)
    assert o.report.kernels and call in o.text
    assert ALIAS_ATTR in o.text and stats(o)["in_place_kernels"] == 1
    # the kernel's output reuses the dot's buffer: one 32 KiB buffer less at the peak
    mem = o.report.memory
    assert mem["peak_live_bytes_before"] - mem["peak_live_bytes_after"] == 64 * 128 * 4
    again = hlofuse.optimize(o.text, target=target, pipeline=PASS)
    assert again.text == o.text


def test_no_in_place_when_the_input_stays_live():
    text = EPILOGUE.replace("return %y : tensor<64x128xf32>",
                            "return %y, %d : tensor<64x128xf32>, tensor<64x128xf32>") \
                   .replace("-> tensor<64x128xf32> {", "-> (tensor<64x128xf32>, tensor<64x128xf32>) {", 1)
    o = hlofuse.optimize(text, target="gpu", pipeline=KERNEL_PIPE, options=ALL_KERNELS)
    assert o.report.kernels and "output_operand_aliases" not in o.text
    assert stats(o)["in_place_kernels"] == 0


def test_report_names_the_bytes_donate_argnums_would_save():
    """A training step called without donate_argnums: its parameters have the types of the new
    parameters; the report says which and how many bytes donating them saves. With donation,
    no advice (the pass aliases them instead); under the threshold, none either."""
    import jax
    import jax.numpy as jnp

    def step(w, b, x):
        g = jax.grad(lambda w, b: ((x @ w + b) ** 2).sum(), argnums=(0, 1))(w, b)
        return w - 0.1 * g[0], b - 0.1 * g[1]
    args = (jnp.ones((512, 1024)), jnp.ones((1024,)), jnp.ones((8, 512)))
    rep = hlofuse.jit(step).report(*args)
    (note,) = [n for n in rep.notes if "not donated" in n]
    want = (512 * 1024 + 1024) * 4
    assert "2 argument(s)" in note and f"{want / 2**20:.1f} MiB" in note and "argument 0" in note
    rep = hlofuse.jit(step, donate_argnums=(0, 1)).report(*args)
    assert not [n for n in rep.notes if "not donated" in n]
    assert [r["argument"] for r in rep.aliases] == [0, 1]
    assert not [n for n in hlofuse.jit(step).report(jnp.ones((512, 8)), jnp.ones((8,)),
                                                    args[2]).notes if "not donated" in n]
