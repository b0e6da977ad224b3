// golden: unchanged
// golden: reason=weight is not a constant
// The weight is a runtime argument: nothing to fold the scale into.
func.func @main(%x: tensor<3x4xf32>, %w: tensor<4x2xf32>) -> tensor<3x2xf32> {
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<3x4xf32>, tensor<4x2xf32>) -> tensor<3x2xf32>
  %s = stablehlo.constant dense<[1.5, 0.75]> : tensor<2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [1] : (tensor<2xf32>) -> tensor<3x2xf32>
  %1 = stablehlo.multiply %y, %sb : tensor<3x2xf32>
  return %1 : tensor<3x2xf32>
}
