// moe-gpu-emit-library writes the GPU library the kernel builder makes into a
// module, and an error where the module already holds one of its symbols.
// The library's text is pinned by its SHA-256: the kernels, device and host
// functions whose outputs and speed were checked on the GPU. A change of any of
// them changes the digest; one made on purpose updates it here, with the op
// checks and a same-run timing on the GPU (docs/gpu-kernels.md), or, where the
// PTX stays the same (Target/NVPTX/moe-kernels-ptx.mlir's digest), alone.
// RUN: rm -rf %t && split-file %s %t
// RUN: moe-opt %t/empty.mlir --moe-gpu-emit-library | FileCheck %s
// RUN: moe-opt %t/empty.mlir --moe-gpu-emit-library | %PYTHON -c "import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())" | FileCheck %s --check-prefix=DIGEST
// DIGEST: {{^}}2866f223747b6a2d4f0338f08beaa30940689e60304374ff9f9d21c68ca300c0{{$}}
// RUN: moe-opt %t/taken.mlir --moe-gpu-emit-library --verify-diagnostics
// With configs, the host functions of those roles launch their kernels under
// the library's names; the others keep the library's.
// RUN: moe-opt %t/empty.mlir --moe-gpu-emit-library="configs=dact:dact_unroll=8,expert_ffn.down:stages=2" | FileCheck %s --check-prefix=CONFIGS
// RUN: not moe-opt %t/empty.mlir --moe-gpu-emit-library="configs=dact:dact_unroll=3" 2>&1 | FileCheck %s --check-prefix=BADCONFIG

// CHECK: module attributes {gpu.container_module}
// CHECK: gpu.module @moe_kernels
// CHECK: gpu.func @moe_gemm_up_gather(
// CHECK: gpu.func @moe_add(
// CHECK: gpu.func @moe_selection_bias_count(
// CHECK: gpu.func @moe_selection_bias_update(
// CHECK: gpu.func @moe_gather_rows(
// CHECK: gpu.func @moe_ep_queue_fill(
// CHECK: gpu.func @moe_scale_rows(
// CHECK: gpu.func @moe_token_sum(
// CHECK: gpu.func @moe_aux_counts(
// CHECK: gpu.func @moe_aux_loss_grad(
// CHECK: gpu.func @moe_dispatch_scan_capacity(
// CHECK: gpu.func @moe_dispatch_place_capacity(
// CHECK: gpu.func @moe_segment_colsum(
// CHECK: gpu.func @moe_sum_splits_f32(
// CHECK: gpu.func @moe_bias_dweights(
// CHECK: func.func private @__moe_gpu_exp(
// CHECK: func.func private @moeTensorMapDeviceBf16(
// CHECK: func.func private @__moe_gpu_router(
// CHECK: func.func private @__moe_gpu_update_selection_bias(
// CHECK: func.func private @__moe_gpu_router_grad_acc(
// CHECK: func.func private @__moe_gpu_ep_pack(
// CHECK: func.func private @__moe_gpu_scatter_rows(
// CHECK: func.func private @__moe_gpu_combine_grad(
// CHECK: func.func private @__moe_gpu_expert_ffn_grad(
// CHECK: func.func private @__moe_gpu_dispatch_capacity(
// CHECK: func.func private @__moe_gpu_aux_loss(
// CHECK: func.func private @__moe_gpu_aux_loss_grad(
// CHECK: func.func private @__moe_gpu_expert_combine_grad_bias(
// CHECK: func.func private @__moe_gpu_expert_combine_grad_bias_acc(
// CHECK: func.func private @__moe_gpu_expert_ffn_grad_bias(

// CONFIGS: gpu.func @moe_gemm_rows_mn_bf16(
// CONFIGS: gpu.func @moe_gemm_rows_mn_bf16_s2(
// CONFIGS: gpu.func @moe_gemm_dact_gather_u8(
// CONFIGS: gpu.func @moe_gemm_dact_rows_u8(
// CONFIGS-LABEL: func.func private @__moe_gpu_router(
// CONFIGS-LABEL: func.func private @__moe_gpu_expert_ffn(
// CONFIGS: @moe_kernels::@moe_gemm_up_gather blocks
// CONFIGS: @moe_kernels::@moe_gemm_rows_mn_bf16_s2 blocks
// CONFIGS-LABEL: func.func private @__moe_gpu_shared_expert(
// CONFIGS: @moe_kernels::@moe_gemm_rows_mn_bf16 blocks
// CONFIGS-LABEL: func.func private @__moe_gpu_expert_combine_grad(
// CONFIGS: @moe_kernels::@moe_gemm_dact_gather_u8 blocks
// CONFIGS-LABEL: func.func private @__moe_gpu_shared_expert_grad(
// CONFIGS: @moe_kernels::@moe_gemm_dact_rows_u8 blocks
// BADCONFIG: error: in @__moe_gpu_expert_combine_grad: kernel config 'dact' gives #moe_gpu.gemm<{{.*}}dact_unroll = 3>: dact_unroll must be 1, 2, 4 or 8, got 3

//--- empty.mlir
module {
}

//--- taken.mlir
// expected-error @+1 {{moe-gpu-emit-library: the module already has @__moe_gpu_add, a symbol of the GPU library}}
module {
  func.func @__moe_gpu_add() {
    return
  }
}
