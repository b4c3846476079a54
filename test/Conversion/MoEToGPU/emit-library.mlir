// moe-gpu-emit-library writes the GPU library the kernel builder makes into a
// module: the same text as gen_gpu_library.py's library once printed, and an
// error where the module already holds one of its symbols.
// RUN: rm -rf %t && split-file %s %t
// RUN: moe-opt %t/empty.mlir --moe-gpu-emit-library | FileCheck %s
// RUN: moe-opt %t/empty.mlir --moe-gpu-emit-library -o %t/built.mlir
// RUN: %PYTHON %moe_src_root/lib/Conversion/MoEToGPU/gen_gpu_library.py | moe-opt -o %t/generated.mlir
// RUN: diff %t/generated.mlir %t/built.mlir
// RUN: moe-opt %t/taken.mlir --moe-gpu-emit-library --verify-diagnostics

// CHECK: module attributes {gpu.container_module}
// CHECK: gpu.module @moe_kernels
// CHECK: gpu.func @moe_gemm_up_gather(
// CHECK: gpu.func @moe_add(
// CHECK: func.func private @__moe_gpu_exp(
// CHECK: func.func private @moeTensorMapDeviceBf16(
// CHECK: func.func private @__moe_gpu_router(
// CHECK: func.func private @__moe_gpu_router_grad_acc(

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
