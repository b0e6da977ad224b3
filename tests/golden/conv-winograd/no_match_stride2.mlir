// golden: unchanged
// golden: reason=window_strides != 1
// a strided 3x3 convolution stays with XLA; the report says why.
func.func @main(%x: tensor<1x6x6x16xf32>, %w: tensor<3x3x16x16xf32>) -> tensor<1x3x3x16xf32> {
  %y = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [2, 2], pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x6x6x16xf32>, tensor<3x3x16x16xf32>) -> tensor<1x3x3x16xf32>
  return %y : tensor<1x3x3x16xf32>
}
