module {
  func.func @main(%arg0: tensor<2x16x16xf32>, %arg1: tensor<2x16x16xf32>, %arg2: tensor<2x16x16xf32>) -> tensor<2x16x16xf32> {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %cst_0 = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %0 = call @hlofuse_attention_0(%arg0, %arg1, %arg2) : (tensor<2x16x16xf32>, tensor<2x16x16xf32>, tensor<2x16x16xf32>) -> tensor<2x16x16xf32>
    return %0 : tensor<2x16x16xf32>
  }
  func.func private @hlofuse_attention_0(%arg0: tensor<2x16x16xf32>, %arg1: tensor<2x16x16xf32>, %arg2: tensor<2x16x16xf32>) -> tensor<2x16x16xf32> attributes {hlofuse.attention = "{\22label_sizes\22:[[\22b0\22,2],[\22l1\22,16],[\22r1\22,16],[\22d\22,16],[\22dv\22,16]],\22batch_labels\22:[\22b0\22],\22row_labels\22:[\22l1\22],\22key\22:\22r1\22,\22repeat\22:null,\22head_dim\22:16,\22v_head_dim\22:16,\22q_arg\22:0,\22k_arg\22:1,\22v_arg\22:2,\22q_dims\22:[\22b0\22,\22l1\22,\22d\22],\22k_dims\22:[\22b0\22,\22r1\22,\22d\22],\22v_dims\22:[\22b0\22,\22r1\22,\22dv\22],\22out_dims\22:[\22b0\22,\22l1\22,\22dv\22],\22side_args\22:[],\22const_sides\22:[],\22steps\22:[{\22@\22:\22LogitStep\22,\22ref\22:[\22op\22,2],\22name\22:\22stablehlo.constant\22,\22operands\22:[{\22@\22:\22Splat\22,\22value\22:0.25,\22dtype\22:\22f32\22}],\22dtype\22:\22f32\22,\22dims\22:[]},{\22@\22:\22LogitStep\22,\22ref\22:[\22op\22,4],\22name\22:\22stablehlo.broadcast_in_dim\22,\22operands\22:[[\22op\22,2]],\22dtype\22:\22f32\22,\22dims\22:[\22b0\22,\22l1\22,\22r1\22]},{\22@\22:\22LogitStep\22,\22ref\22:[\22op\22,5],\22name\22:\22stablehlo.multiply\22,\22operands\22:[[\22op\22,3],[\22op\22,4]],\22dtype\22:\22f32\22,\22dims\22:[\22b0\22,\22l1\22,\22r1\22]}],\22s_ref\22:[\22op\22,3],\22s_dtype\22:\22f32\22,\22x_ref\22:[\22op\22,5],\22mask_select\22:null,\22m_init\22:-Infinity,\22x_dtype\22:\22f32\22,\22p_dtype\22:\22f32\22,\22out_dtype\22:\22f32\22,\22precision\22:[[\22DEFAULT\22,\22DEFAULT\22],[\22DEFAULT\22,\22DEFAULT\22]]}", hlofuse.kind = "attention", hlofuse.region = 0 : i64} {
    %cst = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %cst_1 = stablehlo.constant dense<2.500000e-01> : tensor<f32>
    %0 = stablehlo.dot_general %arg0, %arg1, batching_dims = [0] x [0], contracting_dims = [2] x [2] : (tensor<2x16x16xf32>, tensor<2x16x16xf32>) -> tensor<2x16x16xf32>
    %1 = stablehlo.broadcast_in_dim %cst_1, dims = [] : (tensor<f32>) -> tensor<2x16x16xf32>
    %2 = stablehlo.multiply %0, %1 : tensor<2x16x16xf32>
    %3 = stablehlo.reduce(%2 init: %cst) applies stablehlo.maximum across dimensions = [2] : (tensor<2x16x16xf32>, tensor<f32>) -> tensor<2x16xf32>
    %4 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<2x16xf32>
    %5 = stablehlo.maximum %4, %3 : tensor<2x16xf32>
    %6 = stablehlo.broadcast_in_dim %5, dims = [0, 1] : (tensor<2x16xf32>) -> tensor<2x16x1xf32>
    %7 = stablehlo.broadcast_in_dim %6, dims = [0, 1, 2] : (tensor<2x16x1xf32>) -> tensor<2x16x16xf32>
    %8 = stablehlo.subtract %2, %7 : tensor<2x16x16xf32>
    %9 = stablehlo.exponential %8 : tensor<2x16x16xf32>
    %10 = stablehlo.reduce(%9 init: %cst_0) applies stablehlo.add across dimensions = [2] : (tensor<2x16x16xf32>, tensor<f32>) -> tensor<2x16xf32>
    %11 = stablehlo.broadcast_in_dim %10, dims = [0, 1] : (tensor<2x16xf32>) -> tensor<2x16x1xf32>
    %12 = stablehlo.broadcast_in_dim %11, dims = [0, 1, 2] : (tensor<2x16x1xf32>) -> tensor<2x16x16xf32>
    %13 = stablehlo.divide %9, %12 : tensor<2x16x16xf32>
    %14 = stablehlo.dot_general %13, %arg2, batching_dims = [0] x [0], contracting_dims = [2] x [1] : (tensor<2x16x16xf32>, tensor<2x16x16xf32>) -> tensor<2x16x16xf32>
    return %14 : tensor<2x16x16xf32>
  }
}
