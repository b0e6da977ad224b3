// golden: unchanged
// golden: reason=softmax probabilities are used outside the P·V product
// Attention that also returns its weights (sdpa.mlir returning %13 too): the probabilities
// must exist in memory, which a flash kernel never writes, so the candidate is left to XLA.
module {
  func.func @main(%arg0: tensor<2x16x16xf32>, %arg1: tensor<2x16x16xf32>, %arg2: tensor<2x16x16xf32>) -> (tensor<2x16x16xf32>, tensor<2x16x16xf32>) {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %cst_0 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %cst_1 = stablehlo.constant dense<2.500000e-01> : tensor<f32>
    %0 = stablehlo.dot_general %arg0, %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<2x16x16xf32>, tensor<2x16x16xf32>) -> tensor<2x16x16xf32>
    %1 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2x16x16xf32>
    %2 = stablehlo.multiply %0, %1 : tensor<2x16x16xf32>
    %3 = stablehlo.reduce(%2 init: %cst_0) applies stablehlo.maximum across dimensions = [2] : (tensor<2x16x16xf32>, tensor<f32>) -> tensor<2x16xf32>
    %4 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<2x16xf32>
    %5 = stablehlo.maximum %4, %3 : tensor<2x16xf32>
    %6 = stablehlo.broadcast_in_dim %5, dims = [0, 1] : (tensor<2x16xf32>) -> tensor<2x16x1xf32>
    %7 = stablehlo.broadcast_in_dim %6, dims = [0, 1, 2] : (tensor<2x16x1xf32>) -> tensor<2x16x16xf32>
    %8 = stablehlo.subtract %2, %7 : tensor<2x16x16xf32>
    %9 = stablehlo.exponential %8 : tensor<2x16x16xf32>
    %10 = stablehlo.reduce(%9 init: %cst) applies stablehlo.add across dimensions = [2] : (tensor<2x16x16xf32>, tensor<f32>) -> tensor<2x16xf32>
    %11 = stablehlo.broadcast_in_dim %10, dims = [0, 1] : (tensor<2x16xf32>) -> tensor<2x16x1xf32>
    %12 = stablehlo.broadcast_in_dim %11, dims = [0, 1, 2] : (tensor<2x16x1xf32>) -> tensor<2x16x16xf32>
    %13 = stablehlo.divide %9, %12 : tensor<2x16x16xf32>
    %14 = stablehlo.dot_general %13, %arg2, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x16x16xf32>, tensor<2x16x16xf32>) -> tensor<2x16x16xf32>
    return %14, %13 : tensor<2x16x16xf32>, tensor<2x16x16xf32>
  }
}

