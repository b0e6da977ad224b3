// Two elementwise chains reading the same input, with no path between them: one
// multi-output elementwise region that reads %x once.
func.func @main(%x: tensor<8x16xf32>, %y: tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xf32>) {
  %0 = stablehlo.tanh %x : tensor<8x16xf32>
  %1 = stablehlo.multiply %0, %y : tensor<8x16xf32>
  %2 = stablehlo.exponential %x : tensor<8x16xf32>
  %3 = stablehlo.add %2, %x : tensor<8x16xf32>
  return %1, %3 : tensor<8x16xf32>, tensor<8x16xf32>
}
