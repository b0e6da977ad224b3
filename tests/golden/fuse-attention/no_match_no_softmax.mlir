// golden: unchanged
// (q k^T) v without a softmax between the two dots: not attention.
func.func @main(%q: tensor<2x16x16xf32>, %k: tensor<2x16x16xf32>, %v: tensor<2x16x16xf32>) -> tensor<2x16x16xf32> {
  %0 = stablehlo.dot_general %q, %k, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<2x16x16xf32>, tensor<2x16x16xf32>) -> tensor<2x16x16xf32>
  %1 = stablehlo.dot_general %0, %v, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x16x16xf32>, tensor<2x16x16xf32>) -> tensor<2x16x16xf32>
  return %1 : tensor<2x16x16xf32>
}
