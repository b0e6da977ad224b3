// golden: unchanged
// a dot whose result is already f32 (bf16 operands, preferred_element_type=f32), and an f32
// dot: nothing to widen.
func.func @main(%x: tensor<4x8xbf16>, %w: tensor<8x16xbf16>, %a: tensor<4x8xf32>, %v: tensor<8x16xf32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
  %y = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0] : (tensor<4x8xbf16>, tensor<8x16xbf16>) -> tensor<4x16xf32>
  %z = stablehlo.dot_general %a, %v, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
  return %y, %z : tensor<4x16xf32>, tensor<4x16xf32>
}
