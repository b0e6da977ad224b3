"""``hlofuse.jit(..., freeze_argnums=...)`` and the issue-5 acceptance test: an NCHW conv net
(conv -> BN -> relu, twice, plus a residual) under ``target="gpu"`` keeps transposes only at the
boundaries, has no BatchNorm arithmetic over activations left, and computes what ``jax.jit``
computes (run with the same passes on CPU, since the gpu module cannot execute here)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax

import hlofuse
from hlofuse.runtime.testing import assert_same
from hlofuse.runtime.testing import ALL_KERNELS

RNG = np.random.default_rng(0)
C = 8


def bn_params():
    return {"mean": RNG.standard_normal(C).astype(np.float32),
            "var": RNG.uniform(0.5, 2.0, C).astype(np.float32),
            "gamma": RNG.standard_normal(C).astype(np.float32),
            "beta": RNG.standard_normal(C).astype(np.float32)}


PARAMS = {"w1": (0.3 * RNG.standard_normal((C, C, 3, 3))).astype(np.float32),
          "w2": (0.3 * RNG.standard_normal((C, C, 3, 3))).astype(np.float32),
          "bn1": bn_params(), "bn2": bn_params()}
X = RNG.standard_normal((2, C, 8, 8)).astype(np.float32)


def batchnorm(x, p, eps=1e-5):
    """Inference BatchNorm over NCHW, as flax writes it."""
    shape = (1, -1, 1, 1)
    mul = lax.rsqrt(p["var"] + eps) * p["gamma"]
    return (x - p["mean"].reshape(shape)) * mul.reshape(shape) + p["beta"].reshape(shape)


def conv(x, w):
    return lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))


def net(params, x):
    y = jax.nn.relu(batchnorm(conv(x, params["w1"]), params["bn1"]))
    y = batchnorm(conv(y, params["w2"]), params["bn2"])
    return jax.nn.relu(y + x)


def op_counts(text: str) -> dict:
    ops = re.findall(r"= (stablehlo\.[a-z_]+)", text)
    return {o: ops.count(o) for o in set(ops)}


def stats(report, name):
    return next(p.stats for p in report.passes if p.name == name)


def test_conv_net_gpu_layout_and_batchnorm_folded():
    f = hlofuse.jit(net, freeze_argnums=0, target="gpu", options=ALL_KERNELS)
    low = f.lower(PARAMS, X)
    text = low.as_text()
    main = text[text.index("func.func public @main"):]
    main = main[:main.index("\n  }")]
    counts = op_counts(main)
    # two NHWC convolutions; only the input and output boundary transposes remain
    assert counts.get("stablehlo.convolution") == 2
    assert main.count("[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]") == 2
    assert counts.get("stablehlo.transpose") == 2
    # frozen parameters are constants: @main takes only x
    assert re.search(r"@main\(%arg0: tensor<2x8x8x8xf32>[^,]*\) ->", main)
    # no BatchNorm arithmetic over activations: no subtract / multiply / rsqrt anywhere
    for op in ("stablehlo.subtract", "stablehlo.multiply", "stablehlo.rsqrt", "stablehlo.divide"):
        assert op not in text, op
    assert stats(low.report, "batchnorm-fold")["folded"] == 2
    la = stats(low.report, "layout-assignment")
    assert la["convs_to_channels_last"] == 2 and la["transposes_after"] == 2
    # bias + relu (+ residual) epilogues became Triton kernels
    assert text.count("__gpu$xla.gpu.triton") >= 2


def test_conv_net_same_pipeline_on_cpu_matches_jax():
    f = hlofuse.jit(net, freeze_argnums=0, target="cpu", options={"conv_layout": "channels_last"})
    out = f(PARAMS, X)
    rep = f.lower(PARAMS, X).report
    assert stats(rep, "batchnorm-fold")["folded"] == 2
    assert stats(rep, "layout-assignment")["transposes_after"] == 2
    assert_same(out, jax.jit(net)(PARAMS, X), "reassociate")


def test_freeze_cache_is_keyed_on_identity():
    f = hlofuse.jit(net, freeze_argnums=0, target="cpu", pipeline="cleanup")
    f(PARAMS, X)
    f(PARAMS, X + 1)
    assert f.compilations == 1
    other = jax.tree_util.tree_map(lambda a: a * 2, PARAMS)   # new arrays: new constants
    y = f(other, X)
    assert f.compilations == 2
    assert_same(y, jax.jit(net)(other, X), "kernel")


def test_freeze_argnums_validation():
    with pytest.raises(ValueError, match="frozen arguments cannot also be"):
        hlofuse.jit(net, freeze_argnums=0, donate_argnums=0)
    g = hlofuse.jit(lambda w, x: x @ w, freeze_argnums=-2, target="cpu", pipeline="cleanup")
    w = np.eye(3, dtype=np.float32)
    text = g.lower(w, np.ones((2, 3), np.float32)).as_text()
    assert "stablehlo.constant" in text and len(re.findall(r"%arg\d+:", text)) == 1
    with pytest.raises(ValueError, match="freeze_argnums"):
        hlofuse.jit(lambda w: w, freeze_argnums=3)(w)
