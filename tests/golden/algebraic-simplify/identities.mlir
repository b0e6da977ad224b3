// x * 1, relu o relu, a double transpose and -(-x): each row of the pattern table fires once.
func.func @main(%x: tensor<4x8xf32>, %y: tensor<8x4xf32>) -> (tensor<4x8xf32>, tensor<8x4xf32>) {
  %one = stablehlo.constant dense<1.0> : tensor<4x8xf32>
  %zero = stablehlo.constant dense<0.0> : tensor<4x8xf32>
  %m = stablehlo.multiply %x, %one : tensor<4x8xf32>
  %r1 = stablehlo.maximum %m, %zero : tensor<4x8xf32>
  %r2 = stablehlo.maximum %r1, %zero : tensor<4x8xf32>
  %n1 = stablehlo.negate %r2 : tensor<4x8xf32>
  %n2 = stablehlo.negate %n1 : tensor<4x8xf32>
  %t1 = stablehlo.transpose %y, dims = [1, 0] : (tensor<8x4xf32>) -> tensor<4x8xf32>
  %t2 = stablehlo.transpose %t1, dims = [1, 0] : (tensor<4x8xf32>) -> tensor<8x4xf32>
  return %n2, %t2 : tensor<4x8xf32>, tensor<8x4xf32>
}
