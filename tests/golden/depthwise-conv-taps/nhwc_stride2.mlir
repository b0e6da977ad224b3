// golden: numbers=reassociate
// a 3x3 stride-2 depthwise convolution (MobileNet's downsampling): the input padded once, then
// nine strided slices each times its channel weights (a broadcast row of the filter), summed
// in filter order; XLA:CPU fuses them with the ReLU6 after them into one loop.
func.func @main(%x: tensor<1x5x5x3xf32>, %w: tensor<3x3x1x3xf32>) -> tensor<1x3x3x3xf32> {
  %0 = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {stride = [2, 2], pad = [[1, 1], [1, 1]], lhs_dilate = [1, 1], rhs_dilate = [1, 1], reverse = [false, false]} {batch_group_count = 1 : i64, feature_group_count = 3 : i64} : (tensor<1x5x5x3xf32>, tensor<3x3x1x3xf32>) -> tensor<1x3x3x3xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<1x3x3x3xf32>
  %six = stablehlo.constant dense<6.0> : tensor<1x3x3x3xf32>
  %1 = stablehlo.clamp %zero, %0, %six : tensor<1x3x3x3xf32>
  return %1 : tensor<1x3x3x3xf32>
}
