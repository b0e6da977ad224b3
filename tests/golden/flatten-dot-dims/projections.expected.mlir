module {
  func.func public @main(%arg0: tensor<2x4x8xf32>, %arg1: tensor<8x2x4xf32>, %arg2: tensor<2x4xf32>, %arg3: tensor<2x4x8xf32>, %arg4: tensor<8xf32>) -> tensor<2x4x8xf32> {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.reshape %arg1 : (tensor<8x2x4xf32>) -> tensor<8x8xf32>
    %1 = stablehlo.dot_general %arg0, %0, contracting_dims = [2] x [0] : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %2 = stablehlo.reshape %arg2 : (tensor<2x4xf32>) -> tensor<8xf32>
    %3 = stablehlo.broadcast_in_dim %2, dims = [2] : (tensor<8xf32>) -> tensor<2x4x8xf32>
    %4 = stablehlo.add %1, %3 : tensor<2x4x8xf32>
    %5 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x4x8xf32>
    %6 = stablehlo.maximum %4, %5 : tensor<2x4x8xf32>
    %7 = stablehlo.reshape %arg3 : (tensor<2x4x8xf32>) -> tensor<8x8xf32>
    %8 = stablehlo.dot_general %6, %7, contracting_dims = [2] x [0] : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
    %9 = stablehlo.broadcast_in_dim %arg4, dims = [2] : (tensor<8xf32>) -> tensor<2x4x8xf32>
    %10 = stablehlo.add %8, %9 : tensor<2x4x8xf32>
    return %10 : tensor<2x4x8xf32>
  }
}
