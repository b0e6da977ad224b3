module {
  func.func @main(%arg0: tensor<1x1x16xbf16>, %arg1: tensor<16x40xbf16>) -> tensor<1x1x40xbf16> {
    %0 = stablehlo.reshape %arg0 : (tensor<1x1x16xbf16>) -> tensor<1x16xbf16>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<bf16>
    %1 = stablehlo.pad %0, %cst, low = [0, 0], high = [1, 0], interior = [0, 0] : (tensor<1x16xbf16>, tensor<bf16>) -> tensor<2x16xbf16>
    %2 = stablehlo.dot_general %1, %arg1, contracting_dims = [1] x [0] : (tensor<2x16xbf16>, tensor<16x40xbf16>) -> tensor<2x40xf32>
    %3 = stablehlo.slice %2 [0:1, 0:40] : (tensor<2x40xf32>) -> tensor<1x40xf32>
    %4 = stablehlo.reshape %3 : (tensor<1x40xf32>) -> tensor<1x1x40xf32>
    %5 = stablehlo.convert %4 : (tensor<1x1x40xf32>) -> tensor<1x1x40xbf16>
    return %5 : tensor<1x1x40xbf16>
  }
}
