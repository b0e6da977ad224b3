// golden: numbers=exact
// golden: options={"int8_gemv_pad_min_elems": 64, "int8_gemv_rows": 2, "shift": "always"}
// an int8 vector-matrix dot (batch-1 decoding) is also computed as a two-row product: the
// shifted u8 vector padded with a zero row, the first row sliced back before the correction.
func.func @main(%x: tensor<1x1x16xi8>, %w: tensor<16x40xi8>) -> tensor<1x1x40xi32> {
  %y = stablehlo.dot_general %x, %w, contracting_dims = [2] x [0] : (tensor<1x1x16xi8>, tensor<16x40xi8>) -> tensor<1x1x40xi32>
  return %y : tensor<1x1x40xi32>
}
