module {
  func.func @main(%arg0: tensor<1x1x16xi8>, %arg1: tensor<16x40xi8>) -> tensor<1x1x40xi32> {
    %0 = stablehlo.reshape %arg0 : (tensor<1x1x16xi8>) -> tensor<1x16xi8>
    %c = stablehlo.constant dense<0> : tensor<i8>
    %1 = stablehlo.pad %0, %c, low = [0, 0], high = [7, 0], interior = [0, 0] : (tensor<1x16xi8>, tensor<i8>) -> tensor<8x16xi8>
    %2 = stablehlo.dot_general %1, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xi8>, tensor<16x40xi8>) -> tensor<8x40xi32>
    %3 = stablehlo.slice %2 [0:1, 0:40] : (tensor<8x40xi32>) -> tensor<1x40xi32>
    %4 = stablehlo.reshape %3 : (tensor<1x40xi32>) -> tensor<1x1x40xi32>
    return %4 : tensor<1x1x40xi32>
  }
}
