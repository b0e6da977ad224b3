// golden: unchanged
// golden: reason=operand is a function argument
// Nothing constant to fold: every op reads the runtime argument.
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %c = stablehlo.constant dense<2.0> : tensor<4xf32>
  %y = stablehlo.multiply %x, %c : tensor<4xf32>
  %z = stablehlo.exponential %y : tensor<4xf32>
  return %z : tensor<4xf32>
}
