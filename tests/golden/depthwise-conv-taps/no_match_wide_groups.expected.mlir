module {
  func.func @main(%arg0: tensor<1x5x5x32xf32>, %arg1: tensor<3x3x16x32xf32>) -> tensor<1x5x5x32xf32> {
    %0 = stablehlo.convolution(%arg0, %arg1) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 2 : i64} : (tensor<1x5x5x32xf32>, tensor<3x3x16x32xf32>) -> tensor<1x5x5x32xf32>
    return %0 : tensor<1x5x5x32xf32>
  }
}
