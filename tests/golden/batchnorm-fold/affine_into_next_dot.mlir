// golden: numbers=reassociate
// LayerNorm's gamma/beta (per-feature constants along K) before a dot with frozen weights:
// gamma is multiplied into the weights' rows, beta @ W becomes a bias after the dot.
func.func @main(%n: tensor<3x4xf32>) -> tensor<3x2xf32> {
  %g = stablehlo.constant dense<[1.5, 0.5, 2.0, 1.0]> : tensor<4xf32>
  %b = stablehlo.constant dense<[0.25, -1.0, 0.5, 2.0]> : tensor<4xf32>
  %w = stablehlo.constant dense<[[1.0, 2.0], [3.0, -1.0], [0.5, 0.25], [-2.0, 1.0]]> : tensor<4x2xf32>
  %gb = stablehlo.broadcast_in_dim %g, dims = [1] : (tensor<4xf32>) -> tensor<3x4xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<4xf32>) -> tensor<3x4xf32>
  %0 = stablehlo.multiply %n, %gb : tensor<3x4xf32>
  %1 = stablehlo.add %0, %bb : tensor<3x4xf32>
  %z = stablehlo.dot_general %1, %w, contracting_dims = [1] x [0] : (tensor<3x4xf32>, tensor<4x2xf32>) -> tensor<3x2xf32>
  return %z : tensor<3x2xf32>
}
