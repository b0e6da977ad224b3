// golden: unchanged
// golden: reason=left_as_written
// the lhs contracting dims 1 and 3 are not adjacent: flattening them would need a transpose,
// so the product is left as written.
func.func public @main(%arg0: tensor<2x2x4x3xf32>, %arg1: tensor<2x3x8xf32>) -> tensor<2x4x8xf32> {
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1, 3] x [0, 1] : (tensor<2x2x4x3xf32>, tensor<2x3x8xf32>) -> tensor<2x4x8xf32>
  return %0 : tensor<2x4x8xf32>
}
