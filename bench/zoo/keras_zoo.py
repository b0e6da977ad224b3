"""Zoo models written with Keras 3 on its JAX backend: ``keras.applications.MobileNetV2``
(depthwise-separable convolutions, BatchNorm, ReLU6; NHWC), a BERT-style encoder of
``keras.layers.MultiHeadAttention`` and ``LayerNormalization``, and a CNN training step.

Keras models are stateful objects; JAX users call them functionally, as Keras' guide to
custom JAX training loops writes it: ``model.stateless_call(trainable, non_trainable, x)``
with the variables' values as arguments, and ``optimizer.stateless_apply`` for the update.
The backend must be JAX: :func:`bench.zoo.import_library` sets ``KERAS_BACKEND=jax`` before
the first import, and :func:`_keras` refuses a Keras already imported with another backend.
"""

from __future__ import annotations

import numpy as np

import jax
import jax.numpy as jnp

from bench.zoo import import_library
from bench.zoo.inputs import padding_mask, token_ids


def _keras():
    """``keras`` on the JAX backend (:func:`bench.zoo.import_library`), or a clear error when
    it was imported with another one."""
    keras = import_library("keras")
    if keras.backend.backend() != "jax":
        raise RuntimeError(f"the Keras zoo models need KERAS_BACKEND=jax; Keras was imported "
                           f"with the {keras.backend.backend()!r} backend")
    return keras


def _variables(model):
    return ([v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables])


# ------------------------------------------------------------------------------------------
# MobileNetV2 (keras.applications, random weights)
# ------------------------------------------------------------------------------------------
def keras_mobilenet(cfg, seed):
    keras = _keras()
    keras.utils.set_random_seed(seed)
    model = keras.applications.MobileNetV2(
        input_shape=(cfg["image"], cfg["image"], 3), alpha=cfg["alpha"], weights=None,
        classes=cfg["classes"], classifier_activation=None)
    tv, ntv = _variables(model)

    def fn(tv, ntv, x):
        y, _ = model.stateless_call(tv, ntv, x, training=False)
        return y

    x = np.random.default_rng(seed).standard_normal(
        (cfg["batch"], cfg["image"], cfg["image"], 3)).astype(np.float32)
    return fn, (tv, ntv, jnp.asarray(x))


# ------------------------------------------------------------------------------------------
# BERT-style encoder (keras.layers.MultiHeadAttention, post-LN, exact GELU)
# ------------------------------------------------------------------------------------------
def _encoder(keras, cfg):
    layers = keras.layers
    ids = keras.Input((cfg["seq"],), dtype="int32")
    mask = keras.Input((cfg["seq"],), dtype="bool")
    x = layers.Embedding(cfg["vocab"], cfg["d"])(ids)
    x = x + layers.Embedding(cfg["seq"], cfg["d"])(keras.ops.arange(cfg["seq"]))
    x = layers.LayerNormalization(epsilon=1e-12)(x)
    attn_mask = mask[:, None, :]                 # [B, 1, S]: every query sees the unpadded keys
    for _ in range(cfg["layers"]):
        a = layers.MultiHeadAttention(cfg["heads"], cfg["d"] // cfg["heads"])(
            x, x, attention_mask=attn_mask)
        x = layers.LayerNormalization(epsilon=1e-12)(x + a)
        f = layers.Dense(cfg["ff"], activation=keras.activations.gelu)(x)
        x = layers.LayerNormalization(epsilon=1e-12)(x + layers.Dense(cfg["d"])(f))
    return keras.Model([ids, mask], x)


def keras_bert(cfg, seed):
    keras = _keras()
    keras.utils.set_random_seed(seed)
    model = _encoder(keras, cfg)
    tv, ntv = _variables(model)
    rng = np.random.default_rng(seed)
    b, s = cfg["batch"], cfg["seq"]

    def fn(tv, ntv, ids, mask):
        y, _ = model.stateless_call(tv, ntv, [ids, mask], training=False)
        return y

    return fn, (tv, ntv, token_ids(rng, (b, s), cfg["vocab"]), padding_mask(b, s))


# ------------------------------------------------------------------------------------------
# CNN training step (Conv2D + BatchNormalization in training mode, Adam)
# ------------------------------------------------------------------------------------------
def _cnn(keras, cfg):
    layers = keras.layers
    x = inp = keras.Input((cfg["image"], cfg["image"], 3))
    for i, c in enumerate(cfg["widths"]):
        x = layers.Conv2D(c, 3, strides=1 if i == 0 else 2, padding="same", use_bias=False)(x)
        x = layers.ReLU()(layers.BatchNormalization()(x))
        y = layers.Conv2D(c, 3, padding="same", use_bias=False)(x)
        x = layers.ReLU()(x + layers.BatchNormalization()(y))
    x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, layers.Dense(cfg["classes"])(x))


def keras_cnn_train(cfg, seed):
    keras = _keras()
    keras.utils.set_random_seed(seed)
    model = _cnn(keras, cfg)
    opt = keras.optimizers.Adam(1e-3)
    opt.build(model.trainable_variables)
    loss_obj = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    tv, ntv = _variables(model)
    ov = [v.value for v in opt.variables]

    def step(tv, ntv, ov, x, y):
        def loss_fn(tv):
            logits, ntv_new = model.stateless_call(tv, ntv, x, training=True)
            return loss_obj(y, logits), ntv_new
        (loss, ntv_new), grads = jax.value_and_grad(loss_fn, has_aux=True)(tv)
        tv_new, ov_new = opt.stateless_apply(ov, grads, tv)
        return loss, tv_new, ntv_new, ov_new

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((cfg["batch"], cfg["image"], cfg["image"], 3)).astype(np.float32)
    return step, (tv, ntv, ov, jnp.asarray(x),
                  token_ids(rng, (cfg["batch"],), cfg["classes"]))
