// A whole moe.layer on the CPU, with a checkpoint region and an offloaded
// tensor crossing function boundaries as !moe.host_tensor.
// RUN: moe-opt %s --moe-lower-to-cpu-pipeline | \
// RUN:   mlir-runner -e main -entry-point-result=void \
// RUN:     -shared-libs=%mlir_runner_utils,%mlir_c_runner_utils | FileCheck %s

func.func private @printMemrefI32(tensor<*xi32>)
func.func private @printMemrefF32(tensor<*xf32>)

// Top-1 of two experts with renormalisation: every weight is exactly 1.
// capacity = ceil(1.0 * 4 * 1 / 2) = 2.
func.func @forward(%x: tensor<4x2xf32>, %wr: tensor<2x2xf32>,
                   %wgu: tensor<2x2x2xf32>, %wd: tensor<2x2x2xf32>)
    -> (tensor<4x2xf32>, !moe.host_tensor<4x2xf32>) {
  %out, %logits = moe.checkpoint (%x, %wr, %wgu, %wd)
      : (tensor<4x2xf32>, tensor<2x2xf32>, tensor<2x2x2xf32>,
         tensor<2x2x2xf32>) -> (tensor<4x2xf32>, tensor<4x2xf32>) {
  ^bb0(%a: tensor<4x2xf32>, %b: tensor<2x2xf32>, %c: tensor<2x2x2xf32>,
       %d: tensor<2x2x2xf32>):
    %0, %1 = moe.layer %a, %b, %c, %d
        {activation = #moe.activation<silu>, capacity_factor = 1.0,
         routing = #moe.routing<scoring = softmax, top_k = 1,
                                renormalize = true>}
        : tensor<4x2xf32>, tensor<2x2xf32>, tensor<2x2x2xf32>,
          tensor<2x2x2xf32> -> tensor<4x2xf32>, tensor<4x2xf32>
    moe.yield %0, %1 : tensor<4x2xf32>, tensor<4x2xf32>
  }
  %host = moe.offload %logits : tensor<4x2xf32> -> !moe.host_tensor<4x2xf32>
  return %out, %host : tensor<4x2xf32>, !moe.host_tensor<4x2xf32>
}

func.func @backward(%host: !moe.host_tensor<4x2xf32>) -> tensor<4x2xf32> {
  %logits = moe.prefetch %host
      : !moe.host_tensor<4x2xf32> -> tensor<4x2xf32>
  return %logits : tensor<4x2xf32>
}

func.func @main() {
  %x = arith.constant dense<[[1.0, 0.0], [0.0, 1.0], [2.0, 0.0], [0.5, 0.0]]>
      : tensor<4x2xf32>
  %wr = arith.constant dense<[[1.0, 0.0], [0.0, 1.0]]> : tensor<2x2xf32>
  %wgu = arith.constant dense<[[[1.0, 0.0], [0.0, 1.0]],
                               [[2.0, 0.0], [0.0, 2.0]]]> : tensor<2x2x2xf32>
  %wd = arith.constant dense<[[[1.0, 0.0], [0.0, 1.0]],
                              [[1.0, 0.0], [0.0, 1.0]]]> : tensor<2x2x2xf32>
  %out, %host = call @forward(%x, %wr, %wgu, %wd)
      : (tensor<4x2xf32>, tensor<2x2xf32>, tensor<2x2x2xf32>,
         tensor<2x2x2xf32>) -> (tensor<4x2xf32>, !moe.host_tensor<4x2xf32>)
  // Tokens 0, 2, 3 pick expert 0, token 1 expert 1; expert 0 keeps tokens 0
  // and 2 only, so token 3 gets 0. round(1000 out): silu(1) = 0.731059,
  // silu(2) = 1.761594 (expert 1 doubles its input).
  // CHECK:      [731,   0],
  // CHECK-NEXT: [0,   1762],
  // CHECK-NEXT: [1762,   0],
  // CHECK-NEXT: [0,   0]]
  %thousand = arith.constant dense<1000.0> : tensor<4x2xf32>
  %s = arith.mulf %out, %thousand : tensor<4x2xf32>
  %r = math.round %s : tensor<4x2xf32>
  %i = arith.fptosi %r : tensor<4x2xf32> to tensor<4x2xi32>
  %u0 = tensor.cast %i : tensor<4x2xi32> to tensor<*xi32>
  call @printMemrefI32(%u0) : (tensor<*xi32>) -> ()
  // The logits come back from the host unchanged.
  // CHECK:      [1,   0],
  // CHECK-NEXT: [0,   1],
  // CHECK-NEXT: [2,   0],
  // CHECK-NEXT: [0.5,   0]]
  %logits = call @backward(%host)
      : (!moe.host_tensor<4x2xf32>) -> tensor<4x2xf32>
  %u1 = tensor.cast %logits : tensor<4x2xf32> to tensor<*xf32>
  call @printMemrefF32(%u1) : (tensor<*xf32>) -> ()
  return
}
