// golden: numbers=exact
// golden: options={"int8_gemv_pad_min_elems": 64, "int8_gemv_rows": 8, "shift": "never"}
// on a CPU that multiplies signed int8 itself (AMX-INT8: what shift="auto" finds there) the dot
// stays signed x signed; a vector-matrix dot is still computed as a small matrix product, the
// vector padded with seven zero rows (AMX tiles want more than two), the first row sliced back.
func.func @main(%x: tensor<1x1x16xi8>, %w: tensor<16x40xi8>) -> tensor<1x1x40xi32> {
  %y = stablehlo.dot_general %x, %w, contracting_dims = [2] x [0] : (tensor<1x1x16xi8>, tensor<16x40xi8>) -> tensor<1x1x40xi32>
  return %y : tensor<1x1x40xi32>
}
