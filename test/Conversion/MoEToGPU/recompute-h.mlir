// convert-moe-to-gpu on a plan that recomputes H (policy=recompute): backward
// runs the expert FFNs again for H alone, so it calls the up-projection-only
// host functions, allocates no buffer for the unread y (nor for A: the up
// projection's _h kernel writes H alone), and never launches the down GEMM
// there; forward is unchanged (docs/memory.md).
// RUN: moe-opt %s --moe-decompose --moe-plan-activations="policy=recompute report=false" --moe-generate-backward --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu | FileCheck %s

// CHECK-LABEL: func.func @ds_like_forward(
// CHECK: call @__moe_gpu_expert_ffn(
// CHECK: call @__moe_gpu_shared_expert(
// CHECK-LABEL: func.func @ds_like_backward(
// The recomputed H of the shared expert and of the experts; y ([37, 64] and
// [74, 64]) gets no buffer.
// CHECK-NOT: gpu.alloc {{.*}} : memref<74x64xbf16>
// CHECK-DAG: call @__moe_gpu_shared_expert_h({{.*}}) : (!gpu.async.token, memref<?x?xbf16>, memref<?x?xbf16>, memref<?x?xbf16>, i32, memref<?x?xbf16>) -> !gpu.async.token
// CHECK-DAG: call @__moe_gpu_expert_ffn_h({{.*}}) : (!gpu.async.token, memref<?x?xbf16>, memref<?xi32>, memref<?xi32>, memref<?x?x?xbf16>, memref<?x?x?xbf16>, i32, memref<?x?xbf16>) -> !gpu.async.token
// CHECK-NOT: call @__moe_gpu_expert_ffn(
// CHECK-NOT: call @__moe_gpu_shared_expert(
// CHECK: call @__moe_gpu_expert_combine_grad_acc(
// CHECK-LABEL: func.func private @__moe_gpu_expert_ffn_h(
// CHECK-NOT: moe_gemm_rows_mn_bf16
// CHECK-NOT: gpu.alloc
// CHECK: gpu.launch_func {{.*}} @moe_kernels::@moe_gemm_up_gather_h blocks
// CHECK-NOT: moe_gemm_rows_mn_bf16
// CHECK: return
// CHECK-LABEL: func.func private @__moe_gpu_shared_expert_h(
// CHECK-NOT: moe_gemm_rows_mn_bf16
// CHECK: gpu.launch_func {{.*}} @moe_kernels::@moe_gemm_up_rows_h blocks
// CHECK-NOT: moe_gemm_rows_mn_bf16
// CHECK: return

func.func @ds_like(%x: tensor<37x64xbf16>, %wr: tensor<64x8xbf16>, %b: tensor<8xf32>,
                   %wgu: tensor<8x64x128xbf16>, %wd: tensor<8x64x64xbf16>,
                   %swgu: tensor<64x256xbf16>, %swd: tensor<128x64xbf16>)
    -> tensor<37x64xbf16> {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd bias(%b : tensor<8xf32>)
      shared(%swgu, %swd : tensor<64x256xbf16>, tensor<128x64xbf16>)
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = sigmoid, top_k = 2, renormalize = true,
                              num_groups = 4, topk_groups = 2, scaling_factor = 2.5>}
      : tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<8x64x128xbf16>,
        tensor<8x64x64xbf16> -> tensor<37x64xbf16>, tensor<37x8xf32>
  return %out : tensor<37x64xbf16>
}
