module {
  func.func @main(%arg0: tensor<8x16xf32>, %arg1: tensor<8x16xf32>, %arg2: tensor<16x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
    %0 = call @hlofuse_region_0(%arg0, %arg2) : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
    %1 = call @hlofuse_region_1(%arg1, %arg2) : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
    return %0, %1 : tensor<8x16xf32>, tensor<8x16xf32>
  }
  func.func private @hlofuse_region_0(%arg0: tensor<8x16xf32>, %arg1: tensor<16x16xf32>) -> tensor<8x16xf32> attributes {hlofuse.kind = "matmul_epilogue", hlofuse.region = 0 : i64, hlofuse.xla = "cost model: bare dot_general, nothing to fuse around it; XLA's library GEMM is at least as fast"} {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
  func.func private @hlofuse_region_1(%arg0: tensor<8x16xf32>, %arg1: tensor<16x16xf32>) -> tensor<8x16xf32> attributes {hlofuse.kind = "matmul_epilogue", hlofuse.region = 1 : i64, hlofuse.xla = "cost model: bare dot_general, nothing to fuse around it; XLA's library GEMM is at least as fast"} {
    %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [1] x [0] : (tensor<8x16xf32>, tensor<16x16xf32>) -> tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
}
