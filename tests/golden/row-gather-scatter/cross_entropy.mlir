// golden: options={"on_cpu": true}
// jax.value_and_grad of -take_along_axis(log_softmax(z), y[:, None], -1).mean() (jax export, after
// inline-calls,canonicalize,cse): the label gather becomes a masked row sum, the gradient's
// scatter-add a select over the row, the size-1 reduces elementwise ops.
module @jit_xent attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4x8xf32>, %arg1: tensor<4xi32>) -> (tensor<f32> {jax.result_info = "result[0]"}, tensor<4x8xf32> {jax.result_info = "result[1]"}) {
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %cst_0 = stablehlo.constant dense<4.000000e+00> : tensor<f32>
    %cst_1 = stablehlo.constant dense<0x7FC00000> : tensor<f32>
    %c = stablehlo.constant dense<true> : tensor<i1>
    %c_2 = stablehlo.constant dense<7> : tensor<1xi32>
    %c_3 = stablehlo.constant dense<8> : tensor<i32>
    %c_4 = stablehlo.constant dense<0> : tensor<i32>
    %cst_5 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %cst_6 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %0 = stablehlo.reduce(%arg0 init: %cst_6) applies stablehlo.maximum across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
    %1 = stablehlo.broadcast_in_dim %cst_6, dims = [] : (tensor<f32>) -> tensor<4xf32>
    %2 = stablehlo.maximum %1, %0 : tensor<4xf32>
    %3 = stablehlo.broadcast_in_dim %2, dims = [0] : (tensor<4xf32>) -> tensor<4x1xf32>
    %4 = stablehlo.broadcast_in_dim %3, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x8xf32>
    %5 = stablehlo.subtract %arg0, %4 : tensor<4x8xf32>
    %6 = stablehlo.exponential %5 : tensor<4x8xf32>
    %7 = stablehlo.reduce(%6 init: %cst_5) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
    %8 = stablehlo.broadcast_in_dim %7, dims = [0] : (tensor<4xf32>) -> tensor<4x1xf32>
    %9 = stablehlo.log %8 : tensor<4x1xf32>
    %10 = stablehlo.broadcast_in_dim %9, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x8xf32>
    %11 = stablehlo.subtract %5, %10 : tensor<4x8xf32>
    %12 = stablehlo.broadcast_in_dim %arg1, dims = [0] : (tensor<4xi32>) -> tensor<4x1xi32>
    %13 = stablehlo.broadcast_in_dim %c_4, dims = [] : (tensor<i32>) -> tensor<4x1xi32>
    %14 = stablehlo.compare LT, %12, %13, SIGNED : (tensor<4x1xi32>, tensor<4x1xi32>) -> tensor<4x1xi1>
    %15 = stablehlo.broadcast_in_dim %c_3, dims = [] : (tensor<i32>) -> tensor<4x1xi32>
    %16 = stablehlo.add %12, %15 : tensor<4x1xi32>
    %17 = stablehlo.select %14, %16, %12 : tensor<4x1xi1>, tensor<4x1xi32>
    %18 = stablehlo.reshape %17 : (tensor<4x1xi32>) -> tensor<4x1x1xi32>
    %19 = stablehlo.broadcast_in_dim %c_4, dims = [] : (tensor<i32>) -> tensor<4x1x1xi32>
    %20 = stablehlo.compare GE, %18, %19, SIGNED : (tensor<4x1x1xi32>, tensor<4x1x1xi32>) -> tensor<4x1x1xi1>
    %21 = stablehlo.broadcast_in_dim %c_2, dims = [2] : (tensor<1xi32>) -> tensor<1x1x1xi32>
    %22 = stablehlo.broadcast_in_dim %21, dims = [0, 1, 2] : (tensor<1x1x1xi32>) -> tensor<4x1x1xi32>
    %23 = stablehlo.compare LE, %18, %22, SIGNED : (tensor<4x1x1xi32>, tensor<4x1x1xi32>) -> tensor<4x1x1xi1>
    %24 = stablehlo.and %20, %23 : tensor<4x1x1xi1>
    %25 = stablehlo.reduce(%24 init: %c) applies stablehlo.and across dimensions = [2] : (tensor<4x1x1xi1>, tensor<i1>) -> tensor<4x1xi1>
    %26 = "stablehlo.gather"(%11, %18) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [1], operand_batching_dims = [0], start_indices_batching_dims = [0], start_index_map = [1], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<4x8xf32>, tensor<4x1x1xi32>) -> tensor<4x1xf32>
    %27 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<4x1xf32>
    %28 = stablehlo.select %25, %26, %27 : tensor<4x1xi1>, tensor<4x1xf32>
    %29 = stablehlo.reduce(%28 init: %cst_5) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x1xf32>, tensor<f32>) -> tensor<f32>
    %30 = stablehlo.divide %29, %cst_0 : tensor<f32>
    %31 = stablehlo.negate %30 : tensor<f32>
    %32 = stablehlo.negate %cst : tensor<f32>
    %33 = stablehlo.divide %32, %cst_0 : tensor<f32>
    %34 = stablehlo.broadcast_in_dim %33, dims = [] : (tensor<f32>) -> tensor<4x1xf32>
    %35 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<4x8xf32>
    %36 = "stablehlo.scatter"(%35, %18, %34) <{indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [1], input_batching_dims = [0], scatter_indices_batching_dims = [0], scatter_dims_to_operand_dims = [1], index_vector_dim = 2>, unique_indices = false}> ({
    ^bb0(%arg2: tensor<f32>, %arg3: tensor<f32>):
      %45 = stablehlo.add %arg2, %arg3 : tensor<f32>
      stablehlo.return %45 : tensor<f32>
    }) : (tensor<4x8xf32>, tensor<4x1x1xi32>, tensor<4x1xf32>) -> tensor<4x8xf32>
    %37 = stablehlo.negate %36 : tensor<4x8xf32>
    %38 = stablehlo.reduce(%37 init: %cst_5) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
    %39 = stablehlo.reshape %38 : (tensor<4xf32>) -> tensor<4x1xf32>
    %40 = stablehlo.divide %39, %8 : tensor<4x1xf32>
    %41 = stablehlo.reduce(%40 init: %cst_5) applies stablehlo.add across dimensions = [1] : (tensor<4x1xf32>, tensor<f32>) -> tensor<4xf32>
    %42 = stablehlo.broadcast_in_dim %41, dims = [0] : (tensor<4xf32>) -> tensor<4x8xf32>
    %43 = stablehlo.multiply %42, %6 : tensor<4x8xf32>
    %44 = stablehlo.add %36, %43 : tensor<4x8xf32>
    return %31, %44 : tensor<f32>, tensor<4x8xf32>
  }
}
