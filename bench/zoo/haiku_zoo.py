"""Zoo models written with Haiku: a BERT-style encoder in bf16 (``hk.MultiHeadAttention``,
``hk.LayerNorm``; Haiku creates parameters in the input's dtype) and ResNet-50's stem and
first stage in NCHW (``hk.Conv2D``/``hk.BatchNorm`` with ``data_format="NCHW"``, state from
``hk.transform_with_state``). Parameters and state are arguments of the returned function."""

from __future__ import annotations

import numpy as np

import haiku as hk
import jax
import jax.numpy as jnp

from bench.zoo.inputs import padding_mask


# ------------------------------------------------------------------------------------------
# BERT-style encoder
# ------------------------------------------------------------------------------------------
def hk_bert(cfg, seed):
    rng = np.random.default_rng(seed)
    d, heads, ff = cfg["d"], cfg["heads"], cfg["ff"]
    dtype = jnp.dtype(cfg["dtype"])

    def forward(x, keep):
        mask = (keep[:, None, None, :] & keep[:, None, :, None])  # [B, 1, S, S]
        for _ in range(cfg["layers"]):
            a = hk.MultiHeadAttention(heads, d // heads, model_size=d,
                                      w_init=hk.initializers.VarianceScaling(1.0))(x, x, x, mask)
            x = hk.LayerNorm(-1, True, True, eps=1e-12)(x + a)
            h = hk.Linear(d)(jax.nn.gelu(hk.Linear(ff)(x)))
            x = hk.LayerNorm(-1, True, True, eps=1e-12)(x + h)
        return x

    t = hk.without_apply_rng(hk.transform(forward))
    x = jnp.asarray(rng.standard_normal((cfg["batch"], cfg["seq"], d)).astype(np.float32), dtype)
    keep = padding_mask(cfg["batch"], cfg["seq"])
    params = t.init(jax.random.key(seed), x, keep)  # in x's dtype
    return t.apply, (params, x, keep)


# ------------------------------------------------------------------------------------------
# ResNet-50 stem + conv2_x, NCHW
# ------------------------------------------------------------------------------------------
def _bn():
    return hk.BatchNorm(True, True, 0.9, eps=1e-5, data_format="NCHW")


def _conv(c, k, stride=1):
    return hk.Conv2D(c, k, stride=stride, with_bias=False, data_format="NCHW")


def hk_resnet(cfg, seed):
    rng = np.random.default_rng(seed)
    width = cfg["width"]

    def forward(x, is_training):
        x = jax.nn.relu(_bn()(_conv(cfg["stem"], 7, 2)(x), is_training))
        x = hk.max_pool(x, (1, 1, 3, 3), (1, 1, 2, 2), "SAME", channel_axis=1)
        for _ in range(cfg["blocks"]):
            y = jax.nn.relu(_bn()(_conv(width, 1)(x), is_training))
            y = jax.nn.relu(_bn()(_conv(width, 3)(y), is_training))
            y = _bn()(_conv(width * 4, 1)(y), is_training)
            if y.shape != x.shape:
                x = _bn()(_conv(width * 4, 1)(x), is_training)
            x = jax.nn.relu(x + y)
        return x

    t = hk.without_apply_rng(hk.transform_with_state(forward))
    x = jnp.asarray(rng.standard_normal((cfg["batch"], 3, cfg["image"], cfg["image"]))
                    .astype(np.float32))
    params, state = t.init(jax.random.key(seed), x, True)

    def trained(path, v):  # running statistics as a trained network has them
        name = "/".join(str(p) for p in path)
        if "mean_ema" in name and "average" in name:
            return jnp.asarray(rng.standard_normal(v.shape).astype(np.float32) * 0.1)
        if "var_ema" in name and "average" in name:
            return jnp.asarray(rng.uniform(0.5, 1.5, v.shape).astype(np.float32))
        return v
    state = jax.tree_util.tree_map_with_path(trained, state)

    def fn(params, state, x):
        out, _ = t.apply(params, state, x, False)
        return out
    return fn, (params, state, x)


__all__ = ["hk_bert", "hk_resnet"]
