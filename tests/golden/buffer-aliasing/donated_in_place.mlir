// golden: donated=0
// Argument 0 is donated; output 1 updates it in place, so the pass aliases output 1 to it
// (tf.aliasing_output on the argument); output 0 is unrelated to it.
func.func @main(%x: tensor<4x8xf32>, %y: tensor<3xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>, tensor<f32>) {
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %i = stablehlo.constant dense<1> : tensor<i32>
  %row = stablehlo.constant dense<7.0> : tensor<1x8xf32>
  %e = stablehlo.exponential %x : tensor<4x8xf32>
  %u = stablehlo.dynamic_update_slice %x, %row, %i, %i : (tensor<4x8xf32>, tensor<1x8xf32>, tensor<i32>, tensor<i32>) -> tensor<4x8xf32>
  %s = stablehlo.reduce(%y init: %z) applies stablehlo.add across dimensions = [0] : (tensor<3xf32>, tensor<f32>) -> tensor<f32>
  return %e, %u, %s : tensor<4x8xf32>, tensor<4x8xf32>, tensor<f32>
}
