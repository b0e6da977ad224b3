module {
  func.func @main(%arg0: tensor<4x16xi8>, %arg1: tensor<16x8xi8>, %arg2: tensor<16xf32>) -> tensor<4x8xf32> {
    %0 = stablehlo.convert %arg0 : (tensor<4x16xi8>) -> tensor<4x16xf32>
    %cst = stablehlo.constant dense<5.000000e-02> : tensor<4x16xf32>
    %1 = stablehlo.multiply %0, %cst : tensor<4x16xf32>
    %2 = stablehlo.convert %arg1 : (tensor<16x8xi8>) -> tensor<16x8xf32>
    %3 = stablehlo.broadcast_in_dim %arg2, dims = [0] : (tensor<16xf32>) -> tensor<16x8xf32>
    %4 = stablehlo.multiply %2, %3 : tensor<16x8xf32>
    %5 = stablehlo.dot_general %1, %4, contracting_dims = [1] x [0] : (tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>
    return %5 : tensor<4x8xf32>
  }
}
