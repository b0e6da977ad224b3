module {
  func.func @main(%arg0: tensor<2x4x8xbf16>, %arg1: tensor<2x8x16xbf16>, %arg2: tensor<2x4x16xbf16>) -> tensor<2x4x16xbf16> {
    %0 = stablehlo.dot_general %arg0, %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [1], precision = [DEFAULT, DEFAULT] : (tensor<2x4x8xbf16>, tensor<2x8x16xbf16>) -> tensor<2x4x16xf32>
    %1 = stablehlo.convert %0 : (tensor<2x4x16xf32>) -> tensor<2x4x16xbf16>
    %2 = stablehlo.add %1, %arg2 : tensor<2x4x16xbf16>
    return %2 : tensor<2x4x16xbf16>
  }
}
