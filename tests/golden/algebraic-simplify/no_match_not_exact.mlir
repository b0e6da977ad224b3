// golden: unchanged
// golden: reason=x + (+0.0) is not x for x = -0.0
// No exact identity applies: x + (+0.0) is not x (-0.0 + +0.0 = +0.0), x * 0 is not 0 (NaN,
// inf), x - x is not 0 (NaN): the table deliberately has no such rows.
func.func @main(%x: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) {
  %zero = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  %a = stablehlo.add %x, %zero : tensor<4x8xf32>
  %m = stablehlo.multiply %x, %zero : tensor<4x8xf32>
  %s = stablehlo.subtract %x, %x : tensor<4x8xf32>
  return %a, %m, %s : tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>
}
