module {
  func.func @main(%arg0: tensor<4x8xbf16>, %arg1: tensor<8x16xbf16>, %arg2: tensor<4x8xf32>, %arg3: tensor<8x16xf32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<4x8xbf16>, tensor<8x16xbf16>) -> tensor<4x16xf32>
    %1 = stablehlo.dot_general %arg2, %arg3, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
    return %0, %1 : tensor<4x16xf32>, tensor<4x16xf32>
  }
}
