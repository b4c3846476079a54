// RUN: moe-opt %s --moe-plan-activations="report=false" --moe-generate-backward --moe-plan-memory | FileCheck %s
// RUN: moe-opt %s --moe-plan-activations="report=false" --moe-generate-backward --moe-plan-memory=memory-report=- -o /dev/null | FileCheck %s --check-prefix=KEEP
// RUN: moe-opt %s --moe-plan-activations="policy=offload report=false" --moe-generate-backward --moe-offload --moe-plan-memory="memory-report=- alignment=1" -o /dev/null | FileCheck %s --check-prefix=OFFLOAD
// RUN: moe-opt %s --moe-plan-activations="report=false" --moe-generate-backward --moe-plan-memory=memory-report=%t.report -o /dev/null
// RUN: FileCheck %s --check-prefix=KEEP < %t.report
// A report that cannot be written is a diagnostic (a full device ended in "LLVM ERROR"):
// RUN: not moe-opt %s --moe-plan-memory=memory-report=/dev/full -o /dev/null 2>&1 | FileCheck %s --check-prefix=FULL
// FULL: error: moe-plan-memory: cannot write the memory report to '/dev/full': {{.*}}
// FULL-NOT: LLVM ERROR
// RUN: moe-opt %s --moe-decompose --moe-plan-memory=memory-report=- -o /dev/null | FileCheck %s --check-prefix=ALONE
// RUN: moe-opt %s --moe-plan-activations="report=false" --moe-generate-backward --moe-fold-adds --moe-plan-memory=memory-report=- -o /dev/null | FileCheck %s --check-prefix=FOLDED
// RUN: moe-opt %s --moe-plan-activations="policy=recompute report=false" --moe-generate-backward --moe-plan-memory=memory-report=- -o /dev/null | FileCheck %s --check-prefix=RECOMPUTE

// The layer of moe-plan-activations.mlir (x 128 B, routing metadata 212 B,
// h 256 B each) as a training step, forward then backward.

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

// The offsets are attributes, one per result, -1 outside the arena; each
// function has an arena of its own, for what it neither takes nor returns.
// The source @layer is not planned (its step is the pair).
// CHECK-LABEL: func.func @layer(
// CHECK-NOT: moe.arena
// CHECK-LABEL: func.func @layer_forward(
// CHECK-SAME: moe.arena_size = 384 : i64
// CHECK-NOT: moe.router {{.*}}moe.arena_offsets
// CHECK: moe.expert_ffn {{.*}}moe.arena_offsets = array<i64: 0, -1>
// CHECK: moe.combine {{.*}}moe.arena_offsets = array<i64: 256>
// CHECK-LABEL: func.func @layer_backward(
// CHECK-SAME: moe.arena_size = 800 : i64
// CHECK: moe.expert_combine_grad {{.*}}moe.arena_offsets = array<i64: 256, 768, -1, -1>

// What the functions return (the saved tensors, y, the gradients) is the
// caller's; the rest shares the function's arena, y and the combine's
// output in forward's, the parts of dx in backward's.
// KEEP: moe-plan-memory: forward @layer_forward ops [0, 6], backward @layer_backward ops [7, 12], alignment 256 B
// KEEP-NEXT: op 0 moe.router
// KEEP-NEXT: op 1 moe.dispatch
// KEEP-NEXT: op 2 moe.expert_ffn
// KEEP: op 6 func.return
// KEEP-NEXT: op 7 moe.shared_expert_grad
// KEEP: op 12 func.return
// KEEP-NEXT: buffer 0 moe.router.weights: 32 B returned, live [0, 8], saved
// KEEP-NEXT: buffer 1 moe.router.experts: 32 B returned, live [0, 10], saved
// KEEP-NEXT: buffer 2 moe.router.logits: 64 B returned, live [0, 10], saved
// KEEP: buffer 6 moe.expert_ffn.y: 256 B at offset 0 in @layer_forward, live [2, 3]
// KEEP-NEXT: buffer 7 moe.expert_ffn.h: 256 B returned, live [2, 8], saved
// KEEP-NEXT: buffer 8 moe.combine: 128 B at offset 256 in @layer_forward, live [3, 5]
// KEEP: buffer 10 moe.shared_expert.h: 256 B returned, live [4, 7], saved
// KEEP-NEXT: buffer 11 arith.addf: 128 B returned, live [5, 6]
// KEEP-NEXT: buffer 12 moe.shared_expert_grad.dx: 128 B at offset 0 in @layer_backward, live [7, 9]
// KEEP: buffer 15 moe.expert_combine_grad.dx: 128 B at offset 256 in @layer_backward, live [8, 9]
// KEEP-NEXT: buffer 16 moe.expert_combine_grad.d_weights: 32 B at offset 768 in @layer_backward, live [8, 10]
// KEEP: peak: 5364 B {{.*}} at op 8
// KEEP-NEXT: arena @layer_forward: 384 B
// KEEP-NEXT: arena @layer_backward: 800 B
// The saved set of keep (852 B) without x (128 B), which the caller holds.
// KEEP-NEXT: saved for backward: 724 B (6.74e-07 GiB) in 8 buffers, and 4864 B (4.53e-06 GiB) of saved arguments
// KEEP-NEXT: offloaded to the host: 0 B

// moe-fold-adds: an op that accumulates writes its result over its
// `accumulate`, one buffer for both. The combine adds onto the shared
// expert's y, which forward returns; the router's dx and the experts' onto
// the shared expert's dx, which backward returns: neither add leaves a
// buffer in the arena.
// FOLDED: op 3 moe.shared_expert
// FOLDED-NEXT: op 4 moe.combine
// FOLDED: buffer 6 moe.expert_ffn.y: 256 B at offset 0 in @layer_forward, live [2, 4]
// FOLDED: buffer 8 moe.shared_expert.y: 128 B returned, live [3, 5]
// FOLDED-NOT: moe.combine:
// FOLDED: buffer 10 moe.shared_expert_grad.dx: 128 B returned, live [6, 9]
// FOLDED-NOT: .dx:
// FOLDED: peak:
// FOLDED-NEXT: arena @layer_forward: 256 B
// FOLDED-NEXT: arena @layer_backward: 32 B

// Recomputing h in backward runs the expert FFNs' up projections only: their
// y has no buffer there.
// RECOMPUTE: op 7 moe.shared_expert
// RECOMPUTE-NEXT: op 8 moe.expert_ffn
// RECOMPUTE: buffer 12 moe.shared_expert.h: 256 B at offset 0 in @layer_backward, live [7, 9]
// RECOMPUTE-NEXT: buffer 13 moe.expert_ffn.h: 256 B at offset 256 in @layer_backward, live [8, 10]

// With everything offloaded, h leaves the device at its moe.offload and
// comes back at its moe.prefetch; both device copies are allocations apart
// (their copies run on another stream), not in an arena. The saved set is
// that of recompute (340 B) without x.
// OFFLOAD: op 2 moe.expert_ffn
// OFFLOAD-NEXT: op 3 moe.offload
// OFFLOAD: op 9 moe.prefetch
// OFFLOAD-NEXT: op 10 moe.prefetch
// OFFLOAD: buffer 7 moe.expert_ffn.h: 256 B apart, live [2, 3]
// OFFLOAD-NEXT: host 8 moe.offload: 256 B, live [3, 10]
// OFFLOAD: host 12 moe.offload: 256 B, live [6, 9]
// OFFLOAD: buffer 14 moe.prefetch: 256 B apart, live [9, 11]
// OFFLOAD-NEXT: buffer 15 moe.prefetch: 256 B apart, live [10, 12]
// OFFLOAD: peak: 5364 B {{.*}} at op 12
// OFFLOAD-NEXT: arena @layer_forward: 384 B
// OFFLOAD-NEXT: arena @layer_backward: 416 B
// OFFLOAD-NEXT: saved for backward: 212 B (1.97e-07 GiB) in 6 buffers
// OFFLOAD-NEXT: offloaded to the host: 512 B

// Without backward, a function is a step of its own.
// ALONE: moe-plan-memory: forward @layer ops [0, 6], alignment 256 B
// ALONE: arena @layer:
// ALONE-NOT: saved for backward
