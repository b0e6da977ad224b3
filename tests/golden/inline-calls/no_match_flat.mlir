// golden: unchanged
// Nothing to inline: no func.call.
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = stablehlo.exponential %x : tensor<4xf32>
  return %y : tensor<4xf32>
}
