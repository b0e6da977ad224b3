// golden: before=fuse-elementwise
// golden: options={"no_kernels": true}
// golden: reason=kernels disabled by option
// no_kernels: the region stays a call to the outlined function, marked hlofuse.xla with why.
func.func @main(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = stablehlo.multiply %x, %y : tensor<8x16xf32>
  %1 = stablehlo.tanh %0 : tensor<8x16xf32>
  %2 = stablehlo.add %1, %x : tensor<8x16xf32>
  return %2 : tensor<8x16xf32>
}
