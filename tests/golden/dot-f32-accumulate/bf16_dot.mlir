// golden: numbers=reassociate
// cpu: a bf16 x bf16 -> bf16 dot (here batched, with a bias epilogue) becomes the same dot with
// an f32 result and a convert to bf16 right after it; the epilogue is unchanged.
func.func @main(%x: tensor<2x4x8xbf16>, %w: tensor<2x8x16xbf16>, %b: tensor<2x4x16xbf16>) -> tensor<2x4x16xbf16> {
  %y = stablehlo.dot_general %x, %w, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x4x8xbf16>, tensor<2x8x16xbf16>) -> tensor<2x4x16xbf16>
  %z = stablehlo.add %y, %b : tensor<2x4x16xbf16>
  return %z : tensor<2x4x16xbf16>
}
