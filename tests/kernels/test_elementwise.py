"""The elementwise kernel family: interpret mode, TPU interpret mode, gpu/tpu lowering, blocks."""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

import hlofuse
from hlofuse import ir as hir
from hlofuse.kernels import elementwise as ew
from hlofuse.kernels.lowering import lower_to_text
from hlofuse.kernels.tiling import Blocks2D, elementwise_blocks
from hlofuse.passes.fusion.outline import KIND_ATTR
from hlofuse.testing import assert_same

# every block class: full operands, a bias along the last dim (col), per-row values (row),
# a runtime scalar; plus compare/select and a bool output
REGION = """
func.func @main(%x: tensor<6x10x24xf32>, %b: tensor<24xf32>, %r: tensor<6x10xf32>, %s: tensor<f32>)
    -> (tensor<6x10x24xf32>, tensor<6x10x24xi1>) {
  %c = stablehlo.constant dense<0.5> : tensor<f32>
  %cb = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<f32>) -> tensor<6x10x24xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [2] : (tensor<24xf32>) -> tensor<6x10x24xf32>
  %rb = stablehlo.broadcast_in_dim %r, dims = [0, 1] : (tensor<6x10xf32>) -> tensor<6x10x24xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [] : (tensor<f32>) -> tensor<6x10x24xf32>
  %0 = stablehlo.multiply %x, %cb : tensor<6x10x24xf32>
  %1 = stablehlo.add %0, %bb : tensor<6x10x24xf32>
  %2 = stablehlo.subtract %1, %rb : tensor<6x10x24xf32>
  %3 = stablehlo.compare GT, %2, %sb : (tensor<6x10x24xf32>, tensor<6x10x24xf32>) -> tensor<6x10x24xi1>
  %4 = stablehlo.tanh %2 : tensor<6x10x24xf32>
  %5 = stablehlo.select %3, %4, %0 : tensor<6x10x24xi1>, tensor<6x10x24xf32>
  func.return %5, %3 : tensor<6x10x24xf32>, tensor<6x10x24xi1>
}"""


_KEEP = []  # the spec refers into its module: keep the module alive


@pytest.fixture(scope="module")
def spec():
    opt = hlofuse.optimize(REGION, pipeline=["fuse-elementwise"])
    _KEEP.append(opt)
    fn = [f for f in hir.funcs(opt.module) if KIND_ATTR in f.attributes][0]
    return ew.spec_from_func(fn)


def _inputs():
    rng = np.random.default_rng(1)
    return (rng.standard_normal((6, 10, 24)).astype(np.float32), rng.standard_normal(24).astype(np.float32),
            rng.standard_normal((6, 10)).astype(np.float32), np.float32(0.25))


def test_spec_classes(spec):
    assert spec.domain == (6, 10, 24) and (spec.rows, spec.cols) == (60, 24)
    assert sorted(spec.in_classes) == ["col", "full", "row", "scalar"]


def test_interpret_kernel_matches_reference(spec):
    args = [a for a in _inputs()]
    order = _order(spec)
    args = [args[i] for i in order]
    got = ew.build_elementwise(spec, "cpu")(*args)
    ref = ew.elementwise_reference(spec)(*args)
    assert_same(got, ref, "exact")


def _order(spec):
    # map region inputs (in region order) to our _inputs() by class
    by_class = {"full": 0, "col": 1, "row": 2, "scalar": 3}
    return [by_class[c] for c in spec.in_classes]


@pytest.mark.parametrize("target", ["gpu", "tpu"])
def test_tiled_blocks_in_interpret_mode(spec, target):
    """The gpu/tpu tiling (edge blocks included) computes the same thing; tpu via TPU interpret."""
    args = [_inputs()[i] for i in _order(spec)]
    interpret = pltpu.InterpretParams() if target == "tpu" else True
    blocks = Blocks2D(target, 60, 24, 16, 128 if target == "tpu" else 16) if target == "gpu" else \
        Blocks2D("tpu", 60, 24, 16, 24)
    got = ew.build_elementwise(spec, target, interpret=interpret, blocks=blocks)(*args)
    ref = ew.elementwise_reference(spec)(*args)
    assert blocks.grid[0] * blocks.grid[1] > 1  # really tiled
    assert_same(got, ref, "kernel")


@pytest.mark.parametrize("target,marker", [("gpu", "__gpu$xla.gpu.triton"), ("tpu", "tpu_custom_call"),
                                           ("cpu", "stablehlo.while")])
def test_lowers_for_every_target(spec, target, marker):
    fn = ew.build_elementwise(spec, target)
    avals = [jax.ShapeDtypeStruct(s, d) for s, d in zip(spec.in_shapes, spec.in_dtypes)]
    text = lower_to_text(fn, avals, target)
    assert marker in text
    assert fn.kernel_name.startswith("hlofuse_elementwise_")


def test_end_to_end_region_through_jit():
    def f(x, b, r, s):
        y = x * 0.5 + b - r[..., None]
        return jnp.where(y > s, jnp.tanh(y), x * 0.5), y > s
    args = _inputs()
    hf = hlofuse.jit(f)
    assert_same(hf(*args), jax.jit(f)(*args), "kernel")
    assert len(hf.report(*args).kernels) == 1


@pytest.mark.parametrize("rows,cols,target", [(1, 1, "gpu"), (4096, 4096, "gpu"), (100, 96, "gpu"),
                                              (1000, 1000, "tpu"), (8192, 4096, "tpu"), (3, 5, "tpu"),
                                              (64, 64, "cpu")])
def test_block_heuristic_is_valid(rows, cols, target):
    b = elementwise_blocks(rows, cols, target=target)
    assert b.br >= 1 and b.bc >= 1
    if target == "gpu":
        assert b.br * b.bc <= 4096
    if target == "tpu":
        assert 2 * 2 * b.br * b.bc * 4 <= 16 * 1024 * 1024


@pytest.mark.parametrize("args,match", [(("gpu", 100, 96, 32, 96), "powers of two"),
                                        (("tpu", 100, 1000, 8, 100), "multiple of 128"),
                                        (("tpu", 100, 128, 10, 128), "multiple of 8"),
                                        (("cpu", 100, 96, 50, 96), "whole array")])
def test_invalid_blocks_are_rejected(args, match):
    with pytest.raises(ValueError, match=match):
        Blocks2D(*args)
