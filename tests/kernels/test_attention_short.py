"""The loop-free cpu attention for short sequences (kernels/attention/short.py).

Each case: the path is chosen (its block description says so), and it matches the outlined
region compiled by XLA on its own within the ``reassociate`` tolerance (the normalization
moves after P·V, as in the flash loops). End to end, ``hlofuse.jit`` of a BERT-style attention
uses it (no while loop left in the module) and matches ``jax.jit``.
"""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.kernels import attention as A
from hlofuse.runtime.testing import assert_same
from tests.fusion_util import run_region
from tests.attention_regions import bench_spec as _bench_spec, region as _region, strict_causal_region


@pytest.mark.parametrize("case", ["plain-odd-cross", "causal-gqa", "causal-finite-fill", "tril-mqa",
                                  "bool-padding", "additive", "bias-gqa", "causal-bf16"])
def test_short_path_matches_the_region(case):
    spec, text, ins = _region(case)
    assert A.short_fits(spec)
    fn = A.build_attention(spec, "cpu")                 # no blocks given: the short path
    assert "no loop" in fn.blocks and fn.kernel_name.startswith("hlofuse_attention_cpu_")
    assert_same(jax.jit(fn)(*ins), run_region(text, ins), "reassociate")


def test_short_path_keeps_fully_masked_rows_nan():
    """Strict causal with -inf: row 0 sees no key; the original softmax gives NaN there."""
    spec, text, ins = strict_causal_region()
    want = run_region(text, ins)
    assert np.isnan(want[0][:, :, 0]).all()
    fn = A.build_attention(spec, "cpu")
    assert "no loop" in fn.blocks
    got = jax.jit(fn)(*ins)
    assert np.isnan(np.asarray(got[0])[:, :, 0]).all()
    assert_same(got, want, "reassociate")


def test_long_sequences_keep_the_loops():
    spec = _bench_spec(4096)
    assert not A.short_fits(spec)
    assert "loops" in A.build_attention(spec, "cpu").blocks       # key blocks or whole rows
    small = _bench_spec(256)                            # 8 heads x 256 x 256: fits
    assert A.short_fits(small)
    assert A.build_attention(small, "cpu", blocks=A.cpu_plan(small)).blocks.startswith("cpu loops")
    causal = _bench_spec(512, causal=True)              # the loops skip blocks above the diagonal
    assert not A.short_fits(causal) and "+skip" in A.build_attention(causal, "cpu").blocks


def test_jit_bert_style_attention_uses_the_short_path():
    """BSHD inputs, an additive padding mask, 1/sqrt(d) scale, as bench's BERT layer."""
    def f(q, k, v, mask):
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * 0.125 + mask
        return jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, axis=-1), v)
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 48, 4, 64)), jnp.float32) for _ in range(3))
    mask = np.zeros((1, 1, 1, 48), np.float32)
    mask[..., 40:] = -1e9
    args = (q, k, v, jnp.asarray(mask))
    hf = hlofuse.jit(f, autotune=False)
    report = str(hf.report(*args))
    assert "hlofuse_attention_cpu_" in report and "no loop" in report
    assert "stablehlo.while" not in hf.lower(*args).as_text()
    assert_same(hf(*args), jax.jit(f)(*args), "reassociate")
