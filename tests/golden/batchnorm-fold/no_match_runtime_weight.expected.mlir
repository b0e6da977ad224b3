module {
  func.func @main(%arg0: tensor<3x4xf32>, %arg1: tensor<4x2xf32>) -> tensor<3x2xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<3x4xf32>, tensor<4x2xf32>) -> tensor<3x2xf32>
    %cst = stablehlo.constant dense<[1.500000e+00, 7.500000e-01]> : tensor<2xf32>
    %1 = stablehlo.broadcast_in_dim %cst, dims = [1] : (tensor<2xf32>) -> tensor<3x2xf32>
    %2 = stablehlo.multiply %0, %1 : tensor<3x2xf32>
    return %2 : tensor<3x2xf32>
  }
}
