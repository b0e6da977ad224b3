module {
  func.func @main(%arg0: tensor<2x4x6x6xf32>, %arg1: tensor<4x4x3x3xf32>) -> tensor<2x4x6x6xf32> {
    %0 = stablehlo.transpose %arg1, dims = [2, 3, 1, 0] : (tensor<4x4x3x3xf32>) -> tensor<3x3x4x4xf32>
    %1 = stablehlo.transpose %arg0, dims = [0, 2, 3, 1] : (tensor<2x4x6x6xf32>) -> tensor<2x6x6x4xf32>
    %2 = stablehlo.convolution(%1, %0) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x6x6x4xf32>, tensor<3x3x4x4xf32>) -> tensor<2x6x6x4xf32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<2x6x6x4xf32>
    %3 = stablehlo.maximum %2, %cst : tensor<2x6x6x4xf32>
    %4 = stablehlo.transpose %3, dims = [0, 3, 1, 2] : (tensor<2x6x6x4xf32>) -> tensor<2x4x6x6xf32>
    return %4 : tensor<2x4x6x6xf32>
  }
}
