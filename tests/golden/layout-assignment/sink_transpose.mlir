// A transpose sinks through exponential, multiply and add (a broadcast on the other side is
// re-broadcast) to the output: one transpose, last.
func.func @main(%x: tensor<2x3x4xf32>, %b: tensor<3xf32>) -> tensor<4x2x3xf32> {
  %t = stablehlo.transpose %x, dims = [2, 0, 1] : (tensor<2x3x4xf32>) -> tensor<4x2x3xf32>
  %e = stablehlo.exponential %t : tensor<4x2x3xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [2] : (tensor<3xf32>) -> tensor<4x2x3xf32>
  %h = stablehlo.constant dense<0.5> : tensor<4x2x3xf32>
  %m = stablehlo.multiply %e, %h : tensor<4x2x3xf32>
  %y = stablehlo.add %m, %bb : tensor<4x2x3xf32>
  return %y : tensor<4x2x3xf32>
}
