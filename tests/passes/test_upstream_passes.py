"""The thin wrappers around jaxlib's upstream passes: cse, canonicalize, symbol-dce."""

import numpy as np

import hlofuse
from hlofuse.core import ir as hir

MODULE = """
func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.tanh %a : tensor<4xf32>
  %1 = stablehlo.tanh %a : tensor<4xf32>
  %dead = stablehlo.exponential %a : tensor<4xf32>
  %2 = stablehlo.add %0, %1 : tensor<4xf32>
  func.return %2 : tensor<4xf32>
}
func.func private @unused(%a: tensor<4xf32>) -> tensor<4xf32> {
  func.return %a : tensor<4xf32>
}
"""


def _count(text, name):
    return text.count(name)


def test_cse_merges_duplicates_and_is_idempotent():
    opt = hlofuse.optimize(MODULE, pipeline=["cse"])
    assert _count(opt.text, "stablehlo.tanh") == 1
    assert opt.report.passes[0].stats["ops_removed"] >= 1
    again = hlofuse.optimize(opt.text, pipeline=["cse"])
    assert again.text == opt.text


def test_canonicalize_removes_dead_ops():
    opt = hlofuse.optimize(MODULE, pipeline=["canonicalize"])
    assert "exponential" not in opt.text and opt.report.passes[0].stats["ops_removed"] >= 1


def test_symbol_dce_removes_unused_private_functions():
    opt = hlofuse.optimize(MODULE, pipeline=["symbol-dce"])
    assert "@unused" not in opt.text and "@main" in opt.text


def test_cleanup_pipeline_keeps_results_exact():
    x = np.array([-1.0, -0.0, 0.5, 3.0], np.float32)
    opt = hlofuse.optimize(MODULE, pipeline="cleanup")
    (before,) = hir.eval_module(MODULE, [x])
    (after,) = hir.eval_module(opt.text, [x])
    np.testing.assert_array_equal(before, after)
