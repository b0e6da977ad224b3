"""conv1x1-to-dot: 1x1 NHWC convolutions become dots, so fuse-matmul-epilogue fuses their
epilogue; every other convolution stays, with a note saying why."""

import numpy as np

import jax

import hlofuse
from hlofuse.runtime.testing import assert_same
from tests.fusion_util import kernels, outline, pipe

PIPE = pipe("conv1x1-to-dot", "fuse-matmul-epilogue")
R = np.random.default_rng(1)
F32 = np.float32


def _conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))


def test_conv1x1_becomes_matmul_with_bn_relu_residual_epilogue():
    x = R.standard_normal((2, 6, 6, 16)).astype(F32)
    w = (R.standard_normal((1, 1, 16, 16)) * 0.2).astype(F32)
    sc, sh = R.standard_normal(16).astype(F32), R.standard_normal(16).astype(F32)
    fn = lambda x, w, sc, sh: jax.nn.relu(_conv(x, w) * sc + sh + x)  # noqa: E731
    for target in ("gpu", "tpu"):
        out = outline(fn, (x, w, sc, sh), "conv1x1-to-dot,fuse-matmul-epilogue", target=target,
                      options={"conv1x1-to-dot": {"on_gpu": True, "on_tpu": True}})
        (r,) = [r for r in out.report.regions if r.kind == "matmul_epilogue"]
        assert r.extra["conv1x1"] and r.reason is None and "stablehlo.maximum" in r.ops
    # gpu and tpu by default: the convolutions stay (measured less memory with XLA's own
    # convolutions: H100/A100, v5e)
    for target in ("gpu", "tpu"):
        out = outline(fn, (x, w, sc, sh), "conv1x1-to-dot,fuse-matmul-epilogue", target=target)
        assert not [r for r in out.report.regions if r.kind == "matmul_epilogue"]
        (s,) = [p.stats for p in out.report.passes if p.name == "conv1x1-to-dot"]
        assert s == {"conv1x1_as_dot": 0,
                     "skipped": f"{target} (on_{target}=true rewrites there)"}
    # cpu: a dot by default, left to XLA's library dot and epilogue fusion (no kernel)
    f = hlofuse.jit(fn, target="cpu", pipeline=PIPE)
    rep = f.report(x, w, sc, sh)
    assert not kernels(rep, "matmul_epilogue")
    (r,) = [r for r in rep.regions if r.kind == "matmul_epilogue"]
    assert r.extra["conv1x1"] and "1x1 convolution's dot on cpu" in r.reason
    assert "stablehlo.convolution" not in f.lower(x, w, sc, sh).as_text()
    assert_same(f(x, w, sc, sh), jax.jit(fn)(x, w, sc, sh), "reassociate")


def test_other_convolutions_are_reported_and_left_to_xla():
    x = R.standard_normal((2, 6, 6, 8)).astype(F32)
    w3 = (R.standard_normal((3, 3, 8, 8)) * 0.2).astype(F32)
    w1 = (R.standard_normal((1, 1, 8, 8)) * 0.2).astype(F32)
    fn = lambda x, a, b: (jax.nn.relu(_conv(x, a)), _conv(x, b))  # noqa: E731
    f = hlofuse.jit(fn, target="cpu", pipeline=PIPE, options={"conv1x1_as_dot": False})
    notes = f.report(x, w3, w1).notes
    assert any("1 convolution(s) left to XLA" in n and "3x3 kernel" in n for n in notes), notes
    assert any("1 1x1 convolution(s) left to XLA" in n and "conv1x1_as_dot=False" in n for n in notes), notes
    assert_same(f(x, w3, w1), jax.jit(fn)(x, w3, w1), "exact")
    # a second run over the optimized module finds nothing new (idempotence)
    again = hlofuse.optimize(f.lower(x, w3, w1).as_text(), target="cpu", pipeline=PIPE,
                             options={"conv1x1_as_dot": False})
    assert again.report.regions == []
    (stats,) = [p.stats for p in again.report.passes if p.name == "conv1x1-to-dot"]
    assert stats == {"conv1x1_as_dot": 0}
