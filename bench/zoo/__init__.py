"""A model zoo built with public JAX model libraries (Flax NNX and Linen, Equinox, Haiku,
Transformers' Flax classes, Keras 3 on its JAX backend).

Every model is written the way the library's users write it (its layers, its init, its
state handling), with random weights from a config: nothing is downloaded. A model is a pure
function ``fn(*args)`` whose parameters are *arguments* (never closed over), as a training or
serving step passes them, plus its arguments. Each model has two configs:

* ``small``: a few hundred parameters to a few thousand, for CI (``tests/test_zoo.py``);
* ``real``: the published model's layer sizes (BERT-base, Llama-style GQA, ViT-S/16, ResNet-50
  stage 1, ...) with the depth cut to a few layers so that ``python -m bench --zoo`` runs in
  minutes on a 2-core CPU; the table says what each one is.

The libraries are an optional extra (``pip install -e ".[zoo]"``); this module imports none of
them, so listing the zoo and :func:`missing_libraries` work without it.

    python -m bench --zoo [--models nnx_llama,eqx_mlp] [--zoo-size real|small] [--plot zoo.png]
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from typing import Callable

__all__ = ["ZooModel", "MODELS", "LIBRARIES", "names", "get", "import_library",
           "missing_libraries", "instantiate",
           "f32_reference", "bf16_parity", "BF16_PARITY"]

#: import name -> the distribution that provides it (what ``.[zoo]`` installs)
LIBRARIES = {"flax": "flax", "equinox": "equinox", "haiku": "dm-haiku", "optax": "optax",
             "transformers": "transformers", "keras": "keras"}


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """One zoo model.

    Attributes:
      name: identifier on the command line and in tables.
      library: the library it is written with ('flax.nnx', 'flax.linen', 'equinox', 'haiku',
        'transformers', 'keras').
      kind: 'encoder', 'decoder', 'decode' (one generation step with a KV cache), 'vit',
            'convnet' or 'mlp'.
      mode: 'inference' or 'train' (a training step: value_and_grad + an optax update).
      builder: ``'module:function'`` in this package; called as ``function(cfg, seed)`` it
        returns ``(fn, args)``.
      small, real: the two configs (plain dicts, passed to the builder).
      description: what the real config is, one line.
      category: the :data:`hlofuse.runtime.testing.TOLERANCES` category its outputs are compared with.
      requires: import names of the libraries it needs.
    """
    name: str
    library: str
    kind: str
    mode: str
    builder: str
    small: dict
    real: dict
    description: str
    category: str
    requires: tuple = ()

    def config(self, size: str) -> dict:
        if size not in ("small", "real"):
            raise ValueError(f"zoo config size must be 'small' or 'real', got {size!r}")
        return dict(self.small if size == "small" else self.real)

    def instantiate(self, size: str = "real", seed: int = 0) -> tuple[Callable, tuple]:
        mod, fun = self.builder.split(":")
        build = getattr(importlib.import_module(f"bench.zoo.{mod}"), fun)
        return build(self.config(size), seed)


def _m(name, library, kind, mode, builder, small, real, description, category, requires):
    return ZooModel(name, library, kind, mode, builder, small, real, description, category,
                    tuple(requires))


_NNX, _LINEN, _EQX, _HK = ("flax", "optax"), ("flax", "optax"), ("equinox", "optax"), ("haiku",)
_HF = ("transformers", "flax")
_KERAS = ("keras",)

MODELS: dict[str, ZooModel] = {m.name: m for m in [
    # ---------------------------------------------------------------- Flax NNX
    _m("nnx_bert", "flax.nnx", "encoder", "inference", "flax_zoo:nnx_bert",
       dict(layers=1, d=32, heads=4, ff=64, seq=8, batch=2, vocab=50),
       dict(layers=2, d=768, heads=12, ff=3072, seq=128, batch=2, vocab=30522),
       "BERT-base encoder (nnx.MultiHeadAttention, padding mask, GELU), 2 of 12 layers, B=2 S=128",
       "reassociate", _NNX),
    _m("nnx_llama", "flax.nnx", "decoder", "inference", "flax_zoo:nnx_llama",
       dict(layers=1, d=32, heads=4, kv_heads=2, ff=64, seq=8, batch=1, vocab=64, dtype="float32"),
       dict(layers=2, d=1024, heads=16, kv_heads=4, ff=2816, seq=256, batch=1, vocab=32000,
            dtype="float32"),
       "Llama-style decoder (RMSNorm, RoPE, GQA 16q/4kv, causal, SwiGLU), d=1024, 2 layers, S=256",
       "reassociate", _NNX),
    _m("nnx_llama_bf16", "flax.nnx", "decoder", "inference", "flax_zoo:nnx_llama",
       dict(layers=1, d=32, heads=4, kv_heads=2, ff=64, seq=8, batch=1, vocab=64, dtype="bfloat16"),
       dict(layers=2, d=1024, heads=16, kv_heads=4, ff=2816, seq=256, batch=1, vocab=32000,
            dtype="bfloat16"),
       "nnx_llama with bf16 parameters and activations",
       "reassociate", _NNX),
    _m("nnx_llama_train", "flax.nnx", "decoder", "train", "flax_zoo:nnx_llama_train",
       dict(layers=1, d=32, heads=4, kv_heads=2, ff=64, seq=8, batch=2, vocab=64, dtype="float32"),
       dict(layers=2, d=256, heads=8, kv_heads=2, ff=704, seq=256, batch=4, vocab=4096,
            dtype="float32"),
       "Llama training step (GQA 8q/2kv, RoPE, causal, SwiGLU; next-token CE, optax.sgd "
       "momentum), "
       "d=256, 2 layers, B=4 S=256", "grad", _NNX),
    _m("nnx_gpt_scan_train", "flax.nnx", "decoder", "train", "flax_zoo:nnx_gpt_scan_train",
       dict(layers=2, d=32, heads=4, ff=64, seq=8, batch=2, vocab=64),
       dict(layers=4, d=256, heads=8, ff=1024, seq=256, batch=4, vocab=4096),
       "GPT training step with its blocks under nnx.scan and nnx.remat (causal, pre-LN, GELU; "
       "next-token CE, optax.sgd momentum), d=256, 4 layers, B=4 S=256", "grad", _NNX),
    _m("nnx_gpt_scan_noremat_train", "flax.nnx", "decoder", "train",
       "flax_zoo:nnx_gpt_scan_noremat_train",
       dict(layers=2, d=32, heads=4, ff=64, seq=8, batch=2, vocab=64),
       dict(layers=4, d=256, heads=8, ff=1024, seq=256, batch=4, vocab=4096),
       "nnx_gpt_scan_train without nnx.remat: the forward loop saves the probabilities for the "
       "backward loop, d=256, 4 layers, B=4 S=256", "grad", _NNX),
    _m("nnx_vit", "flax.nnx", "vit", "inference", "flax_zoo:nnx_vit",
       dict(layers=1, d=32, heads=4, ff=64, image=16, patch=8, batch=2, classes=10),
       dict(layers=4, d=384, heads=6, ff=1536, image=224, patch=16, batch=2, classes=1000),
       "ViT-S/16 (patch conv, class token, pre-LN encoder), 4 of 12 layers, 224x224, B=2",
       "reassociate", _NNX),
    _m("nnx_mlp_train", "flax.nnx", "mlp", "train", "flax_zoo:nnx_mlp_train",
       dict(sizes=(16, 32, 32, 4), batch=8),
       dict(sizes=(784, 2048, 2048, 2048, 10), batch=256),
       "MLP training step (nnx.Linear, GELU, softmax CE, optax.adamw), 784-2048x3-10, B=256",
       "grad", _NNX),
    # ---------------------------------------------------------------- Flax Linen
    _m("linen_resnet_nhwc", "flax.linen", "convnet", "inference", "flax_zoo:linen_resnet",
       dict(stem=8, width=4, blocks=1, image=16, batch=1),
       dict(stem=64, width=64, blocks=3, image=224, batch=1),
       "ResNet-50 stem + stage conv2_x (3 bottlenecks), BatchNorm (running stats), NHWC, 224x224",
       "reassociate", _LINEN),
    _m("linen_resnet_train", "flax.linen", "convnet", "train", "flax_zoo:linen_resnet_train",
       dict(widths=(8, 16), image=8, batch=4, classes=10),
       dict(widths=(32, 64, 128), image=32, batch=32, classes=10),
       "CIFAR-style ResNet training step (BatchNorm batch stats, optax.sgd momentum), 32x32, B=32",
       "grad", _LINEN),
    _m("linen_int8_bert", "flax.linen", "encoder", "inference", "flax_zoo:linen_int8_bert",
       dict(layers=1, d=32, heads=4, ff=64, seq=8, batch=2),
       dict(layers=2, d=768, heads=12, ff=3072, seq=128, batch=2),
       "BERT-base encoder with every Dense int8 (int8 weights, per-channel scales, static "
       "activation scales, int8 dot_general -> int32), padding mask, 2 of 12 layers, B=2 S=128",
       "requantize", _LINEN),
    _m("linen_unet", "flax.linen", "unet", "inference", "flax_zoo:linen_unet",
       dict(ch=8, groups=4, heads=2, image=8, batch=2),
       dict(ch=64, groups=32, heads=4, image=32, batch=4),
       "Diffusion UNet (GroupNorm, SiLU, 3x3 convs, sinusoidal timestep embedding, 16x16 "
       "self-attention, avg-pool down, nearest resize up with skip), 64/128 channels, 32x32, B=4",
       "reassociate", _LINEN),
    _m("linen_unet_train", "flax.linen", "unet", "train", "flax_zoo:linen_unet_train",
       dict(ch=8, groups=4, heads=2, image=8, batch=2),
       dict(ch=64, groups=32, heads=4, image=32, batch=4),
       "linen_unet's denoising training step (noise-prediction MSE, optax.adamw)",
       "grad", _LINEN),
    # ---------------------------------------------------------------- Equinox
    _m("eqx_cnn_nchw", "equinox", "convnet", "inference", "eqx_zoo:eqx_cnn",
       dict(channels=(4, 8), image=8, batch=2, classes=10),
       dict(channels=(32, 64, 128, 256), image=64, batch=16, classes=100),
       "4-conv CNN with eqx.nn.BatchNorm (inference), NCHW (vmapped CHW), 64x64, B=16",
       "reassociate", _EQX),
    _m("eqx_mlp", "equinox", "mlp", "inference", "eqx_zoo:eqx_mlp",
       dict(din=16, width=32, depth=2, dout=4, batch=8, dtype="float32"),
       dict(din=1024, width=4096, depth=3, dout=1024, batch=128, dtype="float32"),
       "eqx.nn.MLP 1024-4096x3-1024, GELU, vmapped over B=128",
       "reassociate", _EQX),
    _m("eqx_mlp_bf16", "equinox", "mlp", "inference", "eqx_zoo:eqx_mlp",
       dict(din=16, width=32, depth=2, dout=4, batch=8, dtype="bfloat16"),
       dict(din=1024, width=4096, depth=3, dout=1024, batch=128, dtype="bfloat16"),
       "eqx_mlp in bf16",
       "reassociate", _EQX),
    _m("eqx_gpt", "equinox", "decoder", "inference", "eqx_zoo:eqx_gpt",
       dict(layers=1, d=32, heads=4, ff=64, seq=8, batch=1, vocab=64),
       dict(layers=2, d=768, heads=12, ff=3072, seq=256, batch=2, vocab=50257),
       "GPT-2-small decoder (eqx.nn.MultiheadAttention, RoPE, causal mask), 2 of 12 layers, "
       "B=2 S=256", "reassociate", _EQX),
    _m("eqx_gpt_train", "equinox", "decoder", "train", "eqx_zoo:eqx_gpt_train",
       dict(layers=1, d=32, heads=4, ff=64, seq=8, batch=2, vocab=64),
       dict(layers=2, d=256, heads=4, ff=1024, seq=128, batch=8, vocab=4096),
       "GPT decoder training step (next-token CE, optax.adam), d=256, 2 layers, B=8 S=128",
       "grad", _EQX),
    # ---------------------------------------------------------------- Haiku
    _m("hk_bert_bf16", "haiku", "encoder", "inference", "haiku_zoo:hk_bert",
       dict(layers=1, d=32, heads=4, ff=64, seq=8, batch=2, dtype="bfloat16"),
       dict(layers=2, d=768, heads=12, ff=3072, seq=128, batch=2, dtype="bfloat16"),
       "BERT-base encoder (hk.MultiHeadAttention, hk.LayerNorm) in bf16, 2 of 12 layers, "
       "B=2 S=128", "reassociate", _HK),
    _m("hk_resnet_nchw", "haiku", "convnet", "inference", "haiku_zoo:hk_resnet",
       dict(stem=8, width=4, blocks=1, image=16, batch=1),
       dict(stem=64, width=64, blocks=3, image=224, batch=1),
       "ResNet-50 stem + stage conv2_x, hk.Conv2D/hk.BatchNorm data_format=NCHW, 224x224",
       "reassociate", _HK),
    # ---------------------------------------------------------------- Transformers (Flax)
    _m("hf_bert", "transformers", "encoder", "inference", "hf_zoo:hf_bert",
       dict(layers=1, d=32, heads=4, ff=64, seq=8, batch=2, vocab=50),
       dict(layers=2, d=768, heads=12, ff=3072, seq=128, batch=2, vocab=30522),
       "Transformers FlaxBertModel (BertConfig, exact GELU, head mask einsum, padding mask), "
       "2 of 12 layers, B=2 S=128", "reassociate", _HF),
    _m("hf_llama_decode", "transformers", "decode", "inference", "hf_zoo:hf_llama_decode",
       dict(layers=1, d=32, heads=4, kv_heads=2, ff=64, prompt=8, cache=16, batch=2, vocab=64),
       dict(layers=2, d=1024, heads=16, kv_heads=4, ff=2816, prompt=1024, cache=2048, batch=4,
            vocab=32000),
       "Transformers FlaxLlamaForCausalLM decode step (GQA 16q/4kv, KV cache of 2048 filled to "
       "1024 by the prompt, one token), d=1024, 2 layers, B=4", "reassociate", _HF),
    # ---------------------------------------------------------------- Keras 3 (JAX backend)
    _m("keras_mobilenet", "keras", "convnet", "inference", "keras_zoo:keras_mobilenet",
       dict(image=32, alpha=0.35, classes=10, batch=2),
       dict(image=224, alpha=1.0, classes=1000, batch=1),
       "keras.applications.MobileNetV2 (depthwise-separable convs, BatchNorm, ReLU6), NHWC "
       "224x224, B=1", "reassociate", _KERAS),
    _m("keras_bert", "keras", "encoder", "inference", "keras_zoo:keras_bert",
       dict(layers=1, d=32, heads=4, ff=64, seq=8, batch=2, vocab=50),
       dict(layers=2, d=768, heads=12, ff=3072, seq=128, batch=2, vocab=30522),
       "BERT-style encoder of keras.layers.MultiHeadAttention (EinsumDense projections, padding "
       "mask), LayerNormalization, exact GELU, 2 layers d=768, B=2 S=128", "reassociate", _KERAS),
    _m("keras_cnn_train", "keras", "convnet", "train", "keras_zoo:keras_cnn_train",
       dict(widths=(8, 16), image=8, batch=4, classes=10),
       dict(widths=(32, 64, 128), image=32, batch=32, classes=10),
       "CNN training step (Conv2D, BatchNormalization batch stats, residual adds, "
       "SparseCategoricalCrossentropy, Adam via stateless_apply), 32x32, B=32", "grad", _KERAS),
]}


def names() -> list[str]:
    return list(MODELS)


def get(name: str) -> ZooModel:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(MODELS)}") from None


def import_library(lib: str):
    """Import a zoo library by its import name. Keras 3 picks its backend at its first import
    (TensorFlow by default): the zoo's Keras models need JAX's, so it is set first unless the
    environment names one."""
    if lib == "keras":
        os.environ.setdefault("KERAS_BACKEND", "jax")
    return importlib.import_module(lib)


def missing_libraries(models=None) -> list[str]:
    """Distributions the given models (default: all) need that cannot be imported here."""
    need = sorted({lib for m in (models or MODELS.values()) for lib in m.requires})
    out = []
    for lib in need:
        try:
            import_library(lib)
        except ImportError:
            out.append(LIBRARIES.get(lib, lib))
    return out


def instantiate(name: str, size: str = "real", seed: int = 0) -> tuple[Callable, tuple]:
    return get(name).instantiate(size, seed)


#: a bf16 model whose outputs differ from jax.jit's beyond the bf16 tolerance still passes when
#: hlofuse is as accurate as jax.jit: its max and RMS errors against the same model computed in
#: f32 are at most this multiple of jax.jit's. Several layers of bf16 rounding at different
#: fusion boundaries move outputs by a few bf16 ulps of the output's *scale*, which an
#: elementwise tolerance cannot express near zero (nnx_llama_bf16: both sides 0.047 max error
#: against f32 on logits of size 4, 0.043 apart).
BF16_PARITY = 1.5


def f32_reference(name: str, size: str, seed: int, args) -> Callable | None:
    """For a bf16 model: a function of the model's outputs' leaves giving the same model built
    in f32 with the bf16 arguments upcast (None for other models)."""
    import jax
    import jax.numpy as jnp
    m = get(name)
    cfg = m.config(size)
    if cfg.get("dtype") != "bfloat16":
        return None
    mod, fun = m.builder.split(":")
    build = getattr(importlib.import_module(f"bench.zoo.{mod}"), fun)
    fn32, args32 = build(dict(cfg, dtype="float32"), seed)
    up = jax.tree_util.tree_map(
        lambda a: a.astype(jnp.float32) if getattr(a, "dtype", None) == jnp.bfloat16 else a, args)
    if jax.tree_util.tree_structure(up) != jax.tree_util.tree_structure(args32):
        raise ValueError(f"{name}: the f32 build has another argument structure")
    return lambda: jax.jit(fn32)(*up)


def accuracy(out, ref) -> dict:
    """Max and RMS absolute error of ``out`` against ``ref`` over all leaves (in float64)."""
    import jax
    import numpy as np
    a = np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree_util.tree_leaves(out)])
    b = np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree_util.tree_leaves(ref)])
    d = np.abs(a - b)
    return {"max": float(d.max()), "rms": float(np.sqrt(np.mean(d * d)))}


def bf16_parity(out, want, ref) -> dict:
    """``out`` is as accurate as ``want`` against ``ref`` (see :data:`BF16_PARITY`)."""
    eo, ew = accuracy(out, ref), accuracy(want, ref)
    ok = eo["max"] <= BF16_PARITY * ew["max"] and eo["rms"] <= BF16_PARITY * ew["rms"]
    return {"ok": ok, "hlofuse_vs_f32": eo, "jax_vs_f32": ew, "factor": BF16_PARITY}
