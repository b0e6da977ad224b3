module @jit_f {
  func.func public @main(%arg0: tensor<8x16xf32>) -> tensor<8x16xf32> {
    %0 = stablehlo.tanh %arg0 : tensor<8x16xf32>
    return %0 : tensor<8x16xf32>
  }
}
