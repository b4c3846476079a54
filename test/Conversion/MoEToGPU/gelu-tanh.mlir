// A gelu_tanh layer on the GPU path: like gelu (nongated.mlir), the up and
// dact roles of the expert and shared expert FFNs run the tanh-form kernels
// (activation = gelu_tanh, b = w_mn), launched by the host function variants;
// no erf kernel is built. Without moe-gpu-select-kernels the op's activation
// picks them too.
// RUN: moe-opt %s --moe-decompose --moe-generate-backward --moe-gpu-select-kernels --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu | FileCheck %s
// RUN: moe-opt %s --moe-decompose --moe-generate-backward --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=NOSELECT
// RUN: moe-opt %s --moe-decompose --moe-generate-backward --moe-gpu-select-kernels --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=NOERF

// CHECK-DAG: call @__moe_gpu_expert_ffn__moe_gemm_up_gather_gelu_tanh(
// CHECK-DAG: call @__moe_gpu_expert_combine_grad_acc__moe_gemm_dact_gather_gelu_tanh(
// CHECK-DAG: call @__moe_gpu_shared_expert__moe_gemm_up_rows_gelu_tanh(
// CHECK-DAG: call @__moe_gpu_shared_expert_grad__moe_gemm_dact_rows_gelu_tanh(
// CHECK-DAG: gpu.func @moe_gemm_up_gather_gelu_tanh(
// CHECK-DAG: gpu.func @moe_gemm_dact_gather_gelu_tanh(
// CHECK-DAG: gpu.func @moe_gemm_up_rows_gelu_tanh(
// CHECK-DAG: gpu.func @moe_gemm_dact_rows_gelu_tanh(

// NOERF-NOT: gelu_erf

// NOSELECT-DAG: call @__moe_gpu_expert_ffn__moe_gemm_up_gather_gelu_tanh(
// NOSELECT-DAG: gpu.func @moe_gemm_up_gather_gelu_tanh(

func.func @layer(%x: tensor<37x128xbf16>, %w_router: tensor<128x4xbf16>,
                 %w_gate_up: tensor<4x128x192xbf16>, %w_down: tensor<4x192x128xbf16>,
                 %shared_gate_up: tensor<128x128xbf16>, %shared_down: tensor<128x128xbf16>)
    -> (tensor<37x128xbf16>, tensor<37x4xf32>) {
  %out, %logits = moe.layer %x, %w_router, %w_gate_up, %w_down
      shared(%shared_gate_up, %shared_down : tensor<128x128xbf16>, tensor<128x128xbf16>)
      {activation = #moe.activation<gelu_tanh>,
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x128xbf16>, tensor<128x4xbf16>, tensor<4x128x192xbf16>,
        tensor<4x192x128xbf16> -> tensor<37x128xbf16>, tensor<37x4xf32>
  return %out, %logits : tensor<37x128xbf16>, tensor<37x4xf32>
}
