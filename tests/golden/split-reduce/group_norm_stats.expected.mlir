module {
  func.func @main(%arg0: tensor<2x4x4x4x2xf32>) -> tensor<2x4xf32> {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.reshape %arg0 : (tensor<2x4x4x4x2xf32>) -> tensor<2x16x8xf32>
    %1 = stablehlo.reduce(%0 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<2x16x8xf32>, tensor<f32>) -> tensor<2x8xf32>
    %2 = stablehlo.reshape %1 : (tensor<2x8xf32>) -> tensor<8x2xf32>
    %3 = stablehlo.reduce(%2 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<8x2xf32>, tensor<f32>) -> tensor<8xf32>
    %4 = stablehlo.reshape %3 : (tensor<8xf32>) -> tensor<2x4xf32>
    return %4 : tensor<2x4xf32>
  }
}
