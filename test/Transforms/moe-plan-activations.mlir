// RUN: moe-opt %s --moe-plan-activations 2>/dev/null | FileCheck %s --check-prefix=KEEP
// RUN: moe-opt %s --moe-plan-activations 2>&1 >/dev/null | FileCheck %s --check-prefix=KEEP-REMARK
// RUN: moe-opt %s --moe-plan-activations="policy=keep memory-budget=852 report=false" | FileCheck %s --check-prefix=KEEP
// RUN: moe-opt %s --moe-plan-activations="policy=recompute report=false" | FileCheck %s --check-prefix=RECOMPUTE
// RUN: moe-opt %s --moe-plan-activations="memory-budget=500 report=false" | FileCheck %s --check-prefix=RECOMPUTE
// RUN: moe-opt %s --moe-plan-activations="memory-budget=700 report=false" | FileCheck %s --check-prefix=PARTIAL
// RUN: moe-opt %s --moe-plan-activations="memory-budget=4GiB report=false" | FileCheck %s --check-prefix=KEEP
// RUN: moe-opt %s --moe-plan-activations="policy=recompute report=false" --moe-generate-backward | FileCheck %s --check-prefix=SAVED
// RUN: moe-opt %s --moe-plan-activations="memory-budget=700 gpu-tflops=1e-6 auto-offload=false" 2>&1 >/dev/null | FileCheck %s --check-prefix=REMARK
// RUN: moe-opt %s --moe-plan-activations="policy=offload report=false" | FileCheck %s --check-prefix=OFFLOAD
// RUN: moe-opt %s --moe-plan-activations="memory-budget=700 gpu-tflops=1e-6 report=false" | FileCheck %s --check-prefix=SLOWGPU
// RUN: moe-opt %s --moe-plan-activations="memory-budget=340 gpu-tflops=1 report=false" | FileCheck %s --check-prefix=MIXED
// RUN: moe-opt %s --moe-plan-activations="memory-budget=340 gpu-tflops=1" 2>&1 >/dev/null | FileCheck %s --check-prefix=MIXED-REMARK
// RUN: moe-opt %s --moe-plan-activations="memory-budget=340 gpu-tflops=1 host-gbps=1" 2>&1 | FileCheck %s --check-prefix=SLOWLINK
// RUN: moe-opt %s --moe-plan-activations="policy=offload report=false" --moe-generate-backward | FileCheck %s --check-prefix=OFFLOAD-SAVED

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

// KEEP-REMARK: moe-plan-activations.mlir:[[# @LINE - 21]]:1: remark: activation plan 'keep' (policy auto): keep saves 852 B (7.93e-07 GiB), recompute saves 340 B (3.17e-07 GiB) and adds 8192 FLOPs (1.05e-05 us at 780 TFLOP/s), offload saves 340 B (3.17e-07 GiB) and adds 0.0186 us of copies compute does not hide (at 55 GB/s); planned 852 B (7.93e-07 GiB) on the device, 0 recomputed and 0 offloaded of 2 expert FFNs, 0 extra FLOPs, 0 us added
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

// Without offload, a slow GPU still recomputes the routed experts.
// REMARK: moe-plan-activations.mlir:{{[0-9]+}}:1: remark: activation plan 'partial' (policy auto, memory-budget 700 B (6.52e-07 GiB)): keep saves 852 B (7.93e-07 GiB), recompute saves 340 B (3.17e-07 GiB) and adds 8192 FLOPs (8.19e+03 us at 1e-06 TFLOP/s), offload saves 340 B (3.17e-07 GiB) and adds 0.00931 us of copies compute does not hide (at 55 GB/s); planned 596 B (5.55e-07 GiB) on the device, 1 recomputed and 0 offloaded of 2 expert FFNs, 4096 extra FLOPs, 4.1e+03 us added

// policy=offload marks every candidate; nothing is wrapped.
// OFFLOAD-LABEL: func.func @layer(
// OFFLOAD-SAME: moe.activation_plan = "offload", moe.offloaded_bytes = 512 : i64, moe.saved_bytes = 340 : i64
// OFFLOAD-NOT: moe.checkpoint
// OFFLOAD: moe.expert_ffn {{.*}}moe.plan = "offload"
// OFFLOAD-NOT: moe.checkpoint
// OFFLOAD: moe.shared_expert {{.*}}moe.plan = "offload"

// With a slow GPU, offloading the routed experts' h (256 B, 9.3 ns of
// copies) beats recomputing it (4096 FLOPs at 1e-6 TFLOP/s, 4 ms).
// SLOWGPU-LABEL: func.func @layer(
// SLOWGPU-SAME: moe.activation_plan = "partial", moe.offloaded_bytes = 256 : i64, moe.saved_bytes = 596 : i64
// SLOWGPU-NOT: moe.checkpoint
// SLOWGPU: moe.expert_ffn {{.*}}moe.plan = "offload"
// SLOWGPU-NOT: moe.plan
// SLOWGPU: return

// Everything must leave the device. At 1 TFLOP/s the copies of the routed
// experts' h (4.65 ns each way at 55 GB/s) hide behind the shared expert
// that follows (6144 FLOPs, 6.1 ns forward, twice that backward), so they
// are offloaded; the shared expert's h has no compute after it to hide
// behind (9.3 ns exposed) and is recomputed instead (4096 FLOPs, 4.1 ns).
// MIXED-REMARK: remark: activation plan 'partial' (policy auto, memory-budget 340 B (3.17e-07 GiB)): keep saves 852 B (7.93e-07 GiB), recompute saves 340 B (3.17e-07 GiB) and adds 8192 FLOPs (0.00819 us at 1 TFLOP/s), offload saves 340 B (3.17e-07 GiB) and adds 0.00931 us of copies compute does not hide (at 55 GB/s); planned 340 B (3.17e-07 GiB) on the device and 256 B (2.38e-07 GiB) on the host, 1 recomputed and 1 offloaded of 2 expert FFNs, 4096 extra FLOPs, 0.0041 us added
// MIXED-LABEL: func.func @layer(
// MIXED-SAME: moe.activation_plan = "partial", moe.offloaded_bytes = 256 : i64, moe.saved_bytes = 340 : i64
// MIXED: moe.expert_ffn {{.*}}moe.plan = "offload"
// MIXED: moe.checkpoint({{.*}}) {moe.plan = "recompute"}
// MIXED-NEXT: ^bb0(
// MIXED-NEXT: moe.shared_expert

// A 1 GB/s link hides nothing: both are recomputed.
// SLOWLINK: activation plan 'recompute'

// Offloaded h is still saved by moe-generate-backward (moe-offload moves
// it): the saved set is that of keep.
// OFFLOAD-SAVED-LABEL: func.func @layer_forward(
// OFFLOAD-SAVED-SAME: moe.num_saved = 14 : i64
// OFFLOAD-SAVED: moe.expert_ffn {{.*}}moe.plan = "offload"
