"""Zoo models written with Equinox: a CNN with BatchNorm in NCHW (Equinox convolutions are
channel-first), ``eqx.nn.MLP`` (f32 and bf16), a GPT-style decoder with rotary embeddings and a
causal mask, and its training step. Parameters are separated from the static structure with
``eqx.partition`` and passed as arguments; per-example models are vmapped over the batch, as
Equinox users write them."""

from __future__ import annotations

import numpy as np

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jr
import optax

from bench.zoo.inputs import token_ids as _ids


def _split(model):
    return eqx.partition(model, eqx.is_array)


# ------------------------------------------------------------------------------------------
# CNN with BatchNorm, NCHW
# ------------------------------------------------------------------------------------------
class CNN(eqx.Module):
    convs: list
    norms: list
    head: eqx.nn.Linear

    def __init__(self, channels, classes, key):
        keys = jr.split(key, len(channels) + 1)
        cin, convs, norms = 3, [], []
        for i, (c, k) in enumerate(zip(channels, keys)):
            convs.append(eqx.nn.Conv2d(cin, c, 3, stride=1 if i == 0 else 2, padding=1,
                                       use_bias=False, key=k))
            norms.append(eqx.nn.BatchNorm(c, axis_name="batch", mode="ema"))
            cin = c
        self.convs, self.norms = convs, norms
        self.head = eqx.nn.Linear(cin, classes, key=keys[-1])

    def __call__(self, x, state):  # x: [C, H, W]
        for conv, bn in zip(self.convs, self.norms):
            x, state = bn(conv(x), state)
            x = jax.nn.relu(x)
        return self.head(jnp.mean(x, axis=(1, 2))), state


def eqx_cnn(cfg, seed):
    rng = np.random.default_rng(seed)
    model, state = eqx.nn.make_with_state(CNN)(tuple(cfg["channels"]), cfg["classes"], jr.key(seed))
    model = eqx.nn.inference_mode(model)
    params, static = _split(model)

    def fn(params, state, x):
        m = eqx.combine(params, static)
        out, _ = jax.vmap(m, axis_name="batch", in_axes=(0, None), out_axes=(0, None))(x, state)
        return out

    x = rng.standard_normal((cfg["batch"], 3, cfg["image"], cfg["image"])).astype(np.float32)
    return fn, (params, state, jnp.asarray(x))


# ------------------------------------------------------------------------------------------
# MLP
# ------------------------------------------------------------------------------------------
def eqx_mlp(cfg, seed):
    rng = np.random.default_rng(seed)
    dtype = jnp.dtype(cfg["dtype"])
    model = eqx.nn.MLP(cfg["din"], cfg["dout"], cfg["width"], cfg["depth"],
                       activation=jax.nn.gelu, dtype=dtype, key=jr.key(seed))
    params, static = _split(model)

    def fn(params, x):
        return jax.vmap(eqx.combine(params, static))(x)

    x = rng.standard_normal((cfg["batch"], cfg["din"])).astype(np.float32)
    return fn, (params, jnp.asarray(x, dtype))


# ------------------------------------------------------------------------------------------
# GPT-style decoder: pre-LN, eqx.nn.MultiheadAttention with rotary q/k and a causal mask
# ------------------------------------------------------------------------------------------
class Block(eqx.Module):
    ln1: eqx.nn.LayerNorm
    attn: eqx.nn.MultiheadAttention
    rope: eqx.nn.RotaryPositionalEmbedding
    ln2: eqx.nn.LayerNorm
    fc1: eqx.nn.Linear
    fc2: eqx.nn.Linear

    def __init__(self, d, heads, ff, key):
        k1, k2, k3 = jr.split(key, 3)
        self.ln1, self.ln2 = eqx.nn.LayerNorm(d), eqx.nn.LayerNorm(d)
        self.attn = eqx.nn.MultiheadAttention(heads, d, use_query_bias=True, use_key_bias=True,
                                              use_value_bias=True, use_output_bias=True, key=k1)
        self.rope = eqx.nn.RotaryPositionalEmbedding(d // heads)
        self.fc1, self.fc2 = eqx.nn.Linear(d, ff, key=k2), eqx.nn.Linear(ff, d, key=k3)

    def __call__(self, x):  # [S, d]
        s = x.shape[0]
        causal = jnp.tril(jnp.ones((s, s), dtype=bool))

        def process_heads(q, k, v):  # [S, H, Dh]
            rot = jax.vmap(self.rope, in_axes=1, out_axes=1)
            return rot(q), rot(k), v

        h = jax.vmap(self.ln1)(x)
        x = x + self.attn(h, h, h, mask=causal, process_heads=process_heads)
        h = jax.vmap(self.ln2)(x)
        return x + jax.vmap(lambda t: self.fc2(jax.nn.gelu(self.fc1(t))))(h)


class GPT(eqx.Module):
    embed: eqx.nn.Embedding
    blocks: list
    ln: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, cfg, key):
        keys = jr.split(key, cfg["layers"] + 2)
        d = cfg["d"]
        self.embed = eqx.nn.Embedding(cfg["vocab"], d, key=keys[0])
        self.blocks = [Block(d, cfg["heads"], cfg["ff"], k) for k in keys[1:-1]]
        self.ln = eqx.nn.LayerNorm(d)
        self.head = eqx.nn.Linear(d, cfg["vocab"], use_bias=False, key=keys[-1])

    def hidden(self, tokens):  # [S] -> [S, d]
        x = jax.vmap(self.embed)(tokens)
        for blk in self.blocks:
            x = blk(x)
        return jax.vmap(self.ln)(x)

    def __call__(self, tokens):  # prefill: the next token's logits
        return self.head(self.hidden(tokens)[-1])


def eqx_gpt(cfg, seed):
    rng = np.random.default_rng(seed)
    params, static = _split(GPT(cfg, jr.key(seed)))

    def fn(params, tokens):
        return jax.vmap(eqx.combine(params, static))(tokens)
    return fn, (params, _ids(rng, (cfg["batch"], cfg["seq"]), cfg["vocab"]))


def eqx_gpt_train(cfg, seed):
    rng = np.random.default_rng(seed)
    params, static = _split(GPT(cfg, jr.key(seed)))
    tx = optax.adam(3e-4)

    def step(params, opt_state, tokens):  # tokens [B, S + 1]
        def loss_fn(p):
            m = eqx.combine(p, static)
            logits = jax.vmap(lambda t: jax.vmap(m.head)(m.hidden(t)))(tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    return step, (params, tx.init(params), _ids(rng, (cfg["batch"], cfg["seq"] + 1), cfg["vocab"]))


__all__ = ["eqx_cnn", "eqx_mlp", "eqx_gpt", "eqx_gpt_train"]
