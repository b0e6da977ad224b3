module {
  func.func @main(%arg0: tensor<8x16xf32>, %arg1: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %0 = call @hlofuse_k0_main(%arg0, %arg1) : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
  func.func private @hlofuse_region_0(%arg0: tensor<8x16xf32>, %arg1: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {hlofuse.kind = "elementwise", hlofuse.region = 0 : i64} {
    %0 = stablehlo.multiply %arg0, %arg1 : tensor<8x16xf32>
    %1 = stablehlo.tanh %0 : tensor<8x16xf32>
    %2 = stablehlo.add %1, %arg0 : tensor<8x16xf32>
    return %2 : tensor<8x16xf32>
  }
  func.func private @hlofuse_k0_main(%arg0: tensor<8x16xf32>, %arg1: tensor<8x16xf32>) -> tensor<8x16xf32> attributes {hlofuse.kernel = "elementwise|0|hlofuse_elementwise_region0|8x16 blocks, grid 1x1", hlofuse.xla_original = "<kernel payload>"} {
    %0 = stablehlo.custom_call @__gpu$xla.gpu.triton(%arg0, %arg1) {backend_config = "<kernel payload>", mhlo.backend_config = {debug = false, grid_x = 1 : i32, grid_y = 1 : i32, grid_z = 1 : i32, ir = "<kernel payload>", name = "hlofuse_elementwise_region0", num_stages = 1 : i32, num_warps = 1 : i32}, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
}
