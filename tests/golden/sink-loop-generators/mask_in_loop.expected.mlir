module {
  func.func @main(%arg0: tensor<64x64xf32>, %arg1: tensor<64x64xf32>) -> tensor<64x64xf32> {
    %0 = stablehlo.iota dim = 0 : tensor<64x64xi32>
    %1 = stablehlo.iota dim = 1 : tensor<64x64xi32>
    %2 = stablehlo.compare GE, %0, %1, SIGNED : (tensor<64x64xi32>, tensor<64x64xi32>) -> tensor<64x64xi1>
    %cst = stablehlo.constant dense<-1.000000e+30> : tensor<f32>
    %3 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<64x64xf32>
    %4 = stablehlo.iota dim = 0 : tensor<4x4xi32>
    %5 = stablehlo.iota dim = 1 : tensor<4x4xi32>
    %6 = stablehlo.compare LT, %4, %5, SIGNED : (tensor<4x4xi32>, tensor<4x4xi32>) -> tensor<4x4xi1>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %7:5 = stablehlo.while(%iterArg = %c, %iterArg_0 = %arg0, %iterArg_1 = %2, %iterArg_2 = %arg1, %iterArg_3 = %6) : tensor<i32>, tensor<64x64xf32>, tensor<64x64xi1>, tensor<64x64xf32>, tensor<4x4xi1>
    cond {
      %c_4 = stablehlo.constant dense<3> : tensor<i32>
      %8 = stablehlo.compare LT, %iterArg, %c_4, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %8 : tensor<i1>
    } do {
      %cst_4 = stablehlo.constant dense<-1.000000e+30> : tensor<f32>
      %8 = stablehlo.broadcast_in_dim %cst_4, dims = [] : (tensor<f32>) -> tensor<64x64xf32>
      %9 = stablehlo.iota dim = 0 : tensor<64x64xi32>
      %10 = stablehlo.iota dim = 1 : tensor<64x64xi32>
      %11 = stablehlo.compare GE, %9, %10, SIGNED : (tensor<64x64xi32>, tensor<64x64xi32>) -> tensor<64x64xi1>
      %c_5 = stablehlo.constant dense<1> : tensor<i32>
      %cst_6 = stablehlo.constant dense<2.000000e+00> : tensor<64x64xf32>
      %12 = stablehlo.add %iterArg, %c_5 : tensor<i32>
      %13 = stablehlo.multiply %iterArg_0, %cst_6 : tensor<64x64xf32>
      %14 = stablehlo.select %11, %13, %8 : tensor<64x64xi1>, tensor<64x64xf32>
      %15 = stablehlo.add %14, %iterArg_2 : tensor<64x64xf32>
      %16 = stablehlo.not %iterArg_3 : tensor<4x4xi1>
      %17 = stablehlo.not %16 : tensor<4x4xi1>
      stablehlo.return %12, %15, %iterArg_1, %iterArg_2, %17 : tensor<i32>, tensor<64x64xf32>, tensor<64x64xi1>, tensor<64x64xf32>, tensor<4x4xi1>
    }
    return %7#1 : tensor<64x64xf32>
  }
}
