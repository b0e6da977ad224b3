// Upstream symbol-dce: @unused is private and never called; @helper is called and stays.
module {
  func.func private @unused(%x: tensor<4xf32>) -> tensor<4xf32> {
    %y = stablehlo.exponential %x : tensor<4xf32>
    return %y : tensor<4xf32>
  }
  func.func private @helper(%x: tensor<4xf32>) -> tensor<4xf32> {
    %y = stablehlo.tanh %x : tensor<4xf32>
    return %y : tensor<4xf32>
  }
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %y = func.call @helper(%x) : (tensor<4xf32>) -> tensor<4xf32>
    return %y : tensor<4xf32>
  }
}
