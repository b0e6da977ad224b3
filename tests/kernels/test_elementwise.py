"""The elementwise kernel family: interpret mode, TPU interpret mode, gpu/tpu lowering, blocks."""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

import hlofuse
from hlofuse.core import ir as hir
from hlofuse.kernels import elementwise as ew
from hlofuse.kernels.lowering import lower_to_text
from hlofuse.kernels.tiling import Blocks2D, elementwise_blocks
from hlofuse.passes.fusion.outline import KIND_ATTR
from hlofuse.runtime.testing import assert_same
from hlofuse.runtime.testing import ALL_KERNELS

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
                                           ("cpu", None)])
def test_lowers_for_every_target(spec, target, marker):
    fn = ew.build_elementwise(spec, target)
    avals = [jax.ShapeDtypeStruct(s, d) for s, d in zip(spec.in_shapes, spec.in_dtypes)]
    text = lower_to_text(fn, avals, target)
    if marker is None:  # cpu: plain StableHLO, the one-step grid evaluated without a loop
        assert "custom_call" not in text and "stablehlo.while" not in text
        assert "stablehlo.multiply" in text or "stablehlo.add" in text
    else:
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


# ---------------------------------------------------------------------------------------------
# Splat constants are read as one element, never built at their IR shape (issue 11, item 9)
# ---------------------------------------------------------------------------------------------

SPLAT_ADD_EXP = """
func.func @main(%arg0: tensor<{shape}xf32>) -> tensor<{shape}xf32> {{
  %c = stablehlo.constant dense<1.0> : tensor<{shape}xf32>
  %0 = stablehlo.add %arg0, %c : tensor<{shape}xf32>
  %1 = stablehlo.exponential %0 : tensor<{shape}xf32>
  return %1 : tensor<{shape}xf32>
}}"""


@pytest.mark.parametrize("mlir_type,literal,expected", [
    ("f32", "1.0", np.float32(1.0)), ("bf16", "-1.5", jnp.bfloat16(-1.5)), ("f16", "2.0", np.float16(2)),
    ("i32", "-7", np.int32(-7)), ("ui8", "255", np.uint8(255)), ("ui32", "4294967295", np.uint32(2**32 - 1)),
    ("i1", "true", np.bool_(True)), ("f64", "0.1", np.float64(0.1)), ("f32", "0x7FC00000", np.float32("nan")),
])
def test_splat_scalar_reads_one_element(mlir_type, literal, expected):
    import resource
    text = (f"func.func @main() -> tensor<16384x16384x{mlir_type}> {{\n"
            f"  %c = stablehlo.constant dense<{literal}> : tensor<16384x16384x{mlir_type}>\n"
            f"  return %c : tensor<16384x16384x{mlir_type}>\n}}")
    m = hir.parse(text, hir.new_context())
    (op,) = [o for o in hir.all_ops(m) if o.name == "stablehlo.constant"]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    s = ew.splat_scalar(op)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024
    assert s.shape == () and s.dtype == np.asarray(expected).dtype
    assert s == expected or (np.isnan(expected) and np.isnan(s))
    assert grown < 64 << 20, f"reading a splat of {mlir_type} grew the peak RSS by {grown >> 20} MiB"


def test_splat_scalar_is_none_for_dense_constants():
    m = hir.parse("func.func @main() -> tensor<2xf32> {\n"
                  "  %c = stablehlo.constant dense<[1.0, 2.0]> : tensor<2xf32>\n"
                  "  return %c : tensor<2xf32>\n}", hir.new_context())
    (op,) = [o for o in hir.all_ops(m) if o.name == "stablehlo.constant"]
    assert ew.splat_scalar(op) is None


def test_splat_region_matches_reference_and_xla():
    """A splat cloned into the region is a literal in the kernel and a full in the reference."""
    opt = hlofuse.optimize(SPLAT_ADD_EXP.format(shape="20x30"), pipeline=["fuse-elementwise"])
    _KEEP.append(opt)
    fn = [f for f in hir.funcs(opt.module) if KIND_ATTR in f.attributes][0]
    assert "dense<1.000000e+00> : tensor<20x30xf32>" in str(fn)  # the splat is in the region
    sp = ew.spec_from_func(fn)
    x = np.random.default_rng(0).standard_normal((20, 30)).astype(np.float32)
    want = np.exp(x + np.float32(1))
    assert_same(ew.build_elementwise(sp, "cpu")(x), (want,), "kernel")
    assert_same(ew.elementwise_reference(sp)(x), (want,), "kernel")


def test_one_gib_splat_is_not_materialized_by_the_elementwise_kernel():
    """add + exp over a 1 GiB splat (a ~280-byte module): fusing and kernelizing it must not
    build the splat on the host (it peaked at 1.2 GB in ``hlofuse report``).

    ``algebraic-simplify`` is disabled here: it reads splats through
    ``passes/graph_util.splat_value`` -> ``hlofuse.core.ops.const_value``, which still builds the
    array (see ``test_default_pipeline_does_not_materialize_a_large_splat``)."""
    from tests.kernels.memory_util import MiB, optimize_rss_growth
    grown, res = optimize_rss_growth(SPLAT_ADD_EXP, "16384x16384", "64x64",
                                     disable=["algebraic-simplify"])
    assert res["kernels"] == ["elementwise"], res["text"][:2000]
    assert grown < 200 * MiB, f"optimizing grew the peak RSS by {grown / MiB:.0f} MiB (splat: 1024 MiB)"


def test_default_pipeline_does_not_materialize_a_large_splat():
    from tests.kernels.memory_util import MiB, optimize_rss_growth
    grown, res = optimize_rss_growth(SPLAT_ADD_EXP, "8192x8192", "64x64")  # a 256 MiB splat
    assert grown < 64 * MiB, f"optimizing grew the peak RSS by {grown / MiB:.0f} MiB (splat: 256 MiB)"


REGION_16 = """
func.func @main(%x: tensor<40x96x{t}>, %y: tensor<40x96x{t}>) -> (tensor<40x96x{t}>, tensor<40x96x{t}>) {{
  %one = stablehlo.constant dense<1.0> : tensor<40x96x{t}>
  %0 = stablehlo.divide %x, %y : tensor<40x96x{t}>
  %1 = stablehlo.add %0, %one : tensor<40x96x{t}>
  %2 = stablehlo.logistic %x : tensor<40x96x{t}>
  %3 = stablehlo.multiply %2, %y : tensor<40x96x{t}>
  %4 = stablehlo.sqrt %1 : tensor<40x96x{t}>
  func.return %4, %3 : tensor<40x96x{t}>, tensor<40x96x{t}>
}}"""


# (no f16 on tpu: Mosaic blocks hold none, check_tpu_dtypes refuses them before any math)
@pytest.mark.parametrize("target,dtype", [("gpu", "bf16"), ("gpu", "f16"), ("tpu", "bf16")])
def test_16_bit_arithmetic_runs_in_f32_rounded_per_op(target, dtype):
    """Triton has no bf16 or f16 divide: a bf16 ``x / y`` (or sigmoid, which divides) failed to
    build for gpu and stayed XLA's. gpu/tpu kernels compute 16-bit arithmetic in f32 and round
    each op's result back to its type, which for divide, add and sqrt is the correctly rounded
    16-bit result: bit for bit the module's own op-by-op values, when the interpret-mode
    kernel is compiled without excess precision (each op rounded, as Triton and Mosaic run it)."""
    opt = hlofuse.optimize(REGION_16.format(t=dtype), pipeline=["fuse-elementwise"])
    _KEEP.append(opt)
    fn = [f for f in hir.funcs(opt.module) if KIND_ATTR in f.attributes][0]
    sp = ew.spec_from_func(fn)
    r = np.random.default_rng(0)
    dt = hir.np_dtype(dtype)
    x = jnp.asarray(r.standard_normal((40, 96)).astype(dt))
    y = jnp.asarray((r.uniform(0.5, 4.0, (40, 96)) * r.choice([-1, 1], (40, 96))).astype(dt))
    interpret = pltpu.InterpretParams() if target == "tpu" else True
    kernel = ew.build_elementwise(sp, target, interpret=interpret)
    got = jax.jit(kernel, compiler_options={"xla_allow_excess_precision": False})(x, y)
    want = ew.elementwise_reference(sp)(x, y)   # op by op, each rounded to its type
    assert_same(got, want, "exact")
    avals = [jax.ShapeDtypeStruct(x.shape, x.dtype)] * 2
    text = lower_to_text(ew.build_elementwise(sp, target), avals, target)
    assert ("__gpu$xla.gpu.triton" if target == "gpu" else "tpu_custom_call") in text
    # end to end: the region is a kernel for the target, not left to XLA
    f = hlofuse.jit(lambda x, y: (jnp.sqrt(x / y + 1), jax.nn.sigmoid(x) * y), target=target,
                    options=ALL_KERNELS)
    rep = f.report(x, y)
    assert [k.kind for k in rep.kernels] == ["elementwise"], rep
