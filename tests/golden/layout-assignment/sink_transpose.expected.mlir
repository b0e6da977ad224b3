module {
  func.func @main(%arg0: tensor<2x3x4xf32>, %arg1: tensor<3xf32>) -> tensor<4x2x3xf32> {
    %0 = stablehlo.exponential %arg0 : tensor<2x3x4xf32>
    %cst = stablehlo.constant dense<5.000000e-01> : tensor<2x3x4xf32>
    %1 = stablehlo.multiply %0, %cst : tensor<2x3x4xf32>
    %2 = stablehlo.broadcast_in_dim %arg1, dims = [1] : (tensor<3xf32>) -> tensor<2x3x4xf32>
    %3 = stablehlo.add %1, %2 : tensor<2x3x4xf32>
    %4 = stablehlo.transpose %3, dims = [2, 0, 1] : (tensor<2x3x4xf32>) -> tensor<4x2x3xf32>
    return %4 : tensor<4x2x3xf32>
  }
}
