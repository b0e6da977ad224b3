module {
  func.func @main(%arg0: tensor<2x5x5x8xf32>, %arg1: tensor<3x3x8x16xf32>) -> tensor<2x5x5x16xf32> {
    %0 = stablehlo.convolution(%arg0, %arg1) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x5x5x8xf32>, tensor<3x3x8x16xf32>) -> tensor<2x5x5x16xf32>
    return %0 : tensor<2x5x5x16xf32>
  }
}
