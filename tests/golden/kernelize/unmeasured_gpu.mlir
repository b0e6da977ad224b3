// golden: target=gpu
// golden: before=fuse-elementwise
// golden: reason=unmeasured: kept XLA (XLA fuses this)
// gpu, nothing measured: XLA fuses an elementwise chain itself, so the region stays with XLA
// (marked, so a second run leaves it) and the report says why.
func.func @main(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = stablehlo.multiply %x, %y : tensor<8x16xf32>
  %1 = stablehlo.tanh %0 : tensor<8x16xf32>
  %2 = stablehlo.add %1, %x : tensor<8x16xf32>
  return %2 : tensor<8x16xf32>
}
