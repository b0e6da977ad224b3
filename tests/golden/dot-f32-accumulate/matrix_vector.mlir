// golden: numbers=reassociate
// golden: options={"gemv_pad_min_elems": 64, "gemv_rows": 2}
// a bf16 matrix-vector dot (a decoder's next-token head) is computed as a two-row product
// with an f32 result: the vector is padded with a zero row, the first row sliced back.
func.func @main(%x: tensor<1x1x16xbf16>, %w: tensor<16x40xbf16>) -> tensor<1x1x40xbf16> {
  %y = stablehlo.dot_general %x, %w, contracting_dims = [2] x [0] : (tensor<1x1x16xbf16>, tensor<16x40xbf16>) -> tensor<1x1x40xbf16>
  return %y : tensor<1x1x40xbf16>
}
