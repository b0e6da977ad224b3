// What jax emits for jit(relu) inside jit: private functions called from @main (one calling
// another); after the pass @main is one flat body and the callees are gone.
module {
  func.func private @relu(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %z = stablehlo.constant dense<0.0> : tensor<4x8xf32>
    %y = stablehlo.maximum %x, %z : tensor<4x8xf32>
    return %y : tensor<4x8xf32>
  }
  func.func private @block(%x: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %s = stablehlo.add %x, %b : tensor<4x8xf32>
    %r = func.call @relu(%s) : (tensor<4x8xf32>) -> tensor<4x8xf32>
    return %r : tensor<4x8xf32>
  }
  func.func @main(%x: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> tensor<4x8xf32> {
    %y = func.call @block(%x, %b) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %z = func.call @block(%y, %b) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    return %z : tensor<4x8xf32>
  }
}
