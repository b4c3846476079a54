// The non-gated experts (silu, gelu: its erf form) on the GPU path: the up
// and dact roles run the activation's kernels (activation = ..., the up
// GEMM's b = w_mn: H and A are n wide), built with the host function
// variants that launch them; the other GEMMs are the library's, with dH and
// W_gate_up n wide. gelu_tanh's layers are in gelu-tanh.mlir; here its
// kernels are configs of the kernel library alone (the ops harness builds
// them). A config that changes an op's activation, or breaks the
// activation's rules, is refused.
// RUN: rm -rf %t && split-file %s %t
// RUN: moe-opt %t/silu.mlir --moe-decompose --moe-generate-backward --moe-gpu-select-kernels --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=SILU
// RUN: sed 's/<silu>/<gelu>/' %t/silu.mlir | moe-opt --moe-decompose --moe-generate-backward --moe-gpu-select-kernels --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=GELU
// RUN: moe-opt %t/ffn.mlir --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=NOSELECT
// RUN: echo 'module {}' | moe-opt '--moe-gpu-emit-library=configs=expert_ffn.up:b=w_mn:activation=gelu_tanh,expert_combine_grad.dact:activation=gelu_tanh' | FileCheck %s --check-prefix=TANH
// RUN: not moe-opt %t/silu.mlir --moe-decompose --moe-gpu-select-kernels=configs=up:activation=gelu_tanh --moe-plan-memory --convert-moe-to-gpu 2>&1 | FileCheck %s --check-prefix=OTHER
// RUN: not moe-opt %t/silu.mlir --moe-decompose --moe-gpu-select-kernels=configs=up:b=w_mn_swiglu 2>&1 | FileCheck %s --check-prefix=GATEDB
// RUN: not moe-opt %t/silu.mlir --moe-decompose --moe-gpu-select-kernels=configs=down:activation=silu 2>&1 | FileCheck %s --check-prefix=NOTACT

// SILU-DAG: call @__moe_gpu_expert_ffn__moe_gemm_up_gather_silu(
// SILU-DAG: call @__moe_gpu_shared_expert__moe_gemm_up_rows_silu(
// SILU-DAG: call @__moe_gpu_expert_combine_grad_acc__moe_gemm_dact_gather_silu(
// SILU-DAG: call @__moe_gpu_shared_expert_grad__moe_gemm_dact_rows_silu(
// The activation's kernels, beside the library's; silu by the SFU sigmoid.
// SILU-DAG: gpu.func @moe_gemm_up_gather_silu(
// SILU-DAG: gpu.func @moe_gemm_dact_gather_silu(
// SILU-DAG: gpu.func @moe_gemm_up_rows_silu(
// SILU-DAG: gpu.func @moe_gemm_dact_rows_silu(
// SILU-DAG: gpu.func @moe_gemm_wgrad_gather_a(
// SILU-DAG: func.call @__moe_gpu_sigmoid

// GELU-DAG: call @__moe_gpu_expert_ffn__moe_gemm_up_gather_gelu_erf(
// GELU-DAG: call @__moe_gpu_expert_combine_grad_acc__moe_gemm_dact_gather_gelu_erf(
// GELU-DAG: call @__moe_gpu_shared_expert__moe_gemm_up_rows_gelu_erf(
// GELU-DAG: call @__moe_gpu_shared_expert_grad__moe_gemm_dact_rows_gelu_erf(
// erf by its rational approximation: a division and the SFU exp.
// GELU-DAG: gpu.func @moe_gemm_up_gather_gelu_erf(
// GELU-DAG: gpu.func @moe_gemm_dact_gather_gelu_erf(
// GELU-DAG: func.call @__moe_gpu_exp

// Without moe-gpu-select-kernels the op's activation still picks its kernels.
// NOSELECT: call @__moe_gpu_expert_ffn__moe_gemm_up_gather_silu(
// NOSELECT: gpu.func @moe_gemm_up_gather_silu(

// TANH-DAG: func.func private @__moe_gpu_expert_ffn(
// TANH-DAG: @moe_kernels::@moe_gemm_up_gather_gelu_tanh
// TANH-DAG: gpu.func @moe_gemm_up_gather_gelu_tanh(
// TANH-DAG: gpu.func @moe_gemm_dact_gather_gelu_tanh(

// OTHER: error: 'moe_gpu.kernels' chooses @moe_gemm_up_gather_gelu_tanh for 'up', which computes another GEMM than the one moe.expert_ffn runs there (@moe_gemm_up_gather_silu)
// GATEDB: error: kernel config 'up' gives {{.*}}: epilogue = swiglu with activation = silu (not gated) needs b = w_mn, got b = w_mn_swiglu
// NOTACT: error: kernel config 'down' gives {{.*}}: activation = silu needs epilogue = swiglu or dswiglu, got store_bf16

//--- silu.mlir
func.func @layer(%x: tensor<37x128xbf16>, %w_router: tensor<128x4xbf16>,
                 %w_gate_up: tensor<4x128x192xbf16>, %w_down: tensor<4x192x128xbf16>,
                 %shared_gate_up: tensor<128x128xbf16>, %shared_down: tensor<128x128xbf16>)
    -> (tensor<37x128xbf16>, tensor<37x4xf32>) {
  %out, %logits = moe.layer %x, %w_router, %w_gate_up, %w_down
      shared(%shared_gate_up, %shared_down : tensor<128x128xbf16>, tensor<128x128xbf16>)
      {activation = #moe.activation<silu>,
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x128xbf16>, tensor<128x4xbf16>, tensor<4x128x192xbf16>,
        tensor<4x192x128xbf16> -> tensor<37x128xbf16>, tensor<37x4xf32>
  return %out, %logits : tensor<37x128xbf16>, tensor<37x4xf32>
}

//--- ffn.mlir
func.func @ffn(%x: tensor<37x128xbf16>, %ids: tensor<74xi32>, %offsets: tensor<5xi32>,
               %wgu: tensor<4x128x192xbf16>, %wd: tensor<4x192x128xbf16>)
    -> (tensor<74x128xbf16>, tensor<74x192xbf16>) {
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd {activation = #moe.activation<silu>}
      : tensor<37x128xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<4x128x192xbf16>,
        tensor<4x192x128xbf16> -> tensor<74x128xbf16>, tensor<74x192xbf16>
  return %y, %h : tensor<74x128xbf16>, tensor<74x192xbf16>
}
