// golden: target=cpu
// golden: unchanged
// golden: reason=3x3 kernel (only 1x1 convolutions are matmuls)
// a 3x3 convolution is not a matmul: it stays with XLA and the report says why.
func.func @main(%x: tensor<2x5x5x8xf32>, %w: tensor<3x3x8x16xf32>) -> tensor<2x5x5x16xf32> {
  %y = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x5x5x8xf32>, tensor<3x3x8x16xf32>) -> tensor<2x5x5x16xf32>
  return %y : tensor<2x5x5x16xf32>
}
