// golden: unchanged
// the repeated dim is contracted, not a batch dim: left alone.
func.func @main(%x: tensor<8x64xf32>, %w: tensor<32x16xf32>) -> tensor<8x16xf32> {
  %wb = stablehlo.broadcast_in_dim %w, dims = [0, 2] : (tensor<32x16xf32>) -> tensor<32x2x16xf32>
  %wr = stablehlo.reshape %wb : (tensor<32x2x16xf32>) -> tensor<64x16xf32>
  %y = stablehlo.dot_general %x, %wr, contracting_dims = [1] x [0] : (tensor<8x64xf32>, tensor<64x16xf32>) -> tensor<8x16xf32>
  func.return %y : tensor<8x16xf32>
}
