module {
  func.func @main(%arg0: tensor<2x5x5x8xf32>, %arg1: tensor<1x1x8x16xf32>) -> tensor<2x5x5x16xf32> {
    %0 = stablehlo.reshape %arg1 : (tensor<1x1x8x16xf32>) -> tensor<8x16xf32>
    %1 = stablehlo.dot_general %arg0, %0, contracting_dims = [3] x [0] {hlofuse.conv1x1} : (tensor<2x5x5x8xf32>, tensor<8x16xf32>) -> tensor<2x5x5x16xf32>
    return %1 : tensor<2x5x5x16xf32>
  }
}
