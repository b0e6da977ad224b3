// golden: numbers=reassociate
// Flax LinearGeneral projections: x[B,S,D].W[D,H,Dh] + b[H,Dh] (two rhs free dims), relu, then
// a[B,S,H,Dh].W[H,Dh,D] + b (two contracting dims). Both become one-contracting-dim products;
// the bias add and relu move above the result reshape, which then cancels into the second
// product's operand reshape.
func.func public @main(%arg0: tensor<2x4x8xf32>, %arg1: tensor<8x2x4xf32>, %arg2: tensor<2x4xf32>, %arg3: tensor<2x4x8xf32>, %arg4: tensor<8xf32>) -> tensor<2x4x8xf32> {
  %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %0 = stablehlo.dot_general %arg0, %arg1, contracting_dims = [2] x [0] : (tensor<2x4x8xf32>, tensor<8x2x4xf32>) -> tensor<2x4x2x4xf32>
  %1 = stablehlo.broadcast_in_dim %arg2, dims = [2, 3] : (tensor<2x4xf32>) -> tensor<2x4x2x4xf32>
  %2 = stablehlo.add %0, %1 : tensor<2x4x2x4xf32>
  %3 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x4x2x4xf32>
  %4 = stablehlo.maximum %2, %3 : tensor<2x4x2x4xf32>
  %5 = stablehlo.dot_general %4, %arg3, contracting_dims = [2, 3] x [0, 1] : (tensor<2x4x2x4xf32>, tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %6 = stablehlo.broadcast_in_dim %arg4, dims = [2] : (tensor<8xf32>) -> tensor<2x4x8xf32>
  %7 = stablehlo.add %5, %6 : tensor<2x4x8xf32>
  return %7 : tensor<2x4x8xf32>
}
