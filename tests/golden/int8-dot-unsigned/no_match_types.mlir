// golden: numbers=exact
// golden: options={"shift": "always"}
// golden: unchanged
// golden: reason=result is not int32
// not rewritten: an int8 dot with an int16 result, a u8 x s8 dot (already the fast form) and
// a float dot.
func.func @main(%a: tensor<4x8xi8>, %b: tensor<8x16xi8>, %u: tensor<4x8xui8>, %c: tensor<4x8xf32>, %d: tensor<8x16xf32>) -> (tensor<4x16xi16>, tensor<4x16xi32>, tensor<4x16xf32>) {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<4x8xi8>, tensor<8x16xi8>) -> tensor<4x16xi16>
  %1 = stablehlo.dot_general %u, %b, contracting_dims = [1] x [0] : (tensor<4x8xui8>, tensor<8x16xi8>) -> tensor<4x16xi32>
  %2 = stablehlo.dot_general %c, %d, contracting_dims = [1] x [0] : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
  return %0, %1, %2 : tensor<4x16xi16>, tensor<4x16xi32>, tensor<4x16xf32>
}
