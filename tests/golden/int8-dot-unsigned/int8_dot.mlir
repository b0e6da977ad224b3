// golden: numbers=exact
// golden: options={"shift": "always"}
// cpu: an int8 x int8 -> int32 dot (here batched, with its dequant epilogue) becomes a u8 x s8
// dot of the lhs shifted by 128 (bitcast, xor 0x80) minus 128 * the rhs's column sums, which
// a two-row u8 x s8 dot of a constant computes; the same integers, the epilogue unchanged.
func.func @main(%x: tensor<2x4x8xi8>, %w: tensor<2x8x16xi8>, %s: tensor<2x4x16xf32>) -> tensor<2x4x16xf32> {
  %y = stablehlo.dot_general %x, %w, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x4x8xi8>, tensor<2x8x16xi8>) -> tensor<2x4x16xi32>
  %f = stablehlo.convert %y : (tensor<2x4x16xi32>) -> tensor<2x4x16xf32>
  %z = stablehlo.multiply %f, %s : tensor<2x4x16xf32>
  return %z : tensor<2x4x16xf32>
}
