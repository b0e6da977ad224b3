module {
  func.func @main(%arg0: tensor<4x16xf32>, %arg1: tensor<16x8xi8>, %arg2: tensor<8xf32>) -> tensor<4x8xf32> {
    %0 = stablehlo.convert %arg1 : (tensor<16x8xi8>) -> tensor<16x8xf32>
    %1 = stablehlo.dot_general %arg0, %0, contracting_dims = [1] x [0] : (tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>
    %2 = stablehlo.broadcast_in_dim %arg2, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    %3 = stablehlo.multiply %1, %2 : tensor<4x8xf32>
    %4 = stablehlo.subtract %2, %2 : tensor<4x8xf32>
    %5 = stablehlo.add %3, %4 : tensor<4x8xf32>
    return %5 : tensor<4x8xf32>
  }
}
