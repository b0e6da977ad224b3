"""Attention modules of Flax (NNX, Linen) and Equinox in training steps (issue 15, item 1):
``hlofuse.jit(jax.value_and_grad(loss))`` over the module's parameters and its input builds the
flash forward with lse and the flash backward (``attention_fwd_lse``, ``attention_bwd``), leaves
no attention candidate to XLA, and gives jax.jit's loss and gradients (``grad`` tolerance).

Needs the ``zoo`` extra (``pip install -e ".[zoo,test]"``); without it the module skips.
``.ci/run`` runs it in its zoo step, in a venv with the extra installed.
"""

import os
import textwrap

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
from hlofuse.runtime.testing import assert_same  # noqa: E402

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


NNX_EXPLICIT = textwrap.dedent('''
    import json, os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    sys.path.insert(0, ROOT)
    import jax, jax.numpy as jnp, hlofuse
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec as P, AxisType
    from tests.sharded_programs import agreement, collectives
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    part = lambda *names: nnx.with_partitioning(nnx.initializers.lecun_normal(), names)

    class Block(nnx.Module):
        def __init__(self, d, h, rngs):
            self.ln = nnx.LayerNorm(d, rngs=rngs)
            self.attn = nnx.MultiHeadAttention(num_heads=h, in_features=d, decode=False, rngs=rngs,
                                               kernel_init=part(None, "model"))
            self.w1 = nnx.Linear(d, 4 * d, rngs=rngs, kernel_init=part(None, "model"))
            self.w2 = nnx.Linear(4 * d, d, rngs=rngs, kernel_init=part("model", None))

        def __call__(self, x):
            x = x + self.attn(self.ln(x))
            return x + self.w2(jax.nn.gelu(self.w1(x)), out_sharding=P("data"))

    out = {}
    with jax.set_mesh(mesh):
        graphdef, state = nnx.split(Block(64, 8, nnx.Rngs(0)))
        x = jax.device_put(jax.random.normal(jax.random.key(1), (8, 16, 64)), NamedSharding(mesh, P("data")))

        def step(state, x):
            loss = lambda s: jnp.mean(nnx.merge(graphdef, s)(x) ** 2)
            l, g = jax.value_and_grad(loss)(state)
            return l, jax.tree.map(lambda p, q: p - 0.1 * q, state, g)
        h = hlofuse.jit(step, autotune=False, tiered=False)
        a, b = jax.jit(step)(state, x), h(state, x)
        rep = h.report(state, x)
        out = {**agreement(a, b),
               "jax": collectives(jax.jit(step).lower(state, x).compile().as_text()),
               "hlofuse": collectives(h.lower(state, x).compile().as_text()),
               "per_shard": sorted(r.kind for r in rep.regions if "per_shard" in r.extra)}
    print(json.dumps(out))
''').replace("ROOT", repr(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def test_nnx_block_step_on_an_explicit_mesh():
    """A Flax NNX block with partitioned kernels (``nnx.with_partitioning``) trained on a 2x4
    mesh with Explicit axes: jax.jit's loss, parameters and output shardings, no more
    collectives, and the flash forward and backward per shard (the backward's input from a
    resharding constraint read as replicated before: 'reshapes a sharded dim')."""
    from hlofuse.runtime.testing import TOLERANCES
    from tests.sharded_programs import run_json_child
    o = run_json_child(NNX_EXPLICIT)
    assert o["err"] <= TOLERANCES["grad"]["float32"][0] and o["same_sharding"], o
    assert all(n <= o["jax"][k] for k, n in o["hlofuse"].items()), o
    assert {"attention_fwd_lse", "attention_bwd", "reduction"} <= set(o["per_shard"]), o
