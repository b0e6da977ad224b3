"""``depthwise-conv-taps``: on cpu a depthwise convolution becomes the sum of its taps (strided
slices of the padded input times per-channel weights), its input gradient too (strided: the
gradient interleaved with zeros), and its filter gradient one reduced product per filter
position: the values of the unrewritten module within ``reassociate`` over layouts, strides,
padding, filter dilation, filter sizes, 1-D and 2-D, f32 and bf16; no convolution left; a
MobileNet block and its gradient through the default pipeline against jax.jit; refusals in the
report; other targets and ``disable=`` untouched; a rerun changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax import lax

import hlofuse
from hlofuse.runtime.execute import run_module
from hlofuse.runtime.testing import assert_same
from tests.fusion_util import PREFIX

PASS = "depthwise-conv-taps"
PIPE = f"{PREFIX},{PASS}"
R = np.random.default_rng(0)


def dw(x, w, stride=1, padding="SAME", dil=1, dn=("NHWC", "HWIO", "NHWC"), groups=None):
    n = x.ndim - 2
    c = x.shape[dn[0].index("C")]
    return lax.conv_general_dilated(x, w, (stride,) * n, padding, rhs_dilation=(dil,) * n,
                                    dimension_numbers=dn, feature_group_count=groups or c)


def _stats(report):
    (stats,) = [p.stats for p in report.passes if p.name == PASS]
    return stats


def _text(fn, args, platform="cpu"):
    return jax.export.export(jax.jit(fn), platforms=[platform])(*args).mlir_module()


def _f32(*shape):
    return R.standard_normal(shape).astype(np.float32)


CASES = {
    "3x3 same": ((2, 9, 9, 8), (3, 3, 1, 8), {}),
    "stride 2": ((1, 10, 10, 8), (3, 3, 1, 8), dict(stride=2)),
    "stride 2 valid, odd": ((1, 11, 11, 8), (3, 3, 1, 8), dict(stride=2, padding="VALID")),
    "5x5 uneven padding": ((1, 9, 9, 4), (5, 5, 1, 4), dict(padding=((1, 3), (2, 0)))),
    "filter dilation 2": ((1, 12, 12, 4), (3, 3, 1, 4), dict(dil=2)),
    "7x7 (ConvNeXt)": ((1, 9, 9, 6), (7, 7, 1, 6), {}),
    "channels first": ((2, 8, 9, 9), (8, 1, 3, 3), dict(dn=("NCHW", "OIHW", "NCHW"))),
    "output in another layout": ((2, 9, 9, 8), (3, 3, 1, 8), dict(dn=("NHWC", "HWIO", "NCHW"))),
    "1-D, stride 2": ((2, 17, 8), (3, 1, 8), dict(stride=2, dn=("NWC", "WIO", "NWC"))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_depthwise_convolutions_become_sums_of_taps(name):
    xs, ws, kw = CASES[name]
    x, w = _f32(*xs), _f32(*ws)
    fn = lambda x, w: dw(x, w, **kw)  # noqa: E731
    text = _text(fn, (x, w))
    _check_rewritten(fn, (x, w), {"rewritten": 1, "filter_gradients": 0})


# grouped convolutions with few channels per group (ResNeXt), and channel multipliers
GROUPED = {
    "channel multiplier 2": ((1, 9, 9, 4), (3, 3, 1, 8), dict(groups=4)),
    "4 channels per group": ((1, 9, 9, 8), (3, 3, 4, 8), dict(groups=2)),
    "2 per group, 4 outputs each, NCHW, stride 2": (
        (2, 8, 9, 9), (16, 2, 3, 3), dict(groups=4, stride=2, dn=("NCHW", "OIHW", "NCHW"))),
}


@pytest.mark.parametrize("name", list(GROUPED))
def test_grouped_convolutions_and_their_input_gradients_become_taps(name):
    xs, ws, kw = GROUPED[name]
    x, w = _f32(*xs), _f32(*ws)
    _check_rewritten(lambda x, w: dw(x, w, **kw), (x, w), {"rewritten": 1, "filter_gradients": 0})
    dy = _f32(*jax.eval_shape(lambda x, w: dw(x, w, **kw), x, w).shape)
    dx = lambda w, dy: jax.vjp(lambda z: dw(z, w, **kw), x)[1](dy)[0]  # noqa: E731
    _check_rewritten(dx, (w, dy), {"rewritten": 1, "filter_gradients": 0})


@pytest.mark.parametrize("name", list(CASES))
def test_input_and_filter_gradients_become_taps_too(name):
    """jax's input gradient (a depthwise convolution of the flipped filter; strided: over the
    output gradient interleaved with zeros, ``lhs_dilation``) and filter gradient
    (``batch_group_count`` groups) of each case."""
    xs, ws, kw = CASES[name]
    x, w = _f32(*xs), _f32(*ws)
    dy = _f32(*jax.eval_shape(lambda x, w: dw(x, w, **kw), x, w).shape)
    # each gradient is linear in the other operand: only the arguments it reads
    dx = lambda w, dy: jax.vjp(lambda z: dw(z, w, **kw), x)[1](dy)[0]  # noqa: E731
    dw_ = lambda x, dy: jax.vjp(lambda v: dw(x, v, **kw), w)[1](dy)[0]  # noqa: E731
    _check_rewritten(dx, (w, dy), {"rewritten": 1, "filter_gradients": 0})
    _check_rewritten(dw_, (x, dy), {"rewritten": 1, "filter_gradients": 1})


def _check_rewritten(fn, args, stats):
    text = _text(fn, args)
    opt = hlofuse.optimize(text, target="cpu", pipeline=PIPE)
    assert _stats(opt.report) == stats
    assert "stablehlo.convolution" not in opt.text and "stablehlo.slice" in opt.text
    base = hlofuse.optimize(text, target="cpu", pipeline=PREFIX)
    got, want = run_module(opt.text, list(args)), run_module(base.text, list(args))
    assert got[0].shape == want[0].shape
    assert_same(got, want, "reassociate")
    # a rerun finds nothing to rewrite and changes nothing
    again = hlofuse.optimize(opt.text, target="cpu", pipeline=PASS)
    assert _stats(again.report) == {"rewritten": 0, "filter_gradients": 0}
    assert again.text == hlofuse.optimize(opt.text, target="cpu", pipeline="none").text


def test_bf16_is_computed_in_f32_and_rounded_once():
    x, w = _f32(1, 9, 9, 16).astype(jnp.bfloat16), _f32(3, 3, 1, 16).astype(jnp.bfloat16)
    f = hlofuse.jit(dw, autotune=False)
    assert _stats(f.report(x, w)) == {"rewritten": 1, "filter_gradients": 0}
    text = f.lower(x, w).as_text()
    assert "stablehlo.convolution" not in text and "tensor<1x9x9x16xf32>" in text
    got, want = f(x, w), jax.jit(dw)(x, w)
    assert got.dtype == want.dtype == jnp.bfloat16
    assert_same(got, want, "reassociate")


def _mobilenet_block(p, x):
    """Inverted residual: 1x1 expand, ReLU6, 3x3 depthwise (stride 1), BatchNorm (inference
    affine), ReLU6, 1x1 project, residual."""
    h = jnp.clip(jnp.einsum("nhwc,cd->nhwd", x, p["expand"]), 0, 6)
    h = dw(h, p["dw"]) * p["scale"] + p["shift"]
    h = jnp.clip(h, 0, 6)
    return x + jnp.einsum("nhwd,dc->nhwc", h, p["project"])


def _block_args():
    p = {"expand": _f32(8, 24) * 0.3, "dw": _f32(3, 3, 1, 24) * 0.3, "scale": _f32(24),
         "shift": _f32(24), "project": _f32(24, 8) * 0.3}
    return p, _f32(2, 10, 10, 8)


def test_mobilenet_block_and_its_gradient_against_jax_jit():
    p, x = _block_args()
    f = hlofuse.jit(_mobilenet_block, autotune=False)
    assert _stats(f.report(p, x)) == {"rewritten": 1, "filter_gradients": 0}
    assert "stablehlo.convolution" not in f.lower(p, x).as_text()
    assert_same(f(p, x), jax.jit(_mobilenet_block)(p, x), "reassociate")
    # the gradient: the forward, the input gradient and the filter gradient, no convolution left
    loss = lambda p, x: jnp.sum(_mobilenet_block(p, x) ** 2)  # noqa: E731
    g = hlofuse.jit(jax.grad(loss, argnums=(0, 1)), autotune=False)
    assert _stats(g.report(p, x)) == {"rewritten": 3, "filter_gradients": 1}
    assert "stablehlo.convolution" not in g.lower(p, x).as_text()
    assert_same(g(p, x), jax.jit(jax.grad(loss, argnums=(0, 1)))(p, x), "reassociate")


def test_refusals_are_reported_and_left_as_written():
    x = _f32(1, 8, 8, 32)
    cases = {
        # 16 channels per group: 144 products per output, past max_taps (72)
        "9 filter positions x 16 channel(s) per group (max_taps=72)": (
            lambda x, w: dw(x, w, groups=2), _f32(3, 3, 16, 32)),
        # a channel multiplier's filter gradient is not one channel vector per position
        "not a per-channel filter gradient": (
            lambda x, dy: jax.vjp(lambda v: dw(x, v, groups=32), _f32(3, 3, 1, 64))[1](dy)[0],
            _f32(1, 8, 8, 64)),
    }
    for why, (fn, w) in cases.items():
        text = _text(fn, (x, w))
        opt = hlofuse.optimize(text, target="cpu", pipeline=PIPE)
        assert _stats(opt.report)[f"refused[{why}]"] == 1, why
        assert "stablehlo.convolution" in opt.text
        assert any(n.startswith(PASS) and why in n for n in opt.report.notes), opt.report.notes
        assert_same(run_module(opt.text, [x, w]),
                    run_module(hlofuse.optimize(text, target="cpu", pipeline=PREFIX).text, [x, w]),
                    "reassociate")
    # a filter of more positions than max_taps
    x, w = _f32(1, 8, 8, 4), _f32(3, 3, 1, 4)
    opt = hlofuse.optimize(_text(dw, (x, w)), target="cpu", pipeline=PIPE,
                           options={PASS: {"max_taps": 8}})
    assert _stats(opt.report) == {
        "rewritten": 0, "filter_gradients": 0,
        "refused[9 filter positions x 1 channel(s) per group (max_taps=8)]": 1}
    # an ungrouped convolution is not a candidate
    opt = hlofuse.optimize(_text(lambda x, w: dw(x, w, groups=1), (x, _f32(3, 3, 4, 4))),
                           target="cpu", pipeline=PIPE)
    assert _stats(opt.report) == {"rewritten": 0, "filter_gradients": 0}
    assert "stablehlo.convolution" in opt.text


def test_other_targets_and_disabled_leave_the_convolution():
    x, w = _f32(1, 8, 8, 4), _f32(3, 3, 1, 4)
    for platform, target, opts in (("cuda", "gpu", None), ("tpu", "tpu", None),
                                   ("cpu", "cpu", [PASS])):
        text = _text(dw, (x, w), platform)
        opt = hlofuse.optimize(text, target=target, pipeline=PIPE, disable=opts or ())
        assert _stats(opt.report) == ({} if opts else {"rewritten": 0, "filter_gradients": 0})
        assert opt.text == hlofuse.optimize(text, target=target, pipeline=PREFIX).text


def test_a_zero_sum_of_negative_zeros_may_change_sign_as_passes_readme_says():
    """passes/README.md, invariant 1: products that are all -0.0 sum to -0.0 as taps, to +0.0
    in the convolution (its sum starts from +0.0); within the pass's tolerance category, and
    not fixable by an added ``+ 0.0``, which XLA simplifies away (checked here, so the page
    goes stale loudly if XLA changes)."""
    def f(x, w):
        return lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)),
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        feature_group_count=4)
    x, w = np.zeros((1, 5, 5, 4), np.float32), -np.ones((3, 3, 1, 4), np.float32)
    text = jax.jit(f).lower(x, w).as_text()
    after = hlofuse.optimize(text, pipeline=f"{PREFIX},depthwise-conv-taps")
    assert "stablehlo.convolution" not in after.text
    got, want = run_module(after.text, [x, w])[0], run_module(text, [x, w])[0]
    assert_same(got, want, "reassociate")
    assert np.signbit(got).all() and not np.signbit(want).any()
    assert np.signbit(jax.jit(lambda a: a + 0.0)(np.float32(-0.0)))
