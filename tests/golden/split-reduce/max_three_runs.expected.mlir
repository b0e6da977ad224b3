module {
  func.func @main(%arg0: tensor<3x2x5x2x7xf32>) -> tensor<2x2xf32> {
    %cst = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %0 = stablehlo.reshape %arg0 : (tensor<3x2x5x2x7xf32>) -> tensor<60x7xf32>
    %1 = stablehlo.reduce(%0 init: %cst) applies stablehlo.maximum across dimensions = [1] : (tensor<60x7xf32>, tensor<f32>) -> tensor<60xf32>
    %2 = stablehlo.reshape %1 : (tensor<60xf32>) -> tensor<6x5x2xf32>
    %3 = stablehlo.reduce(%2 init: %cst) applies stablehlo.maximum across dimensions = [1] : (tensor<6x5x2xf32>, tensor<f32>) -> tensor<6x2xf32>
    %4 = stablehlo.reshape %3 : (tensor<6x2xf32>) -> tensor<3x4xf32>
    %5 = stablehlo.reduce(%4 init: %cst) applies stablehlo.maximum across dimensions = [0] : (tensor<3x4xf32>, tensor<f32>) -> tensor<4xf32>
    %6 = stablehlo.reshape %5 : (tensor<4xf32>) -> tensor<2x2xf32>
    return %6 : tensor<2x2xf32>
  }
}
