// moe ops in a nested module: the module passes work on the functions of the
// module they run on. convert-moe-to-linalg left calls of an undefined
// @__moe_cpu_router in the inner module, and the GPU pipeline exited 0 with
// the moe ops untouched. Each now fails with an error at the inner module,
// and runs when it is given the inner module.

// RUN: not moe-opt %s --convert-moe-to-linalg 2>&1 | FileCheck %s --check-prefix=LINALG
// RUN: not moe-opt %s --convert-moe-to-gpu 2>&1 | FileCheck %s --check-prefix=GPU
// RUN: not moe-opt %s --moe-generate-backward 2>&1 | FileCheck %s --check-prefix=BACKWARD
// RUN: not moe-opt %s --moe-offload 2>&1 | FileCheck %s --check-prefix=OFFLOAD
// RUN: not moe-opt %s --moe-plan-memory 2>&1 | FileCheck %s --check-prefix=MEMORY
// RUN: not moe-opt %s --moe-training-pipeline=chip=sm_90a 2>&1 | FileCheck %s --check-prefix=BACKWARD
// RUN: not moe-opt %s --moe-lower-to-cpu-pipeline 2>&1 | FileCheck %s --check-prefix=LINALG
// RUN: moe-opt %s --pass-pipeline='builtin.module(builtin.module(moe-generate-backward,convert-moe-to-linalg))' | FileCheck %s --check-prefix=INNER

// LINALG: nested-modules-regressions.mlir:[[@LINE+9]]:3: error: convert-moe-to-linalg runs on the functions of the module it is given, and this nested module holds moe ops it would not reach; run it on the nested module: --pass-pipeline='builtin.module(builtin.module(convert-moe-to-linalg))'
// GPU: [[@LINE+8]]:3: error: convert-moe-to-gpu runs on the functions
// BACKWARD: [[@LINE+7]]:3: error: moe-generate-backward runs on the functions
// OFFLOAD: [[@LINE+6]]:3: error: moe-offload runs on the functions
// MEMORY: [[@LINE+5]]:3: error: moe-plan-memory runs on the functions
// INNER: module @inner
// INNER: func.func @f_backward
// INNER: call @__moe_cpu_router_grad
module {
  module @inner {
    func.func @f(%x: tensor<8x16xf32>, %wr: tensor<16x4xf32>) -> tensor<8x4xf32> {
      %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
          : tensor<8x16xf32>, tensor<16x4xf32> -> tensor<8x2xf32>, tensor<8x2xi32>, tensor<8x4xf32>
      return %l : tensor<8x4xf32>
    }
  }
}
