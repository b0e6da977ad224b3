"""Modules that are not StableHLO, shared by the bad-input and CLI tests (a helper, not a test
module)."""

ARITH_ONLY = ("module { func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> { "
              "%0 = arith.addf %a, %b : tensor<4xf32>\n %1 = arith.mulf %0, %a : tensor<4xf32>\n"
              " return %1 : tensor<4xf32> } }")
MHLO = ("module { func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  %0 = mhlo.add %a, %a : tensor<4xf32>\n"
        "  %1 = \"mhlo.tanh\"(%0) : (tensor<4xf32>) -> tensor<4xf32>\n"
        "  return %1 : tensor<4xf32> } }")
