"""Attention modules of Flax (NNX, Linen) and Equinox in training steps (issue 15, item 1):
``hlofuse.jit(jax.value_and_grad(loss))`` over the module's parameters and its input builds the
flash forward with lse and the flash backward (``attention_fwd_lse``, ``attention_bwd``), leaves
no attention candidate to XLA, and gives jax.jit's loss and gradients (``grad`` tolerance).

Needs the ``zoo`` extra (``pip install -e ".[zoo,test]"``); without it the module skips.
``.ci/run`` runs it in its zoo step, in a venv with the extra installed.
"""

import numpy as np
import pytest

from bench import zoo

_MISSING = zoo.missing_libraries()
if _MISSING:
    pytest.skip(f"model zoo libraries not installed ({', '.join(_MISSING)}): run "
                f"pip install -e '.[zoo,test]' to test Flax/Equinox attention in training steps "
                f"(.ci/run does, in .venv-zoo)", allow_module_level=True)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import hlofuse  # noqa: E402
from hlofuse.testing import assert_same  # noqa: E402

B, S, D, H = 2, 8, 16, 2


def _x():
    return jnp.asarray(np.random.default_rng(0).standard_normal((B, S, D)), jnp.float32)


def _nnx(causal):
    from flax import nnx
    m = nnx.MultiHeadAttention(num_heads=H, in_features=D, qkv_features=D, decode=False,
                               dropout_rate=0.0, rngs=nnx.Rngs(0))
    graph, params = nnx.split(m)
    mask = nnx.make_causal_mask(jnp.ones((B, S))) if causal else None

    def out(params, x):
        return nnx.merge(graph, params)(x, mask=mask)
    return out, params


def _linen(causal):
    from flax import linen as nn
    m = nn.MultiHeadDotProductAttention(num_heads=H, qkv_features=D, dropout_rate=0.0)
    params = m.init(jax.random.key(0), _x())
    mask = nn.make_causal_mask(jnp.ones((B, S))) if causal else None

    def out(params, x):
        return m.apply(params, x, mask=mask, deterministic=True)
    return out, params


def _eqx(causal):
    import equinox as eqx
    m = eqx.nn.MultiheadAttention(H, D, use_query_bias=True, use_output_bias=True,
                                  key=jax.random.key(0))
    params, static = eqx.partition(m, eqx.is_array)
    mask = jnp.tril(jnp.ones((S, S), bool)) if causal else None

    def out(params, x):       # eqx modules are per example: vmapped over the batch
        mm = eqx.combine(params, static)
        return jax.vmap(lambda t: mm(t, t, t, mask=mask))(x)
    return out, params


@pytest.mark.parametrize("lib,causal", [("nnx", False), ("nnx", True), ("linen", True),
                                        ("eqx", True)])
def test_attention_module_training_step_gets_flash_forward_and_backward(lib, causal):
    out, params = {"nnx": _nnx, "linen": _linen, "eqx": _eqx}[lib](causal)

    def loss(params, x):
        return jnp.sum(out(params, x) ** 2)
    step = jax.value_and_grad(loss, argnums=(0, 1))
    args = (params, _x())
    g = hlofuse.jit(step, autotune=False)
    report = g.report(*args)
    kinds = sorted(r.kind for r in report.regions
                   if r.kind in ("attention_fwd_lse", "attention_bwd") and r.kernel)
    assert kinds == ["attention_bwd", "attention_fwd_lse"], report
    (stats,) = [p.stats for p in report.passes if p.name == "fuse-attention"]
    assert stats["attention_training"] == 1
    # nothing else in the step is an attention candidate (the scaled Q, the projections of O)
    assert not [n for n in report.notes if n.startswith("fuse-attention:")], report.notes
    (val, grads), (val0, grads0) = g(*args), jax.jit(step)(*args)
    assert_same(grads, grads0, "grad")
    assert_same(val, val0, "grad")


def test_llama_training_step_gets_both_kernels_per_layer():
    """The zoo's Llama training step (nnx, GQA through jax.nn.dot_product_attention, RoPE,
    causal; next-token CE and SGD with momentum): every layer's attention gets the flash forward
    and backward, and the step matches jax.jit's."""
    from bench.zoo import flax_zoo
    m = zoo.get("nnx_llama_train")
    fn, args = flax_zoo.nnx_llama_train(dict(m.small, layers=2), 0)     # two layers
    g = hlofuse.jit(fn, autotune=False)
    report = g.report(*args)
    kinds = sorted(r.kind for r in report.regions
                   if r.kind in ("attention_fwd_lse", "attention_bwd") and r.kernel)
    assert kinds == ["attention_bwd"] * 2 + ["attention_fwd_lse"] * 2, report
    assert not [n for n in report.notes if n.startswith("fuse-attention:")], report.notes
    assert_same(g(*args), jax.jit(fn)(*args), m.category)
