// golden: before=fuse-elementwise
// golden: numbers=kernel
// cpu: the elementwise region outlined by fuse-elementwise (run first: kernelize builds the
// regions the report lists) becomes a Pallas kernel in interpret mode, plain StableHLO.
func.func @main(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = stablehlo.multiply %x, %y : tensor<8x16xf32>
  %1 = stablehlo.tanh %0 : tensor<8x16xf32>
  %2 = stablehlo.add %1, %x : tensor<8x16xf32>
  return %2 : tensor<8x16xf32>
}
