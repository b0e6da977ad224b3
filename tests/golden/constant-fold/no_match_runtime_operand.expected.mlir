module {
  func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %cst = stablehlo.constant dense<2.000000e+00> : tensor<4xf32>
    %0 = stablehlo.multiply %arg0, %cst : tensor<4xf32>
    %1 = stablehlo.exponential %0 : tensor<4xf32>
    return %1 : tensor<4xf32>
  }
}
