// golden: numbers=exact
// golden: unchanged
// golden: reason=9 filter positions x 16 channel(s) per group (max_taps=72)
// two groups of 16 channels: 144 products per output element as taps, where the sum of taps
// measured 6x slower than XLA's convolution; it stays XLA's.
func.func @main(%x: tensor<1x5x5x32xf32>, %w: tensor<3x3x16x32xf32>) -> tensor<1x5x5x32xf32> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [1, 1], pad = [[1, 1], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 2 : i64} : (tensor<1x5x5x32xf32>, tensor<3x3x16x32xf32>) -> tensor<1x5x5x32xf32>
  return %0 : tensor<1x5x5x32xf32>
}
