module {
  func.func @main(%arg0: tensor<4x16xi8>, %arg1: tensor<16x8xi8>, %arg2: tensor<8xf32>) -> tensor<4x8xf32> {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<4x16xi8>, tensor<16x8xi8>) -> tensor<4x8xi32>
    %1 = stablehlo.convert %0 : (tensor<4x8xi32>) -> tensor<4x8xf32>
    %cst = stablehlo.constant dense<5.000000e-02> : tensor<f32>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<4x8xf32>
    %3 = stablehlo.multiply %1, %2 : tensor<4x8xf32>
    %4 = stablehlo.broadcast_in_dim %arg2, dims = [1] : (tensor<8xf32>) -> tensor<4x8xf32>
    %5 = stablehlo.multiply %3, %4 : tensor<4x8xf32>
    %6 = stablehlo.subtract %4, %4 : tensor<4x8xf32>
    %7 = stablehlo.add %5, %6 : tensor<4x8xf32>
    return %7 : tensor<4x8xf32>
  }
}
