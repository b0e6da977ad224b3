"""conv-winograd: 3x3 stride-1 f32 convolutions become Winograd F(2x2, 3x3) kernels on cpu,
in any layout and padding, forward and in the backward; everything else stays with XLA (3x3
refusals noted), and gpu/tpu keep every convolution."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax

import hlofuse
from hlofuse.kernels.conv_winograd import (build_conv_winograd, conv_winograd_reference,
                                           spec_from_func, winograd_f2x2_3x3)
from hlofuse.runtime.testing import assert_same
from tests.fusion_util import kernels, outline, pipe

PIPE = pipe("conv-winograd", "conv1x1-to-dot", "fuse-matmul-epilogue", "fuse-elementwise")
R = np.random.default_rng(7)
F32 = np.float32


def _conv(x, w, padding="SAME", dn=("NHWC", "HWIO", "NHWC"), stride=1, groups=1):
    return lax.conv_general_dilated(x, w, (stride, stride), padding, dimension_numbers=dn,
                                    feature_group_count=groups)


def _winograd_regions(rep):
    return [r for r in rep.regions if r.kind == "conv_winograd"]


@pytest.mark.parametrize("shape,padding", [((1, 56, 56, 16), ((1, 1), (1, 1))),
                                           ((2, 7, 9, 16), ((1, 1), (1, 1))),
                                           ((1, 8, 8, 16), ((0, 0), (0, 0))),
                                           ((1, 6, 5, 16), ((2, 0), (1, 2)))])
def test_transform_matches_the_direct_convolution(shape, padding):
    """Odd sizes (a partial last tile), no padding and uneven padding."""
    x = R.standard_normal(shape).astype(F32)
    w = R.standard_normal((3, 3, shape[-1], 24)).astype(F32)
    want = _conv(x, w, [tuple(p) for p in padding])
    got = winograd_f2x2_3x3(jnp.asarray(x), jnp.asarray(w), padding)
    assert got.shape == want.shape
    assert_same(got, want, "reassociate")
    # an inf input takes the direct convolution through the output transform: the same
    # values, infs and NaNs as the direct convolution, partial tiles and padding included
    x[0, 1, 2, 3] = np.inf
    want = np.asarray(_conv(x, w, [tuple(p) for p in padding]))
    got = np.asarray(winograd_f2x2_3x3(jnp.asarray(x), jnp.asarray(w), padding))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    assert_same(got[fin], want[fin], "exact")


def test_conv_block_is_a_winograd_kernel_on_cpu():
    x = R.standard_normal((2, 12, 10, 32)).astype(F32)
    w = (R.standard_normal((3, 3, 32, 32)) * 0.1).astype(F32)
    sc, sh = R.standard_normal(32).astype(F32), R.standard_normal(32).astype(F32)
    fn = lambda x, w, sc, sh: jax.nn.relu(_conv(x, w) * sc + sh + x)  # noqa: E731
    f = hlofuse.jit(fn, target="cpu", pipeline=PIPE, tiered=False, autotune=False)
    rep = f.report(x, w, sc, sh)
    (r,) = _winograd_regions(rep)
    assert r.kernel.startswith("hlofuse_conv_winograd_") and r.extra["algorithm"] == "winograd F(2x2,3x3)"
    assert kernels(rep, "conv_winograd")
    text = f.lower(x, w, sc, sh).as_text()
    # the direct convolution is left only as the fallback for a result that is not finite
    assert text.count("stablehlo.convolution") == 1
    assert "stablehlo.case" in text or "stablehlo.if" in text
    assert_same(f(x, w, sc, sh), jax.jit(fn)(x, w, sc, sh), "reassociate")


@pytest.mark.parametrize("case", ["inf-row", "nan-pixel", "near-max", "huge-x-tiny-w",
                                  "tiny-x-huge-w"])
def test_non_finite_and_huge_inputs_give_what_the_direct_convolution_gives(case):
    """The transforms subtract inputs (inf - inf = NaN where the direct sum is inf) and scale
    them up before the products (an overflow where the direct sum is finite): a row of +inf
    gave NaN for jax.jit's +inf, values near the float32 maximum gave inf for finite outputs
    (found by an adversarial test), and so did a huge input with a tiny filter (the input
    transform alone overflowed: all NaN for finite outputs) or a tiny input with a huge filter.
    Inputs that could overflow any intermediate are convolved directly."""
    rng = np.random.default_rng(0)
    w = (np.abs(rng.standard_normal((3, 3, 16, 16))) * 0.1).astype(F32)
    x = rng.standard_normal((1, 8, 8, 16)).astype(F32)
    if case == "inf-row":
        x[0, 0] = np.inf
    elif case == "nan-pixel":
        x[0, 3, 4, 5] = np.nan
    elif case == "near-max":
        x = (np.sign(x) * 1.5e38).astype(F32)
        w = (rng.standard_normal((3, 3, 16, 16)) * 1e-3).astype(F32)
    elif case == "huge-x-tiny-w":     # alternating signs: Bᵀ d B reaches 4 max|x|
        x = (1e38 * (-1.0) ** np.add.outer(np.arange(8), np.arange(8)))[None, :, :, None]
        x = np.broadcast_to(x, (1, 8, 8, 16)).astype(F32)
        w = (rng.standard_normal((3, 3, 16, 16)) * 1e-5).astype(F32)
    else:
        x = (x * 1e-20).astype(F32)
        w = np.full((3, 3, 16, 16), 3e38, F32)
    f = hlofuse.jit(_conv, tiered=False, autotune=False)
    assert _winograd_regions(f.report(x, w))            # the rewrite fired
    got, want = np.asarray(f(x, w)), np.asarray(jax.jit(_conv)(x, w))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    assert_same(got[fin], want[fin], "reassociate")


@pytest.mark.parametrize("dn", [("NCHW", "OIHW", "NCHW"), ("NHWC", "OIHW", "NCHW"),
                                ("NCHW", "HWIO", "NHWC")])
def test_any_layout(dn):
    """The kernel reads the program's layouts as they are (layout-assignment is not in this
    pipeline, so the convolution keeps them)."""
    x = R.standard_normal((1, 16, 9, 11) if dn[0] == "NCHW" else (1, 9, 11, 16)).astype(F32)
    w = R.standard_normal((20, 16, 3, 3) if dn[1] == "OIHW" else (3, 3, 16, 20)).astype(F32)
    fn = lambda x, w: _conv(x, w, "SAME", dn) * 2.0  # noqa: E731
    f = hlofuse.jit(fn, target="cpu", pipeline=PIPE, tiered=False, autotune=False)
    assert len(_winograd_regions(f.report(x, w))) == 1
    assert_same(f(x, w), jax.jit(fn)(x, w), "reassociate")


def test_kernel_family_against_its_reference():
    """spec_from_func / build / reference on the outlined region (the checks hlofuse.runtime.verify
    runs), for a permuted layout and uneven padding."""
    x = R.standard_normal((2, 16, 7, 6)).astype(F32)
    w = R.standard_normal((3, 3, 16, 17)).astype(F32)
    fn = lambda x, w: _conv(x, w, ((2, 0), (0, 1)), ("NCHW", "HWIO", "NHWC"))  # noqa: E731
    out = outline(fn, (x, w), "conv-winograd")
    (fn_op,) = out.funcs("conv_winograd")
    spec = spec_from_func(fn_op)
    assert spec.padding == ((2, 0), (0, 1))
    got = build_conv_winograd(spec, "cpu")(x, w)
    assert_same(got, conv_winograd_reference(spec)(x, w), "reassociate")
    assert_same(got[0], fn(x, w), "reassociate")
    with pytest.raises(NotImplementedError, match="cpu only"):
        build_conv_winograd(spec, "gpu")


def test_refusals_stay_with_xla_and_3x3_ones_are_noted():
    x = R.standard_normal((1, 10, 10, 32)).astype(F32)
    cases = {
        "window_strides != 1": lambda x, w: _conv(x, w, stride=2),
        "5x5 filter": lambda x, w: _conv(x, jnp.pad(w, ((1, 1), (1, 1), (0, 0), (0, 0)))),
        "feature_group_count != 1": lambda x, w: _conv(x, w[:, :, :16], groups=2),
        "bf16 convolution": lambda x, w: _conv(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)),
        "min_channels=16": lambda x, w: _conv(x[..., :8], w[:, :, :8]),
    }
    w = (R.standard_normal((3, 3, 32, 32)) * 0.1).astype(F32)
    for why, fn in cases.items():
        f = hlofuse.jit(fn, target="cpu", pipeline=PIPE, tiered=False, autotune=False)
        rep = f.report(x, w)
        assert not _winograd_regions(rep), why
        notes = [n for n in rep.notes if "conv-winograd" in n]
        if why == "5x5 filter":
            assert not notes, notes          # not a 3x3 convolution: conv1x1-to-dot's to note
        else:
            assert any(why in n for n in notes), (why, rep.notes)
        assert_same(f(x, w), jax.jit(fn)(x, w), "exact")


def test_gpu_and_tpu_keep_their_convolutions():
    x = R.standard_normal((1, 8, 8, 32)).astype(F32)
    w = R.standard_normal((3, 3, 32, 32)).astype(F32)
    for target in ("gpu", "tpu"):
        out = outline(lambda x, w: _conv(x, w), (x, w), "conv-winograd", target=target)
        assert not out.funcs("conv_winograd")
        assert "stablehlo.convolution" in str(out.module)


def test_disabled_and_idempotent():
    x = R.standard_normal((1, 8, 8, 32)).astype(F32)
    w = R.standard_normal((3, 3, 32, 32)).astype(F32)
    fn = lambda x, w: jax.nn.relu(_conv(x, w))  # noqa: E731
    off = hlofuse.jit(fn, target="cpu", pipeline=PIPE, tiered=False, autotune=False,
                      disable=["conv-winograd"])
    assert not _winograd_regions(off.report(x, w))
    on = hlofuse.jit(fn, target="cpu", pipeline=PIPE, tiered=False, autotune=False)
    again = hlofuse.optimize(on.lower(x, w).as_text(), target="cpu", pipeline=PIPE)
    assert not _winograd_regions(again.report)


def test_training_step_input_gradient_uses_winograd():
    """jax.grad of a conv layer: the input gradient is a 3x3 stride-1 convolution with the
    filter reversed and its feature dims swapped (a Winograd kernel); the filter gradient is a
    convolution over the whole image (left to XLA)."""
    x = R.standard_normal((2, 10, 10, 16)).astype(F32)
    w1 = (R.standard_normal((3, 3, 16, 16)) * 0.2).astype(F32)
    w2 = (R.standard_normal((3, 3, 16, 16)) * 0.2).astype(F32)

    def loss(w1, w2, x):
        return jnp.sum(jnp.tanh(_conv(jax.nn.relu(_conv(x, w1)), w2)) ** 2)
    step = jax.value_and_grad(loss, argnums=(0, 1))
    f = hlofuse.jit(step, target="cpu", tiered=False, autotune=False)
    rep = f.report(w1, w2, x)
    assert len(kernels(rep, "conv_winograd")) >= 3     # two forward, one input gradient
    assert_same(f(w1, w2, x), jax.jit(step)(w1, w2, x), "grad")
