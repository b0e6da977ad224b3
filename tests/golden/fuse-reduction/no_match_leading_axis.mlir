// golden: unchanged
// golden: reason=not the last dim
// exp(x).sum(0) * 2: a reduction over the leading axis is not a row reduction; left to XLA.
module {
  func.func @main(%arg0: tensor<4x32xf32>) -> (tensor<32xf32>) {
    %cst = stablehlo.constant dense<2.000000e+00> : tensor<f32>
    %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.exponential %arg0 : tensor<4x32xf32>
    %1 = stablehlo.reduce(%0 init: %cst_0) applies stablehlo.add across dimensions = [0] : (tensor<4x32xf32>, tensor<f32>) -> tensor<32xf32>
    %2 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<32xf32>
    %3 = stablehlo.multiply %1, %2 : tensor<32xf32>
    return %3 : tensor<32xf32>
  }
}

