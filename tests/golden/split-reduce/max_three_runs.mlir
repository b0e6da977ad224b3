// golden: options={"min_split_elements": 64}
// a max over three runs (dims 0, 2, 4): the largest run first, the rest regrouped; exact.
func.func @main(%x: tensor<3x2x5x2x7xf32>) -> tensor<2x2xf32> {
  %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
  %m = stablehlo.reduce(%x init: %ninf) applies stablehlo.maximum across dimensions = [0, 2, 4] : (tensor<3x2x5x2x7xf32>, tensor<f32>) -> tensor<2x2xf32>
  return %m : tensor<2x2xf32>
}
