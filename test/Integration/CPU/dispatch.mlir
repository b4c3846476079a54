// Dispatch queues on the CPU: capacity, dropping, invalid experts, unused
// rows (docs/cpu-path.md section 2, "Dispatch").
// RUN: moe-opt %s --moe-lower-to-cpu-pipeline | \
// RUN:   mlir-runner -e main -entry-point-result=void \
// RUN:     -shared-libs=%mlir_runner_utils,%mlir_c_runner_utils | FileCheck %s

func.func private @printMemrefI32(tensor<*xi32>)

func.func @dispatch(%experts: tensor<5x2xi32>)
    -> (tensor<10xi32>, tensor<4xi32>, tensor<5x2xi32>) {
  // capacity = ceil(0.9 * 5 * 2 / 3) = 3
  %ids, %offs, %rows = moe.dispatch %experts
      {num_experts = 3 : i64, capacity_factor = 0.9}
      : tensor<5x2xi32> -> tensor<10xi32>, tensor<4xi32>, tensor<5x2xi32>
  return %ids, %offs, %rows : tensor<10xi32>, tensor<4xi32>, tensor<5x2xi32>
}

// The same without a capacity factor, with T only known at run time.
func.func private @dispatch_dropless(%experts: tensor<?x2xi32>)
    -> (tensor<?xi32>, tensor<4xi32>, tensor<?x2xi32>) {
  %ids, %offs, %rows = moe.dispatch %experts {num_experts = 3 : i64}
      : tensor<?x2xi32> -> tensor<?xi32>, tensor<4xi32>, tensor<?x2xi32>
  return %ids, %offs, %rows : tensor<?xi32>, tensor<4xi32>, tensor<?x2xi32>
}

func.func @main() {
  // Token 3 picks expert 7 (out of range) and token 4 picks -1: dropped.
  %experts = arith.constant dense<[[1, 0], [1, 2], [1, 0], [7, 1], [-1, 1]]>
      : tensor<5x2xi32>
  %ids, %offs, %rows = call @dispatch(%experts)
      : (tensor<5x2xi32>) -> (tensor<10xi32>, tensor<4xi32>, tensor<5x2xi32>)
  // Expert 1 keeps its first 3 of 5 pairs: (0,0) (1,0) (2,0); expert 0 gets
  // (0,1) (2,1); expert 2 gets (1,1). Rows 6..9 are unused.
  // CHECK: [0,  2,  0,  1,  2,  1,  0,  0,  0,  0]
  // CHECK: [0,  2,  5,  6]
  // CHECK:      [2,   0],
  // CHECK-NEXT: [3,   5],
  // CHECK-NEXT: [4,   1],
  // CHECK-NEXT: [-1,   -1],
  // CHECK-NEXT: [-1,   -1]]
  %u0 = tensor.cast %ids : tensor<10xi32> to tensor<*xi32>
  call @printMemrefI32(%u0) : (tensor<*xi32>) -> ()
  %u1 = tensor.cast %offs : tensor<4xi32> to tensor<*xi32>
  call @printMemrefI32(%u1) : (tensor<*xi32>) -> ()
  %u2 = tensor.cast %rows : tensor<5x2xi32> to tensor<*xi32>
  call @printMemrefI32(%u2) : (tensor<*xi32>) -> ()

  %dyn = tensor.cast %experts : tensor<5x2xi32> to tensor<?x2xi32>
  %ids2, %offs2, %rows2 = call @dispatch_dropless(%dyn)
      : (tensor<?x2xi32>) -> (tensor<?xi32>, tensor<4xi32>, tensor<?x2xi32>)
  // Dropless: every valid pair is kept, expert by expert in token order.
  // CHECK: [0,  2,  0,  1,  2,  3,  4,  1,  0,  0]
  // CHECK: [0,  2,  7,  8]
  // CHECK:      [2,   0],
  // CHECK-NEXT: [3,   7],
  // CHECK-NEXT: [4,   1],
  // CHECK-NEXT: [-1,   5],
  // CHECK-NEXT: [-1,   6]]
  %v0 = tensor.cast %ids2 : tensor<?xi32> to tensor<*xi32>
  call @printMemrefI32(%v0) : (tensor<*xi32>) -> ()
  %v1 = tensor.cast %offs2 : tensor<4xi32> to tensor<*xi32>
  call @printMemrefI32(%v1) : (tensor<*xi32>) -> ()
  %v2 = tensor.cast %rows2 : tensor<?x2xi32> to tensor<*xi32>
  call @printMemrefI32(%v2) : (tensor<*xi32>) -> ()
  return
}
