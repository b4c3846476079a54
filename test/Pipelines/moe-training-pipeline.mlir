// The registered pipeline without chip (decomposition only), its passes, and
// its option checks. With chip=sm_90a: moe-training-pipeline-gpu.mlir.
// RUN: moe-opt %s --moe-training-pipeline | FileCheck %s
// RUN: moe-opt %s --moe-training-pipeline="memory-budget=4GiB offload=auto" | FileCheck %s
// RUN: moe-opt %s --pass-pipeline='builtin.module(moe-training-pipeline{chip= memory-budget=1.5GB})' | FileCheck %s
// RUN: moe-opt %s --moe-training-pipeline --dump-pass-pipeline -o /dev/null 2>&1 | FileCheck %s --check-prefix=DUMP
// RUN: not moe-opt %s --moe-training-pipeline="chip=sm_80" 2>&1 | FileCheck %s --check-prefix=CHIP
// RUN: not moe-opt %s --moe-training-pipeline="memory-budget=4GiX" 2>&1 | FileCheck %s --check-prefix=BUDGET
// RUN: not moe-opt %s --moe-training-pipeline="memory-budget=-1" 2>&1 | FileCheck %s --check-prefix=NEGATIVE
// RUN: not moe-opt %s --moe-training-pipeline="offload=sometimes" 2>&1 | FileCheck %s --check-prefix=OFFLOAD
// RUN: moe-opt --help | FileCheck %s --check-prefix=HELP
// Every option is checked, with or without chip (these were accepted without it):
// RUN: not moe-opt %s --moe-training-pipeline="policy=frugal" 2>&1 | FileCheck %s --check-prefix=POLICY
// RUN: not moe-opt %s --moe-training-pipeline="format=offload" 2>&1 | FileCheck %s --check-prefix=FORMAT
// RUN: not moe-opt %s --moe-training-pipeline="gpu-tflops=0" 2>&1 | FileCheck %s --check-prefix=RATE

// DUMP: builtin.module(
// DUMP-NEXT: moe-decompose,
// DUMP-NEXT: canonicalize{
// DUMP-NEXT: cse
// DUMP-NEXT: )
// CHIP: unsupported chip 'sm_80': the kernels use wgmma and setmaxnreg, which need sm_90a
// BUDGET: unknown unit 'GiX' in memory size '4GiX'
// NEGATIVE: memory size '-1' must start with a non-negative number
// OFFLOAD: Cannot find option named 'sometimes'
// POLICY: moe-training-pipeline: unknown policy 'frugal' (expected keep, recompute, offload or auto)
// FORMAT: moe-training-pipeline: unknown format 'offload' (expected bin, isa or fatbin)
// RATE: moe-training-pipeline: gpu-tflops and host-gbps must be positive
// HELP: --moe-decompose
// HELP: --moe-training-pipeline
// HELP-DAG: --chip=<string>
// HELP-DAG: --memory-budget=<string>
// HELP-DAG: --offload=<value>
// HELP-DAG: --host-gbps=<number>
// HELP-DAG: --memory-report=<string>

// The layer is decomposed; the unused router logits stay (the router makes
// them anyway).
// CHECK-LABEL: func.func @layer
// CHECK-NOT: moe.layer
// CHECK: moe.router
// CHECK: moe.dispatch
// CHECK: moe.expert_ffn
// CHECK: moe.combine
func.func @layer(%x: tensor<37x48xbf16>, %wr: tensor<48x5xbf16>,
                 %wgu: tensor<5x48x80xbf16>, %wd: tensor<5x40x48xbf16>)
    -> tensor<37x48xbf16> {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x48xbf16>, tensor<48x5xbf16>, tensor<5x48x80xbf16>,
        tensor<5x40x48xbf16> -> tensor<37x48xbf16>, tensor<37x5xf32>
  return %out : tensor<37x48xbf16>
}
