module {
  func.func @main(%arg0: tensor<4x8xf32>, %arg1: tensor<4x2x1xi32>) -> (tensor<4x2xf32>, tensor<4xf32>) {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.tanh %arg0 : tensor<4x8xf32>
    %1 = "stablehlo.gather"(%0, %arg1) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [1], operand_batching_dims = [0], start_indices_batching_dims = [0], start_index_map = [1], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<4x8xf32>, tensor<4x2x1xi32>) -> tensor<4x2xf32>
    %2 = stablehlo.reduce(%0 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
    return %1, %2 : tensor<4x2xf32>, tensor<4xf32>
  }
}
