// golden: unchanged
// Nothing donated: no alias is added (the memory plan still goes to the report).
func.func @main(%x: tensor<256xf32>) -> tensor<256xf32> {
  %a = stablehlo.exponential %x : tensor<256xf32>
  %b = stablehlo.exponential %a : tensor<256xf32>
  %c = stablehlo.add %a, %b : tensor<256xf32>
  return %c : tensor<256xf32>
}
