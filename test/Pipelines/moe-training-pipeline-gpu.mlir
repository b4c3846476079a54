// moe-training-pipeline with chip=sm_90a: forward and backward host code in
// the LLVM dialect calling the mgpu* runtime, with each kernel the layer
// launches embedded as a gpu.binary of its own and no other (docs/gpu-path.md).
// Checks structure only: nothing runs here.
// RUN: moe-opt %s --moe-training-pipeline="chip=sm_90a format=isa" --dump-pass-pipeline -o /dev/null 2>&1 | FileCheck %s --check-prefix=DUMP
// RUN: moe-opt %s --moe-training-pipeline="chip=sm_90a format=isa" -o %t.isa.mlir
// RUN: FileCheck %s < %t.isa.mlir
// The shared expert's and the H-only kernels are not launched, so not there.
// RUN: grep -c "^  gpu.binary @moe_gemm_up_gather " %t.isa.mlir | FileCheck %s --check-prefix=ONCE
// RUN: not grep -q "gpu.binary @moe_gemm_up_rows\|gpu.binary @moe_gemm_up_gather_h\|gpu.binary @moe_kernels" %t.isa.mlir
// ONCE: {{^}}1{{$}}
// RUN: moe-opt %s --pass-pipeline='builtin.module(moe-training-pipeline{chip=sm_90a format=isa opt-level=2})' | FileCheck %s
// RUN: moe-opt %s --moe-training-pipeline="chip=sm_90a format=isa" | mlir-translate --mlir-to-llvmir | FileCheck %s --check-prefix=LLVM
// RUN: %if ptxas %{ moe-opt %s --moe-training-pipeline="chip=sm_90a" | mlir-translate --mlir-to-llvmir | FileCheck %s --check-prefix=CUBIN %}
// RUN: not moe-opt %s --moe-training-pipeline="chip=sm_90a format=offload" 2>&1 | FileCheck %s --check-prefix=FORMAT
// RUN: not moe-opt %s --moe-training-pipeline="chip=sm_90a opt-level=4" 2>&1 | FileCheck %s --check-prefix=OPT
// RUN: moe-opt %s --moe-training-pipeline="chip=sm_90a format=isa policy=recompute" 2>&1 | FileCheck %s --check-prefix=PLAN
// RUN: not moe-opt %s --moe-training-pipeline="chip=sm_90a format=isa policy=fast" 2>&1 | FileCheck %s --check-prefix=POLICY
// RUN: not moe-opt %s --moe-training-pipeline="chip=sm_90" 2>&1 | FileCheck %s --check-prefix=CHIP
// RUN: moe-opt %s --moe-training-pipeline="chip=sm_90a format=isa policy=offload" 2>&1 | FileCheck %s --check-prefix=OFFLOAD
// RUN: moe-opt %s --moe-training-pipeline="chip=sm_90a format=isa offload=always" 2>&1 | FileCheck %s --check-prefix=OFFLOAD
// RUN: moe-opt %s --moe-training-pipeline="chip=sm_90a format=isa offload=auto memory-budget=7000 host-gbps=1e9" 2>&1 | FileCheck %s --check-prefix=OFFLOAD
// RUN: not moe-opt %s --moe-training-pipeline="chip=sm_90a format=isa policy=keep offload=always" 2>&1 | FileCheck %s --check-prefix=CONTRADICT
// RUN: not moe-opt %s --moe-training-pipeline="chip=sm_90a format=isa memory-budget=1KiB" 2>&1 | FileCheck %s --check-prefix=BUDGET
// RUN: moe-opt %s --moe-training-pipeline="chip=sm_90a format=isa memory-report=-" -o /dev/null | FileCheck %s --check-prefix=REPORT
// RUN: moe-opt %s --moe-training-pipeline="chip=sm_90a format=isa memory-report=- offload=auto host-gbps=20 gpu-tflops=500" --dump-pass-pipeline -o /dev/null 2>&1 | FileCheck %s --check-prefix=DUMP-OPTIONS

// moe-plan-activations runs before moe-generate-backward; with a recompute plan
// convert-moe-to-gpu runs the checkpointed expert FFN in place in forward, and
// backward launches the up-projection again instead of reading a saved H.
// PLAN: remark: activation plan 'recompute' (policy recompute): keep saves 44420 B
// PLAN: llvm.func @layer_forward(
// PLAN: @moe_gemm_up_gather{{(_h)?}}::@moe_gemm_up_gather
// PLAN: llvm.func @layer_backward(
// PLAN: @moe_gemm_up_gather{{(_h)?}}::@moe_gemm_up_gather
// POLICY: error: moe-training-pipeline: unknown policy 'fast' (expected keep, recompute, offload or auto)

// Offload plans (asked for, or chosen by auto when offload=auto and the link
// is fast): forward copies h to the host after the expert FFN's launches, and
// backward brings it back before the gradient's.
// OFFLOAD: llvm.func @layer_forward(
// OFFLOAD: @moe_gemm_up_gather::@moe_gemm_up_gather
// OFFLOAD: llvm.call @mgpuMoeOffload(
// OFFLOAD: llvm.call @mgpuMoeOffloadsFinish()
// OFFLOAD: llvm.func @layer_backward(
// OFFLOAD: llvm.call @mgpuMoePrefetch(
// OFFLOAD: llvm.call @mgpuMoeAwaitPrefetch(
// OFFLOAD: @moe_gemm_{{[a-z0-9_]+}}::@moe_gemm_
// CONTRADICT: error: moe-training-pipeline: offload=always contradicts policy=keep
// BUDGET: moe-training-pipeline-gpu.mlir:[[# @LINE + 96]]:1: error: memory-budget 1024 B (9.54e-07 GiB) cannot be met with policy=auto: the smallest budget it can meet is 6532 B (6.08e-06 GiB)

// The report is of what the GPU path runs: after moe-fold-adds (backward's
// add is gone into the router's dx), y alone in forward's arena and the
// weights' gradient in backward's, at the offsets the conversion uses.
// REPORT: moe-plan-memory: forward @layer_forward ops [0, 4], backward @layer_backward ops [5, 7], alignment 256 B
// REPORT: buffer 6 moe.expert_ffn.y: 9472 B at offset 0 in @layer_forward, live [2, 3]
// REPORT: buffer 10 moe.expert_combine_grad.d_weights: 296 B at offset 0 in @layer_backward, live [5, 6]
// REPORT: peak: 241324 B
// REPORT-NEXT: arena @layer_forward: 9472 B
// REPORT-NEXT: arena @layer_backward: 296 B
// REPORT: saved for backward: 39684 B

// DUMP-OPTIONS: moe-plan-activations{auto-offload=true gpu-tflops=5.000000e+02 host-gbps=2.000000e+01 memory-budget= policy=auto report=false}
// DUMP-OPTIONS-NEXT: ),
// DUMP-OPTIONS-NEXT: moe-generate-backward,
// DUMP-OPTIONS-NEXT: moe-offload{prefetch=early},
// DUMP-OPTIONS-NEXT: moe-gpu-select-kernels{chip=sm_90a {{.*}}},
// DUMP-OPTIONS-NEXT: moe-fold-adds,
// DUMP-OPTIONS-NEXT: moe-ep-stages,
// DUMP-OPTIONS-NEXT: moe-plan-memory{alignment=256 memory-report=-},
// DUMP-OPTIONS-NEXT: convert-moe-to-gpu{library=},

// DUMP: builtin.module(
// DUMP-NEXT: moe-decompose,
// DUMP-NEXT: canonicalize{
// DUMP-NEXT: func.func(
// DUMP-NEXT: moe-plan-activations{auto-offload=false gpu-tflops=7.800000e+02 host-gbps=5.500000e+01 memory-budget= policy=auto report=false}
// DUMP-NEXT: ),
// DUMP-NEXT: moe-generate-backward,
// DUMP-NEXT: moe-offload{prefetch=early},
// DUMP-NEXT: moe-gpu-select-kernels{chip=sm_90a {{.*}}},
// DUMP-NEXT: moe-fold-adds,
// DUMP-NEXT: moe-ep-stages,
// DUMP-NEXT: moe-plan-memory{alignment=256 memory-report=},
// DUMP-NEXT: convert-moe-to-gpu{library=},
// DUMP-NEXT: inline{
// DUMP-NEXT: symbol-dce,
// DUMP-NEXT: canonicalize{
// DUMP-NEXT: cse,
// DUMP-NEXT: moe-gpu-split-kernel-modules,
// DUMP-NEXT: nvvm-attach-target{O=3 chip=sm_90a {{.*}}features=+ptx80
// DUMP-NEXT: convert-nvgpu-to-nvvm,
// DUMP-NEXT: gpu.module(
// DUMP: convert-gpu-to-nvvm{{.*}}use-bare-ptr-memref-call-conv=false}
// DUMP-NEXT: moe-align-dynamic-shared-memory{alignment=1024}
// DUMP: ),
// DUMP-NEXT: expand-strided-metadata,
// DUMP-NEXT: lower-affine,
// DUMP-NEXT: convert-scf-to-cf{
// DUMP-NEXT: gpu-to-llvm{{.*}}use-bare-pointers-for-kernels=false}
// DUMP-NEXT: convert-to-llvm{
// DUMP-NEXT: reconcile-unrealized-casts,
// DUMP-NEXT: gpu-module-to-binary{format=isa
// DUMP-NEXT: canonicalize{
// DUMP-NEXT: )

// FORMAT: moe-training-pipeline: unknown format 'offload' (expected bin, isa or fatbin)
// OPT: moe-training-pipeline: opt-level must be 0 to 3, got 4
// CHIP: unsupported chip 'sm_90': the kernels use wgmma and setmaxnreg, which need sm_90a

// The host functions were inlined; only the two entry functions and the
// runtime declarations are left, with the parameter metadata moe-compile
// reads. The original @layer is dropped.
// CHECK-NOT: func.func
// CHECK-NOT: @__moe_gpu_
// CHECK-NOT: llvm.func @layer(
// CHECK-LABEL: llvm.func @layer_forward(
// CHECK-SAME: moe.gpu.entry = "forward"
// CHECK-SAME: moe.gpu.layer_name = "layer"
// CHECK-SAME: moe.gpu.workspace_bytes = 9472 : i64
// CHECK: llvm.call @mgpuStreamCreate()
// CHECK: llvm.call @mgpuMemAlloc(
// CHECK: llvm.call @mgpuMemFree(
// CHECK: llvm.call @mgpuStreamSynchronize(
// CHECK: llvm.call @mgpuStreamDestroy(
// CHECK-LABEL: llvm.func @layer_backward(
// CHECK-SAME: moe.gpu.entry = "backward"
// CHECK-NOT: __moe_gpu_
// CHECK: gpu.binary @
// CHECK: gpu.binary @moe_gemm_up_gather {{ *}}[#gpu.object<#nvvm.target<{{.*}}chip = "sm_90a", features = "+ptx80">, {{.*}}assembly = "
// The dynamic shared memory is one external 1024-aligned array (docs/gpu-kernels.md, pitfall P6).
// CHECK-SAME: .extern .shared .align 1024 .b8 __dynamic_shmem__0[]

// PTX is JIT-compiled when the module loads, in a global constructor.
// LLVM-DAG: define void @layer_forward(ptr
// LLVM-DAG: define void @layer_backward(ptr
// LLVM-DAG: @llvm.global_ctors = appending global {{.*}} @moe_gemm_up_gather_load
// LLVM-DAG: call ptr @mgpuModuleLoadJIT(ptr @moe_gemm_up_gather_binary, i32 3)
// LLVM-DAG: call void @mgpuLaunchKernel(ptr
// LLVM-DAG: declare void @mgpuLaunchKernel(ptr, i64, i64, i64, i64, i64, i64, i32, ptr, ptr, ptr, i64)

// format=bin (the default): a cubin from ptxas, loaded with its size.
// CUBIN-DAG: call ptr @mgpuModuleLoad(ptr @moe_gemm_up_gather_binary, i64 {{[0-9]+}})
// CUBIN-DAG: call void @mgpuLaunchKernel(ptr

func.func @layer(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>,
                 %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<37x4xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>,
        tensor<4x128x64xbf16> -> tensor<37x64xbf16>, tensor<37x4xf32>
  return %out, %logits : tensor<37x64xbf16>, tensor<37x4xf32>
}
