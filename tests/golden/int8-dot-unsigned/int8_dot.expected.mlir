module {
  func.func @main(%arg0: tensor<2x4x8xi8>, %arg1: tensor<2x8x16xi8>, %arg2: tensor<2x4x16xf32>) -> tensor<2x4x16xf32> {
    %0 = stablehlo.bitcast_convert %arg0 : (tensor<2x4x8xi8>) -> tensor<2x4x8xui8>
    %c = stablehlo.constant dense<128> : tensor<2x4x8xui8>
    %1 = stablehlo.xor %0, %c : tensor<2x4x8xui8>
    %2 = stablehlo.dot_general %1, %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x4x8xui8>, tensor<2x8x16xi8>) -> tensor<2x4x16xi32>
    %c_0 = stablehlo.constant dense<128> : tensor<2x2x8xui8>
    %3 = stablehlo.dot_general %c_0, %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x2x8xui8>, tensor<2x8x16xi8>) -> tensor<2x2x16xi32>
    %4 = stablehlo.slice %3 [0:2, 0:1, 0:16] : (tensor<2x2x16xi32>) -> tensor<2x1x16xi32>
    %5 = stablehlo.reshape %4 : (tensor<2x1x16xi32>) -> tensor<2x16xi32>
    %6 = stablehlo.broadcast_in_dim %5, dims = [0, 2] : (tensor<2x16xi32>) -> tensor<2x4x16xi32>
    %7 = stablehlo.subtract %2, %6 : tensor<2x4x16xi32>
    %8 = stablehlo.convert %7 : (tensor<2x4x16xi32>) -> tensor<2x4x16xf32>
    %9 = stablehlo.multiply %8, %arg2 : tensor<2x4x16xf32>
    return %9 : tensor<2x4x16xf32>
  }
}
