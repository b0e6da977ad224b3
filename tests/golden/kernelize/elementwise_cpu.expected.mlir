module {
  func.func @main(%arg0: tensor<8x16xf32>, %arg1: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %0 = call @hlofuse_k0_main(%arg0, %arg1) : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
  func.func private @hlofuse_region_0(%arg0: tensor<8x16xf32>, %arg1: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {hlofuse.kind = "elementwise", hlofuse.region = 0 : i64} {
    %0 = stablehlo.multiply %arg0, %arg1 : tensor<8x16xf32>
    %1 = stablehlo.tanh %0 : tensor<8x16xf32>
    %2 = stablehlo.add %1, %arg0 : tensor<8x16xf32>
    return %2 : tensor<8x16xf32>
  }
  func.func private @hlofuse_k0_main(%arg0: tensor<8x16xf32>, %arg1: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {hlofuse.kernel = "elementwise|0|hlofuse_elementwise_45ede2e728|8x16 blocks, grid 1x1"} {
    %c = stablehlo.constant dense<true> : tensor<i1>
    %c_0 = stablehlo.constant dense<16> : tensor<i32>
    %c_1 = stablehlo.constant dense<8> : tensor<i32>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %c_3 = stablehlo.constant dense<1> : tensor<i32>
    %cst = stablehlo.constant dense<0x7FC00000> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<8x16xf32>
    %1 = stablehlo.multiply %c_3, %c_3 : tensor<i32>
    %2:7 = stablehlo.while(%iterArg = %1, %iterArg_4 = %c_2, %iterArg_5 = %c_2, %iterArg_6 = %c_2, %iterArg_7 = %arg0, %iterArg_8 = %arg1, %iterArg_9 = %0) : tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>
    cond {
      %3 = stablehlo.convert %iterArg : tensor<i32>
      %4 = stablehlo.compare LT, %iterArg_4, %3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %4 : tensor<i1>
    } do {
      %3 = stablehlo.multiply %c_1, %iterArg_5 : tensor<i32>
      %4 = stablehlo.multiply %c_0, %iterArg_6 : tensor<i32>
      %5 = stablehlo.compare LT, %3, %c_2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %6 = stablehlo.add %3, %c_1 : tensor<i32>
      %7 = stablehlo.select %5, %6, %3 : tensor<i1>, tensor<i32>
      %8 = stablehlo.compare LT, %4, %c_2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %9 = stablehlo.add %4, %c_0 : tensor<i32>
      %10 = stablehlo.select %8, %9, %4 : tensor<i1>, tensor<i32>
      %11 = stablehlo.dynamic_slice %iterArg_7, %7, %10, sizes = [8, 16] : (tensor<8x16xf32>, tensor<i32>, tensor<i32>) -> tensor<8x16xf32>
      %12 = stablehlo.dynamic_slice %iterArg_8, %7, %10, sizes = [8, 16] : (tensor<8x16xf32>, tensor<i32>, tensor<i32>) -> tensor<8x16xf32>
      %13 = stablehlo.multiply %11, %12 : tensor<8x16xf32>
      %14 = stablehlo.tanh %13 : tensor<8x16xf32>
      %15 = stablehlo.add %14, %11 : tensor<8x16xf32>
      %16 = stablehlo.dynamic_update_slice %iterArg_7, %11, %7, %10 : (tensor<8x16xf32>, tensor<8x16xf32>, tensor<i32>, tensor<i32>) -> tensor<8x16xf32>
      %17 = stablehlo.dynamic_update_slice %iterArg_8, %12, %7, %10 : (tensor<8x16xf32>, tensor<8x16xf32>, tensor<i32>, tensor<i32>) -> tensor<8x16xf32>
      %18 = stablehlo.dynamic_update_slice %iterArg_9, %15, %7, %10 : (tensor<8x16xf32>, tensor<8x16xf32>, tensor<i32>, tensor<i32>) -> tensor<8x16xf32>
      %19 = stablehlo.add %iterArg_4, %c_3 : tensor<i32>
      %20 = stablehlo.add %iterArg_6, %c_3 : tensor<i32>
      %21 = func.call @hlofuse_k0__where(%c, %20, %iterArg_6) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %22 = stablehlo.compare EQ, %21, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %23 = func.call @hlofuse_k0__where_0(%22, %c_2, %21) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %24 = stablehlo.add %iterArg_5, %c_3 : tensor<i32>
      %25 = func.call @hlofuse_k0__where(%22, %24, %iterArg_5) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %26 = stablehlo.compare EQ, %25, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %27 = func.call @hlofuse_k0__where_0(%26, %c_2, %25) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      stablehlo.return %iterArg, %19, %27, %23, %16, %17, %18 : tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>
    }
    return %2#6 : tensor<8x16xf32>
  }
  func.func private @hlofuse_k0__where(%arg0: tensor<i1>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<i1>, tensor<i32>
    return %0 : tensor<i32>
  }
  func.func private @hlofuse_k0__where_0(%arg0: tensor<i1>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %1 = stablehlo.select %arg0, %0, %arg2 : tensor<i1>, tensor<i32>
    return %1 : tensor<i32>
  }
}
