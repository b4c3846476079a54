// RUN: moe-opt %s --moe-ep-stages -split-input-file -verify-diagnostics | FileCheck %s

// A layer's forward with a dispatch and a combine becomes three stages. Stage
// 0 routes and packs the rows for each rank; stage 1 takes what arrived and
// runs the local experts, returning the rows to send back as they are; stage
// 2 places what came back and combines. What a later stage reads of an
// earlier one is carried; the function's arguments go to each stage that
// reads them.
// CHECK-NOT: func.func @ep(
// CHECK-LABEL: func.func @ep_stage0(
// CHECK-SAME: %[[X:.*]]: tensor<?x16xf32>, %[[WR:.*]]: tensor<16x8xf32>)
// CHECK-SAME: -> (tensor<32x16xf32>, tensor<2x4xi32>, tensor<2xi32>, tensor<9xi32>, tensor<?x2xf32>, tensor<?x2xi32>, tensor<?x8xf32>)
// CHECK-SAME: moe.ep_capacity = 16 : i64, moe.ep_collectives = ["dispatch", "combine"]
// CHECK-SAME: moe.ep_inputs = ["arg0", "arg1"]
// CHECK-SAME: moe.ep_outputs = ["send0", "send_counts0", "dropped0", "carry0", "carry1", "carry2", "result1"]
// CHECK-SAME: moe.ep_overflows = ["error", "none"]
// CHECK-SAME: moe.ep_results = ["stage2", "stage0"], moe.ep_size = 2 : i64, moe.ep_stage = 0 : i64, moe.ep_stage_of = "ep", moe.ep_stages = 3 : i64, moe.max_tokens = 32 : i64
// CHECK: %[[W:.*]], %[[E:.*]], %[[L:.*]] = moe.router %[[X]], %[[WR]]
// CHECK: %[[IDS:.*]], %[[OFF:.*]], %[[ROWS:.*]] = moe.dispatch %[[E]]
// CHECK: %[[SEND:.*]], %[[COUNTS:.*]], %[[DROPPED:.*]] = moe.ep_pack %[[X]], %[[OFF]] gather(%[[IDS]] : tensor<?xi32>) {capacity = 16 : i64, ep_size = 2 : i64}
// CHECK: return %[[SEND]], %[[COUNTS]], %[[DROPPED]], %[[OFF]], %[[W]], %[[ROWS]], %[[L]]
// CHECK-LABEL: func.func @ep_stage1(
// CHECK-SAME: %[[RECV:.*]]: tensor<32x16xf32>, %[[RCOUNTS:.*]]: tensor<2x4xi32>, %[[WGU:.*]]: tensor<4x16x24xf32>, %[[WD:.*]]: tensor<4x12x16xf32>) -> tensor<32x16xf32>
// CHECK-SAME: moe.ep_inputs = ["received0", "received_counts0", "arg2", "arg3"]
// CHECK-SAME: moe.ep_outputs = ["send1"]
// CHECK-SAME: moe.ep_stage = 1 : i64
// CHECK: %[[QIDS:.*]], %[[QOFF:.*]] = moe.ep_queues %[[RCOUNTS]]
// CHECK: %[[Y:.*]], %{{.*}} = moe.expert_ffn %[[RECV]], %[[QIDS]], %[[QOFF]], %[[WGU]], %[[WD]]
// CHECK: %[[BACK:.*]] = moe.scatter_rows %[[Y]], %[[QIDS]]
// CHECK: return %[[BACK]]
// CHECK-LABEL: func.func @ep_stage2(
// CHECK-SAME: %[[RET:.*]]: tensor<32x16xf32>, %[[OFF2:.*]]: tensor<9xi32>, %[[W2:.*]]: tensor<?x2xf32>, %[[ROWS2:.*]]: tensor<?x2xi32>) -> tensor<?x16xf32>
// CHECK-SAME: moe.ep_inputs = ["returned1", "carry0", "carry1", "carry2"]
// CHECK-SAME: moe.ep_outputs = ["result0"]
// CHECK: %[[YG:.*]] = moe.ep_unpack %[[RET]], %[[OFF2]] {capacity = 16 : i64, ep_size = 2 : i64} : tensor<32x16xf32>, tensor<9xi32> -> tensor<?x16xf32>
// CHECK: %[[OUT:.*]] = moe.combine %[[YG]], %[[W2]], %[[ROWS2]]
// CHECK: return %[[OUT]]
func.func @ep(%x: tensor<?x16xf32>, %wr: tensor<16x8xf32>,
              %wgu: tensor<4x16x24xf32>, %wd: tensor<4x12x16xf32>)
    -> (tensor<?x16xf32>, tensor<?x8xf32>) attributes {moe.max_tokens = 32 : i64} {
  %w, %e, %logits = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x16xf32>, tensor<16x8xf32> -> tensor<?x2xf32>, tensor<?x2xi32>, tensor<?x8xf32>
  %ids, %off, %rows = moe.dispatch %e {num_experts = 8 : i64}
      : tensor<?x2xi32> -> tensor<?xi32>, tensor<9xi32>, tensor<?x2xi32>
  %recv, %counts, %dropped = moe.ep_dispatch %x, %off gather(%ids : tensor<?xi32>)
      {capacity = 16 : i64, ep_size = 2 : i64}
      : tensor<?x16xf32>, tensor<9xi32> -> tensor<32x16xf32>, tensor<2x4xi32>, tensor<2xi32>
  %qids, %qoff = moe.ep_queues %counts {capacity = 16 : i64}
      : tensor<2x4xi32> -> tensor<32xi32>, tensor<5xi32>
  %y, %h = moe.expert_ffn %recv, %qids, %qoff, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<32x16xf32>, tensor<32xi32>, tensor<5xi32>, tensor<4x16x24xf32>,
        tensor<4x12x16xf32> -> tensor<32x16xf32>, tensor<32x24xf32>
  %back = moe.scatter_rows %y, %qids : tensor<32x16xf32>, tensor<32xi32> -> tensor<32x16xf32>
  %yg = moe.ep_combine %back, %off {capacity = 16 : i64, ep_size = 2 : i64}
      : tensor<32x16xf32>, tensor<9xi32> -> tensor<?x16xf32>
  %out = moe.combine %yg, %w, %rows
      : tensor<?x16xf32>, tensor<?x2xf32>, tensor<?x2xi32> -> tensor<?x16xf32>
  return %out, %logits : tensor<?x16xf32>, tensor<?x8xf32>
}

// -----

// A function compiled for one chunk of a step: each stage keeps the chunk's
// bound and the step's, which the runtime splits into chunks.
// CHECK-LABEL: func.func @chunk_stage0(
// CHECK-SAME: moe.ep_stage = 0 : i64, moe.ep_stage_of = "chunk", moe.ep_stages = 3 : i64, moe.ep_step_tokens = 100 : i64, moe.max_tokens = 32 : i64
// CHECK-LABEL: func.func @chunk_stage1(
// CHECK-SAME: moe.ep_step_tokens = 100 : i64, moe.max_tokens = 32 : i64
// CHECK-LABEL: func.func @chunk_stage2(
// CHECK-SAME: moe.ep_step_tokens = 100 : i64, moe.max_tokens = 32 : i64
func.func @chunk(%x: tensor<?x16xf32>, %wr: tensor<16x8xf32>,
              %wgu: tensor<4x16x24xf32>, %wd: tensor<4x12x16xf32>)
    -> (tensor<?x16xf32>, tensor<?x8xf32>) attributes {moe.ep_step_tokens = 100 : i64, moe.max_tokens = 32 : i64} {
  %w, %e, %logits = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x16xf32>, tensor<16x8xf32> -> tensor<?x2xf32>, tensor<?x2xi32>, tensor<?x8xf32>
  %ids, %off, %rows = moe.dispatch %e {num_experts = 8 : i64}
      : tensor<?x2xi32> -> tensor<?xi32>, tensor<9xi32>, tensor<?x2xi32>
  %recv, %counts, %dropped = moe.ep_dispatch %x, %off gather(%ids : tensor<?xi32>)
      {capacity = 16 : i64, ep_size = 2 : i64}
      : tensor<?x16xf32>, tensor<9xi32> -> tensor<32x16xf32>, tensor<2x4xi32>, tensor<2xi32>
  %qids, %qoff = moe.ep_queues %counts {capacity = 16 : i64}
      : tensor<2x4xi32> -> tensor<32xi32>, tensor<5xi32>
  %y, %h = moe.expert_ffn %recv, %qids, %qoff, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<32x16xf32>, tensor<32xi32>, tensor<5xi32>, tensor<4x16x24xf32>,
        tensor<4x12x16xf32> -> tensor<32x16xf32>, tensor<32x24xf32>
  %back = moe.scatter_rows %y, %qids : tensor<32x16xf32>, tensor<32xi32> -> tensor<32x16xf32>
  %yg = moe.ep_combine %back, %off {capacity = 16 : i64, ep_size = 2 : i64}
      : tensor<32x16xf32>, tensor<9xi32> -> tensor<?x16xf32>
  %out = moe.combine %yg, %w, %rows
      : tensor<?x16xf32>, tensor<?x2xf32>, tensor<?x2xi32> -> tensor<?x16xf32>
  return %out, %logits : tensor<?x16xf32>, tensor<?x8xf32>
}

// -----

// A training pair's contract moves to its stages; an argument returned as it
// is comes from the caller and the dropped count from the stage that packs;
// rows received and sent straight back make a stage of their own; a combine
// that sums per token unpacks with its reduce.
// CHECK-LABEL: func.func @pair_forward_stage0(
// CHECK-SAME: moe.ep_num_saved = 1 : i64
// CHECK-SAME: moe.ep_outputs = ["send0", "send_counts0", "dropped0", "result2"]
// CHECK-SAME: moe.ep_overflows = ["drop", "none"]
// CHECK-SAME: moe.ep_results = ["stage2", "arg0", "stage0"]
// CHECK: moe.ep_pack {{.*}}overflow = #moe.ep_overflow<drop>
// CHECK-LABEL: func.func @pair_forward_stage1(
// CHECK-SAME: %[[RECV:[a-z0-9]+]]: tensor<32x16xf32>, %{{.*}}: tensor<2x4xi32>) -> tensor<32x16xf32>
// CHECK-SAME: moe.ep_inputs = ["received0", "received_counts0"]
// CHECK-SAME: moe.ep_outputs = ["send1"]
// CHECK-NEXT: return %[[RECV]]
// CHECK-LABEL: func.func @pair_forward_stage2(
// CHECK-SAME: moe.ep_inputs = ["returned1", "arg3", "arg1"]
// CHECK-SAME: moe.ep_outputs = ["result0"]
// CHECK: moe.ep_unpack %{{.*}}, %{{.*}} reduce(%{{.*}} : tensor<4x2xi32>)
// CHECK-NOT: moe.ep_combine
func.func @pair_forward(%x: tensor<4x16xf32>, %off: tensor<9xi32>, %ids: tensor<8xi32>, %rows: tensor<4x2xi32>)
    -> (tensor<4x16xf32>, tensor<4x16xf32>, tensor<2xi32>) attributes {moe.num_saved = 1 : i64} {
  %recv, %counts, %dropped = moe.ep_dispatch %x, %off gather(%ids : tensor<8xi32>)
      {capacity = 16 : i64, ep_size = 2 : i64, overflow = #moe.ep_overflow<drop>}
      : tensor<4x16xf32>, tensor<9xi32> -> tensor<32x16xf32>, tensor<2x4xi32>, tensor<2xi32>
  %sum = moe.ep_combine %recv, %off reduce(%rows : tensor<4x2xi32>) {capacity = 16 : i64, ep_size = 2 : i64}
      : tensor<32x16xf32>, tensor<9xi32> -> tensor<4x16xf32>
  return %sum, %x, %dropped : tensor<4x16xf32>, tensor<4x16xf32>, tensor<2xi32>
}

// -----

func.func @mixed(%x: tensor<4x16xf32>, %off: tensor<9xi32>) -> tensor<8x16xf32> {
  %recv, %counts, %dropped = moe.ep_dispatch %x, %off {capacity = 16 : i64, ep_size = 2 : i64}
      : tensor<4x16xf32>, tensor<9xi32> -> tensor<32x16xf32>, tensor<2x4xi32>, tensor<2xi32>
  // expected-error @+1 {{has ep_size 4 and capacity 8 but the first collective of @mixed has 2 and 16; moe-ep-stages needs one of each a function}}
  %back = moe.ep_combine %recv, %off {capacity = 8 : i64, ep_size = 4 : i64}
      : tensor<32x16xf32>, tensor<9xi32> -> tensor<8x16xf32>
  return %back : tensor<8x16xf32>
}

// -----

// expected-error @+1 {{cannot make @taken_stage1: a symbol of that name exists}}
func.func @taken(%x: tensor<4x16xf32>, %off: tensor<9xi32>) -> tensor<32x16xf32> {
  %recv, %counts, %dropped = moe.ep_dispatch %x, %off {capacity = 16 : i64, ep_size = 2 : i64}
      : tensor<4x16xf32>, tensor<9xi32> -> tensor<32x16xf32>, tensor<2x4xi32>, tensor<2xi32>
  return %recv : tensor<32x16xf32>
}
func.func @taken_stage1() {
  return
}

// -----

func.func @in_region(%x: tensor<4x16xf32>, %off: tensor<9xi32>) -> tensor<32x16xf32> {
  // expected-error @+1 {{holds an expert-parallel collective in a region; moe-ep-stages splits at collectives of the function's body only}}
  %r = moe.checkpoint (%x, %off) : (tensor<4x16xf32>, tensor<9xi32>) -> (tensor<32x16xf32>) {
  ^bb0(%a: tensor<4x16xf32>, %o: tensor<9xi32>):
    %recv, %counts, %dropped = moe.ep_dispatch %a, %o {capacity = 16 : i64, ep_size = 2 : i64}
        : tensor<4x16xf32>, tensor<9xi32> -> tensor<32x16xf32>, tensor<2x4xi32>, tensor<2xi32>
    moe.yield %recv : tensor<32x16xf32>
  }
  return %r : tensor<32x16xf32>
}
