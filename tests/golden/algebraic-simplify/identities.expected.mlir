module {
  func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<8x4xf32>) -> (tensor<4x8xf32>, tensor<8x4xf32>) {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<4x8xf32>
    %0 = stablehlo.maximum %arg0, %cst : tensor<4x8xf32>
    return %0, %arg1 : tensor<4x8xf32>, tensor<8x4xf32>
  }
}
