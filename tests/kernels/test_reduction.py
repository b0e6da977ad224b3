"""Reduction kernel family: every target's blocks checked against the plain-jnp reference
(cpu whole-array interpret, gpu tiles in interpret mode, tpu tiles in TPU interpret mode), and
lowered to Triton / Mosaic custom calls from this machine."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from hlofuse.kernels import FAMILIES
from hlofuse.kernels import reduction as red
from hlofuse.kernels.tiling import RowBlocks, row_blocks
from hlofuse.runtime.testing import assert_same
from tests.fusion_util import check_kernel_everywhere, func_inputs, outline

FAM = FAMILIES["reduction"]
R = np.random.default_rng(3)


def region(fn, *args):
    out = outline(fn, args, "fuse-reduction")
    (f,) = out.funcs("reduction")
    return out, f


def layernorm(x, g, b):
    m = x.mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b


def test_layernorm_padded_gpu_rows_and_multi_step_tpu_grid():
    x = R.standard_normal((3, 8, 100)).astype(np.float32)       # 24 rows of 100: padded to 128 lanes on gpu
    g, b = R.standard_normal(100).astype(np.float32), R.standard_normal(100).astype(np.float32)
    keep, f = region(layernorm, x, g, b)
    used = check_kernel_everywhere(f, FAM, category="reassociate",
                                   gpu_blocks=RowBlocks("gpu", 24, 100, 8, 128),
                                   tpu_blocks=RowBlocks("tpu", 24, 100, 8, 100))
    assert used["gpu"].padded and used["gpu"].grid == (3,) and used["tpu"].grid == (3,)
    assert used["cpu"].grid == (1,)
    assert red.spec_from_func(f).pattern == "layernorm"


def test_softmax_and_row_outputs():
    x = R.standard_normal((16, 40)).astype(np.float32)
    keep, f = region(lambda x: (jax.nn.softmax(x, -1), jnp.max(x, -1), jnp.sum(jax.nn.softmax(x, -1) * x, -1)), x)
    spec = red.spec_from_func(f)
    assert sorted(spec.out_classes) == ["full", "row", "row"]
    check_kernel_everywhere(f, FAM, category="reassociate", gpu_blocks=RowBlocks("gpu", 16, 40, 4, 64),
                            tpu_blocks=RowBlocks("tpu", 16, 40, 8, 40))


def test_bf16_rmsnorm():
    x = R.standard_normal((8, 64)).astype(jnp.bfloat16)
    g = R.standard_normal(64).astype(jnp.bfloat16)
    keep, f = region(lambda x, g: x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g, x, g)
    check_kernel_everywhere(f, FAM, category="reassociate", lower=True)


def test_reference_matches_the_original_function():
    x = R.standard_normal((6, 24)).astype(np.float32)
    fn = lambda x: jax.nn.log_softmax(x * 2.0, -1)  # noqa: E731
    keep, f = region(fn, x)
    ins = func_inputs(f)
    assert_same(red.reduction_reference(red.spec_from_func(f))(*ins), (jax.jit(fn)(*ins),), "exact")


def test_row_blocks_are_validated():
    with pytest.raises(ValueError, match="powers of two"):
        RowBlocks("gpu", 10, 100, 3, 128)
    with pytest.raises(ValueError, match="shorter than the row"):
        RowBlocks("gpu", 10, 100, 4, 64)
    with pytest.raises(ValueError, match="whole row"):
        RowBlocks("tpu", 16, 256, 8, 128)
    with pytest.raises(ValueError, match="multiple of 8"):
        RowBlocks("tpu", 16, 256, 4, 256)
    with pytest.raises(ValueError, match="whole array"):
        RowBlocks("cpu", 16, 256, 8, 256)
    b = row_blocks(4096, 768, target="tpu")
    assert b.br % 8 == 0 and b.vmem_bytes <= 16 * 1024 * 1024
    assert row_blocks(100, 3000, target="gpu").bc == 4096
    with pytest.raises(ValueError):
        row_blocks(10, 100_000, target="gpu")


def test_one_gib_splat_in_a_reduction_region_is_not_materialized():
    """A splat cloned into a reduction region is one literal in the block evaluator
    (kernels/blockeval.py), not a 1 GiB host array (issue 11, item 9)."""
    from tests.kernels.memory_util import MiB, optimize_rss_growth
    template = """
func.func @main(%arg0: tensor<{shape}xf32>) -> tensor<16384xf32> {{
  %c = stablehlo.constant dense<1.0> : tensor<{shape}xf32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %0 = stablehlo.multiply %arg0, %c : tensor<{shape}xf32>
  %1 = stablehlo.exponential %0 : tensor<{shape}xf32>
  %2 = stablehlo.reduce(%1 init: %z) applies stablehlo.add across dimensions = [1] : (tensor<{shape}xf32>, tensor<f32>) -> tensor<16384xf32>
  return %2 : tensor<16384xf32>
}}"""
    grown, res = optimize_rss_growth(template, "16384x16384", "16384x64",
                                     disable=["algebraic-simplify"])  # see test_elementwise
    assert res["kernels"] == ["reduction"], res["text"][:2000]
    assert grown < 200 * MiB, f"optimizing grew the peak RSS by {grown / MiB:.0f} MiB (splat: 1024 MiB)"


def test_layernorm_backward_column_partials_on_gpu_and_tpu_blocks():
    # 20 rows in row blocks of 8: a partial last block whose extra rows must not reach the column
    # sums (d(scale), d(bias)); gpu also pads 100 lanes to 128
    x = R.standard_normal((20, 100)).astype(np.float32)
    s, b = R.standard_normal(100).astype(np.float32), R.standard_normal(100).astype(np.float32)
    loss = lambda p, x: (layernorm(x, p["s"], p["b"]) ** 2).sum()  # noqa: E731
    keep = outline(jax.value_and_grad(loss), ({"s": s, "b": b}, x), "fuse-reduction{column_reductions=on}")
    (f,) = keep.funcs("reduction")
    spec = red.spec_from_func(f)
    assert len(spec.col_outputs) == 2 and spec.pattern == "layernorm"
    used = check_kernel_everywhere(f, FAM, category="reassociate",
                                   gpu_blocks=RowBlocks("gpu", 20, 100, 8, 128),
                                   tpu_blocks=RowBlocks("tpu", 20, 100, 8, 100))
    assert used["gpu"].grid == (3,) and used["tpu"].grid == (3,) and used["gpu"].padded

