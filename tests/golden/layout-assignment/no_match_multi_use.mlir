// golden: target=gpu
// golden: unchanged
// golden: reason=transpose has other users
// The transpose has another user (it is returned): sinking it would not remove it.
func.func @main(%x: tensor<2x3xf32>) -> (tensor<3x2xf32>, tensor<3x2xf32>) {
  %t = stablehlo.transpose %x, dims = [1, 0] : (tensor<2x3xf32>) -> tensor<3x2xf32>
  %e = stablehlo.exponential %t : tensor<3x2xf32>
  return %e, %t : tensor<3x2xf32>, tensor<3x2xf32>
}
