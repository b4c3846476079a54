// Router selection on the CPU: top-k order, ties, NaN, the selection bias,
// group-limited selection and exact logits (docs/cpu-path.md section 2,
// "Router").
// RUN: moe-opt %s --moe-lower-to-cpu-pipeline | \
// RUN:   mlir-runner -e main -entry-point-result=void \
// RUN:     -shared-libs=%mlir_runner_utils,%mlir_c_runner_utils | FileCheck %s

func.func private @printMemrefI32(tensor<*xi32>)
func.func private @printMemrefF32(tensor<*xf32>)

func.func @top2(%x: tensor<4x2xf32>, %wr: tensor<2x4xf32>, %b: tensor<4xf32>)
    -> (tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x4xf32>) {
  %w, %e, %l = moe.router %x, %wr bias(%b : tensor<4xf32>)
      {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true,
                              scaling_factor = 2.0>}
      : tensor<4x2xf32>, tensor<2x4xf32>
      -> tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x4xf32>
  return %w, %e, %l : tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x4xf32>
}

// Eight experts in four groups of two; the two best groups are candidates.
func.func @grouped(%x: tensor<2x8xf32>, %wr: tensor<8x8xf32>)
    -> tensor<2x3xi32> {
  %w, %e, %l = moe.router %x, %wr
      {routing = #moe.routing<scoring = sigmoid, top_k = 3, renormalize = true,
                              num_groups = 4, topk_groups = 2>}
      : tensor<2x8xf32>, tensor<8x8xf32>
      -> tensor<2x3xf32>, tensor<2x3xi32>, tensor<2x8xf32>
  return %e : tensor<2x3xi32>
}

func.func @main() {
  // logits = x . wr: exact small integers.
  %x = arith.constant dense<[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, -1.0]]>
      : tensor<4x2xf32>
  %wr = arith.constant dense<[[1.0, 3.0, 2.0, 3.0], [0.0, 1.0, 1.0, -1.0]]>
      : tensor<2x4xf32>
  %zero = arith.constant dense<0.0> : tensor<4xf32>
  %w, %e, %l = call @top2(%x, %wr, %zero)
      : (tensor<4x2xf32>, tensor<2x4xf32>, tensor<4xf32>)
      -> (tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x4xf32>)
  // Ties go to the lower index (rows 0 and 1); experts in descending score.
  // CHECK:      [1,   3],
  // CHECK-NEXT: [1,   2],
  // CHECK-NEXT: [1,   2],
  // CHECK-NEXT: [3,   1]]
  %e0 = tensor.cast %e : tensor<4x2xi32> to tensor<*xi32>
  call @printMemrefI32(%e0) : (tensor<*xi32>) -> ()
  // CHECK:      [1,   3,   2,   3],
  // CHECK-NEXT: [0,   1,   1,   -1],
  // CHECK-NEXT: [1,   4,   3,   2],
  // CHECK-NEXT: [2,   5,   3,   7]]
  %l0 = tensor.cast %l : tensor<4x4xf32> to tensor<*xf32>
  call @printMemrefF32(%l0) : (tensor<*xf32>) -> ()
  // Rows 0 and 1 tie: renormalised to 1/2 each, times the scaling 2.
  // CHECK:      [1,   1],
  // CHECK-NEXT: [1,   1],
  %w0 = tensor.cast %w : tensor<4x2xf32> to tensor<*xf32>
  call @printMemrefF32(%w0) : (tensor<*xf32>) -> ()

  // A NaN selection score loses to every number, even as the first
  // candidate: expert 0 is never picked. The -0.5 bias of expert 3 moves it
  // behind expert 2 except in row 3.
  %nan = arith.constant dense<[0x7FC00000, 0.0, 0.0, -0.5]> : tensor<4xf32>
  %wn, %en, %ln = call @top2(%x, %wr, %nan)
      : (tensor<4x2xf32>, tensor<2x4xf32>, tensor<4xf32>)
      -> (tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x4xf32>)
  // CHECK:      [1,   2],
  // CHECK-NEXT: [1,   2],
  // CHECK-NEXT: [1,   2],
  // CHECK-NEXT: [3,   1]]
  %e1 = tensor.cast %en : tensor<4x2xi32> to tensor<*xi32>
  call @printMemrefI32(%e1) : (tensor<*xi32>) -> ()

  // Groups {0,1} {2,3} {4,5} {6,7}. Token 0: scores rank the experts 7 > 0 >
  // 1 > 6 > ..., group sums pick {0,1} and {6,7}. Token 1: the best expert
  // (2) alone does not save its group {2,3}; groups {4,5} and {6,7} win.
  %gx = arith.constant dense<[[1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                              [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]>
      : tensor<2x8xf32>
  %gwr = arith.constant dense<[
      [3.0, 2.0, -4.0, -4.0, -1.0, -2.0, 1.0, 4.0],
      [-3.0, -3.0, 5.0, -5.0, 2.0, 2.0, 1.0, 1.0],
      [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
      [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
      [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
      [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
      [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
      [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]]> : tensor<8x8xf32>
  %ge = call @grouped(%gx, %gwr) : (tensor<2x8xf32>, tensor<8x8xf32>)
      -> tensor<2x3xi32>
  // CHECK:      [7,   0,   1],
  // CHECK-NEXT: [4,   5,   6]]
  %g0 = tensor.cast %ge : tensor<2x3xi32> to tensor<*xi32>
  call @printMemrefI32(%g0) : (tensor<*xi32>) -> ()
  return
}
