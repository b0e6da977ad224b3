module {
  func.func @main(%arg0: tensor<1x1x16xi8>, %arg1: tensor<16x40xi8>) -> tensor<1x1x40xi32> {
    %0 = stablehlo.bitcast_convert %arg0 : (tensor<1x1x16xi8>) -> tensor<1x1x16xui8>
    %c = stablehlo.constant dense<128> : tensor<1x1x16xui8>
    %1 = stablehlo.xor %0, %c : tensor<1x1x16xui8>
    %2 = stablehlo.reshape %1 : (tensor<1x1x16xui8>) -> tensor<1x16xui8>
    %c_0 = stablehlo.constant dense<0> : tensor<ui8>
    %3 = stablehlo.pad %2, %c_0, low = [0, 0], high = [1, 0], interior = [0, 0] : (tensor<1x16xui8>, tensor<ui8>) -> tensor<2x16xui8>
    %4 = stablehlo.dot_general %3, %arg1, contracting_dims = [1] x [0] : (tensor<2x16xui8>, tensor<16x40xi8>) -> tensor<2x40xi32>
    %5 = stablehlo.slice %4 [0:1, 0:40] : (tensor<2x40xi32>) -> tensor<1x40xi32>
    %6 = stablehlo.reshape %5 : (tensor<1x40xi32>) -> tensor<1x1x40xi32>
    %c_1 = stablehlo.constant dense<128> : tensor<2x16xui8>
    %7 = stablehlo.dot_general %c_1, %arg1, contracting_dims = [1] x [0] : (tensor<2x16xui8>, tensor<16x40xi8>) -> tensor<2x40xi32>
    %8 = stablehlo.slice %7 [0:1, 0:40] : (tensor<2x40xi32>) -> tensor<1x40xi32>
    %9 = stablehlo.reshape %8 : (tensor<1x40xi32>) -> tensor<40xi32>
    %10 = stablehlo.broadcast_in_dim %9, dims = [2] : (tensor<40xi32>) -> tensor<1x1x40xi32>
    %11 = stablehlo.subtract %6, %10 : tensor<1x1x40xi32>
    return %11 : tensor<1x1x40xi32>
  }
}
