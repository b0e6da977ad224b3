module {
  func.func @main(%arg0: tensor<1x5x5x3xf32>, %arg1: tensor<3x3x1x3xf32>) -> tensor<1x3x3x3xf32> {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.pad %arg0, %cst, low = [0, 1, 1, 0], high = [0, 1, 1, 0], interior = [0, 0, 0, 0] : (tensor<1x5x5x3xf32>, tensor<f32>) -> tensor<1x7x7x3xf32>
    %1 = stablehlo.slice %0 [0:1, 0:5:2, 0:5:2, 0:3] : (tensor<1x7x7x3xf32>) -> tensor<1x3x3x3xf32>
    %2 = stablehlo.slice %arg1 [0:1, 0:1, 0:1, 0:3] : (tensor<3x3x1x3xf32>) -> tensor<1x1x1x3xf32>
    %3 = stablehlo.reshape %2 : (tensor<1x1x1x3xf32>) -> tensor<3xf32>
    %4 = stablehlo.broadcast_in_dim %3, dims = [3] : (tensor<3xf32>) -> tensor<1x3x3x3xf32>
    %5 = stablehlo.multiply %1, %4 : tensor<1x3x3x3xf32>
    %6 = stablehlo.slice %0 [0:1, 0:5:2, 1:6:2, 0:3] : (tensor<1x7x7x3xf32>) -> tensor<1x3x3x3xf32>
    %7 = stablehlo.slice %arg1 [0:1, 1:2, 0:1, 0:3] : (tensor<3x3x1x3xf32>) -> tensor<1x1x1x3xf32>
    %8 = stablehlo.reshape %7 : (tensor<1x1x1x3xf32>) -> tensor<3xf32>
    %9 = stablehlo.broadcast_in_dim %8, dims = [3] : (tensor<3xf32>) -> tensor<1x3x3x3xf32>
    %10 = stablehlo.multiply %6, %9 : tensor<1x3x3x3xf32>
    %11 = stablehlo.add %5, %10 : tensor<1x3x3x3xf32>
    %12 = stablehlo.slice %0 [0:1, 0:5:2, 2:7:2, 0:3] : (tensor<1x7x7x3xf32>) -> tensor<1x3x3x3xf32>
    %13 = stablehlo.slice %arg1 [0:1, 2:3, 0:1, 0:3] : (tensor<3x3x1x3xf32>) -> tensor<1x1x1x3xf32>
    %14 = stablehlo.reshape %13 : (tensor<1x1x1x3xf32>) -> tensor<3xf32>
    %15 = stablehlo.broadcast_in_dim %14, dims = [3] : (tensor<3xf32>) -> tensor<1x3x3x3xf32>
    %16 = stablehlo.multiply %12, %15 : tensor<1x3x3x3xf32>
    %17 = stablehlo.add %11, %16 : tensor<1x3x3x3xf32>
    %18 = stablehlo.slice %0 [0:1, 1:6:2, 0:5:2, 0:3] : (tensor<1x7x7x3xf32>) -> tensor<1x3x3x3xf32>
    %19 = stablehlo.slice %arg1 [1:2, 0:1, 0:1, 0:3] : (tensor<3x3x1x3xf32>) -> tensor<1x1x1x3xf32>
    %20 = stablehlo.reshape %19 : (tensor<1x1x1x3xf32>) -> tensor<3xf32>
    %21 = stablehlo.broadcast_in_dim %20, dims = [3] : (tensor<3xf32>) -> tensor<1x3x3x3xf32>
    %22 = stablehlo.multiply %18, %21 : tensor<1x3x3x3xf32>
    %23 = stablehlo.add %17, %22 : tensor<1x3x3x3xf32>
    %24 = stablehlo.slice %0 [0:1, 1:6:2, 1:6:2, 0:3] : (tensor<1x7x7x3xf32>) -> tensor<1x3x3x3xf32>
    %25 = stablehlo.slice %arg1 [1:2, 1:2, 0:1, 0:3] : (tensor<3x3x1x3xf32>) -> tensor<1x1x1x3xf32>
    %26 = stablehlo.reshape %25 : (tensor<1x1x1x3xf32>) -> tensor<3xf32>
    %27 = stablehlo.broadcast_in_dim %26, dims = [3] : (tensor<3xf32>) -> tensor<1x3x3x3xf32>
    %28 = stablehlo.multiply %24, %27 : tensor<1x3x3x3xf32>
    %29 = stablehlo.add %23, %28 : tensor<1x3x3x3xf32>
    %30 = stablehlo.slice %0 [0:1, 1:6:2, 2:7:2, 0:3] : (tensor<1x7x7x3xf32>) -> tensor<1x3x3x3xf32>
    %31 = stablehlo.slice %arg1 [1:2, 2:3, 0:1, 0:3] : (tensor<3x3x1x3xf32>) -> tensor<1x1x1x3xf32>
    %32 = stablehlo.reshape %31 : (tensor<1x1x1x3xf32>) -> tensor<3xf32>
    %33 = stablehlo.broadcast_in_dim %32, dims = [3] : (tensor<3xf32>) -> tensor<1x3x3x3xf32>
    %34 = stablehlo.multiply %30, %33 : tensor<1x3x3x3xf32>
    %35 = stablehlo.add %29, %34 : tensor<1x3x3x3xf32>
    %36 = stablehlo.slice %0 [0:1, 2:7:2, 0:5:2, 0:3] : (tensor<1x7x7x3xf32>) -> tensor<1x3x3x3xf32>
    %37 = stablehlo.slice %arg1 [2:3, 0:1, 0:1, 0:3] : (tensor<3x3x1x3xf32>) -> tensor<1x1x1x3xf32>
    %38 = stablehlo.reshape %37 : (tensor<1x1x1x3xf32>) -> tensor<3xf32>
    %39 = stablehlo.broadcast_in_dim %38, dims = [3] : (tensor<3xf32>) -> tensor<1x3x3x3xf32>
    %40 = stablehlo.multiply %36, %39 : tensor<1x3x3x3xf32>
    %41 = stablehlo.add %35, %40 : tensor<1x3x3x3xf32>
    %42 = stablehlo.slice %0 [0:1, 2:7:2, 1:6:2, 0:3] : (tensor<1x7x7x3xf32>) -> tensor<1x3x3x3xf32>
    %43 = stablehlo.slice %arg1 [2:3, 1:2, 0:1, 0:3] : (tensor<3x3x1x3xf32>) -> tensor<1x1x1x3xf32>
    %44 = stablehlo.reshape %43 : (tensor<1x1x1x3xf32>) -> tensor<3xf32>
    %45 = stablehlo.broadcast_in_dim %44, dims = [3] : (tensor<3xf32>) -> tensor<1x3x3x3xf32>
    %46 = stablehlo.multiply %42, %45 : tensor<1x3x3x3xf32>
    %47 = stablehlo.add %41, %46 : tensor<1x3x3x3xf32>
    %48 = stablehlo.slice %0 [0:1, 2:7:2, 2:7:2, 0:3] : (tensor<1x7x7x3xf32>) -> tensor<1x3x3x3xf32>
    %49 = stablehlo.slice %arg1 [2:3, 2:3, 0:1, 0:3] : (tensor<3x3x1x3xf32>) -> tensor<1x1x1x3xf32>
    %50 = stablehlo.reshape %49 : (tensor<1x1x1x3xf32>) -> tensor<3xf32>
    %51 = stablehlo.broadcast_in_dim %50, dims = [3] : (tensor<3xf32>) -> tensor<1x3x3x3xf32>
    %52 = stablehlo.multiply %48, %51 : tensor<1x3x3x3xf32>
    %53 = stablehlo.add %47, %52 : tensor<1x3x3x3xf32>
    %cst_0 = stablehlo.constant dense<0.000000e+00> : tensor<1x3x3x3xf32>
    %cst_1 = stablehlo.constant dense<6.000000e+00> : tensor<1x3x3x3xf32>
    %54 = stablehlo.clamp %cst_0, %53, %cst_1 : tensor<1x3x3x3xf32>
    return %54 : tensor<1x3x3x3xf32>
  }
}
