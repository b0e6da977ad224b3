// golden: numbers=reassociate
// one query row, 4 query heads over 2 KV heads (jnp.repeat: head i*2 + g reads KV head i):
// QKᵀ reads K unrepeated (the group becomes a free dim of Q), P·V reads V unrepeated.
func.func @main(%q: tensor<2x1x4x8xf32>, %k: tensor<2x16x2x8xf32>, %v: tensor<2x16x2x8xf32>) -> tensor<2x4x8x1xf32> {
  %kb = stablehlo.broadcast_in_dim %k, dims = [0, 1, 2, 4] : (tensor<2x16x2x8xf32>) -> tensor<2x16x2x2x8xf32>
  %kr = stablehlo.reshape %kb : (tensor<2x16x2x2x8xf32>) -> tensor<2x16x4x8xf32>
  %vb = stablehlo.broadcast_in_dim %v, dims = [0, 1, 2, 4] : (tensor<2x16x2x8xf32>) -> tensor<2x16x2x2x8xf32>
  %vr = stablehlo.reshape %vb : (tensor<2x16x2x2x8xf32>) -> tensor<2x16x4x8xf32>
  %s = stablehlo.dot_general %q, %kr, batching_dims = [0, 2] x [0, 2], contracting_dims = [3] x [3] : (tensor<2x1x4x8xf32>, tensor<2x16x4x8xf32>) -> tensor<2x4x1x16xf32>
  %e = stablehlo.exponential %s : tensor<2x4x1x16xf32>
  %o = stablehlo.dot_general %vr, %e, batching_dims = [0, 2] x [0, 1], contracting_dims = [1] x [3] : (tensor<2x16x4x8xf32>, tensor<2x4x1x16xf32>) -> tensor<2x4x8x1xf32>
  func.return %o : tensor<2x4x8x1xf32>
}
