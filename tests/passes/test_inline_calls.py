"""``inline-calls``: nested private calls are flattened bit-exactly; dead callees removed."""

import numpy as np

import hlofuse
from tests.fusion_util import eval_modules

NESTED = """
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %0 = func.call @outer(%x) : (tensor<8xf32>) -> tensor<8xf32>
  %1 = func.call @inner(%0) : (tensor<8xf32>) -> tensor<8xf32>
  func.return %1 : tensor<8xf32>
}
func.func private @outer(%a: tensor<8xf32>) -> tensor<8xf32> {
  %0 = func.call @inner(%a) : (tensor<8xf32>) -> tensor<8xf32>
  %1 = stablehlo.multiply %0, %a : tensor<8xf32>
  func.return %1 : tensor<8xf32>
}
func.func private @inner(%a: tensor<8xf32>) -> tensor<8xf32> {
  %0 = stablehlo.tanh %a : tensor<8xf32>
  func.return %0 : tensor<8xf32>
}
"""

NO_CALLS = """
func.func @main(%x: tensor<8xf32>) -> tensor<8xf32> {
  %0 = stablehlo.tanh %x : tensor<8xf32>
  func.return %0 : tensor<8xf32>
}
"""


def test_inlines_nested_calls_and_drops_callees():
    opt = hlofuse.optimize(NESTED, pipeline=["inline-calls"])
    assert "call" not in opt.text and "@inner" not in opt.text and "@outer" not in opt.text
    assert opt.report.passes[0].stats == {"calls_inlined": 3}
    x = np.linspace(-2, 2, 8, dtype=np.float32)
    got, want = eval_modules([opt.text, NESTED], [x])
    np.testing.assert_array_equal(got[0], want[0])


def test_no_calls_is_a_no_op_and_rerun_is_idempotent():
    opt = hlofuse.optimize(NO_CALLS, pipeline=["inline-calls"])
    assert opt.report.passes[0].stats == {"calls_inlined": 0}
    once = hlofuse.optimize(NESTED, pipeline=["inline-calls"]).text
    assert hlofuse.optimize(once, pipeline=["inline-calls"]).text == once
