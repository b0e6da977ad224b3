// golden: before=fuse-matmul-epilogue
// golden: unchanged
// golden: reason=sibling dots share an operand but not the lhs
// Two dots sharing only the rhs: only a shared lhs is loaded once, nothing to merge.
func.func @main(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>, %w: tensor<16x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
  %1 = stablehlo.dot_general %y, %w, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
  return %0, %1 : tensor<8x16xf32>, tensor<8x16xf32>
}
