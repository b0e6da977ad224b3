// golden: numbers=reassociate
// golden: options={"min_split_elements": 64}
// GroupNorm's sum over (1, 2, 4) of x[B, H, W, G, C/G]: the H*W run first, on [B, H*W, C];
// then the C/G run of [B*G, C/G]; a reshape back to [B, G].
func.func @main(%x: tensor<2x4x4x4x2xf32>) -> tensor<2x4xf32> {
  %zero = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %s = stablehlo.reduce(%x init: %zero) applies stablehlo.add across dimensions = [1, 2, 4] : (tensor<2x4x4x4x2xf32>, tensor<f32>) -> tensor<2x4xf32>
  return %s : tensor<2x4xf32>
}
