// convert-moe-to-gpu checks the GEMM configs moe-gpu-select-kernels chose
// against the GPU library: a library config whose kernel the library lacks (a
// symbol lookup by the config's kernel name) is an error at the op. Another
// config of a forward op (router, expert and shared-expert FFN) converts to a
// call of a variant of the op's host function, built with its kernel (the
// accumulating one where moe-fold-adds folded an add into the op, which it
// does if the config can add its tile to C); one that computes another GEMM
// than the role's is an error.
// RUN: rm -rf %t && split-file %s %t
// RUN: moe-opt %t/layer.mlir --moe-gpu-select-kernels --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu | FileCheck %s
// RUN: moe-opt %t/other.mlir --moe-gpu-select-kernels --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=OTHER
// RUN: moe-opt %t/refused.mlir --moe-gpu-select-kernels --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu --split-input-file --verify-diagnostics
// RUN: moe-opt %t/backward.mlir --moe-gpu-select-kernels --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=BACKWARD
// RUN: not moe-opt %t/layer.mlir --moe-gpu-select-kernels --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu=library=%t/empty-library.mlir 2>&1 | FileCheck %s --check-prefix=MISSING

// The library's configs convert as before.
// CHECK-LABEL: func.func @layer
// CHECK: call @__moe_gpu_expert_ffn(
// CHECK-NOT: moe_gpu.kernels
// The down projection with two stages: its own kernel, launched with its
// shared memory by a variant of @__moe_gpu_expert_ffn; the up projection keeps
// the library's kernel.
// OTHER-LABEL: func.func @other
// OTHER: call @__moe_gpu_expert_ffn__moe_gemm_rows_mn_bf16_s2(
// OTHER-NOT: moe_gpu.kernels
// OTHER: gpu.module @moe_kernels
// OTHER: gpu.func @moe_gemm_rows_mn_bf16(
// OTHER: gpu.func @moe_gemm_rows_mn_bf16_s2({{.*}}) kernel attributes {known_block_size = array<i32: 384, 1, 1>}
// OTHER: func.func private @__moe_gpu_expert_ffn__moe_gemm_rows_mn_bf16_s2(
// OTHER: gpu.launch_func async {{.*}} @moe_kernels::@moe_gemm_up_gather blocks {{.*}} threads in (%c384, %c1, %c1)  dynamic_shared_memory_size %c218224_i32
// OTHER: gpu.launch_func async {{.*}} @moe_kernels::@moe_gemm_rows_mn_bf16_s2 blocks {{.*}} threads in (%c384, %c1, %c1)  dynamic_shared_memory_size %c171104_i32
// OTHER: return
// OTHER-NOT: func.func private @__moe_gpu_expert_ffn(

// The router's dX with two stages: the add folds into the accumulating variant,
// whose kernel accumulates too. Stored by bulk row copies the dX cannot add to
// C, so the add stays and the plain variant runs.
// BACKWARD-LABEL: func.func @fold(
// BACKWARD: call @__moe_gpu_add(
// BACKWARD-NOT: call
// BACKWARD: call @__moe_gpu_router_grad_acc__moe_gemm_rows_k_bf16_s2(
// BACKWARD-NOT: call
// BACKWARD: return
// BACKWARD-LABEL: func.func @no_fold(
// BACKWARD: call @__moe_gpu_add(
// BACKWARD-NOT: call
// BACKWARD: call @__moe_gpu_router_grad__moe_gemm_rows_k_bf16_storebulk(
// BACKWARD-NOT: call
// BACKWARD: call @__moe_gpu_add(
// BACKWARD: gpu.func @moe_gemm_rows_k_bf16_acc_s2(
// BACKWARD: gpu.func @moe_gemm_rows_k_bf16_storebulk(
// BACKWARD: func.func private @__moe_gpu_router_grad_acc__moe_gemm_rows_k_bf16_s2(
// BACKWARD: gpu.launch_func async {{.*}} @moe_kernels::@moe_gemm_rows_k_bf16_acc_s2 blocks
// BACKWARD: func.func private @__moe_gpu_router_grad__moe_gemm_rows_k_bf16_storebulk(
// BACKWARD: gpu.launch_func async {{.*}} @moe_kernels::@moe_gemm_rows_k_bf16_storebulk blocks

// MISSING: layer.mlir:{{[0-9]+}}:{{[0-9]+}}: error: the GPU library '{{.*}}empty-library.mlir' has no kernel @moe_gemm_up_gather for 'up'

//--- layer.mlir
func.func @layer(%x: tensor<37x128xbf16>, %ids: tensor<74xi32>, %offsets: tensor<5xi32>,
                 %wgu: tensor<4x128x256xbf16>, %wd: tensor<4x128x128xbf16>)
    -> (tensor<74x128xbf16>, tensor<74x256xbf16>) {
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x128xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<4x128x256xbf16>,
        tensor<4x128x128xbf16> -> tensor<74x128xbf16>, tensor<74x256xbf16>
  return %y, %h : tensor<74x128xbf16>, tensor<74x256xbf16>
}

//--- other.mlir
func.func @other(%x: tensor<37x128xbf16>, %ids: tensor<74xi32>, %offsets: tensor<5xi32>,
                 %wgu: tensor<4x128x256xbf16>, %wd: tensor<4x128x128xbf16>)
    -> (tensor<74x128xbf16>, tensor<74x256xbf16>) {
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd {activation = #moe.activation<swiglu>,
      moe_gpu.kernels = {down = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, stages = 2>}}
      : tensor<37x128xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<4x128x256xbf16>,
        tensor<4x128x128xbf16> -> tensor<74x128xbf16>, tensor<74x256xbf16>
  return %y, %h : tensor<74x128xbf16>, tensor<74x256xbf16>
}

//--- refused.mlir
func.func @other_gemm(%x: tensor<37x128xbf16>, %ids: tensor<74xi32>, %offsets: tensor<5xi32>,
                      %wgu: tensor<4x128x256xbf16>, %wd: tensor<4x128x128xbf16>)
    -> (tensor<74x128xbf16>, tensor<74x256xbf16>) {
  // expected-error @+1 {{'moe_gpu.kernels' chooses @moe_gemm_rows_mn_f32 for 'down', which computes another GEMM than the one moe.expert_ffn runs there (@moe_gemm_rows_mn_bf16)}}
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd {activation = #moe.activation<swiglu>,
      moe_gpu.kernels = {down = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_f32, problem = varlen_m>}}
      : tensor<37x128xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<4x128x256xbf16>,
        tensor<4x128x128xbf16> -> tensor<74x128xbf16>, tensor<74x256xbf16>
  return %y, %h : tensor<74x128xbf16>, tensor<74x256xbf16>
}

//--- backward.mlir
func.func @fold(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %l: tensor<37x4xf32>,
                %e: tensor<37x2xi32>, %dw: tensor<37x2xf32>, %a: tensor<37x64xbf16>, %b: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>) {
  %other = arith.addf %a, %b : tensor<37x64xbf16>
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>,
      moe_gpu.kernels = {dx = #moe_gpu.gemm<a = rows, b = w_k, epilogue = store_bf16, problem = varlen_m, stages = 2>}}
      : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %other, %dx : tensor<37x64xbf16>
  return %sum, %dwr : tensor<37x64xbf16>, tensor<64x4xbf16>
}

func.func @no_fold(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %l: tensor<37x4xf32>,
                   %e: tensor<37x2xi32>, %dw: tensor<37x2xf32>, %a: tensor<37x64xbf16>, %b: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>) {
  %other = arith.addf %a, %b : tensor<37x64xbf16>
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>,
      moe_gpu.kernels = {dx = #moe_gpu.gemm<a = rows, b = w_k, epilogue = store_bf16, problem = varlen_m, store = bulk_rows>}}
      : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %other, %dx : tensor<37x64xbf16>
  return %sum, %dwr : tensor<37x64xbf16>, tensor<64x4xbf16>
}

//--- empty-library.mlir
module {
  gpu.module @moe_kernels {
  }
}
