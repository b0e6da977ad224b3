module {
  func.func @main(%arg0: tensor<4x8x4x2xbf16>) -> tensor<8x4xbf16> {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<bf16>
    %0 = stablehlo.reduce(%arg0 init: %cst) applies stablehlo.add across dimensions = [0, 3] : (tensor<4x8x4x2xbf16>, tensor<bf16>) -> tensor<8x4xbf16>
    return %0 : tensor<8x4xbf16>
  }
}
