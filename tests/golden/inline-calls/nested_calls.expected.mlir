module {
  func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %0 = stablehlo.add %arg0, %arg1 : tensor<4x8xf32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<4x8xf32>
    %1 = stablehlo.maximum %0, %cst : tensor<4x8xf32>
    %2 = stablehlo.add %1, %arg1 : tensor<4x8xf32>
    %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<4x8xf32>
    %3 = stablehlo.maximum %2, %cst_0 : tensor<4x8xf32>
    return %3 : tensor<4x8xf32>
  }
}
