module {
  func.func @main(%arg0: tensor<64x64xf32>, %arg1: tensor<64x64xf32>) -> tensor<64x64xf32> {
    %0 = stablehlo.compare GE, %arg0, %arg1 : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xi1>
    %1 = stablehlo.iota dim = 0 : tensor<4x4xi32>
    %2 = stablehlo.iota dim = 1 : tensor<4x4xi32>
    %3 = stablehlo.compare LT, %1, %2, SIGNED : (tensor<4x4xi32>, tensor<4x4xi32>) -> tensor<4x4xi1>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %4:5 = stablehlo.while(%iterArg = %c, %iterArg_0 = %arg0, %iterArg_1 = %0, %iterArg_2 = %arg1, %iterArg_3 = %3) : tensor<i32>, tensor<64x64xf32>, tensor<64x64xi1>, tensor<64x64xf32>, tensor<4x4xi1>
    cond {
      %c_4 = stablehlo.constant dense<3> : tensor<i32>
      %5 = stablehlo.compare LT, %iterArg, %c_4, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %5 : tensor<i1>
    } do {
      %c_4 = stablehlo.constant dense<1> : tensor<i32>
      %cst = stablehlo.constant dense<2.000000e+00> : tensor<64x64xf32>
      %5 = stablehlo.add %iterArg, %c_4 : tensor<i32>
      %6 = stablehlo.multiply %iterArg_0, %cst : tensor<64x64xf32>
      %7 = stablehlo.select %iterArg_1, %6, %iterArg_2 : tensor<64x64xi1>, tensor<64x64xf32>
      %8 = stablehlo.add %7, %iterArg_2 : tensor<64x64xf32>
      %9 = stablehlo.not %iterArg_3 : tensor<4x4xi1>
      %10 = stablehlo.not %9 : tensor<4x4xi1>
      stablehlo.return %5, %8, %iterArg_1, %iterArg_2, %10 : tensor<i32>, tensor<64x64xf32>, tensor<64x64xi1>, tensor<64x64xf32>, tensor<4x4xi1>
    }
    return %4#1 : tensor<64x64xf32>
  }
}
