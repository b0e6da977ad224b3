// Upstream canonicalize: the dead exponential goes (adding two constants is left to
// constant-fold).
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %c1 = stablehlo.constant dense<1.0> : tensor<4xf32>
  %c2 = stablehlo.constant dense<2.0> : tensor<4xf32>
  %dead = stablehlo.exponential %x : tensor<4xf32>
  %c = stablehlo.add %c1, %c2 : tensor<4xf32>
  %y = stablehlo.multiply %x, %c : tensor<4xf32>
  return %y : tensor<4xf32>
}
