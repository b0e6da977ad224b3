"""Every benchmark workload in one place.

A :class:`Workload` is a pure JAX function plus a factory for its arguments. Parameters are
passed as *arguments* (a pytree), never closed over, so neither ``jax.jit`` nor ``hlofuse.jit``
sees them as constants (XLA would fold them, which is not what a real model step does).

All workloads are float32, batch 1 unless stated, inference (no dropout). Sizes follow the
published models:

=================  =====================================================================
name               what
=================  =====================================================================
bert_s128          BERT-base encoder layer (d=768, 12 heads, FFN 3072, GELU), B=1, S=128
bert_s512          the same at S=512
gpt2_block         GPT-2-small decoder block (d=768, 12 heads, causal, FFN 3072), B=1, S=512
llama_block        LLaMA-style block (RMSNorm, rotary, GQA 16 q / 4 kv heads, SwiGLU), S=256
llama_decode       llama_block's layer decoding 16 tokens (one query row each, fori_loop) from
                   a 2048-slot KV cache filled to 1024, B=4
resnet_nhwc        ResNet-50 stage conv2_x (3 bottlenecks, 56x56, 64->256), inference BN, NHWC
resnet_nchw        the same stage in NCHW
resnet_nhwc_frozen resnet_nhwc with the parameters closed over (constants), as deployed
mlp_3x4096         3 dense layers 4096x4096 with GELU, batch 64
attn_s2048         attention B=1, H=8, d=64, S=2048 (softmax(QK^T/sqrt(d)) V)
attn_s4096         the same at S=4096
layernorm          layernorm micro-benchmark, x[4096, 1024]
softmax            softmax micro-benchmark, x[4096, 1024]
int8_mlp           int8 MLP, weights and activations (int8 dots, int32 accumulation), batch 256
int8_block         GPT-2-small block with int8 linear layers (weights and activations), S=512
int8_mlp_frozen    int8_mlp with the int8 weights closed over (constants, as deployed)
tiny               a tiny MLP (used by tests; not in the default list)
=================  =====================================================================
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["Workload", "WORKLOADS", "DEFAULT", "QUICK", "get", "names"]


@dataclasses.dataclass(frozen=True)
class Workload:
    """One benchmark: ``fn(*make_args(rng))``.

    Attributes:
      name: short identifier used on the command line.
      fn: the function benchmarked (positional pytree arguments, returns a pytree).
      make_args: ``numpy.random.Generator -> tuple`` of numpy pytrees.
      description: one line for tables.
      group: family used for grouping in reports ('transformer', 'conv', 'mlp', 'attention', 'micro').
    """
    name: str
    fn: Callable
    make_args: Callable
    description: str
    group: str
    frozen: bool = False   # close over the first argument (parameters become constants)

    def args(self, seed: int = 0):
        """Arguments as device arrays (deterministic for a seed)."""
        rng = np.random.default_rng(seed)
        return jax.tree_util.tree_map(jnp.asarray, self.make_args(rng))

    def instantiate(self, seed: int = 0) -> tuple[Callable, tuple]:
        """(function, arguments) to benchmark. A frozen workload closes over its parameters,
        as ``jax.jit(functools.partial(apply, params))`` does for inference; the same function
        object is given to ``jax.jit`` and ``hlofuse.jit``."""
        args = self.args(seed)
        if not self.frozen:
            return self.fn, args
        params, rest = args[0], tuple(args[1:])
        return functools.partial(self.fn, params), rest


def _normal(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ------------------------------------------------------------------------------------------
# Building blocks (plain jnp, the way users write them)
# ------------------------------------------------------------------------------------------
def layer_norm(x, g, b, eps=1e-12):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + eps) * g + b


def rms_norm(x, g, eps=1e-6):
    return x * lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps) * g


def attention(q, k, v, *, causal=False, mask=None):
    """q, k, v: [B, S, H, Dh] (BSHD, as models write it). Returns [B, S, H, Dh]."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if mask is not None:
        s = s + mask
    if causal:
        sq, sk = s.shape[-2], s.shape[-1]
        keep = jnp.tril(jnp.ones((sq, sk), dtype=bool))
        s = jnp.where(keep, s, jnp.finfo(s.dtype).min)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def _dense_params(rng, d_in, d_out):
    return {"w": _normal(rng, (d_in, d_out), 1.0 / math.sqrt(d_in)),
            "b": _normal(rng, (d_out,), 0.02)}


# ------------------------------------------------------------------------------------------
# BERT-base encoder layer / GPT-2-small block
# ------------------------------------------------------------------------------------------
def _transformer_params(rng, d, ff):
    return {
        "q": _dense_params(rng, d, d), "k": _dense_params(rng, d, d), "v": _dense_params(rng, d, d),
        "o": _dense_params(rng, d, d),
        "ln1_g": np.ones((d,), np.float32), "ln1_b": np.zeros((d,), np.float32),
        "ff1": _dense_params(rng, d, ff), "ff2": _dense_params(rng, ff, d),
        "ln2_g": np.ones((d,), np.float32), "ln2_b": np.zeros((d,), np.float32),
    }


def bert_layer(p, x, mask, n_heads=12):
    """Post-LN BERT encoder layer; ``mask`` is an additive [B, 1, 1, S] attention mask."""
    b, s, d = x.shape
    h = n_heads

    def proj(name, t):
        return t @ p[name]["w"] + p[name]["b"]

    q = proj("q", x).reshape(b, s, h, d // h)
    k = proj("k", x).reshape(b, s, h, d // h)
    v = proj("v", x).reshape(b, s, h, d // h)
    a = attention(q, k, v, mask=mask).reshape(b, s, d)
    x = layer_norm(x + proj("o", a), p["ln1_g"], p["ln1_b"])
    f = jax.nn.gelu(proj("ff1", x), approximate=False)
    return layer_norm(x + proj("ff2", f), p["ln2_g"], p["ln2_b"])


def _bert_args(s, b=1, d=768, ff=3072):
    def make(rng):
        mask = np.zeros((b, 1, 1, s), np.float32)
        mask[..., s - s // 8:] = -1e9  # padded tail, as a tokenizer would produce
        return (_transformer_params(rng, d, ff), _normal(rng, (b, s, d)), mask)
    return make


def gpt2_block(p, x, n_heads=12):
    """Pre-LN GPT-2 decoder block with a causal mask and tanh-GELU."""
    b, s, d = x.shape
    h = n_heads
    y = layer_norm(x, p["ln1_g"], p["ln1_b"], eps=1e-5)
    q = (y @ p["q"]["w"] + p["q"]["b"]).reshape(b, s, h, d // h)
    k = (y @ p["k"]["w"] + p["k"]["b"]).reshape(b, s, h, d // h)
    v = (y @ p["v"]["w"] + p["v"]["b"]).reshape(b, s, h, d // h)
    a = attention(q, k, v, causal=True).reshape(b, s, d)
    x = x + a @ p["o"]["w"] + p["o"]["b"]
    y = layer_norm(x, p["ln2_g"], p["ln2_b"], eps=1e-5)
    f = jax.nn.gelu(y @ p["ff1"]["w"] + p["ff1"]["b"], approximate=True)
    return x + f @ p["ff2"]["w"] + p["ff2"]["b"]


def _gpt2_args(s=512, b=1, d=768, ff=3072):
    return lambda rng: (_transformer_params(rng, d, ff), _normal(rng, (b, s, d)))


# ------------------------------------------------------------------------------------------
# LLaMA-style block: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU
# ------------------------------------------------------------------------------------------
def rotary(x, cos, sin):
    """x: [B, S, H, Dh]; cos/sin: [S, Dh/2] (rotate-half convention)."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    c, s_ = cos[None, :, None, :], sin[None, :, None, :]
    return jnp.concatenate([x1 * c - x2 * s_, x2 * c + x1 * s_], axis=-1)


def llama_block(p, x, cos, sin, n_heads=16, n_kv=4):
    b, s, d = x.shape
    dh = d // n_heads
    y = rms_norm(x, p["attn_norm"])
    q = (y @ p["wq"]).reshape(b, s, n_heads, dh)
    k = (y @ p["wk"]).reshape(b, s, n_kv, dh)
    v = (y @ p["wv"]).reshape(b, s, n_kv, dh)
    q, k = rotary(q, cos, sin), rotary(k, cos, sin)
    rep = n_heads // n_kv
    k = jnp.repeat(k, rep, axis=2)
    v = jnp.repeat(v, rep, axis=2)
    a = attention(q, k, v, causal=True).reshape(b, s, d)
    x = x + a @ p["wo"]
    y = rms_norm(x, p["ffn_norm"])
    g = jax.nn.silu(y @ p["w1"]) * (y @ p["w3"])
    return x + g @ p["w2"]


def _llama_args(s=256, b=1, d=1024, ff=2816, n_heads=16, n_kv=4):
    def make(rng):
        dh = d // n_heads
        sc = 1.0 / math.sqrt(d)
        p = {"attn_norm": np.ones((d,), np.float32), "ffn_norm": np.ones((d,), np.float32),
             "wq": _normal(rng, (d, d), sc), "wk": _normal(rng, (d, n_kv * dh), sc),
             "wv": _normal(rng, (d, n_kv * dh), sc), "wo": _normal(rng, (d, d), sc),
             "w1": _normal(rng, (d, ff), sc), "w3": _normal(rng, (d, ff), sc),
             "w2": _normal(rng, (ff, d), 1.0 / math.sqrt(ff))}
        inv = 1.0 / (10000 ** (np.arange(0, dh, 2, dtype=np.float32) / dh))
        ang = np.arange(s, dtype=np.float32)[:, None] * inv[None, :]
        return (p, _normal(rng, (b, s, d)), np.cos(ang).astype(np.float32),
                np.sin(ang).astype(np.float32))
    return make


def llama_decode(p, x, cache_k, cache_v, cos, sin, start, n_heads=16, n_kv=4):
    """``T = cos.shape[0] - start`` greedy-style decode steps of :func:`llama_block`'s layer
    with a KV cache (``[B, S_max, n_kv, Dh]``, filled up to ``start`` as a prompt would), one
    query row per step under ``lax.fori_loop``: each step writes its K/V at the position and
    attends to the cache up to it (the mask), K/V repeated to the query heads as models write
    it. Returns the last hidden state and the caches."""
    b, _, d = x.shape
    dh = d // n_heads
    rep = n_heads // n_kv
    s_max = cache_k.shape[1]

    def step(t, carry):
        x, ck, cv = carry
        y = rms_norm(x, p["attn_norm"])
        c, s_ = lax.dynamic_slice_in_dim(cos, t, 1), lax.dynamic_slice_in_dim(sin, t, 1)
        q = rotary((y @ p["wq"]).reshape(b, 1, n_heads, dh), c, s_)
        k = rotary((y @ p["wk"]).reshape(b, 1, n_kv, dh), c, s_)
        ck = lax.dynamic_update_slice(ck, k, (0, t, 0, 0))
        cv = lax.dynamic_update_slice(cv, (y @ p["wv"]).reshape(b, 1, n_kv, dh), (0, t, 0, 0))
        s = jnp.einsum("bqhd,bkhd->bhqk", q, jnp.repeat(ck, rep, axis=2)) / math.sqrt(dh)
        s = jnp.where(jnp.arange(s_max) <= t, s, jnp.finfo(s.dtype).min)
        a = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(s, -1), jnp.repeat(cv, rep, axis=2))
        x = x + a.reshape(b, 1, d) @ p["wo"]
        y = rms_norm(x, p["ffn_norm"])
        return x + (jax.nn.silu(y @ p["w1"]) * (y @ p["w3"])) @ p["w2"], ck, cv
    return lax.fori_loop(start, cos.shape[0], step, (x, cache_k, cache_v))


def _llama_decode_args(s_max=2048, start=1024, steps=16, b=4, d=1024, n_heads=16, n_kv=4):
    block = _llama_args(s=start + steps, b=b, d=d, n_heads=n_heads, n_kv=n_kv)

    def make(rng):
        p, _, cos, sin = block(rng)
        dh = d // n_heads
        cache = [_normal(rng, (b, s_max, n_kv, dh)) for _ in range(2)]
        return (p, _normal(rng, (b, 1, d)), cache[0], cache[1], cos, sin, np.int32(start))
    return make


# ------------------------------------------------------------------------------------------
# ResNet-50 stage conv2_x with inference BatchNorm
# ------------------------------------------------------------------------------------------
_DN = {"NHWC": ("NHWC", "HWIO", "NHWC"), "NCHW": ("NCHW", "OIHW", "NCHW")}


def _bn(x, bn, layout):
    """Inference BatchNorm from running statistics, as written in Flax/Haiku."""
    shape = (1, 1, 1, -1) if layout == "NHWC" else (1, -1, 1, 1)
    scale = bn["gamma"] * lax.rsqrt(bn["var"] + 1e-5)
    return (x - bn["mean"].reshape(shape)) * scale.reshape(shape) + bn["beta"].reshape(shape)


def _conv(x, w, layout, stride=1):
    k = w.shape[0] if layout == "NHWC" else w.shape[2]
    pad = [(k // 2, k // 2)] * 2
    return lax.conv_general_dilated(x, w, (stride, stride), pad, dimension_numbers=_DN[layout])


def resnet_stage(params, x, layout="NHWC"):
    """Three bottleneck blocks (1x1 -> 3x3 -> 1x1, BN after each, ReLU, residual)."""
    for i, blk in enumerate(params):
        y = jax.nn.relu(_bn(_conv(x, blk["w1"], layout), blk["bn1"], layout))
        y = jax.nn.relu(_bn(_conv(y, blk["w2"], layout), blk["bn2"], layout))
        y = _bn(_conv(y, blk["w3"], layout), blk["bn3"], layout)
        sc = _bn(_conv(x, blk["wsc"], layout), blk["bnsc"], layout) if "wsc" in blk else x
        x = jax.nn.relu(y + sc)
    return x


def _resnet_args(layout, hw=56, c_in=64, width=64, c_out=256, blocks=3, b=1):
    def wshape(k, ci, co):
        return (k, k, ci, co) if layout == "NHWC" else (co, ci, k, k)

    def bn(rng, c):
        return {"gamma": (1 + _normal(rng, (c,), 0.1)), "beta": _normal(rng, (c,), 0.1),
                "mean": _normal(rng, (c,), 0.1), "var": (1 + np.abs(_normal(rng, (c,), 0.1)))}

    def make(rng):
        params = []
        ci = c_in
        for i in range(blocks):
            blk = {"w1": _normal(rng, wshape(1, ci, width), 1 / math.sqrt(ci)), "bn1": bn(rng, width),
                   "w2": _normal(rng, wshape(3, width, width), 1 / math.sqrt(9 * width)),
                   "bn2": bn(rng, width),
                   "w3": _normal(rng, wshape(1, width, c_out), 1 / math.sqrt(width)),
                   "bn3": bn(rng, c_out)}
            if ci != c_out:
                blk["wsc"] = _normal(rng, wshape(1, ci, c_out), 1 / math.sqrt(ci))
                blk["bnsc"] = bn(rng, c_out)
            params.append(blk)
            ci = c_out
        shape = (b, hw, hw, c_in) if layout == "NHWC" else (b, c_in, hw, hw)
        return (params, _normal(rng, shape))
    return make


# ------------------------------------------------------------------------------------------
# MLP, attention, micro-benchmarks
# ------------------------------------------------------------------------------------------
def mlp(params, x):
    for layer in params:
        x = jax.nn.gelu(x @ layer["w"] + layer["b"], approximate=False)
    return x


def _mlp_args(d=4096, layers=3, b=64):
    return lambda rng: ([_dense_params(rng, d, d) for _ in range(layers)], _normal(rng, (b, d)))


def _bf16_mlp_loss(ws, x, y):
    h = x
    for w in ws[:-1]:
        h = jax.nn.gelu(h @ w)
    logits = (h @ ws[-1]).astype(jnp.float32)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))


def mlp_bf16_train(ws, x, y):
    """One SGD step of a bf16 MLP (bf16 weights and activations, f32 loss): forward and
    backward dots are all bf16 x bf16 -> bf16 (``dot-f32-accumulate`` on cpu)."""
    loss, grads = jax.value_and_grad(_bf16_mlp_loss)(ws, x, y)
    return loss, [w - jnp.asarray(0.1, w.dtype) * g for w, g in zip(ws, grads)]


def _mlp_bf16_train_args(sizes=(512, 1024, 1024, 10), b=256):
    def make(rng):
        ws = [_normal(rng, (a, c), 0.02).astype(jnp.bfloat16) for a, c in zip(sizes, sizes[1:])]
        return (ws, _normal(rng, (b, sizes[0])).astype(jnp.bfloat16),
                rng.integers(0, sizes[-1], b).astype(np.int32))
    return make


def long_attention(q, k, v):
    """B=1, H heads, BSHD inputs, no mask: softmax(QK^T / sqrt(d)) V."""
    return attention(q, k, v)


def _attn_args(s, h=8, dh=64, b=1):
    return lambda rng: tuple(_normal(rng, (b, s, h, dh)) for _ in range(3))


def layernorm_micro(x, g, b):
    return layer_norm(x, g, b, eps=1e-5)


def softmax_micro(x):
    return jax.nn.softmax(x, axis=-1)


def tiny_mlp(params, x):
    return jnp.tanh(x @ params["w"] + params["b"]).sum(axis=0)


# ------------------------------------------------------------------------------------------
# int8-quantized models (weights and activations), as AQT / qwix serving code writes them
# ------------------------------------------------------------------------------------------
def quant_int8(x, scale):
    """Symmetric int8 quantization with a per-tensor (static, calibrated) scale."""
    return jnp.clip(jnp.round(x / scale), -127, 127).astype(jnp.int8)


def int8_linear(x, p, sx):
    """int8 x int8 -> int32 dot_general, then the dequant scale (activation scale times the
    per-output-channel weight scale) and the bias in f32."""
    acc = lax.dot_general(quant_int8(x, sx), p["wq"], (((x.ndim - 1,), (0,)), ((), ())),
                          preferred_element_type=jnp.int32)
    return acc.astype(jnp.float32) * (sx * p["s"]) + p["b"]


def _int8_dense(rng, d_in, d_out):
    w = _normal(rng, (d_in, d_out), 1.0 / math.sqrt(d_in))
    s = (np.abs(w).max(axis=0) / 127.0).astype(np.float32)
    return {"wq": np.clip(np.round(w / s), -127, 127).astype(np.int8), "s": s,
            "b": _normal(rng, (d_out,), 0.02)}


def int8_mlp(p, x):
    """Quantized linear -> GELU -> linear (activation scales calibrated for N(0,1) inputs)."""
    return int8_linear(jax.nn.gelu(int8_linear(x, p["ff1"], 0.03)), p["ff2"], 0.02)


def _int8_mlp_args(d=1024, ff=4096, b=256):
    return lambda rng: ({"ff1": _int8_dense(rng, d, ff), "ff2": _int8_dense(rng, ff, d)},
                        _normal(rng, (b, d)))


def int8_block(p, x, n_heads=12):
    """GPT-2-small block with every linear layer int8 (attention scores and softmax in f32)."""
    b, s, d = x.shape
    h = n_heads
    y = layer_norm(x, p["ln1_g"], p["ln1_b"], eps=1e-5)
    q = int8_linear(y, p["q"], 0.03).reshape(b, s, h, d // h)
    k = int8_linear(y, p["k"], 0.03).reshape(b, s, h, d // h)
    v = int8_linear(y, p["v"], 0.03).reshape(b, s, h, d // h)
    a = attention(q, k, v, causal=True).reshape(b, s, d)
    x = x + int8_linear(a, p["o"], 0.01)
    y = layer_norm(x, p["ln2_g"], p["ln2_b"], eps=1e-5)
    f = jax.nn.gelu(int8_linear(y, p["ff1"], 0.03), approximate=True)
    return x + int8_linear(f, p["ff2"], 0.02)


def _int8_block_args(s=512, b=1, d=768, ff=3072):
    def make(rng):
        p = {n: _int8_dense(rng, d, d) for n in ("q", "k", "v", "o")}
        p.update(ff1=_int8_dense(rng, d, ff), ff2=_int8_dense(rng, ff, d),
                 ln1_g=np.ones((d,), np.float32), ln1_b=np.zeros((d,), np.float32),
                 ln2_g=np.ones((d,), np.float32), ln2_b=np.zeros((d,), np.float32))
        return (p, _normal(rng, (b, s, d)))
    return make


WORKLOADS: dict[str, Workload] = {w.name: w for w in [
    Workload("bert_s128", bert_layer, _bert_args(128), "BERT-base encoder layer, B=1 S=128",
             "transformer"),
    Workload("bert_s512", bert_layer, _bert_args(512), "BERT-base encoder layer, B=1 S=512",
             "transformer"),
    Workload("gpt2_block", gpt2_block, _gpt2_args(), "GPT-2-small block (causal), B=1 S=512",
             "transformer"),
    Workload("llama_block", llama_block, _llama_args(),
             "LLaMA-style block (RMSNorm, rotary, GQA 16/4, SwiGLU), d=1024 S=256", "transformer"),
    Workload("llama_decode", llama_decode, _llama_decode_args(),
             "llama_block's layer decoding 16 tokens from a 2048-slot KV cache at 1024, B=4",
             "transformer"),
    Workload("resnet_nhwc", lambda p, x: resnet_stage(p, x, "NHWC"), _resnet_args("NHWC"),
             "ResNet-50 conv2_x stage, inference BN, NHWC 1x56x56x64", "conv"),
    Workload("resnet_nchw", lambda p, x: resnet_stage(p, x, "NCHW"), _resnet_args("NCHW"),
             "ResNet-50 conv2_x stage, inference BN, NCHW 1x64x56x56", "conv"),
    Workload("resnet_nhwc_frozen", lambda p, x: resnet_stage(p, x, "NHWC"), _resnet_args("NHWC"),
             "resnet_nhwc with parameters closed over (constants, as in deployed inference)",
             "conv", frozen=True),
    Workload("mlp_3x4096", mlp, _mlp_args(), "MLP 3 x (4096x4096 + GELU), batch 64", "mlp"),
    Workload("attn_s2048", long_attention, _attn_args(2048), "attention B=1 H=8 d=64 S=2048",
             "attention"),
    Workload("attn_s4096", long_attention, _attn_args(4096), "attention B=1 H=8 d=64 S=4096",
             "attention"),
    Workload("layernorm", layernorm_micro,
             lambda rng: (_normal(rng, (4096, 1024)), np.ones((1024,), np.float32),
                          np.zeros((1024,), np.float32)), "layernorm x[4096,1024]", "micro"),
    Workload("softmax", softmax_micro, lambda rng: (_normal(rng, (4096, 1024)),),
             "softmax x[4096,1024]", "micro"),
    Workload("int8_mlp", int8_mlp, _int8_mlp_args(),
             "int8 MLP (weights+activations) 1024->4096 GELU ->1024, batch 256", "quantized"),
    Workload("int8_mlp_frozen", int8_mlp, _int8_mlp_args(),
             "int8_mlp with the weights closed over (constants: XLA folds the cpu kernel's "
             "int8->bf16 weight conversion)", "quantized", frozen=True),
    Workload("int8_block", int8_block, _int8_block_args(),
             "GPT-2-small block, every linear int8 (weights+activations), B=1 S=512", "quantized"),
    Workload("mlp_bf16_train", mlp_bf16_train, _mlp_bf16_train_args(),
             "bf16 MLP training step 512-1024x2-10 (GELU, CE, SGD), batch 256", "mlp"),
    Workload("tiny", tiny_mlp,
             lambda rng: ({"w": _normal(rng, (64, 64), 0.1), "b": _normal(rng, (64,), 0.1)},
                          _normal(rng, (32, 64))), "tiny MLP (tests)", "micro"),
]}

#: what ``python -m bench`` runs without ``--models``
DEFAULT = ["bert_s128", "bert_s512", "gpt2_block", "llama_block", "llama_decode", "resnet_nhwc",
           "resnet_nchw", "resnet_nhwc_frozen", "mlp_3x4096", "attn_s2048", "attn_s4096", "layernorm", "softmax"]
#: ``--quick`` (< 5 min on 2 cores): fewer rounds, without the two slowest/most redundant
#: workloads (attn_s4096: seconds per call on CPU; resnet_nchw: same stage as resnet_nhwc)
QUICK = [n for n in DEFAULT if n not in ("attn_s4096", "resnet_nchw", "resnet_nhwc_frozen")]


def names() -> list[str]:
    return list(WORKLOADS)


def get(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}") from None
