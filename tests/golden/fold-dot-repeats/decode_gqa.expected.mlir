module {
  func.func @main(%arg0: tensor<2x1x4x8xf32>, %arg1: tensor<2x16x2x8xf32>, %arg2: tensor<2x16x2x8xf32>) -> tensor<2x4x8x1xf32> {
    %0 = stablehlo.reshape %arg0 : (tensor<2x1x4x8xf32>) -> tensor<2x1x2x2x8xf32>
    %1 = stablehlo.dot_general %0, %arg1, batching_dims = [0, 2] x [0, 2], contracting_dims = [4] x [3] : (tensor<2x1x2x2x8xf32>, tensor<2x16x2x8xf32>) -> tensor<2x2x1x2x16xf32>
    %2 = stablehlo.reshape %1 : (tensor<2x2x1x2x16xf32>) -> tensor<2x4x1x16xf32>
    %3 = stablehlo.exponential %2 : tensor<2x4x1x16xf32>
    %4 = stablehlo.reshape %3 : (tensor<2x4x1x16xf32>) -> tensor<2x2x2x1x16xf32>
    %5 = stablehlo.dot_general %arg2, %4, batching_dims = [0, 2] x [0, 1], contracting_dims = [1] x [4] : (tensor<2x16x2x8xf32>, tensor<2x2x2x1x16xf32>) -> tensor<2x2x8x2x1xf32>
    %6 = stablehlo.transpose %5, dims = [0, 1, 3, 2, 4] : (tensor<2x2x8x2x1xf32>) -> tensor<2x2x2x8x1xf32>
    %7 = stablehlo.reshape %6 : (tensor<2x2x2x8x1xf32>) -> tensor<2x4x8x1xf32>
    return %7 : tensor<2x4x8x1xf32>
  }
}
