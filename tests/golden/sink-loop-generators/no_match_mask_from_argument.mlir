// golden: unchanged
// a mask computed from the arguments is data: it stays carried.
func.func @main(%x: tensor<64x64xf32>, %b: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %tril = stablehlo.compare GE, %x, %b : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xi1>
  %s0 = stablehlo.iota dim = 0 : tensor<4x4xi32>
  %s1 = stablehlo.iota dim = 1 : tensor<4x4xi32>
  %small = stablehlo.compare LT, %s0, %s1, SIGNED : (tensor<4x4xi32>, tensor<4x4xi32>) -> tensor<4x4xi1>
  %zero = stablehlo.constant dense<0> : tensor<i32>
  %r:5 = stablehlo.while(%it = %zero, %acc = %x, %m = %tril, %bias = %b, %sm = %small)
      : tensor<i32>, tensor<64x64xf32>, tensor<64x64xi1>, tensor<64x64xf32>, tensor<4x4xi1>
   cond {
    %three = stablehlo.constant dense<3> : tensor<i32>
    %lt = stablehlo.compare LT, %it, %three, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  } do {
    %one = stablehlo.constant dense<1> : tensor<i32>
    %two = stablehlo.constant dense<2.0> : tensor<64x64xf32>
    %n = stablehlo.add %it, %one : tensor<i32>
    %y = stablehlo.multiply %acc, %two : tensor<64x64xf32>
    %z = stablehlo.select %m, %y, %bias : tensor<64x64xi1>, tensor<64x64xf32>
    %w = stablehlo.add %z, %bias : tensor<64x64xf32>
    %sw = stablehlo.not %sm : tensor<4x4xi1>
    %sw2 = stablehlo.not %sw : tensor<4x4xi1>
    stablehlo.return %n, %w, %m, %bias, %sw2 : tensor<i32>, tensor<64x64xf32>, tensor<64x64xi1>, tensor<64x64xf32>, tensor<4x4xi1>
  }
  func.return %r#1 : tensor<64x64xf32>
}
