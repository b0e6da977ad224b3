module {
  func.func public @main(%arg0: tensor<1x8x8xf32>, %arg1: tensor<2x3x8x8xf32>) -> (tensor<f32> {jax.result_info = "result[0]"}, tensor<1x8x8xf32> {jax.result_info = "result[1][0]"}, tensor<2x3x8x8xf32> {jax.result_info = "result[1][1]"}) {
    %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %c = stablehlo.constant dense<1> : tensor<i32>
    %cst_0 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %cst_1 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %cst_2 = stablehlo.constant dense<5.000000e-01> : tensor<f32>
    %c_3 = stablehlo.constant dense<2> : tensor<i32>
    %cst_4 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %cst_5 = stablehlo.constant dense<-2.38197633E+38> : tensor<f32>
    %c_6 = stablehlo.constant dense<false> : tensor<i1>
    %c_7 = stablehlo.constant dense<0> : tensor<i32>
    %c_8 = stablehlo.constant dense<true> : tensor<i1>
    %0 = stablehlo.broadcast_in_dim %c_8, dims = [] : (tensor<i1>) -> tensor<1x2x8x8xi1>
    %1 = stablehlo.broadcast_in_dim %c_8, dims = [] : (tensor<i1>) -> tensor<8x8xi1>
    %2 = stablehlo.iota dim = 0 : tensor<8x8xi32>
    %3 = stablehlo.broadcast_in_dim %c_7, dims = [] : (tensor<i32>) -> tensor<8x8xi32>
    %4 = stablehlo.add %2, %3 : tensor<8x8xi32>
    %5 = stablehlo.iota dim = 1 : tensor<8x8xi32>
    %6 = stablehlo.compare GE, %4, %5, SIGNED : (tensor<8x8xi32>, tensor<8x8xi32>) -> tensor<8x8xi1>
    %7 = stablehlo.broadcast_in_dim %c_6, dims = [] : (tensor<i1>) -> tensor<8x8xi1>
    %8 = stablehlo.select %6, %1, %7 : tensor<8x8xi1>, tensor<8x8xi1>
    %9 = stablehlo.broadcast_in_dim %8, dims = [2, 3] : (tensor<8x8xi1>) -> tensor<1x1x8x8xi1>
    %10 = stablehlo.broadcast_in_dim %9, dims = [0, 1, 2, 3] : (tensor<1x1x8x8xi1>) -> tensor<1x2x8x8xi1>
    %11 = stablehlo.and %0, %10 : tensor<1x2x8x8xi1>
    %12 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<1x2x8x8xf32>
    %13 = stablehlo.broadcast_in_dim %11, dims = [1, 2, 3, 4] : (tensor<1x2x8x8xi1>) -> tensor<1x1x2x8x8xi1>
    %14 = stablehlo.broadcast_in_dim %12, dims = [1, 2, 3, 4] : (tensor<1x2x8x8xf32>) -> tensor<1x1x2x8x8xf32>
    %15 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2x8x8xf32>
    %16 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2x1x8x8xf32>
    %17 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2x1x8x2x4xf32>
    %18 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2x1x8x2x1x4xf32>
    %19 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2x1x1x2x8x8xf32>
    %20 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2x1x1x2x8x1xf32>
    %21:16 = stablehlo.while(%iterArg = %arg1, %iterArg_9 = %13, %iterArg_10 = %14, %iterArg_11 = %c_7, %iterArg_12 = %arg0, %iterArg_13 = %15, %iterArg_14 = %16, %iterArg_15 = %15, %iterArg_16 = %15, %iterArg_17 = %17, %iterArg_18 = %18, %iterArg_19 = %19, %iterArg_20 = %20, %iterArg_21 = %20, %iterArg_22 = %19, %iterArg_23 = %17) : tensor<2x3x8x8xf32>, tensor<1x1x2x8x8xi1>, tensor<1x1x2x8x8xf32>, tensor<i32>, tensor<1x8x8xf32>, tensor<2x8x8xf32>, tensor<2x1x8x8xf32>, tensor<2x8x8xf32>, tensor<2x8x8xf32>, tensor<2x1x8x2x4xf32>, tensor<2x1x8x2x1x4xf32>, tensor<2x1x1x2x8x8xf32>, tensor<2x1x1x2x8x1xf32>, tensor<2x1x1x2x8x1xf32>, tensor<2x1x1x2x8x8xf32>, tensor<2x1x8x2x4xf32>
    cond {
      %30 = stablehlo.compare LT, %iterArg_11, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %30 : tensor<i1>
    } do {
      %30 = stablehlo.dynamic_slice %iterArg, %iterArg_11, %c_7, %c_7, %c_7, sizes = [1, 3, 8, 8] : (tensor<2x3x8x8xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x3x8x8xf32>
      %31 = stablehlo.reshape %30 : (tensor<1x3x8x8xf32>) -> tensor<3x8x8xf32>
      %32 = stablehlo.slice %31 [0:1, 0:8, 0:8] : (tensor<3x8x8xf32>) -> tensor<1x8x8xf32>
      %33 = stablehlo.reshape %32 : (tensor<1x8x8xf32>) -> tensor<8x8xf32>
      %34 = stablehlo.dot_general %iterArg_12, %33, contracting_dims = [2] x [0], precision = [DEFAULT, DEFAULT] : (tensor<1x8x8xf32>, tensor<8x8xf32>) -> tensor<1x8x8xf32>
      %35 = stablehlo.slice %31 [1:2, 0:8, 0:8] : (tensor<3x8x8xf32>) -> tensor<1x8x8xf32>
      %36 = stablehlo.reshape %35 : (tensor<1x8x8xf32>) -> tensor<8x8xf32>
      %37 = stablehlo.dot_general %iterArg_12, %36, contracting_dims = [2] x [0], precision = [DEFAULT, DEFAULT] : (tensor<1x8x8xf32>, tensor<8x8xf32>) -> tensor<1x8x8xf32>
      %38 = stablehlo.slice %31 [2:3, 0:8, 0:8] : (tensor<3x8x8xf32>) -> tensor<1x8x8xf32>
      %39 = stablehlo.reshape %38 : (tensor<1x8x8xf32>) -> tensor<8x8xf32>
      %40 = stablehlo.dot_general %iterArg_12, %39, contracting_dims = [2] x [0], precision = [DEFAULT, DEFAULT] : (tensor<1x8x8xf32>, tensor<8x8xf32>) -> tensor<1x8x8xf32>
      %41 = stablehlo.reshape %34 : (tensor<1x8x8xf32>) -> tensor<1x8x2x4xf32>
      %42 = stablehlo.reshape %37 : (tensor<1x8x8xf32>) -> tensor<1x8x2x4xf32>
      %43 = stablehlo.reshape %40 : (tensor<1x8x8xf32>) -> tensor<1x8x2x4xf32>
      %44 = stablehlo.reshape %41 : (tensor<1x8x2x4xf32>) -> tensor<1x8x2x1x4xf32>
      %45 = stablehlo.dot_general %44, %42, batching_dims = [0, 2] x [0, 2], contracting_dims = [4] x [3], precision = [DEFAULT, DEFAULT] : (tensor<1x8x2x1x4xf32>, tensor<1x8x2x4xf32>) -> tensor<1x2x8x1x8xf32>
      %46 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<1x2x8x1x8xf32>
      %47 = stablehlo.multiply %45, %46 : tensor<1x2x8x1x8xf32>
      %48 = stablehlo.transpose %47, dims = [3, 0, 1, 2, 4] : (tensor<1x2x8x1x8xf32>) -> tensor<1x1x2x8x8xf32>
      %49 = stablehlo.select %iterArg_9, %48, %iterArg_10 : tensor<1x1x2x8x8xi1>, tensor<1x1x2x8x8xf32>
      %50 = stablehlo.reduce(%49 init: %cst_1) applies stablehlo.maximum across dimensions = [4] : (tensor<1x1x2x8x8xf32>, tensor<f32>) -> tensor<1x1x2x8xf32>
      %51 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<1x1x2x8xf32>
      %52 = stablehlo.maximum %51, %50 : tensor<1x1x2x8xf32>
      %53 = stablehlo.broadcast_in_dim %52, dims = [0, 1, 2, 3] : (tensor<1x1x2x8xf32>) -> tensor<1x1x2x8x1xf32>
      %54 = stablehlo.broadcast_in_dim %53, dims = [0, 1, 2, 3, 4] : (tensor<1x1x2x8x1xf32>) -> tensor<1x1x2x8x8xf32>
      %55 = stablehlo.subtract %49, %54 : tensor<1x1x2x8x8xf32>
      %56 = stablehlo.exponential %55 : tensor<1x1x2x8x8xf32>
      %57 = stablehlo.reduce(%56 init: %cst_4) applies stablehlo.add across dimensions = [4] : (tensor<1x1x2x8x8xf32>, tensor<f32>) -> tensor<1x1x2x8xf32>
      %58 = stablehlo.broadcast_in_dim %57, dims = [0, 1, 2, 3] : (tensor<1x1x2x8xf32>) -> tensor<1x1x2x8x1xf32>
      %59 = stablehlo.broadcast_in_dim %58, dims = [0, 1, 2, 3, 4] : (tensor<1x1x2x8x1xf32>) -> tensor<1x1x2x8x8xf32>
      %60 = stablehlo.divide %56, %59 : tensor<1x1x2x8x8xf32>
      %61 = stablehlo.dot_general %43, %60, batching_dims = [0, 2] x [1, 2], contracting_dims = [1] x [4], precision = [DEFAULT, DEFAULT] : (tensor<1x8x2x4xf32>, tensor<1x1x2x8x8xf32>) -> tensor<1x2x4x1x8xf32>
      %62 = stablehlo.transpose %61, dims = [3, 0, 4, 1, 2] : (tensor<1x2x4x1x8xf32>) -> tensor<1x1x8x2x4xf32>
      %63 = stablehlo.transpose %62, dims = [1, 2, 3, 0, 4] : (tensor<1x1x8x2x4xf32>) -> tensor<1x8x2x1x4xf32>
      %64 = stablehlo.reshape %63 : (tensor<1x8x2x1x4xf32>) -> tensor<1x8x2x4xf32>
      %65 = stablehlo.reshape %64 : (tensor<1x8x2x4xf32>) -> tensor<1x8x8xf32>
      %66 = stablehlo.add %iterArg_12, %65 : tensor<1x8x8xf32>
      %67 = stablehlo.broadcast_in_dim %33, dims = [1, 2] : (tensor<8x8xf32>) -> tensor<1x8x8xf32>
      %68 = stablehlo.dynamic_update_slice %iterArg_13, %67, %iterArg_11, %c_7, %c_7 : (tensor<2x8x8xf32>, tensor<1x8x8xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<2x8x8xf32>
      %69 = stablehlo.broadcast_in_dim %iterArg_12, dims = [1, 2, 3] : (tensor<1x8x8xf32>) -> tensor<1x1x8x8xf32>
      %70 = stablehlo.dynamic_update_slice %iterArg_14, %69, %iterArg_11, %c_7, %c_7, %c_7 : (tensor<2x1x8x8xf32>, tensor<1x1x8x8xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<2x1x8x8xf32>
      %71 = stablehlo.broadcast_in_dim %36, dims = [1, 2] : (tensor<8x8xf32>) -> tensor<1x8x8xf32>
      %72 = stablehlo.dynamic_update_slice %iterArg_15, %71, %iterArg_11, %c_7, %c_7 : (tensor<2x8x8xf32>, tensor<1x8x8xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<2x8x8xf32>
      %73 = stablehlo.broadcast_in_dim %39, dims = [1, 2] : (tensor<8x8xf32>) -> tensor<1x8x8xf32>
      %74 = stablehlo.dynamic_update_slice %iterArg_16, %73, %iterArg_11, %c_7, %c_7 : (tensor<2x8x8xf32>, tensor<1x8x8xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<2x8x8xf32>
      %75 = stablehlo.broadcast_in_dim %42, dims = [1, 2, 3, 4] : (tensor<1x8x2x4xf32>) -> tensor<1x1x8x2x4xf32>
      %76 = stablehlo.dynamic_update_slice %iterArg_17, %75, %iterArg_11, %c_7, %c_7, %c_7, %c_7 : (tensor<2x1x8x2x4xf32>, tensor<1x1x8x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<2x1x8x2x4xf32>
      %77 = stablehlo.broadcast_in_dim %44, dims = [1, 2, 3, 4, 5] : (tensor<1x8x2x1x4xf32>) -> tensor<1x1x8x2x1x4xf32>
      %78 = stablehlo.dynamic_update_slice %iterArg_18, %77, %iterArg_11, %c_7, %c_7, %c_7, %c_7, %c_7 : (tensor<2x1x8x2x1x4xf32>, tensor<1x1x8x2x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<2x1x8x2x1x4xf32>
      %79 = stablehlo.broadcast_in_dim %43, dims = [1, 2, 3, 4] : (tensor<1x8x2x4xf32>) -> tensor<1x1x8x2x4xf32>
      %80 = stablehlo.dynamic_update_slice %iterArg_23, %79, %iterArg_11, %c_7, %c_7, %c_7, %c_7 : (tensor<2x1x8x2x4xf32>, tensor<1x1x8x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<2x1x8x2x4xf32>
      %81 = stablehlo.add %iterArg_11, %c : tensor<i32>
      stablehlo.return %iterArg, %iterArg_9, %iterArg_10, %81, %66, %68, %70, %72, %74, %76, %78, %iterArg_19, %iterArg_20, %iterArg_21, %iterArg_22, %80 : tensor<2x3x8x8xf32>, tensor<1x1x2x8x8xi1>, tensor<1x1x2x8x8xf32>, tensor<i32>, tensor<1x8x8xf32>, tensor<2x8x8xf32>, tensor<2x1x8x8xf32>, tensor<2x8x8xf32>, tensor<2x8x8xf32>, tensor<2x1x8x2x4xf32>, tensor<2x1x8x2x1x4xf32>, tensor<2x1x1x2x8x8xf32>, tensor<2x1x1x2x8x1xf32>, tensor<2x1x1x2x8x1xf32>, tensor<2x1x1x2x8x8xf32>, tensor<2x1x8x2x4xf32>
    }
    %22 = stablehlo.multiply %21#4, %21#4 : tensor<1x8x8xf32>
    %23 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<1x8x8xf32>
    %24 = stablehlo.multiply %23, %21#4 : tensor<1x8x8xf32>
    %25 = stablehlo.reduce(%22 init: %cst_4) applies stablehlo.add across dimensions = [0, 1, 2] : (tensor<1x8x8xf32>, tensor<f32>) -> tensor<f32>
    %26 = stablehlo.broadcast_in_dim %cst_0, dims = [] : (tensor<f32>) -> tensor<1x8x8xf32>
    %27 = stablehlo.multiply %26, %24 : tensor<1x8x8xf32>
    %28 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<2x3x8x8xf32>
    %29:15 = stablehlo.while(%iterArg = %21#5, %iterArg_9 = %21#6, %iterArg_10 = %21#7, %iterArg_11 = %21#8, %iterArg_12 = %21#9, %iterArg_13 = %21#10, %iterArg_14 = %21#11, %iterArg_15 = %21#12, %iterArg_16 = %21#13, %iterArg_17 = %21#14, %iterArg_18 = %21#15, %iterArg_19 = %13, %iterArg_20 = %c_7, %iterArg_21 = %27, %iterArg_22 = %28) : tensor<2x8x8xf32>, tensor<2x1x8x8xf32>, tensor<2x8x8xf32>, tensor<2x8x8xf32>, tensor<2x1x8x2x4xf32>, tensor<2x1x8x2x1x4xf32>, tensor<2x1x1x2x8x8xf32>, tensor<2x1x1x2x8x1xf32>, tensor<2x1x1x2x8x1xf32>, tensor<2x1x1x2x8x8xf32>, tensor<2x1x8x2x4xf32>, tensor<1x1x2x8x8xi1>, tensor<i32>, tensor<1x8x8xf32>, tensor<2x3x8x8xf32>
    cond {
      %30 = stablehlo.compare LT, %iterArg_20, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %30 : tensor<i1>
    } do {
      %30 = stablehlo.subtract %c_3, %iterArg_20 : tensor<i32>
      %31 = stablehlo.subtract %30, %c : tensor<i32>
      %32 = stablehlo.dynamic_slice %iterArg, %31, %c_7, %c_7, sizes = [1, 8, 8] : (tensor<2x8x8xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x8x8xf32>
      %33 = stablehlo.reshape %32 : (tensor<1x8x8xf32>) -> tensor<8x8xf32>
      %34 = stablehlo.dynamic_slice %iterArg_9, %31, %c_7, %c_7, %c_7, sizes = [1, 1, 8, 8] : (tensor<2x1x8x8xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x8x8xf32>
      %35 = stablehlo.reshape %34 : (tensor<1x1x8x8xf32>) -> tensor<1x8x8xf32>
      %36 = stablehlo.dynamic_slice %iterArg_10, %31, %c_7, %c_7, sizes = [1, 8, 8] : (tensor<2x8x8xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x8x8xf32>
      %37 = stablehlo.reshape %36 : (tensor<1x8x8xf32>) -> tensor<8x8xf32>
      %38 = stablehlo.dynamic_slice %iterArg_11, %31, %c_7, %c_7, sizes = [1, 8, 8] : (tensor<2x8x8xf32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x8x8xf32>
      %39 = stablehlo.reshape %38 : (tensor<1x8x8xf32>) -> tensor<8x8xf32>
      %40 = stablehlo.dynamic_slice %iterArg_12, %31, %c_7, %c_7, %c_7, %c_7, sizes = [1, 1, 8, 2, 4] : (tensor<2x1x8x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x8x2x4xf32>
      %41 = stablehlo.reshape %40 : (tensor<1x1x8x2x4xf32>) -> tensor<1x8x2x4xf32>
      %42 = stablehlo.dynamic_slice %iterArg_13, %31, %c_7, %c_7, %c_7, %c_7, %c_7, sizes = [1, 1, 8, 2, 1, 4] : (tensor<2x1x8x2x1x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x8x2x1x4xf32>
      %43 = stablehlo.reshape %42 : (tensor<1x1x8x2x1x4xf32>) -> tensor<1x8x2x1x4xf32>
      %cst_23 = stablehlo.constant dense<1.000000e+00> : tensor<f32>
      %44 = stablehlo.broadcast_in_dim %cst_23, dims = [] : (tensor<f32>) -> tensor<1x1x2x8x1xf32>
      %45 = stablehlo.dot_general %43, %41, batching_dims = [0, 2] x [0, 2], contracting_dims = [4] x [3], precision = [DEFAULT, DEFAULT] : (tensor<1x8x2x1x4xf32>, tensor<1x8x2x4xf32>) -> tensor<1x2x8x1x8xf32>
      %46 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<1x2x8x1x8xf32>
      %47 = stablehlo.multiply %45, %46 : tensor<1x2x8x1x8xf32>
      %48 = stablehlo.transpose %47, dims = [3, 0, 1, 2, 4] : (tensor<1x2x8x1x8xf32>) -> tensor<1x1x2x8x8xf32>
      %49 = stablehlo.select %iterArg_19, %48, %14 : tensor<1x1x2x8x8xi1>, tensor<1x1x2x8x8xf32>
      %50 = stablehlo.reduce(%49 init: %cst_1) applies stablehlo.maximum across dimensions = [4] : (tensor<1x1x2x8x8xf32>, tensor<f32>) -> tensor<1x1x2x8xf32>
      %51 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<1x1x2x8xf32>
      %52 = stablehlo.maximum %51, %50 : tensor<1x1x2x8xf32>
      %53 = stablehlo.broadcast_in_dim %52, dims = [0, 1, 2, 3] : (tensor<1x1x2x8xf32>) -> tensor<1x1x2x8x1xf32>
      %54 = stablehlo.broadcast_in_dim %53, dims = [0, 1, 2, 3, 4] : (tensor<1x1x2x8x1xf32>) -> tensor<1x1x2x8x8xf32>
      %55 = stablehlo.subtract %49, %54 : tensor<1x1x2x8x8xf32>
      %56 = stablehlo.exponential %55 : tensor<1x1x2x8x8xf32>
      %57 = stablehlo.reduce(%56 init: %cst_4) applies stablehlo.add across dimensions = [4] : (tensor<1x1x2x8x8xf32>, tensor<f32>) -> tensor<1x1x2x8xf32>
      %58 = stablehlo.broadcast_in_dim %57, dims = [0, 1, 2, 3] : (tensor<1x1x2x8xf32>) -> tensor<1x1x2x8x1xf32>
      %59 = stablehlo.broadcast_in_dim %58, dims = [0, 1, 2, 3, 4] : (tensor<1x1x2x8x1xf32>) -> tensor<1x1x2x8x8xf32>
      %60 = stablehlo.divide %56, %59 : tensor<1x1x2x8x8xf32>
      %61 = stablehlo.multiply %58, %58 : tensor<1x1x2x8x1xf32>
      %62 = stablehlo.divide %44, %61 : tensor<1x1x2x8x1xf32>
      %63 = stablehlo.broadcast_in_dim %56, dims = [1, 2, 3, 4, 5] : (tensor<1x1x2x8x8xf32>) -> tensor<1x1x1x2x8x8xf32>
      %64 = stablehlo.broadcast_in_dim %58, dims = [1, 2, 3, 4, 5] : (tensor<1x1x2x8x1xf32>) -> tensor<1x1x1x2x8x1xf32>
      %65 = stablehlo.broadcast_in_dim %60, dims = [1, 2, 3, 4, 5] : (tensor<1x1x2x8x8xf32>) -> tensor<1x1x1x2x8x8xf32>
      %66 = stablehlo.broadcast_in_dim %62, dims = [1, 2, 3, 4, 5] : (tensor<1x1x2x8x1xf32>) -> tensor<1x1x1x2x8x1xf32>
      %67 = stablehlo.reshape %63 : (tensor<1x1x1x2x8x8xf32>) -> tensor<1x1x2x8x8xf32>
      %68 = stablehlo.reshape %64 : (tensor<1x1x1x2x8x1xf32>) -> tensor<1x1x2x8x1xf32>
      %69 = stablehlo.reshape %66 : (tensor<1x1x1x2x8x1xf32>) -> tensor<1x1x2x8x1xf32>
      %70 = stablehlo.reshape %65 : (tensor<1x1x1x2x8x8xf32>) -> tensor<1x1x2x8x8xf32>
      %71 = stablehlo.dynamic_slice %iterArg_18, %31, %c_7, %c_7, %c_7, %c_7, sizes = [1, 1, 8, 2, 4] : (tensor<2x1x8x2x4xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<1x1x8x2x4xf32>
      %72 = stablehlo.reshape %71 : (tensor<1x1x8x2x4xf32>) -> tensor<1x8x2x4xf32>
      %73 = stablehlo.reshape %iterArg_21 : (tensor<1x8x8xf32>) -> tensor<1x8x2x4xf32>
      %74 = stablehlo.reshape %73 : (tensor<1x8x2x4xf32>) -> tensor<1x8x2x1x4xf32>
      %75 = stablehlo.transpose %74, dims = [3, 0, 1, 2, 4] : (tensor<1x8x2x1x4xf32>) -> tensor<1x1x8x2x4xf32>
      %76 = stablehlo.transpose %75, dims = [1, 3, 4, 0, 2] : (tensor<1x1x8x2x4xf32>) -> tensor<1x2x4x1x8xf32>
      %77 = stablehlo.dot_general %76, %72, batching_dims = [0, 1] x [0, 2], contracting_dims = [2] x [3], precision = [DEFAULT, DEFAULT] : (tensor<1x2x4x1x8xf32>, tensor<1x8x2x4xf32>) -> tensor<1x2x1x8x8xf32>
      %78 = stablehlo.transpose %77, dims = [2, 0, 1, 3, 4] : (tensor<1x2x1x8x8xf32>) -> tensor<1x1x2x8x8xf32>
      %79 = stablehlo.dot_general %76, %70, batching_dims = [0, 1] x [1, 2], contracting_dims = [3, 4] x [0, 3], precision = [DEFAULT, DEFAULT] : (tensor<1x2x4x1x8xf32>, tensor<1x1x2x8x8xf32>) -> tensor<1x2x4x8xf32>
      %80 = stablehlo.transpose %79, dims = [0, 3, 1, 2] : (tensor<1x2x4x8xf32>) -> tensor<1x8x2x4xf32>
      %81 = stablehlo.broadcast_in_dim %69, dims = [0, 1, 2, 3, 4] : (tensor<1x1x2x8x1xf32>) -> tensor<1x1x2x8x8xf32>
      %82 = stablehlo.multiply %78, %81 : tensor<1x1x2x8x8xf32>
      %83 = stablehlo.multiply %82, %67 : tensor<1x1x2x8x8xf32>
      %84 = stablehlo.reduce(%83 init: %cst_4) applies stablehlo.add across dimensions = [4] : (tensor<1x1x2x8x8xf32>, tensor<f32>) -> tensor<1x1x2x8xf32>
      %85 = stablehlo.reshape %84 : (tensor<1x1x2x8xf32>) -> tensor<1x1x2x8x1xf32>
      %86 = stablehlo.negate %85 : tensor<1x1x2x8x1xf32>
      %87 = stablehlo.broadcast_in_dim %68, dims = [0, 1, 2, 3, 4] : (tensor<1x1x2x8x1xf32>) -> tensor<1x1x2x8x8xf32>
      %88 = stablehlo.divide %78, %87 : tensor<1x1x2x8x8xf32>
      %89 = stablehlo.reduce(%86 init: %cst_4) applies stablehlo.add across dimensions = [0, 1, 4] : (tensor<1x1x2x8x1xf32>, tensor<f32>) -> tensor<2x8xf32>
      %90 = stablehlo.broadcast_in_dim %89, dims = [2, 3] : (tensor<2x8xf32>) -> tensor<1x1x2x8xf32>
      %91 = stablehlo.broadcast_in_dim %90, dims = [0, 1, 2, 3] : (tensor<1x1x2x8xf32>) -> tensor<1x1x2x8x8xf32>
      %92 = stablehlo.add %88, %91 : tensor<1x1x2x8x8xf32>
      %93 = stablehlo.multiply %92, %67 : tensor<1x1x2x8x8xf32>
      %94 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<1x1x2x8x8xf32>
      %95 = stablehlo.select %iterArg_19, %93, %94 : tensor<1x1x2x8x8xi1>, tensor<1x1x2x8x8xf32>
      %96 = stablehlo.transpose %95, dims = [1, 2, 3, 0, 4] : (tensor<1x1x2x8x8xf32>) -> tensor<1x2x8x1x8xf32>
      %97 = stablehlo.multiply %96, %46 : tensor<1x2x8x1x8xf32>
      %98 = stablehlo.dot_general %97, %43, batching_dims = [0, 1] x [0, 2], contracting_dims = [2, 3] x [1, 3], precision = [DEFAULT, DEFAULT] : (tensor<1x2x8x1x8xf32>, tensor<1x8x2x1x4xf32>) -> tensor<1x2x8x4xf32>
      %99 = stablehlo.transpose %98, dims = [0, 2, 1, 3] : (tensor<1x2x8x4xf32>) -> tensor<1x8x2x4xf32>
      %100 = stablehlo.dot_general %97, %41, batching_dims = [0, 1] x [0, 2], contracting_dims = [4] x [1], precision = [DEFAULT, DEFAULT] : (tensor<1x2x8x1x8xf32>, tensor<1x8x2x4xf32>) -> tensor<1x2x8x1x4xf32>
      %101 = stablehlo.transpose %100, dims = [0, 2, 1, 3, 4] : (tensor<1x2x8x1x4xf32>) -> tensor<1x8x2x1x4xf32>
      %102 = stablehlo.reshape %101 : (tensor<1x8x2x1x4xf32>) -> tensor<1x8x2x4xf32>
      %103 = stablehlo.reshape %80 : (tensor<1x8x2x4xf32>) -> tensor<1x8x8xf32>
      %104 = stablehlo.reshape %99 : (tensor<1x8x2x4xf32>) -> tensor<1x8x8xf32>
      %105 = stablehlo.reshape %102 : (tensor<1x8x2x4xf32>) -> tensor<1x8x8xf32>
      %106 = stablehlo.dot_general %103, %35, contracting_dims = [0, 1] x [0, 1], precision = [DEFAULT, DEFAULT] : (tensor<1x8x8xf32>, tensor<1x8x8xf32>) -> tensor<8x8xf32>
      %107 = stablehlo.transpose %106, dims = [1, 0] : (tensor<8x8xf32>) -> tensor<8x8xf32>
      %108 = stablehlo.dot_general %103, %39, contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<1x8x8xf32>, tensor<8x8xf32>) -> tensor<1x8x8xf32>
      %109 = stablehlo.add %iterArg_21, %108 : tensor<1x8x8xf32>
      %110 = stablehlo.broadcast_in_dim %107, dims = [1, 2] : (tensor<8x8xf32>) -> tensor<1x8x8xf32>
      %111 = stablehlo.pad %110, %cst_4, low = [2, 0, 0], high = [0, 0, 0], interior = [0, 0, 0] : (tensor<1x8x8xf32>, tensor<f32>) -> tensor<3x8x8xf32>
      %112 = stablehlo.dot_general %104, %35, contracting_dims = [0, 1] x [0, 1], precision = [DEFAULT, DEFAULT] : (tensor<1x8x8xf32>, tensor<1x8x8xf32>) -> tensor<8x8xf32>
      %113 = stablehlo.transpose %112, dims = [1, 0] : (tensor<8x8xf32>) -> tensor<8x8xf32>
      %114 = stablehlo.dot_general %104, %37, contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<1x8x8xf32>, tensor<8x8xf32>) -> tensor<1x8x8xf32>
      %115 = stablehlo.add %109, %114 : tensor<1x8x8xf32>
      %116 = stablehlo.broadcast_in_dim %113, dims = [1, 2] : (tensor<8x8xf32>) -> tensor<1x8x8xf32>
      %117 = stablehlo.pad %116, %cst_4, low = [1, 0, 0], high = [1, 0, 0], interior = [0, 0, 0] : (tensor<1x8x8xf32>, tensor<f32>) -> tensor<3x8x8xf32>
      %118 = stablehlo.add %111, %117 : tensor<3x8x8xf32>
      %119 = stablehlo.dot_general %105, %35, contracting_dims = [0, 1] x [0, 1], precision = [DEFAULT, DEFAULT] : (tensor<1x8x8xf32>, tensor<1x8x8xf32>) -> tensor<8x8xf32>
      %120 = stablehlo.transpose %119, dims = [1, 0] : (tensor<8x8xf32>) -> tensor<8x8xf32>
      %121 = stablehlo.dot_general %105, %33, contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<1x8x8xf32>, tensor<8x8xf32>) -> tensor<1x8x8xf32>
      %122 = stablehlo.add %115, %121 : tensor<1x8x8xf32>
      %123 = stablehlo.broadcast_in_dim %120, dims = [1, 2] : (tensor<8x8xf32>) -> tensor<1x8x8xf32>
      %124 = stablehlo.pad %123, %cst_4, low = [0, 0, 0], high = [2, 0, 0], interior = [0, 0, 0] : (tensor<1x8x8xf32>, tensor<f32>) -> tensor<3x8x8xf32>
      %125 = stablehlo.add %118, %124 : tensor<3x8x8xf32>
      %126 = stablehlo.broadcast_in_dim %125, dims = [1, 2, 3] : (tensor<3x8x8xf32>) -> tensor<1x3x8x8xf32>
      %127 = stablehlo.dynamic_update_slice %iterArg_22, %126, %31, %c_7, %c_7, %c_7 : (tensor<2x3x8x8xf32>, tensor<1x3x8x8xf32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<2x3x8x8xf32>
      %128 = stablehlo.add %iterArg_20, %c : tensor<i32>
      stablehlo.return %iterArg, %iterArg_9, %iterArg_10, %iterArg_11, %iterArg_12, %iterArg_13, %iterArg_14, %iterArg_15, %iterArg_16, %iterArg_17, %iterArg_18, %iterArg_19, %128, %122, %127 : tensor<2x8x8xf32>, tensor<2x1x8x8xf32>, tensor<2x8x8xf32>, tensor<2x8x8xf32>, tensor<2x1x8x2x4xf32>, tensor<2x1x8x2x1x4xf32>, tensor<2x1x1x2x8x8xf32>, tensor<2x1x1x2x8x1xf32>, tensor<2x1x1x2x8x1xf32>, tensor<2x1x1x2x8x8xf32>, tensor<2x1x8x2x4xf32>, tensor<1x1x2x8x8xi1>, tensor<i32>, tensor<1x8x8xf32>, tensor<2x3x8x8xf32>
    }
    return %25, %29#13, %29#14 : tensor<f32>, tensor<1x8x8xf32>, tensor<2x3x8x8xf32>
  }
}
