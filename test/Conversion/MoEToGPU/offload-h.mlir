// convert-moe-to-gpu on plans that offload H (moe-offload): the forward's
// saved h is an out-parameter in pinned host memory ("memory" = "host" in
// moe.gpu.params) that mgpuMoeOffload fills after the expert FFN, freeing the
// device copy (no gpu.dealloc of it); the backward starts every prefetch
// first, each into a device buffer the runtime allocates on its copy stream
// (mgpuMoePrefetch returns its address, which becomes a memref through its
// LLVM descriptor), and the call's stream waits for one
// (mgpuMoeAwaitPrefetch) right before the first op that reads it; the buffer
// is freed after its last reader like any temporary.
// Work that needs no prefetched tensor runs before work that does. The
// offloaded h is not in the temporaries' arena (the runtime frees it after
// its copy). The adds are folded into the library's accumulating host
// functions (accumulate.mlir) after the prefetches are scheduled, but no op
// moves past work that waits for a prefetch: in @ds_like every add goes, the
// forward's combine moving after the shared expert; in @ds_shared's backward
// none (the router's and the experts' gradients run ahead of the shared
// expert's, which waits for its prefetch).
// RUN: moe-opt %s --split-input-file --moe-generate-backward --moe-offload --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu | FileCheck %s

// Both H offloaded (policy=offload).
// CHECK-DAG: func.func private @mgpuMoeOffload(i64, i64, i64, i32)
// CHECK-DAG: func.func private @mgpuMoeOffloadsFinish()
// CHECK-DAG: func.func private @mgpuMoePrefetch(i64, i64) -> i64
// CHECK-DAG: func.func private @mgpuMoeAwaitPrefetch(i64)
// CHECK-LABEL: func.func @ds_like_forward(
// CHECK-SAME: %[[HOSTH:[a-z0-9]+]]: memref<74x128xbf16>, %[[HOSTS:[a-z0-9]+]]: memref<37x256xbf16>)
// CHECK-SAME: {dtype = "bf16", memory = "host", name = "moe.expert_ffn.h", role = "saved", shape = array<i64: 74, 128>}
// CHECK-SAME: {dtype = "bf16", memory = "host", name = "moe.shared_expert.h", role = "saved", shape = array<i64: 37, 256>}
// CHECK: %[[H:[a-z0-9_]+]], %{{.*}} = gpu.alloc async {{.*}} : memref<74x128xbf16>
// CHECK: call @__moe_gpu_expert_ffn(
// CHECK: %[[HOSTHP:.*]] = memref.extract_aligned_pointer_as_index %[[HOSTH]]
// CHECK: %[[HP:.*]] = memref.extract_aligned_pointer_as_index %[[H]]
// CHECK: call @mgpuMoeOffload(%{{.*}}, %{{.*}}, %c18944_i64, %c1_i32{{.*}}) : (i64, i64, i64, i32) -> ()
// CHECK-NOT: gpu.dealloc {{.*}} %[[H]]
// CHECK: call @__moe_gpu_shared_expert(
// CHECK: call @mgpuMoeOffload(%{{.*}}, %{{.*}}, %c18944_i64{{.*}}, %c1_i32{{.*}})
// CHECK-NOT: gpu.dealloc {{.*}} %[[H]]
// CHECK: call @__moe_gpu_combine_acc(
// CHECK-NOT: call @__moe_gpu_add(
// CHECK: call @mgpuMoeOffloadsFinish() : () -> ()
// CHECK-NEXT: gpu.wait [
// CHECK-NEXT: return
// CHECK-LABEL: func.func @ds_like_backward(
// CHECK-SAME: {dtype = "bf16", forward_param = "moe.expert_ffn.h", memory = "host", name = "moe.expert_ffn.h", role = "saved", shape = array<i64: 74, 128>}
// The arena of the temporaries, then no device buffer for the prefetches:
// CHECK: gpu.alloc async {{.*}} : memref<{{[0-9]+}}xi8>
// CHECK-NOT: gpu.alloc
// CHECK: %[[SP:.*]] = call @mgpuMoePrefetch(%{{.*}}, %c18944_i64{{.*}}) : (i64, i64) -> i64
// CHECK: %[[SPTR:.*]] = llvm.inttoptr %[[SP]] : i64 to !llvm.ptr
// CHECK: llvm.insertvalue %[[SPTR]], %{{.*}}[0]
// CHECK: llvm.insertvalue %[[SPTR]], %{{.*}}[1]
// CHECK: %[[DS:.*]] = builtin.unrealized_conversion_cast %{{.*}} : !llvm.struct<(ptr, ptr, i64, array<2 x i64>, array<2 x i64>)> to memref<37x256xbf16>
// CHECK: %[[HP:.*]] = call @mgpuMoePrefetch(
// CHECK: %[[DH:.*]] = builtin.unrealized_conversion_cast %{{.*}} to memref<74x128xbf16>
// CHECK-NOT: call @__moe_gpu
// CHECK: call @mgpuMoeAwaitPrefetch(%[[SP]]) : (i64) -> ()
// CHECK-NOT: call @mgpuMoeAwaitPrefetch
// CHECK: call @__moe_gpu_shared_expert_grad(
// CHECK: gpu.dealloc async {{.*}} %[[DS]]
// CHECK: call @mgpuMoeAwaitPrefetch(%[[HP]])
// CHECK: call @__moe_gpu_expert_combine_grad_acc(
// CHECK: gpu.dealloc async {{.*}} %[[DH]]
// CHECK-NOT: call @mgpuMoe
// CHECK: call @__moe_gpu_router_grad_acc(
// CHECK-NOT: call @mgpuMoe
// CHECK-NOT: call @__moe_gpu_add(
// CHECK: return

func.func @ds_like(%arg0: tensor<37x64xbf16>, %arg1: tensor<64x8xbf16>, %arg2: tensor<8xf32>,
                   %arg3: tensor<8x64x128xbf16>, %arg4: tensor<8x64x64xbf16>,
                   %arg5: tensor<64x256xbf16>, %arg6: tensor<128x64xbf16>) -> tensor<37x64xbf16> {
  %weights, %experts, %logits = moe.router %arg0, %arg1 bias(%arg2 : tensor<8xf32>) {routing = #moe.routing<scoring = sigmoid, top_k = 2, renormalize = true, num_groups = 4, topk_groups = 2, scaling_factor = 2.500000e+00>} : tensor<37x64xbf16>, tensor<64x8xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x8xf32>
  %token_ids, %offsets, %rows = moe.dispatch %experts {num_experts = 8 : i64} : tensor<37x2xi32> -> tensor<74xi32>, tensor<9xi32>, tensor<37x2xi32>
  %y, %h = moe.expert_ffn %arg0, %token_ids, %offsets, %arg3, %arg4 {activation = #moe.activation<swiglu>, moe.plan = "offload"} : tensor<37x64xbf16>, tensor<74xi32>, tensor<9xi32>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16> -> tensor<74x64xbf16>, tensor<74x128xbf16>
  %0 = moe.combine %y, %weights, %rows : tensor<74x64xbf16>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x64xbf16>
  %y_0, %h_1 = moe.shared_expert %arg0, %arg5, %arg6 {activation = #moe.activation<swiglu>, moe.plan = "offload"} : tensor<37x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16> -> tensor<37x64xbf16>, tensor<37x256xbf16>
  %1 = arith.addf %0, %y_0 : tensor<37x64xbf16>
  return %1 : tensor<37x64xbf16>
}

// -----

// Only the shared expert's H offloaded: backward runs the experts' gradient,
// which needs no prefetched tensor, before the shared expert's, so the copy
// overlaps it; the router's gradient (after the experts') stays after it.
// CHECK-LABEL: func.func @ds_shared_backward(
// CHECK: call @mgpuMoePrefetch(
// CHECK-NOT: call @mgpuMoePrefetch(
// CHECK: call @__moe_gpu_expert_combine_grad(
// CHECK: call @__moe_gpu_router_grad(
// CHECK: call @mgpuMoeAwaitPrefetch(
// CHECK: call @__moe_gpu_shared_expert_grad(
// CHECK-COUNT-2: call @__moe_gpu_add(
// CHECK-NOT: _acc(
// CHECK: return

func.func @ds_shared(%arg0: tensor<37x64xbf16>, %arg1: tensor<64x8xbf16>, %arg2: tensor<8xf32>,
                     %arg3: tensor<8x64x128xbf16>, %arg4: tensor<8x64x64xbf16>,
                     %arg5: tensor<64x256xbf16>, %arg6: tensor<128x64xbf16>) -> tensor<37x64xbf16> {
  %weights, %experts, %logits = moe.router %arg0, %arg1 bias(%arg2 : tensor<8xf32>) {routing = #moe.routing<scoring = sigmoid, top_k = 2, renormalize = true, num_groups = 4, topk_groups = 2, scaling_factor = 2.500000e+00>} : tensor<37x64xbf16>, tensor<64x8xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x8xf32>
  %token_ids, %offsets, %rows = moe.dispatch %experts {num_experts = 8 : i64} : tensor<37x2xi32> -> tensor<74xi32>, tensor<9xi32>, tensor<37x2xi32>
  %y, %h = moe.expert_ffn %arg0, %token_ids, %offsets, %arg3, %arg4 {activation = #moe.activation<swiglu>, moe.plan = "keep"} : tensor<37x64xbf16>, tensor<74xi32>, tensor<9xi32>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16> -> tensor<74x64xbf16>, tensor<74x128xbf16>
  %0 = moe.combine %y, %weights, %rows : tensor<74x64xbf16>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x64xbf16>
  %y_0, %h_1 = moe.shared_expert %arg0, %arg5, %arg6 {activation = #moe.activation<swiglu>, moe.plan = "offload"} : tensor<37x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16> -> tensor<37x64xbf16>, tensor<37x256xbf16>
  %1 = arith.addf %0, %y_0 : tensor<37x64xbf16>
  return %1 : tensor<37x64xbf16>
}
