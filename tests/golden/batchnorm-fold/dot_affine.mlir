// golden: numbers=reassociate
// dot_general with a constant weight, then a per-output-channel affine chain (divide, scale,
// shift): the scale is multiplied into the weight on the host, the shift is one bias add.
func.func @main(%x: tensor<3x4xf32>) -> tensor<3x2xf32> {
  %w = stablehlo.constant dense<[[1.0, -2.0], [0.5, 3.0], [-1.5, 2.5], [4.0, -0.25]]> : tensor<4x2xf32>
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<3x4xf32>, tensor<4x2xf32>) -> tensor<3x2xf32>
  %s = stablehlo.constant dense<[1.5, 0.75]> : tensor<2xf32>
  %t = stablehlo.constant dense<[-0.5, 2.0]> : tensor<2xf32>
  %sb = stablehlo.broadcast_in_dim %s, dims = [1] : (tensor<2xf32>) -> tensor<3x2xf32>
  %tb = stablehlo.broadcast_in_dim %t, dims = [1] : (tensor<2xf32>) -> tensor<3x2xf32>
  %two = stablehlo.constant dense<2.0> : tensor<3x2xf32>
  %0 = stablehlo.divide %y, %two : tensor<3x2xf32>
  %1 = stablehlo.multiply %sb, %0 : tensor<3x2xf32>
  %2 = stablehlo.subtract %tb, %1 : tensor<3x2xf32>
  return %2 : tensor<3x2xf32>
}
