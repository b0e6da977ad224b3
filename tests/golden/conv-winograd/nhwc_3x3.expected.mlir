module {
  func.func @main(%arg0: tensor<1x6x6x16xf32>, %arg1: tensor<3x3x16x16xf32>) -> tensor<1x6x6x16xf32> {
    %0 = call @hlofuse_region_0(%arg0, %arg1) : (tensor<1x6x6x16xf32>, tensor<3x3x16x16xf32>) -> tensor<1x6x6x16xf32>
    return %0 : tensor<1x6x6x16xf32>
  }
  func.func private @hlofuse_region_0(%arg0: tensor<1x6x6x16xf32>, %arg1: tensor<3x3x16x16xf32>) -> tensor<1x6x6x16xf32> attributes {hlofuse.kind = "conv_winograd", hlofuse.region = 0 : i64} {
    %0 = stablehlo.convolution(%arg0, %arg1) dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f], window = {pad = [[1, 1], [1, 1]]} {batch_group_count = 1 : i64, feature_group_count = 1 : i64} : (tensor<1x6x6x16xf32>, tensor<3x3x16x16xf32>) -> tensor<1x6x6x16xf32>
    return %0 : tensor<1x6x6x16xf32>
  }
}
