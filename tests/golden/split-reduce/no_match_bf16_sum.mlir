// golden: unchanged
// golden: options={"min_split_elements": 64}
// golden: reason=narrower than f32
// a bf16 sum with a bf16 accumulator: every step would round its partial sums to bf16.
func.func @main(%x: tensor<4x8x4x2xbf16>) -> tensor<8x4xbf16> {
  %zero = stablehlo.constant dense<0.000000e+00> : tensor<bf16>
  %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [0, 3] : (tensor<4x8x4x2xbf16>, tensor<bf16>) -> tensor<8x4xbf16>
  return %s : tensor<8x4xbf16>
}
