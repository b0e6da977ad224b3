module {
  func.func @main(%arg0: tensor<8x16xf32>, %arg1: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
    %0:2 = call @hlofuse_region_0(%arg0, %arg1) : (tensor<8x16xf32>, tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>)
    return %0#0, %0#1 : tensor<8x16xf32>, tensor<8x16xf32>
  }
  func.func private @hlofuse_region_0(%arg0: tensor<8x16xf32>, %arg1: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) attributes {hlofuse.kind = "elementwise", hlofuse.region = 0 : i64} {
    %0 = stablehlo.tanh %arg0 : tensor<8x16xf32>
    %1 = stablehlo.multiply %0, %arg1 : tensor<8x16xf32>
    %2 = stablehlo.exponential %arg0 : tensor<8x16xf32>
    %3 = stablehlo.add %2, %arg0 : tensor<8x16xf32>
    return %1, %3 : tensor<8x16xf32>, tensor<8x16xf32>
  }
}
