// golden: target=cpu
// golden: numbers=reassociate
// cpu: a 1x1, stride-1, unpadded NHWC/HWIO convolution is a matmul over channels: it becomes
// reshape(kernel) + dot_general, marked for fuse-matmul-epilogue.
func.func @main(%x: tensor<2x5x5x8xf32>, %w: tensor<1x1x8x16xf32>) -> tensor<2x5x5x16xf32> {
  %y = stablehlo.convolution(%x, %w) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<2x5x5x8xf32>, tensor<1x1x8x16xf32>) -> tensor<2x5x5x16xf32>
  return %y : tensor<2x5x5x16xf32>
}
