module {
  func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.tanh %arg0 : tensor<4xf32>
    %cst = stablehlo.constant dense<3.000000e+00> : tensor<4xf32>
    %1 = stablehlo.multiply %0, %cst : tensor<4xf32>
    %2 = stablehlo.add %1, %1 : tensor<4xf32>
    return %2 : tensor<4xf32>
  }
}
