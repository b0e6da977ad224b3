module {
  func.func @main(%arg0: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<4x8xf32>
    %0 = stablehlo.add %arg0, %cst : tensor<4x8xf32>
    %1 = stablehlo.multiply %arg0, %cst : tensor<4x8xf32>
    %2 = stablehlo.subtract %arg0, %arg0 : tensor<4x8xf32>
    return %0, %1, %2 : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
  }
}
