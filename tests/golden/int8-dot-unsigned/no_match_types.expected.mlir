module {
  func.func @main(%arg0: tensor<4x8xi8>, %arg1: tensor<8x16xi8>, %arg2: tensor<4x8xui8>, %arg3: tensor<4x8xf32>, %arg4: tensor<8x16xf32>) -> (tensor<4x16xi16>, tensor<4x16xi32>, tensor<4x16xf32>) {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<4x8xi8>, tensor<8x16xi8>) -> tensor<4x16xi16>
    %1 = stablehlo.dot_general %arg2, %arg1, contracting_dims = [1] x [0] : (tensor<4x8xui8>, tensor<8x16xi8>) -> tensor<4x16xi32>
    %2 = stablehlo.dot_general %arg3, %arg4, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
    return %0, %1, %2 : tensor<4x16xi16>, tensor<4x16xi32>, tensor<4x16xf32>
  }
}
