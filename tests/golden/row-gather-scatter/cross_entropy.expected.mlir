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
    %25 = stablehlo.reshape %24 : (tensor<4x1x1xi1>) -> tensor<4x1xi1>
    %26 = stablehlo.broadcast_in_dim %c_4, dims = [] : (tensor<i1>) -> tensor<4x1xi1>
    %27 = stablehlo.and %25, %26 : tensor<4x1xi1>
    %28 = stablehlo.reshape %18 : (tensor<4x1x1xi32>) -> tensor<4x1xi32>
    %29 = stablehlo.clamp %c_7, %28, %c : (tensor<i32>, tensor<4x1xi32>, tensor<i32>) -> tensor<4x1xi32>
    %30 = stablehlo.broadcast_in_dim %29, dims = [0, 1] : (tensor<4x1xi32>) -> tensor<4x8xi32>
    %31 = stablehlo.iota dim = 0 : tensor<8xi32>
    %32 = stablehlo.broadcast_in_dim %31, dims = [1] : (tensor<8xi32>) -> tensor<4x8xi32>
    %33 = stablehlo.compare EQ, %32, %30, SIGNED : (tensor<4x8xi32>, tensor<4x8xi32>) -> tensor<4x8xi1>
    %34 = stablehlo.select %33, %11, %cst_0 : tensor<4x8xi1>, tensor<4x8xf32>
    %35 = stablehlo.reduce(%34 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
    %36 = stablehlo.reshape %35 : (tensor<4xf32>) -> tensor<4x1xf32>
    %37 = stablehlo.broadcast_in_dim %cst_3, dims = [] : (tensor<f32>) -> tensor<4x1xf32>
    %38 = stablehlo.select %27, %36, %37 : tensor<4x1xi1>, tensor<4x1xf32>
    %39 = stablehlo.reduce(%38 init: %cst_8) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x1xf32>, tensor<f32>) -> tensor<f32>
    %40 = stablehlo.divide %39, %cst_2 : tensor<f32>
    %41 = stablehlo.negate %40 : tensor<f32>
    %42 = stablehlo.negate %cst_1 : tensor<f32>
    %43 = stablehlo.divide %42, %cst_2 : tensor<f32>
    %44 = stablehlo.broadcast_in_dim %43, dims = [] : (tensor<f32>) -> tensor<4x1xf32>
    %45 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<4x8xf32>
    %46 = stablehlo.broadcast_in_dim %28, dims = [0, 1] : (tensor<4x1xi32>) -> tensor<4x8xi32>
    %47 = stablehlo.compare EQ, %32, %46, SIGNED : (tensor<4x8xi32>, tensor<4x8xi32>) -> tensor<4x8xi1>
    %48 = stablehlo.broadcast_in_dim %44, dims = [0, 1] : (tensor<4x1xf32>) -> tensor<4x8xf32>
    %49 = stablehlo.add %45, %48 : tensor<4x8xf32>
    %50 = stablehlo.select %47, %49, %45 : tensor<4x8xi1>, tensor<4x8xf32>
    %51 = stablehlo.negate %50 : tensor<4x8xf32>
    %52 = stablehlo.reduce(%51 init: %cst_8) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
    %53 = stablehlo.reshape %52 : (tensor<4xf32>) -> tensor<4x1xf32>
    %54 = stablehlo.divide %53, %8 : tensor<4x1xf32>
    %55 = stablehlo.reshape %54 : (tensor<4x1xf32>) -> tensor<4xf32>
    %56 = stablehlo.broadcast_in_dim %cst_8, dims = [] : (tensor<f32>) -> tensor<4xf32>
    %57 = stablehlo.add %55, %56 : tensor<4xf32>
    %58 = stablehlo.broadcast_in_dim %57, dims = [0] : (tensor<4xf32>) -> tensor<4x8xf32>
    %59 = stablehlo.multiply %58, %6 : tensor<4x8xf32>
    %60 = stablehlo.add %50, %59 : tensor<4x8xf32>
    return %41, %60 : tensor<f32>, tensor<4x8xf32>
  }
}
