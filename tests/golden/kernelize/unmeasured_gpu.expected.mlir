module {
  func.func @main(%arg0: tensor<8x16xf32>, %arg1: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %0 = call @hlofuse_region_0(%arg0, %arg1) : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
  func.func private @hlofuse_region_0(%arg0: tensor<8x16xf32>, %arg1: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {hlofuse.kind = "elementwise", hlofuse.region = 0 : i64, hlofuse.xla = "unmeasured: kept XLA (XLA fuses this)"} {
    %0 = stablehlo.multiply %arg0, %arg1 : tensor<8x16xf32>
    %1 = stablehlo.tanh %0 : tensor<8x16xf32>
    %2 = stablehlo.add %1, %arg0 : tensor<8x16xf32>
    return %2 : tensor<8x16xf32>
  }
}
