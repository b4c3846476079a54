// RUN: moe-opt %s --moe-plan-activations 2>/dev/null | FileCheck %s --check-prefix=KEEP
// RUN: moe-opt %s --moe-plan-activations 2>&1 >/dev/null | FileCheck %s --check-prefix=KEEP-REMARK
// RUN: moe-opt %s --moe-plan-activations="policy=keep memory-budget=852 report=false" | FileCheck %s --check-prefix=KEEP
// RUN: moe-opt %s --moe-plan-activations="policy=recompute report=false" | FileCheck %s --check-prefix=RECOMPUTE
// RUN: moe-opt %s --moe-plan-activations="memory-budget=500 report=false" | FileCheck %s --check-prefix=RECOMPUTE
// RUN: moe-opt %s --moe-plan-activations="memory-budget=700 report=false" | FileCheck %s --check-prefix=PARTIAL
// RUN: moe-opt %s --moe-plan-activations="memory-budget=4GiB report=false" | FileCheck %s --check-prefix=KEEP
// RUN: moe-opt %s --moe-plan-activations="policy=recompute report=false" --moe-generate-backward | FileCheck %s --check-prefix=SAVED
// RUN: moe-opt %s --moe-plan-activations="memory-budget=700 gpu-tflops=1e-6" 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK

// A bf16 layer with a shared expert. Every plan saves x (128 B), the routing
// weights, experts and logits (32 + 32 + 64 B) and the queues (32 + 20 + 32
// B): 340 B. Keep adds the h of the experts (8x16 bf16, 256 B) and of the
// shared expert (4x32 bf16, 256 B): 852 B. Recomputing either costs 4096
// FLOPs; under 700 B auto recomputes the first, the routed experts.

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
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<4x16xbf16>, tensor<8xi32>, tensor<5xi32>, tensor<4x16x16xbf16>,
        tensor<4x8x16xbf16> -> tensor<8x16xbf16>, tensor<8x16xbf16>
  %out = moe.combine %y, %w, %rows
      : tensor<8x16xbf16>, tensor<4x2xf32>, tensor<4x2xi32> -> tensor<4x16xbf16>
  %sy, %sh = moe.shared_expert %x, %sgu, %sd {activation = #moe.activation<swiglu>}
      : tensor<4x16xbf16>, tensor<16x32xbf16>, tensor<16x16xbf16> -> tensor<4x16xbf16>, tensor<4x32xbf16>
  %sum = arith.addf %out, %sy : tensor<4x16xbf16>
  return %sum, %logits : tensor<4x16xbf16>, tensor<4x4xf32>
}

// KEEP-REMARK: moe-plan-activations.mlir:17:1: remark: activation plan 'keep' (policy auto): keep saves 852 B (7.93e-07 GiB), recompute saves 340 B (3.17e-07 GiB) and adds 8192 FLOPs (1.05e-05 us at 780 TFLOP/s); planned 852 B (7.93e-07 GiB), 0 of 2 expert FFNs recomputed, 0 extra FLOPs
// KEEP-LABEL: func.func @layer(
// KEEP-SAME: moe.activation_plan = "keep", moe.saved_bytes = 852 : i64
// KEEP-NOT: moe.checkpoint

// RECOMPUTE-LABEL: func.func @layer(
// RECOMPUTE-SAME: moe.activation_plan = "recompute", moe.saved_bytes = 340 : i64
// RECOMPUTE: %[[Y:.*]]:2 = moe.checkpoint(%arg0, %{{.*}}, %{{.*}}, %arg2, %arg3) {moe.plan = "recompute"}
// RECOMPUTE-NEXT: ^bb0(
// RECOMPUTE-NEXT: %{{.*}}, %{{.*}} = moe.expert_ffn
// RECOMPUTE-NEXT: moe.yield
// RECOMPUTE: moe.combine %[[Y]]#0
// RECOMPUTE: %[[S:.*]]:2 = moe.checkpoint(%arg0, %arg4, %arg5) {moe.plan = "recompute"}
// RECOMPUTE-NEXT: ^bb0(
// RECOMPUTE-NEXT: %{{.*}}, %{{.*}} = moe.shared_expert
// RECOMPUTE: arith.addf %{{.*}}, %[[S]]#0

// PARTIAL-LABEL: func.func @layer(
// PARTIAL-SAME: moe.activation_plan = "partial", moe.saved_bytes = 596 : i64
// PARTIAL: moe.checkpoint
// PARTIAL-NEXT: ^bb0(
// PARTIAL-NEXT: moe.expert_ffn
// PARTIAL-NOT: moe.checkpoint
// PARTIAL: moe.shared_expert

// No h is saved: backward recomputes both ops from x, the queues and the
// weights.
// SAVED-LABEL: func.func @layer_forward(
// SAVED-SAME: moe.num_saved = 12 : i64
// SAVED-LABEL: func.func @layer_backward(
// SAVED-NOT: moe.expert_ffn.h
// SAVED-NOT: moe.shared_expert.h
// SAVED-SAME: moe.gradient_args

// REMARK: moe-plan-activations.mlir:17:1: remark: activation plan 'partial' (policy auto, memory-budget 700 B (6.52e-07 GiB)): keep saves 852 B (7.93e-07 GiB), recompute saves 340 B (3.17e-07 GiB) and adds 8192 FLOPs (8.19e+03 us at 1e-06 TFLOP/s); planned 596 B (5.55e-07 GiB), 1 of 2 expert FFNs recomputed, 4096 extra FLOPs
