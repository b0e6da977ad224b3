// golden: numbers=quantize
// int8 activations (per-tensor scale) x int8 weights (per-channel scale), dequantized before a
// float dot: becomes an int8 x int8 -> int32 dot with both scales after the sum.
func.func @main(%xq: tensor<4x16xi8>, %wq: tensor<16x8xi8>, %sw: tensor<8xf32>) -> tensor<4x8xf32> {
  %x = stablehlo.convert %xq : (tensor<4x16xi8>) -> tensor<4x16xf32>
  %sx = stablehlo.constant dense<0.05> : tensor<4x16xf32>
  %xd = stablehlo.multiply %x, %sx : tensor<4x16xf32>
  %w = stablehlo.convert %wq : (tensor<16x8xi8>) -> tensor<16x8xf32>
  %swb = stablehlo.broadcast_in_dim %sw, dims = [1] : (tensor<8xf32>) -> tensor<16x8xf32>
  %wd = stablehlo.multiply %w, %swb : tensor<16x8xf32>
  %y = stablehlo.dot_general %xd, %wd, contracting_dims = [1] x [0] : (tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}
