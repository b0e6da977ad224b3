module {
  func.func public @main(%arg0: tensor<2x2x4x3xf32>, %arg1: tensor<2x3x8xf32>) -> tensor<2x4x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1, 3] x [0, 1] : (tensor<2x2x4x3xf32>, tensor<2x3x8xf32>) -> tensor<2x4x8xf32>
    return %0 : tensor<2x4x8xf32>
  }
}
