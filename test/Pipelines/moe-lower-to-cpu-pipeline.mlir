// The CPU reference pipeline: its passes, and the calling convention of what
// it produces (docs/cpu-path.md section 3).
// RUN: moe-opt %s --moe-lower-to-cpu-pipeline --dump-pass-pipeline -o /dev/null 2>&1 | FileCheck %s --check-prefix=DUMP
// RUN: moe-opt %s --moe-lower-to-cpu-pipeline | FileCheck %s
// RUN: moe-opt %s --pass-pipeline='builtin.module(moe-lower-to-cpu-pipeline)' | FileCheck %s
// RUN: moe-opt %s --moe-lower-to-cpu-pipeline | mlir-translate --mlir-to-llvmir | FileCheck %s --check-prefix=LLVM
// RUN: moe-opt --help | FileCheck %s --check-prefix=HELP

// DUMP: builtin.module(
// DUMP-NEXT: convert-moe-to-linalg,
// DUMP-NEXT: inline{
// DUMP-NEXT: symbol-dce,
// DUMP-NEXT: convert-elementwise-to-linalg,
// DUMP-NEXT: canonicalize{
// DUMP-NEXT: one-shot-bufferize{{{.*}}bufferize-function-boundaries=true{{.*}}function-boundary-type-conversion=identity-layout-map
// DUMP-NEXT: buffer-results-to-out-params{{{.*}}modify-public-functions=true}
// DUMP-NEXT: func.func(
// DUMP-NEXT: llvm-request-c-wrappers
// DUMP-NEXT: ),
// DUMP: ownership-based-buffer-deallocation
// DUMP: bufferization-lower-deallocations,
// DUMP: func.func(
// DUMP-NEXT: convert-linalg-to-loops
// DUMP-NEXT: ),
// DUMP-NEXT: expand-strided-metadata,
// DUMP-NEXT: lower-affine,
// DUMP-NEXT: convert-scf-to-cf{
// DUMP-NEXT: convert-math-to-libm,
// DUMP-NEXT: convert-to-llvm{
// DUMP-NEXT: reconcile-unrealized-casts
// DUMP-NEXT: )

// HELP: --moe-lower-to-cpu-pipeline

// Everything is in the LLVM dialect; the kernels were inlined and are gone.
// CHECK-NOT: func.func
// CHECK-NOT: __moe_cpu_
// CHECK-LABEL: llvm.func @layer(
// CHECK-LABEL: llvm.func @_mlir_ciface_layer(
// CHECK-SAME: %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr)
// CHECK-SAME: attributes {llvm.emit_c_interface}
// CHECK-NOT: __moe_cpu_

// void _mlir_ciface_f(ins..., outs...): 4 inputs, then the 2 outputs, each a
// pointer to a memref descriptor. erf comes from libm.
// LLVM-DAG: define void @_mlir_ciface_layer(ptr %0, ptr %1, ptr %2, ptr %3, ptr %4, ptr %5)
// LLVM-DAG: define void @_mlir_ciface_aux(ptr %0, ptr %1, ptr %2, ptr %3)
// LLVM-DAG: declare float @erff(float)
// LLVM-NOT: _mlir_ciface_erff
// LLVM-NOT: memrefCopy
func.func @layer(%x: tensor<6x4xbf16>, %wr: tensor<4x4xbf16>,
                 %wgu: tensor<4x4x3xbf16>, %wd: tensor<4x3x4xbf16>)
    -> (tensor<6x4xbf16>, tensor<6x4xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<gelu>, capacity_factor = 1.0,
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<6x4xbf16>, tensor<4x4xbf16>, tensor<4x4x3xbf16>,
        tensor<4x3x4xbf16> -> tensor<6x4xbf16>, tensor<6x4xf32>
  return %out, %logits : tensor<6x4xbf16>, tensor<6x4xf32>
}

// Rank-0 results are descriptors too.
func.func @aux(%l: tensor<6x4xf32>, %e: tensor<6x2xi32>)
    -> (tensor<f32>, tensor<f32>) {
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<softmax>}
      : tensor<6x4xf32>, tensor<6x2xi32> -> tensor<f32>, tensor<f32>
  return %lb, %z : tensor<f32>, tensor<f32>
}

// A function may return one tensor twice, and its own arguments.
// LLVM-DAG: define void @_mlir_ciface_twice(ptr %0, ptr %1, ptr %2, ptr %3)
func.func @twice(%l: tensor<6x4xf32>) -> (tensor<6x4xf32>, tensor<6x4xf32>, tensor<6x4xf32>) {
  %0 = arith.addf %l, %l : tensor<6x4xf32>
  return %0, %0, %l : tensor<6x4xf32>, tensor<6x4xf32>, tensor<6x4xf32>
}
