// golden: unchanged
// golden: reason=scale varies along the contracting dim
// The weight scale varies along K: it does not factor out of the sum.
func.func @main(%xq: tensor<4x16xi8>, %wq: tensor<16x8xi8>, %sw: tensor<16xf32>) -> tensor<4x8xf32> {
  %x = stablehlo.convert %xq : (tensor<4x16xi8>) -> tensor<4x16xf32>
  %sx = stablehlo.constant dense<0.05> : tensor<4x16xf32>
  %xd = stablehlo.multiply %x, %sx : tensor<4x16xf32>
  %w = stablehlo.convert %wq : (tensor<16x8xi8>) -> tensor<16x8xf32>
  %swb = stablehlo.broadcast_in_dim %sw, dims = [0] : (tensor<16xf32>) -> tensor<16x8xf32>
  %wd = stablehlo.multiply %w, %swb : tensor<16x8xf32>
  %y = stablehlo.dot_general %xd, %wd, contracting_dims = [1] x [0] : (tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}
