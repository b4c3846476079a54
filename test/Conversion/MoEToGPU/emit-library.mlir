// moe-gpu-emit-library writes the GPU library the kernel builder makes into a
// module: the same text as gen_gpu_library.py's library once printed, and an
// error where the module already holds one of its symbols.
// RUN: rm -rf %t && split-file %s %t
// RUN: moe-opt %t/empty.mlir --moe-gpu-emit-library | FileCheck %s
// RUN: moe-opt %t/empty.mlir --moe-gpu-emit-library -o %t/built.mlir
// RUN: %PYTHON %moe_src_root/lib/Conversion/MoEToGPU/gen_gpu_library.py | moe-opt -o %t/generated.mlir
// RUN: diff %t/generated.mlir %t/built.mlir
// RUN: moe-opt %t/taken.mlir --moe-gpu-emit-library --verify-diagnostics
// With configs, the host functions of those roles launch their kernels under
// the library's names; the others keep the library's.
// RUN: moe-opt %t/empty.mlir --moe-gpu-emit-library="configs=dact:dact_unroll=8,expert_ffn.down:stages=2" | FileCheck %s --check-prefix=CONFIGS
// RUN: not moe-opt %t/empty.mlir --moe-gpu-emit-library="configs=dact:dact_unroll=3" 2>&1 | FileCheck %s --check-prefix=BADCONFIG

// CHECK: module attributes {gpu.container_module}
// CHECK: gpu.module @moe_kernels
// CHECK: gpu.func @moe_gemm_up_gather(
// CHECK: gpu.func @moe_add(
// CHECK: func.func private @__moe_gpu_exp(
// CHECK: func.func private @moeTensorMapDeviceBf16(
// CHECK: func.func private @__moe_gpu_router(
// CHECK: func.func private @__moe_gpu_router_grad_acc(

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
