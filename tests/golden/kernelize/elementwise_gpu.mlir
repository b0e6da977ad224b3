// golden: target=gpu
// golden: before=fuse-elementwise
// golden: options={"kernelize": {"unmeasured": "kernel"}}
// golden: numbers=skip(a Triton custom call does not run on the CPU)
// gpu: the region becomes a Triton kernel behind a custom call (its payload is elided).
func.func @main(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %0 = stablehlo.multiply %x, %y : tensor<8x16xf32>
  %1 = stablehlo.tanh %0 : tensor<8x16xf32>
  %2 = stablehlo.add %1, %x : tensor<8x16xf32>
  return %2 : tensor<8x16xf32>
}
