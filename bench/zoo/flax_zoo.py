"""Zoo models written with Flax: NNX (BERT, Llama-style GQA decoder, ViT, an MLP training step)
and Linen (ResNet with BatchNorm, a ResNet training step, an int8-quantized BERT encoder, a
diffusion UNet and its denoising training step).
Random weights from the configs in :mod:`bench.zoo`; nothing is downloaded. Every builder
returns ``(fn, args)`` with the parameters among the arguments."""

from __future__ import annotations

import functools
import math

import numpy as np

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn
from flax import nnx

from bench.zoo.inputs import padding_mask as _padding_mask, token_ids as _ids


def _list(modules):
    """A list of submodules as the installed Flax wants it (nnx.List where it exists)."""
    return nnx.List(modules) if hasattr(nnx, "List") else list(modules)


# ------------------------------------------------------------------------------------------
# NNX BERT encoder
# ------------------------------------------------------------------------------------------
class BertLayer(nnx.Module):
    def __init__(self, d, heads, ff, *, rngs):
        self.attn = nnx.MultiHeadAttention(heads, d, decode=False, deterministic=True, rngs=rngs)
        self.ln1 = nnx.LayerNorm(d, epsilon=1e-12, rngs=rngs)
        self.ff1 = nnx.Linear(d, ff, rngs=rngs)
        self.ff2 = nnx.Linear(ff, d, rngs=rngs)
        self.ln2 = nnx.LayerNorm(d, epsilon=1e-12, rngs=rngs)

    def __call__(self, x, mask):
        x = self.ln1(x + self.attn(x, mask=mask))
        return self.ln2(x + self.ff2(nnx.gelu(self.ff1(x))))


class Bert(nnx.Module):
    def __init__(self, cfg, *, rngs):
        d = cfg["d"]
        self.tok = nnx.Embed(cfg["vocab"], d, rngs=rngs)
        self.pos = nnx.Embed(cfg["seq"], d, rngs=rngs)
        self.ln = nnx.LayerNorm(d, epsilon=1e-12, rngs=rngs)
        self.layers = _list(BertLayer(d, cfg["heads"], cfg["ff"], rngs=rngs)
                            for _ in range(cfg["layers"]))

    def __call__(self, ids, keep):
        x = self.ln(self.tok(ids) + self.pos(jnp.arange(ids.shape[1]))[None])
        mask = nnx.make_attention_mask(keep, keep)
        for layer in self.layers:
            x = layer(x, mask)
        return x


def _nnx_apply(model):
    graphdef, state = nnx.split(model)

    def fn(state, *inputs):
        return nnx.merge(graphdef, state)(*inputs)
    return fn, state


def nnx_bert(cfg, seed):
    rng = np.random.default_rng(seed)
    fn, state = _nnx_apply(Bert(cfg, rngs=nnx.Rngs(seed)))
    return fn, (state, _ids(rng, (cfg["batch"], cfg["seq"]), cfg["vocab"]),
                _padding_mask(cfg["batch"], cfg["seq"]))


# ------------------------------------------------------------------------------------------
# NNX Llama-style decoder: RMSNorm, rotary embeddings, grouped-query causal attention, SwiGLU
# ------------------------------------------------------------------------------------------
def rope(x, theta=10000.0):
    """Rotary position embedding of x [B, S, H, D] (half-split form, as Llama ports write it)."""
    s, dh = x.shape[1], x.shape[-1]
    freq = 1.0 / theta ** (jnp.arange(0, dh, 2, dtype=jnp.float32) / dh)
    ang = jnp.arange(s, dtype=jnp.float32)[:, None] * freq[None, :]
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


class LlamaAttention(nnx.Module):
    def __init__(self, d, heads, kv_heads, dtype, *, rngs):
        self.h, self.kv, self.dh = heads, kv_heads, d // heads
        lin = functools.partial(nnx.Linear, use_bias=False, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.q, self.k = lin(d, heads * self.dh), lin(d, kv_heads * self.dh)
        self.v, self.o = lin(d, kv_heads * self.dh), lin(heads * self.dh, d)

    def __call__(self, x):
        b, s, _ = x.shape
        q = rope(self.q(x).reshape(b, s, self.h, self.dh))
        k = rope(self.k(x).reshape(b, s, self.kv, self.dh))
        v = self.v(x).reshape(b, s, self.kv, self.dh)
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True)  # GQA: kv heads shared
        return self.o(out.reshape(b, s, self.h * self.dh))


class LlamaLayer(nnx.Module):
    def __init__(self, cfg, dtype, *, rngs):
        d, ff = cfg["d"], cfg["ff"]
        norm = functools.partial(nnx.RMSNorm, d, epsilon=1e-6, dtype=dtype, param_dtype=dtype,
                                 rngs=rngs)
        lin = functools.partial(nnx.Linear, use_bias=False, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.n1, self.n2 = norm(), norm()
        self.attn = LlamaAttention(d, cfg["heads"], cfg["kv_heads"], dtype, rngs=rngs)
        self.gate, self.up, self.down = lin(d, ff), lin(d, ff), lin(ff, d)

    def __call__(self, x):
        x = x + self.attn(self.n1(x))
        h = self.n2(x)
        return x + self.down(nnx.silu(self.gate(h)) * self.up(h))


class Llama(nnx.Module):
    def __init__(self, cfg, *, rngs):
        dtype = jnp.dtype(cfg["dtype"])
        self.embed = nnx.Embed(cfg["vocab"], cfg["d"], dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.layers = _list(LlamaLayer(cfg, dtype, rngs=rngs) for _ in range(cfg["layers"]))
        self.norm = nnx.RMSNorm(cfg["d"], epsilon=1e-6, dtype=dtype, param_dtype=dtype, rngs=rngs)
        self.head = nnx.Linear(cfg["d"], cfg["vocab"], use_bias=False, dtype=dtype,
                               param_dtype=dtype, rngs=rngs)

    def __call__(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x[:, -1]))  # prefill: the next token's logits


def nnx_llama(cfg, seed):
    rng = np.random.default_rng(seed)
    fn, state = _nnx_apply(Llama(cfg, rngs=nnx.Rngs(seed)))
    return fn, (state, _ids(rng, (cfg["batch"], cfg["seq"]), cfg["vocab"]))


def nnx_llama_train(cfg, seed):
    """A Llama training step: next-token cross-entropy over every position, SGD with momentum.
    The GQA attention (jax.nn.dot_product_attention) is differentiated through.

    Not Adam: its first step divides each gradient by ``|g| + eps`` (1e-8), and ~800k of this
    model's gradients are below 1e-7 (embedding rows of unseen tokens, ...), so differences of
    4e-8 in the gradients (reassociation; they match within the ``grad`` tolerance) become
    update differences up to 2e-4: the step's outputs would compare the optimizer's
    conditioning, not the program's."""
    rng = np.random.default_rng(seed)
    graphdef, params = nnx.split(Llama(cfg, rngs=nnx.Rngs(seed)), nnx.Param)
    tx = optax.sgd(1e-2, momentum=0.9)

    def step(params, opt_state, ids):
        def loss_fn(p):
            m = nnx.merge(graphdef, p)
            x = m.embed(ids[:, :-1])
            for layer in m.layers:
                x = layer(x)
            logits = m.head(m.norm(x)).astype(jnp.float32)
            return optax.softmax_cross_entropy_with_integer_labels(logits, ids[:, 1:]).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    return step, (params, tx.init(params), _ids(rng, (cfg["batch"], cfg["seq"] + 1), cfg["vocab"]))


# ------------------------------------------------------------------------------------------
# A pre-LN transformer block (the scanned GPT's, causal, and the ViT's)
# ------------------------------------------------------------------------------------------
class PreLNBlock(nnx.Module):
    def __init__(self, d, heads, ff, *, causal=False, rngs):
        self.causal = causal
        self.ln1 = nnx.LayerNorm(d, epsilon=1e-6, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(heads, d, decode=False, deterministic=True, rngs=rngs)
        self.ln2 = nnx.LayerNorm(d, epsilon=1e-6, rngs=rngs)
        self.fc1, self.fc2 = nnx.Linear(d, ff, rngs=rngs), nnx.Linear(ff, d, rngs=rngs)

    def __call__(self, x):
        mask = nnx.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32)) if self.causal else None
        x = x + self.attn(self.ln1(x), mask=mask)
        return x + self.fc2(nnx.gelu(self.fc1(self.ln2(x))))


# ------------------------------------------------------------------------------------------
# NNX GPT with its blocks scanned (nnx.scan over stacked layers, nnx.remat)
# ------------------------------------------------------------------------------------------
class ScannedGPT(nnx.Module):
    """The blocks' parameters stacked along a layer axis (``nnx.vmap`` at init) and run by
    ``nnx.scan``, each block under ``nnx.remat`` (unless ``cfg["remat"]`` is False): how deep
    stacks are written to keep compile time flat and activation memory down."""

    def __init__(self, cfg, *, rngs):
        self.embed = nnx.Embed(cfg["vocab"], cfg["d"], rngs=rngs)

        @nnx.split_rngs(splits=cfg["layers"])
        @nnx.vmap(in_axes=(0,), out_axes=0)
        def blocks(rngs):
            return PreLNBlock(cfg["d"], cfg["heads"], cfg["ff"], causal=True, rngs=rngs)
        self.blocks = blocks(rngs)
        self.ln = nnx.LayerNorm(cfg["d"], rngs=rngs)
        self.head = nnx.Linear(cfg["d"], cfg["vocab"], use_bias=False, rngs=rngs)
        self.remat = cfg.get("remat", True)

    def __call__(self, ids):
        def block(x, blk):
            return blk(x)
        if self.remat:
            block = nnx.remat(block)

        @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
        def run(x, blk):
            return block(x, blk)
        return self.head(self.ln(run(self.embed(ids), self.blocks)))


def nnx_gpt_scan_train(cfg, seed):
    """A GPT training step over scanned, rematerialized blocks: next-token cross-entropy, SGD
    with momentum (not Adam: see :func:`nnx_llama_train`). The backward loop recomputes each
    block's causal attention, where hlofuse fuses its forward and backward (the causal mask,
    hoisted out of the loops by jax, is generated in them again: ``sink-loop-generators``)."""
    rng = np.random.default_rng(seed)
    graphdef, params = nnx.split(ScannedGPT(cfg, rngs=nnx.Rngs(seed)), nnx.Param)
    tx = optax.sgd(1e-2, momentum=0.9)

    def step(params, opt_state, ids):
        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(ids[:, :-1]).astype(jnp.float32)
            return optax.softmax_cross_entropy_with_integer_labels(logits, ids[:, 1:]).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    return step, (params, tx.init(params), _ids(rng, (cfg["batch"], cfg["seq"] + 1), cfg["vocab"]))


def nnx_gpt_scan_noremat_train(cfg, seed):
    """:func:`nnx_gpt_scan_train` without ``nnx.remat``: jax saves each block's attention
    probabilities in the forward loop for the backward loop; hlofuse recomputes them there
    (``remat-loop-attention``) and fuses the attention in both loops."""
    return nnx_gpt_scan_train(dict(cfg, remat=False), seed)


# ------------------------------------------------------------------------------------------
# NNX ViT
# ------------------------------------------------------------------------------------------
class ViT(nnx.Module):
    def __init__(self, cfg, *, rngs):
        d, p = cfg["d"], cfg["patch"]
        n = (cfg["image"] // p) ** 2
        self.patch = nnx.Conv(3, d, (p, p), strides=(p, p), padding="VALID", rngs=rngs)
        self.cls = nnx.Param(jax.random.normal(rngs.params(), (1, 1, d)) * 0.02)
        self.pos = nnx.Param(jax.random.normal(rngs.params(), (1, n + 1, d)) * 0.02)
        self.blocks = _list(PreLNBlock(d, cfg["heads"], cfg["ff"], rngs=rngs)
                            for _ in range(cfg["layers"]))
        self.ln = nnx.LayerNorm(d, epsilon=1e-6, rngs=rngs)
        self.head = nnx.Linear(d, cfg["classes"], rngs=rngs)

    def __call__(self, img):  # NHWC
        x = self.patch(img)
        b = x.shape[0]
        x = x.reshape(b, -1, x.shape[-1])
        x = jnp.concatenate([jnp.broadcast_to(self.cls[...], (b, 1, x.shape[-1])), x], 1)
        x = x + self.pos[...]
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x)[:, 0])


def nnx_vit(cfg, seed):
    rng = np.random.default_rng(seed)
    fn, state = _nnx_apply(ViT(cfg, rngs=nnx.Rngs(seed)))
    img = rng.standard_normal((cfg["batch"], cfg["image"], cfg["image"], 3)).astype(np.float32)
    return fn, (state, jnp.asarray(img))


# ------------------------------------------------------------------------------------------
# NNX MLP training step (value_and_grad + optax.adamw)
# ------------------------------------------------------------------------------------------
class MLP(nnx.Module):
    def __init__(self, sizes, *, rngs):
        self.layers = _list(nnx.Linear(a, b, rngs=rngs) for a, b in zip(sizes[:-1], sizes[1:]))

    def __call__(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = nnx.gelu(x)
        return x


def nnx_mlp_train(cfg, seed):
    rng = np.random.default_rng(seed)
    sizes = tuple(cfg["sizes"])
    graphdef, params = nnx.split(MLP(sizes, rngs=nnx.Rngs(seed)), nnx.Param)
    tx = optax.adamw(1e-3)

    def step(params, opt_state, x, y):
        def loss_fn(p):
            logits = nnx.merge(graphdef, p)(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state

    x = jnp.asarray(rng.standard_normal((cfg["batch"], sizes[0])).astype(np.float32))
    return step, (params, tx.init(params), x, _ids(rng, (cfg["batch"],), sizes[-1]))


# ------------------------------------------------------------------------------------------
# Linen ResNet (NHWC, BatchNorm with running statistics) and a ResNet training step
# ------------------------------------------------------------------------------------------
class Bottleneck(nn.Module):
    width: int
    strides: int = 1

    @nn.compact
    def __call__(self, x, train: bool):
        norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9,
                                 epsilon=1e-5)
        y = nn.relu(norm()(nn.Conv(self.width, (1, 1), use_bias=False)(x)))
        y = nn.relu(norm()(nn.Conv(self.width, (3, 3), self.strides, use_bias=False)(y)))
        y = norm()(nn.Conv(self.width * 4, (1, 1), use_bias=False)(y))
        if x.shape != y.shape:
            x = norm()(nn.Conv(self.width * 4, (1, 1), self.strides, use_bias=False)(x))
        return nn.relu(x + y)


class ResNetStage(nn.Module):
    """ResNet-50's stem and first stage (conv2_x)."""
    stem: int
    width: int
    blocks: int

    @nn.compact
    def __call__(self, x, train: bool = False):
        x = nn.Conv(self.stem, (7, 7), (2, 2), padding=[(3, 3), (3, 3)], use_bias=False)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(x))
        x = nn.max_pool(x, (3, 3), (2, 2), padding="SAME")
        for _ in range(self.blocks):
            x = Bottleneck(self.width)(x, train)
        return x


def _random_stats(batch_stats, rng):
    """Running statistics as a trained network has them (mean ~ N(0, 0.1), var in [0.5, 1.5])."""
    def f(path, v):
        name = str(path[-1])
        if "mean" in name:
            return jnp.asarray(rng.standard_normal(v.shape).astype(np.float32) * 0.1)
        return jnp.asarray(rng.uniform(0.5, 1.5, v.shape).astype(np.float32))
    return jax.tree_util.tree_map_with_path(f, batch_stats)


def linen_resnet(cfg, seed):
    rng = np.random.default_rng(seed)
    model = ResNetStage(cfg["stem"], cfg["width"], cfg["blocks"])
    x = jnp.asarray(rng.standard_normal((cfg["batch"], cfg["image"], cfg["image"], 3))
                    .astype(np.float32))
    v = model.init(jax.random.key(seed), x)
    params, stats = v["params"], _random_stats(v["batch_stats"], rng)

    def fn(params, batch_stats, x):
        return model.apply({"params": params, "batch_stats": batch_stats}, x, train=False)
    return fn, (params, stats, x)


class BasicBlock(nn.Module):
    width: int
    strides: int = 1

    @nn.compact
    def __call__(self, x, train: bool):
        norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9)
        y = nn.relu(norm()(nn.Conv(self.width, (3, 3), self.strides, use_bias=False)(x)))
        y = norm()(nn.Conv(self.width, (3, 3), use_bias=False)(y))
        if x.shape != y.shape:
            x = norm()(nn.Conv(self.width, (1, 1), self.strides, use_bias=False)(x))
        return nn.relu(x + y)


class CifarResNet(nn.Module):
    widths: tuple
    classes: int

    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9)(
            nn.Conv(self.widths[0], (3, 3), use_bias=False)(x)))
        for i, w in enumerate(self.widths):
            x = BasicBlock(w, 1 if i == 0 else 2)(x, train)
        return nn.Dense(self.classes)(jnp.mean(x, axis=(1, 2)))


def linen_resnet_train(cfg, seed):
    rng = np.random.default_rng(seed)
    model = CifarResNet(tuple(cfg["widths"]), cfg["classes"])
    x = jnp.asarray(rng.standard_normal((cfg["batch"], cfg["image"], cfg["image"], 3))
                    .astype(np.float32))
    y = _ids(rng, (cfg["batch"],), cfg["classes"])
    v = model.init(jax.random.key(seed), x, train=False)
    tx = optax.sgd(0.1, momentum=0.9)

    def step(params, batch_stats, opt_state, x, y):
        def loss_fn(p):
            logits, upd = model.apply({"params": p, "batch_stats": batch_stats}, x, train=True,
                                      mutable=["batch_stats"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss, upd["batch_stats"]
        (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), new_stats, opt_state

    params = v["params"]
    return step, (params, v["batch_stats"], tx.init(params), x, y)


# ------------------------------------------------------------------------------------------
# Linen int8 BERT encoder (every Dense quantized, as AQT's serving mode runs it)
# ------------------------------------------------------------------------------------------
class QuantDense(nn.Module):
    """A Dense layer in int8, the way quantized serving code writes it: int8 weights with a
    per-output-channel scale (calibrated offline), the activation quantized with a static
    per-tensor scale, an int8 x int8 -> int32 ``dot_general``, then the dequant scale and the
    bias in f32."""
    features: int
    act_scale: float

    @nn.compact
    def __call__(self, x):
        d = x.shape[-1]
        wq = self.param("wq", lambda k, s: jax.random.randint(k, s, -127, 128, jnp.int32).astype(jnp.int8),
                        (d, self.features))
        scale = self.param("scale", lambda k, s: jax.random.uniform(k, s, jnp.float32, 0.5, 1.5)
                           / (127.0 * math.sqrt(d)) * 2.0, (self.features,))
        bias = self.param("bias", nn.initializers.normal(0.02), (self.features,))
        xq = jnp.clip(jnp.round(x / self.act_scale), -127, 127).astype(jnp.int8)
        acc = jax.lax.dot_general(xq, wq, (((x.ndim - 1,), (0,)), ((), ())),
                                  preferred_element_type=jnp.int32)
        return acc.astype(jnp.float32) * (self.act_scale * scale) + bias


class QuantBertLayer(nn.Module):
    d: int
    heads: int
    ff: int

    @nn.compact
    def __call__(self, x, mask):
        b, s, _ = x.shape
        hd = self.d // self.heads
        q, k, v = (QuantDense(self.d, 0.03, name=n)(x).reshape(b, s, self.heads, hd)
                   for n in ("query", "key", "value"))
        a = nn.dot_product_attention(q, k, v, mask=mask).reshape(b, s, self.d)
        x = nn.LayerNorm(epsilon=1e-12)(x + QuantDense(self.d, 0.02, name="out")(a))
        h = nn.gelu(QuantDense(self.ff, 0.03, name="ff1")(x))
        return nn.LayerNorm(epsilon=1e-12)(x + QuantDense(self.d, 0.02, name="ff2")(h))


class QuantBert(nn.Module):
    layers: int
    d: int
    heads: int
    ff: int

    @nn.compact
    def __call__(self, x, keep):
        mask = nn.make_attention_mask(keep, keep)
        for _ in range(self.layers):
            x = QuantBertLayer(self.d, self.heads, self.ff)(x, mask)
        return x


def linen_int8_bert(cfg, seed):
    rng = np.random.default_rng(seed)
    model = QuantBert(cfg["layers"], cfg["d"], cfg["heads"], cfg["ff"])
    x = jnp.asarray(rng.standard_normal((cfg["batch"], cfg["seq"], cfg["d"])).astype(np.float32))
    keep = _padding_mask(cfg["batch"], cfg["seq"])
    params = model.init(jax.random.key(seed), x, keep)["params"]

    def fn(params, x, keep):
        return model.apply({"params": params}, x, keep)
    return fn, (params, x, keep)


# ------------------------------------------------------------------------------------------
# Linen diffusion UNet (GroupNorm, timestep embedding, spatial self-attention, resize)
# ------------------------------------------------------------------------------------------
class UNetResBlock(nn.Module):
    """A DDPM/Stable-Diffusion residual block: GroupNorm, SiLU, 3x3 conv, the timestep
    embedding added per channel, GroupNorm, SiLU, 3x3 conv, a 1x1 conv on the skip path when
    the width changes."""
    ch: int
    groups: int

    @nn.compact
    def __call__(self, x, temb):
        h = nn.Conv(self.ch, (3, 3))(nn.silu(nn.GroupNorm(self.groups)(x)))
        h = h + nn.Dense(self.ch)(nn.silu(temb))[:, None, None, :]
        h = nn.Conv(self.ch, (3, 3))(nn.silu(nn.GroupNorm(self.groups)(h)))
        if x.shape[-1] != self.ch:
            x = nn.Conv(self.ch, (1, 1))(x)
        return x + h


class UNetAttention(nn.Module):
    """Self-attention over the feature map's positions (GroupNorm first, residual)."""
    heads: int
    groups: int

    @nn.compact
    def __call__(self, x):
        b, hh, ww, c = x.shape
        h = nn.GroupNorm(self.groups)(x).reshape(b, hh * ww, c)
        h = nn.MultiHeadDotProductAttention(num_heads=self.heads)(h, h)
        return x + h.reshape(b, hh, ww, c)


def timestep_embedding(t, dim: int):
    """Sinusoidal embedding of integer timesteps (the DDPM / diffusers form)."""
    half = dim // 2
    freqs = jnp.exp(-math.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / half)
    args = t.astype(jnp.float32)[:, None] * freqs[None]
    return jnp.concatenate([jnp.sin(args), jnp.cos(args)], axis=-1)


class UNet(nn.Module):
    """One down and one up level around an attention middle, as a diffusion model's UNet
    writes it: conv in, residual blocks, average-pool down, nearest-neighbour resize up with the
    skip concatenated, GroupNorm + SiLU + conv out."""
    ch: int
    groups: int
    heads: int

    @nn.compact
    def __call__(self, x, t):
        temb = timestep_embedding(t, self.ch)
        temb = nn.Dense(4 * self.ch)(nn.silu(nn.Dense(4 * self.ch)(temb)))
        h = nn.Conv(self.ch, (3, 3))(x)
        skip = h = UNetResBlock(self.ch, self.groups)(h, temb)
        h = nn.avg_pool(h, (2, 2), (2, 2))
        h = UNetResBlock(2 * self.ch, self.groups)(h, temb)
        h = UNetAttention(self.heads, self.groups)(h)
        h = UNetResBlock(2 * self.ch, self.groups)(h, temb)
        b, hh, ww, c = h.shape
        h = jax.image.resize(h, (b, 2 * hh, 2 * ww, c), "nearest")
        h = UNetResBlock(self.ch, self.groups)(jnp.concatenate([h, skip], axis=-1), temb)
        return nn.Conv(x.shape[-1], (3, 3))(nn.silu(nn.GroupNorm(self.groups)(h)))


def _unet(cfg, seed):
    rng = np.random.default_rng(seed)
    model = UNet(cfg["ch"], cfg["groups"], cfg["heads"])
    x = jnp.asarray(rng.standard_normal((cfg["batch"], cfg["image"], cfg["image"], 3))
                    .astype(np.float32))
    t = jnp.asarray(rng.integers(0, 1000, (cfg["batch"],)).astype(np.int32))
    return model, rng, x, t, model.init(jax.random.key(seed), x, t)["params"]


def linen_unet(cfg, seed):
    model, _, x, t, params = _unet(cfg, seed)

    def fn(params, x, t):
        return model.apply({"params": params}, x, t)
    return fn, (params, x, t)


def linen_unet_train(cfg, seed):
    """A denoising training step: the UNet predicts the noise added to an image (MSE), AdamW."""
    model, rng, x, t, params = _unet(cfg, seed)
    noise = jnp.asarray(rng.standard_normal(x.shape).astype(np.float32))
    tx = optax.adamw(1e-4)

    def step(params, opt_state, x, noise, t):
        a = (1.0 - t.astype(jnp.float32) / 1000.0)[:, None, None, None]
        noisy = jnp.sqrt(a) * x + jnp.sqrt(1.0 - a) * noise

        def loss_fn(p):
            return jnp.mean((model.apply({"params": p}, noisy, t) - noise) ** 2)
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return loss, optax.apply_updates(params, updates), opt_state
    return step, (params, tx.init(params), x, noise, t)


__all__ = ["nnx_bert", "nnx_llama", "nnx_llama_train", "nnx_gpt_scan_train", "nnx_vit", "nnx_mlp_train", "linen_resnet",
           "linen_resnet_train", "linen_int8_bert", "linen_unet", "linen_unet_train", "rope"]
