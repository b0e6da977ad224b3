// W * 2 and transpose(W) of a constant weight fold on the host into one constant each;
// broadcast(bias) to the activation shape stays a broadcast (the size policy).
func.func @main(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %w = stablehlo.constant dense<[[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]> : tensor<3x3xf32>
  %two = stablehlo.constant dense<2.0> : tensor<3x3xf32>
  %w2 = stablehlo.multiply %w, %two : tensor<3x3xf32>
  %wt = stablehlo.transpose %w2, dims = [1, 0] : (tensor<3x3xf32>) -> tensor<3x3xf32>
  %y = stablehlo.dot_general %x, %wt, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x3xf32>) -> tensor<2x3xf32>
  %b = stablehlo.constant dense<[0.5, -1.0, 2.0]> : tensor<3xf32>
  %bb = stablehlo.broadcast_in_dim %b, dims = [1] : (tensor<3xf32>) -> tensor<2x3xf32>
  %s = stablehlo.add %y, %bb : tensor<2x3xf32>
  return %s : tensor<2x3xf32>
}
