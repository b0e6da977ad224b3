// golden: target=gpu
// golden: numbers=reassociate
// gpu: an NCHW convolution becomes NHWC between one boundary transpose in and one out.
func.func @main(%x: tensor<2x4x6x6xf32>, %w: tensor<4x4x3x3xf32>) -> tensor<2x4x6x6xf32> {
  %y = stablehlo.convolution(%x, %w) dim_numbers = [b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x4x6x6xf32>, tensor<4x4x3x3xf32>) -> tensor<2x4x6x6xf32>
  %z = stablehlo.constant dense<0.0> : tensor<2x4x6x6xf32>
  %r = stablehlo.maximum %y, %z : tensor<2x4x6x6xf32>
  return %r : tensor<2x4x6x6xf32>
}
