// Upstream cse: the second tanh and the second constant are the same values as the first.
func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = stablehlo.tanh %x : tensor<4xf32>
  %b = stablehlo.tanh %x : tensor<4xf32>
  %c1 = stablehlo.constant dense<3.0> : tensor<4xf32>
  %c2 = stablehlo.constant dense<3.0> : tensor<4xf32>
  %p = stablehlo.multiply %a, %c1 : tensor<4xf32>
  %q = stablehlo.multiply %b, %c2 : tensor<4xf32>
  %s = stablehlo.add %p, %q : tensor<4xf32>
  return %s : tensor<4xf32>
}
