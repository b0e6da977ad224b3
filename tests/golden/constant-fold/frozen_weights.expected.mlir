module {
  func.func @main(%arg0: tensor<2x3xf32>) -> tensor<2x3xf32> {
    %cst = stablehlo.constant dense<[[2.000000e+00, 8.000000e+00, 1.400000e+01], [4.000000e+00, 1.000000e+01, 1.600000e+01], [6.000000e+00, 1.200000e+01, 1.800000e+01]]> : tensor<3x3xf32>
    %0 = stablehlo.dot_general %arg0, %cst, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x3xf32>) -> tensor<2x3xf32>
    %cst_0 = stablehlo.constant dense<[5.000000e-01, -1.000000e+00, 2.000000e+00]> : tensor<3xf32>
    %1 = stablehlo.broadcast_in_dim %cst_0, dims = [1] : (tensor<3xf32>) -> tensor<2x3xf32>
    %2 = stablehlo.add %0, %1 : tensor<2x3xf32>
    return %2 : tensor<2x3xf32>
  }
}
