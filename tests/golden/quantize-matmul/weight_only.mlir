// golden: numbers=quantize
// f32 activations x int8 weights with a per-channel scale: the scale moves past the dot, the
// convert stays as the dot's prologue.
func.func @main(%x: tensor<4x16xf32>, %wq: tensor<16x8xi8>, %sw: tensor<8xf32>) -> tensor<4x8xf32> {
  %w = stablehlo.convert %wq : (tensor<16x8xi8>) -> tensor<16x8xf32>
  %swb = stablehlo.broadcast_in_dim %sw, dims = [1] : (tensor<8xf32>) -> tensor<16x8xf32>
  %wd = stablehlo.multiply %swb, %w : tensor<16x8xf32>
  %y = stablehlo.dot_general %x, %wd, contracting_dims = [1] x [0] : (tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}
