module {
  func.func @main(%arg0: tensor<2x16x16xf32>, %arg1: tensor<2x16x16xf32>, %arg2: tensor<2x16x16xf32>) -> tensor<2x16x16xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<2x16x16xf32>, tensor<2x16x16xf32>) -> tensor<2x16x16xf32>
    %1 = stablehlo.dot_general %0, %arg2, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x16x16xf32>, tensor<2x16x16xf32>) -> tensor<2x16x16xf32>
    return %1 : tensor<2x16x16xf32>
  }
}
