module {
  func.func @main(%arg0: tensor<8x64xf32>, %arg1: tensor<32x16xf32>) -> tensor<8x16xf32> {
    %0 = stablehlo.broadcast_in_dim %arg1, dims = [0, 2] : (tensor<32x16xf32>) -> tensor<32x2x16xf32>
    %1 = stablehlo.reshape %0 : (tensor<32x2x16xf32>) -> tensor<64x16xf32>
    %2 = stablehlo.dot_general %arg0, %1, contracting_dims = [1] x [0] : (tensor<8x64xf32>, tensor<64x16xf32>) -> tensor<8x16xf32>
    return %2 : tensor<8x16xf32>
  }
}
