module {
  func.func @main(%arg0: tensor<3x4xf32>) -> tensor<3x2xf32> {
    %cst = stablehlo.constant dense<[[1.500000e+00, 3.000000e+00], [1.500000e+00, -5.000000e-01], [1.000000e+00, 5.000000e-01], [-2.000000e+00, 1.000000e+00]]> : tensor<4x2xf32>
    %0 = stablehlo.dot_general %arg0, %cst, contracting_dims = [1] x [0] : (tensor<3x4xf32>, tensor<4x2xf32>) -> tensor<3x2xf32>
    %cst_0 = stablehlo.constant dense<[-6.500000e+00, 3.625000e+00]> : tensor<2xf32>
    %1 = stablehlo.broadcast_in_dim %cst_0, dims = [1] : (tensor<2xf32>) -> tensor<3x2xf32>
    %2 = stablehlo.add %0, %1 : tensor<3x2xf32>
    return %2 : tensor<3x2xf32>
  }
}
