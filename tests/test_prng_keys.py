"""Typed PRNG keys (``jax.random.key``: an extended dtype) as ``hlofuse.jit`` arguments and
results, as dropout training steps and NNX's ``Rngs`` pass them: the same bits as ``jax.jit``
under every call path (tiered first call, the built module, a second process's module cache)
and under grad and vmap. StableHLO carries a key as its uint32 key data; hlofuse's module does
too, and the keys are wrapped again on both sides.
"""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import hlofuse
from hlofuse.runtime import program as runtime
from hlofuse.runtime.testing import assert_same
from hlofuse.runtime import module_cache as mc

X = jnp.asarray(np.random.default_rng(0).standard_normal((16, 32)).astype(np.float32))
W = jnp.asarray(np.random.default_rng(1).standard_normal((32, 32)).astype(np.float32) * 0.2)


def dropout_layer(w, x, key):
    """A dense layer, softmax and dropout: a kernel region beside the random bits."""
    h = jax.nn.softmax(x @ w, axis=-1)
    keep = jax.random.bernoulli(key, 0.8, h.shape)
    return jnp.where(keep, h / 0.8, 0.0)


def step(w, x, key):
    """A training step that splits its key and returns the next one (a key output)."""
    key, sub = jax.random.split(key)
    loss, g = jax.value_and_grad(lambda w: jnp.mean(dropout_layer(w, x, sub) ** 2))(w)
    return loss, w - 0.1 * g, key


def _same(got, want):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
            assert jax.dtypes.issubdtype(b.dtype, jax.dtypes.prng_key)
            assert jax.random.key_impl(a) == jax.random.key_impl(b)
            np.testing.assert_array_equal(jax.random.key_data(a), jax.random.key_data(b))
        else:
            assert_same(a, b, "reassociate")


@pytest.mark.parametrize("impl", ["threefry2x32", "rbg"])
def test_key_arguments_and_results_match_jax_jit(impl):
    key = jax.random.key(3, impl=impl)
    want = jax.jit(step)(W, X, key)
    hf = hlofuse.jit(step, autotune=False, tiered=False)
    got = hf(W, X, key)
    _same(got, want)
    assert jax.random.key_impl(got[2]) == jax.random.key_impl(key)
    rep = hf.report(W, X, key)
    assert any(r.kind == "reduction" for r in rep.kernels), rep   # the softmax got its kernel
    # a batch of keys (split), and the next call with the returned key: the same program
    keys = jax.random.split(key, 4)
    f = hlofuse.jit(jax.vmap(dropout_layer, in_axes=(None, None, 0)), autotune=False,
                    tiered=False)
    _same(f(W, X, keys), jax.jit(jax.vmap(dropout_layer, in_axes=(None, None, 0)))(W, X, keys))
    _same(hf(W, X, got[2]), jax.jit(step)(W, X, want[2]))
    assert hf.compilations == 1


def test_keys_under_the_tiered_first_call_and_transformations():
    key = jax.random.key(7)
    hf = hlofuse.jit(step, autotune=False, tiered=True)
    want = jax.jit(step)(W, X, key)
    _same(hf(W, X, key), want)                         # XLA's code, hlofuse's in the background
    assert hf.block_until_optimized(timeout=300)
    _same(hf(W, X, key), want)                         # hlofuse's module
    hd = hlofuse.jit(dropout_layer, autotune=False, tiered=False)
    g = jax.grad(lambda w: jnp.sum(hd(w, X, key) ** 2))(W)
    assert_same(g, jax.grad(lambda w: jnp.sum(dropout_layer(w, X, key) ** 2))(W), "grad")
    keys = jax.random.split(key, 3)
    _same(jax.vmap(hd, in_axes=(None, None, 0))(W, X, keys),
          jax.vmap(dropout_layer, in_axes=(None, None, 0))(W, X, keys))
    # inside a jax.jit of the caller: the key is a tracer there
    _same(jax.jit(lambda k: hd(W, X, k))(key), jax.jit(dropout_layer)(W, X, key))


def test_keys_through_the_module_cache(tmp_path, monkeypatch):
    # a second process finds the module the first one built: a fresh hlofuse.jit over the same
    # on-disk cache, with the pass pipeline disabled (only the cache can answer)
    monkeypatch.setenv("HLOFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv(mc.ENV, "1")
    monkeypatch.setenv(mc.XLA_ENV, "0")   # never touch jax's global cache config in tests
    key = jax.random.key(11)
    want = jax.jit(step)(W, X, key)
    _same(hlofuse.jit(step, autotune=False, tiered=False)(W, X, key), want)

    def boom(*a, **k):
        raise AssertionError("the pass pipeline ran on a cache hit")
    monkeypatch.setattr(runtime, "optimize", boom)
    hits = mc.STATS["hits"]
    _same(hlofuse.jit(step, autotune=False, tiered=False)(W, X, key), want)
    assert mc.STATS["hits"] == hits + 1


def test_raw_uint32_keys_are_plain_arrays():
    # the legacy jax.random.PRNGKey: a uint32[2] array, no extended dtype, nothing to wrap
    key = jax.random.PRNGKey(5)
    hf = hlofuse.jit(step, autotune=False, tiered=False)
    got = hf(W, X, key)
    _same(got, jax.jit(step)(W, X, key))
    assert got[2].dtype == jnp.uint32
