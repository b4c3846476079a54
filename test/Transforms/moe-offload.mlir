// RUN: moe-opt %s --moe-generate-backward --moe-offload | FileCheck %s
// RUN: moe-opt %s --moe-generate-backward --moe-offload --moe-offload | FileCheck %s
// RUN: moe-opt %s --moe-generate-backward --moe-offload=prefetch=late | FileCheck %s --check-prefix=LATE
// RUN: moe-opt %s --moe-plan-activations="policy=offload report=false" --moe-generate-backward --moe-offload | FileCheck %s --check-prefix=BOTH
// RUN: not moe-opt %s --moe-offload=prefetch=soon 2>&1 | FileCheck %s --check-prefix=PREFETCH
// The shared expert's h offloaded instead: the routed experts' and the router's
// gradients need no prefetched tensor, so they move ahead of the shared
// expert's, which waits for its h (the prefetch stays first, or, late, goes
// right before its reader).
// RUN: sed -e 's/, moe.plan = "offload"}/}/' -e 's/%%sd {activation = #moe.activation<swiglu>}/%%sd {activation = #moe.activation<swiglu>, moe.plan = "offload"}/' %s | moe-opt --moe-generate-backward --moe-offload | FileCheck %s --check-prefix=SHARED
// RUN: sed -e 's/, moe.plan = "offload"}/}/' -e 's/%%sd {activation = #moe.activation<swiglu>}/%%sd {activation = #moe.activation<swiglu>, moe.plan = "offload"}/' %s | moe-opt --moe-generate-backward --moe-offload=prefetch=late | FileCheck %s --check-prefix=SHARED-LATE
// SHARED-LABEL: func.func @layer_backward(
// SHARED-NEXT: %[[BACK:.*]] = moe.prefetch
// SHARED-NEXT: moe.expert_combine_grad
// SHARED-NEXT: moe.router_grad
// SHARED-NEXT: moe.shared_expert_grad {{.*}}, %[[BACK]], %{{.*}} {activation
// SHARED-LATE-LABEL: func.func @layer_backward(
// SHARED-LATE-NEXT: moe.expert_combine_grad
// SHARED-LATE-NEXT: moe.router_grad
// SHARED-LATE-NEXT: %[[BACK:.*]] = moe.prefetch
// SHARED-LATE-NEXT: moe.shared_expert_grad {{.*}}, %[[BACK]], %{{.*}} {activation

// The layer of moe-plan-activations.mlir with the routed experts' h marked
// for offload (as moe-plan-activations marks it). h has one forward use
// besides the saved result, an arith.addf (unused, so it gets no gradient)
// that reads it after the combine: the copy to the host starts after it.

// PREFETCH: moe-offload.mlir:[[@LINE+1]]:1: error: moe-offload: unknown prefetch 'soon' (expected early or late)
func.func @layer(%x: tensor<4x16xbf16>, %wr: tensor<16x4xbf16>,
                 %wgu: tensor<4x16x16xbf16>, %wd: tensor<4x8x16xbf16>,
                 %sgu: tensor<16x32xbf16>, %sd: tensor<16x16xbf16>)
    -> (tensor<4x16xbf16>, tensor<4x4xf32>) {
  %w, %e, %logits = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<4x16xbf16>, tensor<16x4xbf16>
      -> tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x4xf32>
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 4 : i64}
      : tensor<4x2xi32> -> tensor<8xi32>, tensor<5xi32>, tensor<4x2xi32>
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd
      {activation = #moe.activation<swiglu>, moe.plan = "offload"}
      : tensor<4x16xbf16>, tensor<8xi32>, tensor<5xi32>, tensor<4x16x16xbf16>,
        tensor<4x8x16xbf16> -> tensor<8x16xbf16>, tensor<8x16xbf16>
  %out = moe.combine %y, %w, %rows
      : tensor<8x16xbf16>, tensor<4x2xf32>, tensor<4x2xi32> -> tensor<4x16xbf16>
  %hh = arith.addf %h, %h : tensor<8x16xbf16>
  %sy, %sh = moe.shared_expert %x, %sgu, %sd {activation = #moe.activation<swiglu>}
      : tensor<4x16xbf16>, tensor<16x32xbf16>, tensor<16x16xbf16> -> tensor<4x16xbf16>, tensor<4x32xbf16>
  %sum = arith.addf %out, %sy : tensor<4x16xbf16>
  return %sum, %logits : tensor<4x16xbf16>, tensor<4x4xf32>
}

// The source function keeps its mark and is not changed.
// CHECK-LABEL: func.func @layer(
// CHECK-NOT: moe.offload
// CHECK: return

// CHECK-LABEL: func.func @layer_forward(
// CHECK-SAME: -> ({{.*}}, tensor<4x2xi32>, !moe.host_tensor<8x16xbf16>, tensor<4x32xbf16>)
// CHECK-SAME: moe.num_saved = 14
// CHECK: %{{.*}}, %[[H:.*]] = moe.expert_ffn {{.*}}moe.plan = "offload"
// CHECK: moe.combine
// CHECK: arith.addf %[[H]], %[[H]]
// CHECK-NEXT: %[[HOST:.*]] = moe.offload %[[H]] : tensor<8x16xbf16> -> !moe.host_tensor<8x16xbf16>
// CHECK-NOT: moe.offload
// CHECK: %{{.*}}, %[[SH:.*]] = moe.shared_expert
// CHECK: return {{.*}}, %[[HOST]], %[[SH]] :

// CHECK-LABEL: func.func @layer_backward(
// CHECK-SAME: %[[ARG:[a-z0-9]+]]: !moe.host_tensor<8x16xbf16> {moe.offloaded, moe.saved = "moe.expert_ffn.h"}
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<4x32xbf16> {moe.saved = "moe.shared_expert.h"}
// CHECK-NEXT: %[[BACK:.*]] = moe.prefetch %[[ARG]] : !moe.host_tensor<8x16xbf16> -> tensor<8x16xbf16>
// CHECK: moe.shared_expert_grad
// CHECK: moe.expert_combine_grad {{.*}}, %[[BACK]], %{{.*}} {activation
// CHECK-NOT: moe.prefetch

// LATE-LABEL: func.func @layer_backward(
// LATE-NOT: moe.prefetch
// LATE: moe.shared_expert_grad
// LATE-NEXT: %[[BACK:.*]] = moe.prefetch
// LATE-NEXT: moe.expert_combine_grad {{.*}}, %[[BACK]], %{{.*}} {activation

// With both h offloaded, backward needs the shared expert's first (its
// gradient comes first), so its prefetch starts first.
// BOTH-LABEL: func.func @layer_forward(
// BOTH: %{{.*}}, %[[H:.*]] = moe.expert_ffn
// BOTH: arith.addf %[[H]], %[[H]]
// BOTH-NEXT: %[[HOST:.*]] = moe.offload %[[H]]
// BOTH: %{{.*}}, %[[SH:.*]] = moe.shared_expert
// BOTH-NEXT: %[[SHOST:.*]] = moe.offload %[[SH]] : tensor<4x32xbf16> -> !moe.host_tensor<4x32xbf16>
// BOTH: return {{.*}}, %[[HOST]], %[[SHOST]] :
// BOTH-LABEL: func.func @layer_backward(
// BOTH-SAME: %[[A:[a-z0-9]+]]: !moe.host_tensor<8x16xbf16> {moe.offloaded
// BOTH-SAME: %[[B:[a-z0-9]+]]: !moe.host_tensor<4x32xbf16> {moe.offloaded
// BOTH-NEXT: %[[SBACK:.*]] = moe.prefetch %[[B]]
// BOTH-NEXT: %[[BACK:.*]] = moe.prefetch %[[A]]
// BOTH-NEXT: moe.shared_expert_grad {{.*}}, %[[SBACK]], %{{.*}} {activation
// BOTH-NEXT: moe.expert_combine_grad {{.*}}, %[[BACK]], %{{.*}} {activation
