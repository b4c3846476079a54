// RUN: moe-opt %s --moe-generate-backward -split-input-file -verify-diagnostics | FileCheck %s

// The default saved set: x, the weights, the routing weights, experts and
// logits, the dispatch queues and h; never y. combine + expert_ffn become
// one moe.expert_combine_grad.

// CHECK-LABEL: func.func @layer(
// CHECK: return %{{.*}}, %{{.*}} : tensor<37x48xf32>, tensor<37x5xf32>

// CHECK-LABEL: func.func @layer_forward(
// CHECK-SAME: -> (tensor<37x48xf32>, tensor<37x5xf32>, tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>, tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>, tensor<74x80xf32>)
// CHECK-SAME: attributes {moe.num_saved = 11 : i64}
// CHECK: %[[W:.*]], %[[E:.*]], %[[L:.*]] = moe.router
// CHECK: %[[IDS:.*]], %[[OFF:.*]], %[[ROWS:.*]] = moe.dispatch
// CHECK: %[[Y:.*]], %[[H:.*]] = moe.expert_ffn
// CHECK: %[[OUT:.*]] = moe.combine
// CHECK: return %[[OUT]], %[[L]], %arg0, %arg1, %arg2, %arg3, %[[W]], %[[E]], %[[L]], %[[IDS]], %[[OFF]], %[[ROWS]], %[[H]] :

// CHECK-LABEL: func.func @layer_backward(
// CHECK-SAME: %[[X:[^:]*]]: tensor<37x48xf32> {moe.saved = "arg0"}
// CHECK-SAME: %[[WR:[^:]*]]: tensor<48x5xf32> {moe.saved = "arg1"}
// CHECK-SAME: %[[WGU:[^:]*]]: tensor<5x48x80xf32> {moe.saved = "arg2"}
// CHECK-SAME: %[[WD:[^:]*]]: tensor<5x40x48xf32> {moe.saved = "arg3"}
// CHECK-SAME: %[[SW:[^:]*]]: tensor<37x2xf32> {moe.saved = "moe.router.weights"}
// CHECK-SAME: %[[SE:[^:]*]]: tensor<37x2xi32> {moe.saved = "moe.router.experts"}
// CHECK-SAME: %[[SL:[^:]*]]: tensor<37x5xf32> {moe.saved = "moe.router.logits"}
// CHECK-SAME: %[[SIDS:[^:]*]]: tensor<74xi32> {moe.saved = "moe.dispatch.token_ids"}
// CHECK-SAME: %[[SOFF:[^:]*]]: tensor<6xi32> {moe.saved = "moe.dispatch.offsets"}
// CHECK-SAME: %[[SROWS:[^:]*]]: tensor<37x2xi32> {moe.saved = "moe.dispatch.rows"}
// CHECK-SAME: %[[SH:[^:]*]]: tensor<74x80xf32> {moe.saved = "moe.expert_ffn.h"}
// CHECK-SAME: %[[DOUT:[^:]*]]: tensor<37x48xf32>, %[[DLOGITS:[^:]*]]: tensor<37x5xf32>)
// CHECK-SAME: -> (tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>)
// CHECK-SAME: attributes {moe.gradient_args = array<i64: 0, 1, 2, 3>}
// CHECK: %[[DX0:.*]], %[[DW:.*]], %[[DWGU:.*]], %[[DWD:.*]] = moe.expert_combine_grad %[[X]], %[[SIDS]], %[[SOFF]], %[[SROWS]], %[[SW]], %[[WGU]], %[[WD]], %[[SH]], %[[DOUT]] {activation = #moe.activation<swiglu>}
// CHECK: %[[DX1:.*]], %[[DWR:.*]] = moe.router_grad %[[X]], %[[WR]], %[[SL]], %[[SE]], %[[DW]] logits_grad(%[[DLOGITS]] : tensor<37x5xf32>)
// CHECK: %[[DX:.*]] = arith.addf %[[DX0]], %[[DX1]]
// CHECK: return %[[DX]], %[[DWR]], %[[DWGU]], %[[DWD]]
// CHECK-NOT: moe.combine_grad
func.func @layer(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>,
                 %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>)
    -> (tensor<37x48xf32>, tensor<37x5xf32>) {
  %w, %e, %logits = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x48xf32>, tensor<48x5xf32>
      -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 5 : i64}
      : tensor<37x2xi32> -> tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd
      {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>,
        tensor<5x40x48xf32> -> tensor<74x48xf32>, tensor<74x80xf32>
  %out = moe.combine %y, %w, %rows
      : tensor<74x48xf32>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x48xf32>
  return %out, %logits : tensor<37x48xf32>, tensor<37x5xf32>
}

// -----

// Selection bias (no gradient), a shared expert added to the routed output,
// and auxiliary losses returned beside the output.

// CHECK-LABEL: func.func @deepseek_like_backward(
// CHECK-SAME: %{{[^:]*}}: tensor<f32>, %{{[^:]*}}: tensor<f32>)
// CHECK-SAME: -> (tensor<8x16xbf16>, tensor<16x8xbf16>, tensor<8x16x32xbf16>, tensor<8x16x16xbf16>, tensor<16x48xbf16>, tensor<24x16xbf16>)
// CHECK-SAME: attributes {moe.gradient_args = array<i64: 0, 1, 3, 4, 5, 6>}
// CHECK: %[[DLOG:.*]] = moe.aux_loss_grad
// CHECK: moe.shared_expert_grad
// CHECK: moe.expert_combine_grad
// CHECK: moe.router_grad {{.*}} logits_grad(%[[DLOG]] : tensor<8x8xf32>)
func.func @deepseek_like(%x: tensor<8x16xbf16>, %wr: tensor<16x8xbf16>,
                         %bias: tensor<8xf32>, %wgu: tensor<8x16x32xbf16>,
                         %wd: tensor<8x16x16xbf16>, %sgu: tensor<16x48xbf16>,
                         %sd: tensor<24x16xbf16>)
    -> (tensor<8x16xbf16>, tensor<f32>, tensor<f32>) {
  %w, %e, %logits = moe.router %x, %wr bias(%bias : tensor<8xf32>)
      {routing = #moe.routing<scoring = sigmoid, top_k = 2, renormalize = true,
                              num_groups = 4, topk_groups = 2, scaling_factor = 2.5>}
      : tensor<8x16xbf16>, tensor<16x8xbf16>
      -> tensor<8x2xf32>, tensor<8x2xi32>, tensor<8x8xf32>
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 8 : i64}
      : tensor<8x2xi32> -> tensor<16xi32>, tensor<9xi32>, tensor<8x2xi32>
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd
      {activation = #moe.activation<swiglu>}
      : tensor<8x16xbf16>, tensor<16xi32>, tensor<9xi32>, tensor<8x16x32xbf16>,
        tensor<8x16x16xbf16> -> tensor<16x16xbf16>, tensor<16x32xbf16>
  %routed = moe.combine %y, %w, %rows
      : tensor<16x16xbf16>, tensor<8x2xf32>, tensor<8x2xi32> -> tensor<8x16xbf16>
  %ys, %hs = moe.shared_expert %x, %sgu, %sd {activation = #moe.activation<swiglu>}
      : tensor<8x16xbf16>, tensor<16x48xbf16>, tensor<24x16xbf16>
      -> tensor<8x16xbf16>, tensor<8x48xbf16>
  %out = arith.addf %routed, %ys : tensor<8x16xbf16>
  %lb, %z = moe.aux_loss %logits, %e {scoring = #moe.scoring<sigmoid>}
      : tensor<8x8xf32>, tensor<8x2xi32> -> tensor<f32>, tensor<f32>
  return %out, %lb, %z : tensor<8x16xbf16>, tensor<f32>, tensor<f32>
}

// -----

// When y is read by something besides combine, it is saved and the two
// gradient ops stay apart.

// CHECK-LABEL: func.func @y_also_returned_backward(
// CHECK-SAME: {moe.saved = "moe.expert_ffn.y"}
// CHECK: %[[DY:.*]], %[[DW:.*]] = moe.combine_grad
// CHECK: %[[DYSUM:.*]] = arith.addf %{{.*}}, %[[DY]] : tensor<8x16xf32>
// CHECK: moe.expert_ffn_grad {{.*}}, %[[DYSUM]] {activation = #moe.activation<gelu>}
func.func @y_also_returned(%x: tensor<4x16xf32>, %wr: tensor<16x4xf32>,
                           %wgu: tensor<4x16x8xf32>, %wd: tensor<4x8x16xf32>)
    -> (tensor<4x16xf32>, tensor<8x16xf32>) {
  %w, %e, %logits = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<4x16xf32>, tensor<16x4xf32>
      -> tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x4xf32>
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 4 : i64}
      : tensor<4x2xi32> -> tensor<8xi32>, tensor<5xi32>, tensor<4x2xi32>
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd
      {activation = #moe.activation<gelu>}
      : tensor<4x16xf32>, tensor<8xi32>, tensor<5xi32>, tensor<4x16x8xf32>,
        tensor<4x8x16xf32> -> tensor<8x16xf32>, tensor<8x8xf32>
  %out = moe.combine %y, %w, %rows
      : tensor<8x16xf32>, tensor<4x2xf32>, tensor<4x2xi32> -> tensor<4x16xf32>
  return %out, %y : tensor<4x16xf32>, tensor<8x16xf32>
}

// -----

// A checkpointed expert FFN: h is not saved, backward recomputes it from the
// region's inputs, before any gradient op.

// CHECK-LABEL: func.func @checkpointed_forward(
// CHECK-NOT: moe.checkpoint
// CHECK-NOT: moe.recompute
// CHECK: moe.expert_ffn
// CHECK-LABEL: func.func @checkpointed_backward(
// CHECK-NOT: moe.expert_ffn.h
// CHECK-SAME: {moe.gradient_args
// CHECK-NEXT: %{{.*}}, %[[H:.*]] = moe.expert_ffn
// CHECK-NEXT: moe.expert_combine_grad {{.*}}, %[[H]], %{{.*}} {activation
func.func @checkpointed(%x: tensor<4x16xf32>, %wr: tensor<16x4xf32>,
                        %wgu: tensor<4x16x16xf32>, %wd: tensor<4x8x16xf32>)
    -> tensor<4x16xf32> {
  %w, %e, %logits = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 1>}
      : tensor<4x16xf32>, tensor<16x4xf32>
      -> tensor<4x1xf32>, tensor<4x1xi32>, tensor<4x4xf32>
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 4 : i64}
      : tensor<4x1xi32> -> tensor<4xi32>, tensor<5xi32>, tensor<4x1xi32>
  %y, %h = moe.checkpoint (%x, %ids, %offsets, %wgu, %wd)
      : (tensor<4x16xf32>, tensor<4xi32>, tensor<5xi32>, tensor<4x16x16xf32>,
         tensor<4x8x16xf32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
  ^bb0(%a: tensor<4x16xf32>, %b: tensor<4xi32>, %c: tensor<5xi32>,
       %d: tensor<4x16x16xf32>, %f: tensor<4x8x16xf32>):
    %y0, %h0 = moe.expert_ffn %a, %b, %c, %d, %f {activation = #moe.activation<swiglu>}
        : tensor<4x16xf32>, tensor<4xi32>, tensor<5xi32>, tensor<4x16x16xf32>,
          tensor<4x8x16xf32> -> tensor<4x16xf32>, tensor<4x16xf32>
    moe.yield %y0, %h0 : tensor<4x16xf32>, tensor<4x16xf32>
  }
  %out = moe.combine %y, %w, %rows
      : tensor<4x16xf32>, tensor<4x1xf32>, tensor<4x1xi32> -> tensor<4x16xf32>
  return %out : tensor<4x16xf32>
}

// -----

// Only the logits are returned: the routing weights get a zero gradient of
// the dynamic token count. Both functions keep the bound on it.

// CHECK-LABEL: func.func @logits_only_forward(
// CHECK-SAME: moe.max_tokens = 512 : i64
// CHECK-LABEL: func.func @logits_only_backward(
// CHECK-SAME: moe.max_tokens = 512 : i64
// CHECK-NOT: moe.router.weights
// CHECK: %[[T:.*]] = tensor.dim %{{.*}}, %c0 : tensor<?x2xi32>
// CHECK: %[[ZERO:.*]] = tensor.splat %{{.*}}[%[[T]]] : tensor<?x2xf32>
// CHECK: moe.router_grad {{.*}}, %[[ZERO]] logits_grad
func.func @logits_only(%x: tensor<?x16xf32>, %wr: tensor<16x4xf32>) -> tensor<?x4xf32>
    attributes {moe.max_tokens = 512 : i64} {
  %w, %e, %logits = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x16xf32>, tensor<16x4xf32>
      -> tensor<?x2xf32>, tensor<?x2xi32>, tensor<?x4xf32>
  return %logits : tensor<?x4xf32>
}

// -----

func.func @not_decomposed(%x: tensor<8x16xf32>, %wr: tensor<16x4xf32>,
                          %wgu: tensor<4x16x48xf32>, %wd: tensor<4x24x16xf32>)
    -> tensor<8x16xf32> {
  // expected-error @+1 {{must be decomposed first: run --moe-decompose before --moe-generate-backward}}
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 1>}
      : tensor<8x16xf32>, tensor<16x4xf32>, tensor<4x16x48xf32>,
        tensor<4x24x16xf32> -> tensor<8x16xf32>, tensor<8x4xf32>
  return %out : tensor<8x16xf32>
}

// -----

func.func @h_returned(%x: tensor<4x16xf32>, %ids: tensor<4xi32>, %offsets: tensor<5xi32>,
                      %wgu: tensor<4x16x16xf32>, %wd: tensor<4x8x16xf32>)
    -> tensor<4x16xf32> {
  // expected-error @+1 {{has a gradient into its pre-activations h, which moe-generate-backward does not differentiate}}
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<4x16xf32>, tensor<4xi32>, tensor<5xi32>, tensor<4x16x16xf32>,
        tensor<4x8x16xf32> -> tensor<4x16xf32>, tensor<4x16xf32>
  return %h : tensor<4x16xf32>
}

// -----

func.func @no_rule(%x: tensor<4x16xf32>, %wr: tensor<16x4xf32>) -> tensor<4x4xf32> {
  %w, %e, %logits = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<4x16xf32>, tensor<16x4xf32>
      -> tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x4xf32>
  // expected-error @+1 {{is on the gradient path but moe-generate-backward has no gradient rule for it}}
  %sq = arith.mulf %logits, %logits : tensor<4x4xf32>
  return %sq : tensor<4x4xf32>
}

// -----

func.func @taken_forward(%x: tensor<4x16xf32>) { return }

// expected-error @+1 {{cannot generate @taken_forward: a symbol of that name exists}}
func.func @taken(%x: tensor<4x16xf32>, %wr: tensor<16x4xf32>) -> tensor<4x4xf32> {
  %w, %e, %logits = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<4x16xf32>, tensor<16x4xf32>
      -> tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x4xf32>
  return %logits : tensor<4x4xf32>
}

// -----

// A combine that adds a tensor to its output (accumulate, as moe-fold-adds
// leaves it): the added tensor's gradient is the output's, added to the
// gradient that reaches it otherwise (here the router's dx through x).
// CHECK-LABEL: func.func @accumulate_backward(
// CHECK-SAME: %[[DOUT:[a-z0-9]+]]: tensor<37x48xf32>) ->
// CHECK: moe.expert_combine_grad
// CHECK: arith.addf %[[DOUT]], %{{.*}} : tensor<37x48xf32>
// CHECK: %[[DX:.*]], %{{.*}} = moe.router_grad
// CHECK: %[[SUM:.*]] = arith.addf %{{.*}}, %[[DX]]
// CHECK: return %[[SUM]],
func.func @accumulate(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>,
                      %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>)
    -> tensor<37x48xf32> {
  %w, %e, %logits = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x48xf32>, tensor<48x5xf32>
      -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 5 : i64}
      : tensor<37x2xi32> -> tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd
      {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>,
        tensor<5x40x48xf32> -> tensor<74x48xf32>, tensor<74x80xf32>
  %out = moe.combine %y, %w, %rows accumulate(%x : tensor<37x48xf32>)
      : tensor<74x48xf32>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x48xf32>
  return %out : tensor<37x48xf32>
}

// -----

// Expert parallelism: the combine's gradient goes back to the ranks of the
// experts with moe.ep_dispatch (rows that forward dropped are dropped again,
// without a second error), the scatter's gradient is a gather, and x gets
// the rows' gradients summed per token with moe.ep_combine's reduce over
// moe.dispatch's rows. y, which the combine's gradient reads, is saved.
// CHECK-LABEL: func.func @ep_backward(
// CHECK: %[[DY:.*]], %[[DW:.*]] = moe.combine_grad %[[DOUT:[a-z0-9]+]], %[[W:[a-z0-9]+]], %[[ROWS:[a-z0-9]+]], %[[Y:[a-z0-9]+]]
// CHECK: %[[DRECV:.*]], %{{.*}}, %{{.*}} = moe.ep_dispatch %[[DY]], %[[OFF:[a-z0-9]+]] {capacity = 16 : i64, ep_size = 2 : i64, overflow = #moe.ep_overflow<drop>} : tensor<?x16xf32>, tensor<9xi32> -> tensor<32x16xf32>, tensor<2x4xi32>, tensor<2xi32>
// CHECK: %[[DYQ:.*]] = moe.gather_rows %[[DRECV]], %[[QIDS:[a-z0-9]+]]
// CHECK: %[[DX:.*]], %[[DWGU:.*]], %[[DWD:.*]] = moe.expert_ffn_grad %{{.*}}, %[[QIDS]], %{{.*}}, %[[DYQ]]
// CHECK: %[[DXT:.*]] = moe.ep_combine %[[DX]], %[[OFF]] reduce(%[[ROWS]] : tensor<?x2xi32>) {capacity = 16 : i64, ep_size = 2 : i64} : tensor<32x16xf32>, tensor<9xi32> -> tensor<?x16xf32>
// CHECK: %[[DXR:.*]], %[[DWR:.*]] = moe.router_grad
// CHECK: %[[SUM:.*]] = arith.addf %[[DXT]], %[[DXR]]
// CHECK: return %[[SUM]], %[[DWR]], %[[DWGU]], %[[DWD]]
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

func.func @ep_reduce(%rows_in: tensor<32x16xf32>, %off: tensor<9xi32>, %r: tensor<?x2xi32>)
    -> tensor<?x16xf32> {
  // expected-error @+1 {{sums rows per token (reduce), which moe-generate-backward does not differentiate}}
  %dx = moe.ep_combine %rows_in, %off reduce(%r : tensor<?x2xi32>) {capacity = 16 : i64, ep_size = 2 : i64}
      : tensor<32x16xf32>, tensor<9xi32> -> tensor<?x16xf32>
  return %dx : tensor<?x16xf32>
}

// -----

func.func @ep_gather_elsewhere(%x: tensor<?x16xf32>, %ids: tensor<?xi32>, %off: tensor<9xi32>)
    -> tensor<32x16xf32> {
  // expected-error @+1 {{gathers by token_ids that do not come with their offsets from one moe.dispatch, whose rows its gradient needs}}
  %recv, %counts, %dropped = moe.ep_dispatch %x, %off gather(%ids : tensor<?xi32>)
      {capacity = 16 : i64, ep_size = 2 : i64}
      : tensor<?x16xf32>, tensor<9xi32> -> tensor<32x16xf32>, tensor<2x4xi32>, tensor<2xi32>
  return %recv : tensor<32x16xf32>
}

// -----

// A collective in a checkpoint region is never run again in backward: what
// backward reads of it (the rows received) is saved, while the expert FFN
// beside it is recomputed.
// CHECK-LABEL: func.func @ep_checkpoint_backward(
// CHECK-SAME: %{{.*}}: tensor<32x16xf32> {moe.saved = "moe.ep_dispatch.received"}
// CHECK: moe.expert_ffn
// CHECK-NOT: moe.ep_dispatch {{.*}} gather
// CHECK: moe.ep_dispatch %{{.*}}, %{{.*}} {capacity = 16 : i64, ep_size = 2 : i64, overflow = #moe.ep_overflow<drop>}
// CHECK-NOT: moe.ep_dispatch {{.*}} gather
// CHECK: return
func.func @ep_checkpoint(%x: tensor<4x16xf32>, %wr: tensor<16x8xf32>,
                         %wgu: tensor<4x16x24xf32>, %wd: tensor<4x12x16xf32>)
    -> tensor<4x16xf32> {
  %w, %e, %logits = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<4x16xf32>, tensor<16x8xf32> -> tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x8xf32>
  %ids, %off, %rows = moe.dispatch %e {num_experts = 8 : i64}
      : tensor<4x2xi32> -> tensor<8xi32>, tensor<9xi32>, tensor<4x2xi32>
  %yq, %qids = moe.checkpoint (%x, %off, %ids, %wgu, %wd)
      : (tensor<4x16xf32>, tensor<9xi32>, tensor<8xi32>, tensor<4x16x24xf32>,
         tensor<4x12x16xf32>) -> (tensor<32x16xf32>, tensor<32xi32>) {
  ^bb0(%a: tensor<4x16xf32>, %o: tensor<9xi32>, %i: tensor<8xi32>,
       %g: tensor<4x16x24xf32>, %d: tensor<4x12x16xf32>):
    %recv, %counts, %dropped = moe.ep_dispatch %a, %o gather(%i : tensor<8xi32>)
        {capacity = 16 : i64, ep_size = 2 : i64}
        : tensor<4x16xf32>, tensor<9xi32> -> tensor<32x16xf32>, tensor<2x4xi32>, tensor<2xi32>
    %q, %qo = moe.ep_queues %counts {capacity = 16 : i64}
        : tensor<2x4xi32> -> tensor<32xi32>, tensor<5xi32>
    %y, %h = moe.expert_ffn %recv, %q, %qo, %g, %d {activation = #moe.activation<swiglu>}
        : tensor<32x16xf32>, tensor<32xi32>, tensor<5xi32>, tensor<4x16x24xf32>,
          tensor<4x12x16xf32> -> tensor<32x16xf32>, tensor<32x24xf32>
    moe.yield %y, %q : tensor<32x16xf32>, tensor<32xi32>
  }
  %back = moe.scatter_rows %yq, %qids : tensor<32x16xf32>, tensor<32xi32> -> tensor<32x16xf32>
  %yg = moe.ep_combine %back, %off {capacity = 16 : i64, ep_size = 2 : i64}
      : tensor<32x16xf32>, tensor<9xi32> -> tensor<8x16xf32>
  %out = moe.combine %yg, %w, %rows
      : tensor<8x16xf32>, tensor<4x2xf32>, tensor<4x2xi32> -> tensor<4x16xf32>
  return %out : tensor<4x16xf32>
}
