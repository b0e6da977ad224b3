"""Quantized matmul kernels (the matmul-epilogue family on int8 x int8 -> int32 dots): int32
accumulation bit-exact on every target's tiles (gpu tiles in Pallas interpret mode, tpu tiles in
TPU interpret mode, cpu whole arrays), the dequant-scale / bias / gelu / requantize-to-int8
epilogue bit-exact against the unfused program, and the weight-only int8 prologue."""

import numpy as np

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.pallas import tpu as pltpu

from hlofuse.kernels import FAMILIES
from hlofuse.kernels import matmul_epilogue as mme
from hlofuse.kernels.tiling import MatmulBlocks
from hlofuse.runtime.testing import assert_same
from tests.fusion_util import check_kernel_everywhere, func_avals, outline

FAM = FAMILIES["matmul_epilogue"]
R = np.random.default_rng(17)


def idot(a, b):
    return lax.dot_general(a, b, (((a.ndim - 1,), (0,)), ((), ())), preferred_element_type=jnp.int32)


def requant(h, s):
    return jnp.clip(jnp.round(h / s), -127, 127).astype(jnp.int8)


def int8(shape):
    return R.integers(-128, 128, shape).astype(np.int8)   # the full int8 range, extremes included


def region(fn, *args):
    out = outline(fn, args, "fuse-matmul-epilogue")
    (f,) = out.funcs("matmul_epilogue")
    return out, f


def everywhere(f, ins, gpu_blocks, tpu_blocks):
    """Every target's tiles against the plain-jnp reference, bit for bit; returns the blocks."""
    spec = mme.spec_from_func(f)
    want = jax.jit(FAM.reference(spec))(*ins)
    used = {}
    for target, interp, blocks in (("cpu", None, None), ("gpu", True, gpu_blocks),
                                   ("tpu", pltpu.InterpretParams(), tpu_blocks)):
        k = FAM.build(spec, target, interpret=interp, blocks=blocks)
        assert_same(jax.jit(k)(*ins), want, "exact")
        used[target] = k.blocks
    return spec, used


def test_int32_accumulation_exact_on_every_tiling():
    # K=96 in 32-wide chunks (gpu: in-kernel loop; tpu: K on the grid with an int32 VMEM
    # accumulator); full-range int8 operands, the int32 result compared bit for bit
    x, w, b = int8((64, 96)), int8((96, 128)), R.integers(-1000, 1000, 128).astype(np.int32)
    fn = lambda x, w, b: idot(x, w) + b  # noqa: E731
    keep, f = region(fn, x, w, b)
    spec, used = everywhere(f, (x, w, b), MatmulBlocks("gpu", 1, 64, 128, 96, 32, 64, 32),
                            MatmulBlocks("tpu", 1, 64, 128, 96, 32, 128, 96, sublane=32))
    assert spec.integer and used["gpu"].k_steps == 3
    assert_same(jax.jit(FAM.build(spec, "cpu"))(x, w, b), (np.asarray(jax.jit(fn)(x, w, b)),), "exact")
    exact = x.astype(np.int64) @ w.astype(np.int64) + b
    assert np.array_equal(np.asarray(jax.jit(fn)(x, w, b)), exact)


def test_dequant_bias_gelu_requant_epilogue_exact():
    x, w = int8((32, 64)), int8((64, 128))
    sw = R.uniform(1e-3, 1e-2, 128).astype(np.float32)
    b = R.standard_normal(128).astype(np.float32)

    def fn(x, w, sw, b):   # one quantized layer: int8 in, int8 out for the next layer
        h = idot(x, w).astype(jnp.float32) * (0.05 * sw) + b
        return requant(jax.nn.gelu(h), 0.02)
    keep, f = region(fn, x, w, sw, b)
    spec = mme.spec_from_func(f)
    names = [o.name for o in spec.epilogue]
    assert "stablehlo.round_nearest_even" in names and spec.out_dtypes == (np.dtype(np.int8),)
    # the region reads (x, w, 0.05*sw, b, clip bounds as f32 scalars): jax hoists the scale
    # product and the bound converts out of it
    assert [a.shape for a in func_avals(f)] == [(32, 64), (64, 128), (128,), (128,), (), ()]
    ins = (x, w, np.float32(0.05) * sw, b, np.float32(-127), np.float32(127))
    spec, _ = everywhere(f, ins, MatmulBlocks("gpu", 1, 32, 128, 64, 16, 64, 32),
                         MatmulBlocks("tpu", 1, 32, 128, 64, 32, 128, 64, sublane=32))
    # against the unfused program (XLA's own int8 dot and epilogue), bit for bit, with
    # requantized values spread over the int8 range (not all saturated)
    got = np.asarray(jax.jit(FAM.build(spec, "cpu"))(*ins)[0])
    assert np.array_equal(got, np.asarray(jax.jit(fn)(x, w, sw, b)))
    assert len(np.unique(got)) > 100


def test_int8_kernel_lowers_to_triton_and_mosaic():
    x, w = int8((32, 64)), int8((64, 128))
    sw = R.uniform(1e-3, 1e-2, 128).astype(np.float32)
    keep, f = region(lambda x, w, sw: jax.nn.relu(idot(x, w).astype(jnp.float32) * sw), x, w, sw)
    check_kernel_everywhere(f, FAM, category="exact")


def test_weight_only_int8_prologue():
    # bf16 activations, int8 weights converted tile by tile inside the kernel, per-channel scale
    # in the epilogue (quantize-matmul moves it there); the kernel reads the weights as int8
    x = R.standard_normal((16, 64)).astype(jnp.bfloat16)
    w = int8((64, 128))
    s = R.uniform(1e-3, 1e-2, 128).astype(jnp.bfloat16)
    fn = lambda x, w, s: jax.nn.silu((x @ w.astype(jnp.bfloat16)) * s)  # noqa: E731
    keep, f = region(fn, x, w, s)
    spec = mme.spec_from_func(f)
    assert [o.name for o in spec.dots[0].prologue] == ["stablehlo.convert"]
    assert spec.in_dtypes[spec.dots[0].rhs_arg] == np.dtype(np.int8)
    check_kernel_everywhere(f, FAM, category="reassociate")


def test_cpu_int8_product_is_the_programs_integer_dot():
    # cpu kernels keep the program's int8 x int8 -> int32 dot (int8-dot-unsigned makes it the
    # form the host multiplies fastest later): exact at the extremes, 2048 products of
    # (-128)^2 sum to 2^25
    fn = lambda x, w: jax.nn.relu(idot(x, w))  # noqa: E731
    for x, w in ((np.full((8, 2048), -128, np.int8), np.full((2048, 16), -128, np.int8)),
                 (int8((8, 2500)), int8((2500, 16)))):
        keep, f = region(fn, x, w)
        k = FAM.build(mme.spec_from_func(f), "cpu")
        exact = np.maximum(x.astype(np.int64) @ w.astype(np.int64), 0)
        assert np.array_equal(np.asarray(jax.jit(k)(x, w)[0]), exact)
        text = jax.jit(k).lower(x, w).as_text()
        assert "bf16" not in text and "xi8>) -> tensor<" in text
