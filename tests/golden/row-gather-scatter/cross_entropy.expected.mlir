module @jit_xent attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<4x8xf32>, %arg1: tensor<4xi32>) -> (tensor<f32> {jax.result_info = "result[0]"}, tensor<4x8xf32> {jax.result_info = "result[1]"}) {
    %cst = stablehlo.constant dense<-0.000000e+00> : tensor<f32>
    %cst_0 = stablehlo.constant dense<-0.000000e+00> : tensor<4x8xf32>
    %c = stablehlo.constant dense<7> : tensor<i32>
    %cst_1 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %cst_2 = stablehlo.constant dense<4.000000e+00> : tensor<f32>
    %cst_3 = stablehlo.constant dense<0x7FC00000> : tensor<f32>
    %c_4 = stablehlo.constant dense<true> : tensor<i1>
    %c_5 = stablehlo.constant dense<7> : tensor<1xi32>
    %c_6 = stablehlo.constant dense<8> : tensor<i32>
    %c_7 = stablehlo.constant dense<0> : tensor<i32>
    %cst_8 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %cst_9 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %0 = stablehlo.reduce(%arg0 init: %cst_9) applies stablehlo.maximum across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
    %1 = stablehlo.broadcast_in_dim %cst_9, dims = [] : (tensor<f32>) -> tensor<4xf32>
    %2 = stablehlo.maximum %1, %0 : tensor<4xf32>
    %3 = stablehlo.broadcast_in_dim %2, dims = [0] : (tensor<4xf32>) -> tensor<4x1xf32>
    %4 = stablehlo.broadcast_in_dim %3, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x8xf32>
    %5 = stablehlo.subtract %arg0, %4 : tensor<4x8xf32>
    %6 = stablehlo.exponential %5 : tensor<4x8xf32>
    %7 = stablehlo.reduce(%6 init: %cst_8) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
    %8 = stablehlo.broadcast_in_dim %7, dims = [0] : (tensor<4xf32>) -> tensor<4x1xf32>
    %9 = stablehlo.log %8 : tensor<4x1xf32>
    %10 = stablehlo.broadcast_in_dim %9, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x8xf32>
    %11 = stablehlo.subtract %5, %10 : tensor<4x8xf32>
    %12 = stablehlo.broadcast_in_dim %arg1, dims = [0] : (tensor<4xi32>) -> tensor<4x1xi32>
    %13 = stablehlo.broadcast_in_dim %c_7, dims = [] : (tensor<i32>) -> tensor<4x1xi32>
    %14 = stablehlo.compare LT, %12, %13, SIGNED : (tensor<4x1xi32>, tensor<4x1xi32>) -> tensor<4x1xi1>
    %15 = stablehlo.broadcast_in_dim %c_6, dims = [] : (tensor<i32>) -> tensor<4x1xi32>
    %16 = stablehlo.add %12, %15 : tensor<4x1xi32>
    %17 = stablehlo.select %14, %16, %12 : tensor<4x1xi1>, tensor<4x1xi32>
    %18 = stablehlo.reshape %17 : (tensor<4x1xi32>) -> tensor<4x1x1xi32>
    %19 = stablehlo.broadcast_in_dim %c_7, dims = [] : (tensor<i32>) -> tensor<4x1x1xi32>
    %20 = stablehlo.compare GE, %18, %19, SIGNED : (tensor<4x1x1xi32>, tensor<4x1x1xi32>) -> tensor<4x1x1xi1>
    %21 = stablehlo.broadcast_in_dim %c_5, dims = [2] : (tensor<1xi32>) -> tensor<1x1x1xi32>
    %22 = stablehlo.broadcast_in_dim %21, dims = [0, 1, 2] : (tensor<1x1x1xi32>) -> tensor<4x1x1xi32>
    %23 = stablehlo.compare LE, %18, %22, SIGNED : (tensor<4x1x1xi32>, tensor<4x1x1xi32>) -> tensor<4x1x1xi1>
    %24 = stablehlo.and %20, %23 : tensor<4x1x1xi1>
    %25 = stablehlo.reduce(%24 init: %c_4) applies stablehlo.and across dimensions = [2] : (tensor<4x1x1xi1>, tensor<i1>) -> tensor<4x1xi1>
    %26 = stablehlo.reshape %18 : (tensor<4x1x1xi32>) -> tensor<4x1xi32>
    %27 = stablehlo.clamp %c_7, %26, %c : (tensor<i32>, tensor<4x1xi32>, tensor<i32>) -> tensor<4x1xi32>
    %28 = stablehlo.broadcast_in_dim %27, dims = [0, 1] : (tensor<4x1xi32>) -> tensor<4x8xi32>
    %29 = stablehlo.iota dim = 0 : tensor<8xi32>
    %30 = stablehlo.broadcast_in_dim %29, dims = [1] : (tensor<8xi32>) -> tensor<4x8xi32>
    %31 = stablehlo.compare EQ, %30, %28, SIGNED : (tensor<4x8xi32>, tensor<4x8xi32>) -> tensor<4x8xi1>
    %32 = stablehlo.select %31, %11, %cst_0 : tensor<4x8xi1>, tensor<4x8xf32>
    %33 = stablehlo.reduce(%32 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
    %34 = stablehlo.reshape %33 : (tensor<4xf32>) -> tensor<4x1xf32>
    %35 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<4x1xf32>
    %36 = stablehlo.select %25, %34, %35 : tensor<4x1xi1>, tensor<4x1xf32>
    %37 = stablehlo.reduce(%36 init: %cst_8) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x1xf32>, tensor<f32>) -> tensor<f32>
    %38 = stablehlo.divide %37, %cst_2 : tensor<f32>
    %39 = stablehlo.negate %38 : tensor<f32>
    %40 = stablehlo.negate %cst_1 : tensor<f32>
    %41 = stablehlo.divide %40, %cst_2 : tensor<f32>
    %42 = stablehlo.broadcast_in_dim %41, dims = [] : (tensor<f32>) -> tensor<4x1xf32>
    %43 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<4x8xf32>
    %44 = stablehlo.broadcast_in_dim %26, dims = [0, 1] : (tensor<4x1xi32>) -> tensor<4x8xi32>
    %45 = stablehlo.compare EQ, %30, %44, SIGNED : (tensor<4x8xi32>, tensor<4x8xi32>) -> tensor<4x8xi1>
    %46 = stablehlo.broadcast_in_dim %42, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x8xf32>
    %47 = stablehlo.add %43, %46 : tensor<4x8xf32>
    %48 = stablehlo.select %45, %47, %43 : tensor<4x8xi1>, tensor<4x8xf32>
    %49 = stablehlo.negate %48 : tensor<4x8xf32>
    %50 = stablehlo.reduce(%49 init: %cst_8) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
    %51 = stablehlo.reshape %50 : (tensor<4xf32>) -> tensor<4x1xf32>
    %52 = stablehlo.divide %51, %8 : tensor<4x1xf32>
    %53 = stablehlo.reshape %52 : (tensor<4x1xf32>) -> tensor<4xf32>
    %54 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<4xf32>
    %55 = stablehlo.add %53, %54 : tensor<4xf32>
    %56 = stablehlo.broadcast_in_dim %55, dims = [0] : (tensor<4xf32>) -> tensor<4x8xf32>
    %57 = stablehlo.multiply %56, %6 : tensor<4x8xf32>
    %58 = stablehlo.add %48, %57 : tensor<4x8xf32>
    return %39, %58 : tensor<f32>, tensor<4x8xf32>
  }
}
