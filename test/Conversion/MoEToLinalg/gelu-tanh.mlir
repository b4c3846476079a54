// gelu_tanh on the CPU path: the kernels get activation code 3 and the
// conversion copies the tanh-form helpers (forward and derivative) into the
// module; they lower through the whole CPU pipeline (math.tanh to libm's
// tanhf).
// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-cpu-pipeline | FileCheck %s --check-prefix=LLVM

// CHECK-LABEL: func.func @shared
// CHECK-DAG: %[[TANH:.*]] = arith.constant 3 : i32
// CHECK: call @__moe_cpu_shared_expert(%{{.*}}, %{{.*}}, %{{.*}}, %[[TANH]])
// CHECK-DAG: %[[TANH2:.*]] = arith.constant 3 : i32
// CHECK: call @__moe_cpu_shared_expert_grad(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[TANH2]])
// CHECK-DAG: func.func private @__moe_cpu_gelu_tanh(
// CHECK-DAG: func.func private @__moe_cpu_dgelu_tanh(
// CHECK-DAG: math.tanh

// LLVM-DAG: llvm.func @tanhf(
// LLVM-DAG: llvm.func @shared(
func.func @shared(%x: tensor<6x4xf32>, %wgu: tensor<4x3xf32>,
                  %wd: tensor<3x4xf32>) -> (tensor<6x4xf32>, tensor<4x3xf32>) {
  %y, %h = moe.shared_expert %x, %wgu, %wd {activation = #moe.activation<gelu_tanh>}
      : tensor<6x4xf32>, tensor<4x3xf32>, tensor<3x4xf32>
      -> tensor<6x4xf32>, tensor<6x3xf32>
  %dx, %dwgu, %dwd = moe.shared_expert_grad %x, %wgu, %wd, %h, %y
      {activation = #moe.activation<gelu_tanh>}
      : tensor<6x4xf32>, tensor<4x3xf32>, tensor<3x4xf32>, tensor<6x3xf32>,
        tensor<6x4xf32> -> tensor<6x4xf32>, tensor<4x3xf32>, tensor<3x4xf32>
  return %dx, %dwgu : tensor<6x4xf32>, tensor<4x3xf32>
}
