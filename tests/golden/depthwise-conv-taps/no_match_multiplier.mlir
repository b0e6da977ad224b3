// golden: numbers=exact
// golden: unchanged
// golden: reason=channel multiplier above 1
// two filters per channel (a depthwise convolution with channel multiplier 2) stays XLA's.
func.func @main(%x: tensor<1x5x5x3xf32>, %w: tensor<3x3x1x6xf32>) -> tensor<1x5x5x6xf32> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 3 : i64} : (tensor<1x5x5x3xf32>, tensor<3x3x1x6xf32>) -> tensor<1x5x5x6xf32>
  return %0 : tensor<1x5x5x6xf32>
}
