// a 3x3, stride-1 f32 convolution with 16 channels becomes a conv_winograd region (kernelize
// builds it as Winograd F(2x2, 3x3) on cpu); the region alone computes the same numbers.
func.func @main(%x: tensor<1x6x6x16xf32>, %w: tensor<3x3x16x16xf32>) -> tensor<1x6x6x16xf32> {
  %y = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x6x6x16xf32>, tensor<3x3x16x16xf32>) -> tensor<1x6x6x16xf32>
  return %y : tensor<1x6x6x16xf32>
}
