module {
  func.func @main(%arg0: tensor<4x8xf32> {tf.aliasing_output = 1 : i32}, %arg1: tensor<3xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<f32>) {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %c = stablehlo.constant dense<1> : tensor<i32>
    %cst_0 = stablehlo.constant dense<7.000000e+00> : tensor<1x8xf32>
    %0 = stablehlo.exponential %arg0 : tensor<4x8xf32>
    %1 = stablehlo.dynamic_update_slice %arg0, %cst_0, %c, %c : (tensor<4x8xf32>, tensor<1x8xf32>, tensor<i32>, tensor<i32>) -> tensor<4x8xf32>
    %2 = stablehlo.reduce(%arg1 init: %cst) applies stablehlo.add across dimensions = [0] : (tensor<3xf32>, tensor<f32>) -> tensor<f32>
    return %0, %1, %2 : tensor<4x8xf32>, tensor<4x8xf32>, tensor<f32>
  }
}
