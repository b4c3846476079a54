// moe-fold-adds: `sum = arith.addf X, P` whose P is the dx of moe.router_grad,
// the dx of moe.expert_combine_grad or the out of moe.combine becomes P's op
// with `accumulate(X)`, where the sum is returned or is the X of a later fold,
// P and X are read by the add alone, X is made by an op (not a moe.prefetch)
// of the block, and X comes first or P's op can move to right before the add.
// A router_grad whose chosen dx config cannot accumulate keeps its add.
// RUN: moe-opt %s --split-input-file --moe-fold-adds | FileCheck %s

// The router's dx added to the experts': the router's gradient accumulates.
// CHECK-LABEL: func.func @fold(
// CHECK: %[[DX:.*]], %{{.*}}, %{{.*}}, %{{.*}} = moe.expert_combine_grad
// CHECK-NOT: accumulate
// CHECK: %[[SUM:.*]], %[[DWR:.*]] = moe.router_grad %{{.*}} accumulate(%[[DX]] : tensor<37x64xbf16>)
// CHECK-NOT: arith.addf
// CHECK: return %[[SUM]], %[[DWR]]
func.func @fold(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %dx, %dxr : tensor<37x64xbf16>
  return %sum, %dwr, %dwgu, %dwd : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
}

// -----

// X is itself a sum, of two values no op accumulates into: only the last add folds.
// CHECK-LABEL: func.func @fold_after_add(
// CHECK: %[[OTHER:.*]] = arith.addf
// CHECK: moe.router_grad %{{.*}} accumulate(%[[OTHER]] : tensor<37x64xbf16>)
// CHECK-NOT: arith.addf
func.func @fold_after_add(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>, %dshared: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %other = arith.addf %dx, %dshared : tensor<37x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %dxr, %other : tensor<37x64xbf16>
  return %sum, %dwr, %dwgu, %dwd : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
}

// -----

// DeepSeek's forward: the combine moves after the shared expert and adds to its y.
// CHECK-LABEL: func.func @ds_like(
// CHECK: %[[Y:.*]], %{{.*}} = moe.shared_expert
// CHECK: %[[OUT:.*]] = moe.combine %{{.*}} accumulate(%[[Y]] : tensor<37x64xbf16>)
// CHECK-NOT: arith.addf
// CHECK: return %[[OUT]]
func.func @ds_like(%arg0: tensor<37x64xbf16>, %arg1: tensor<64x8xbf16>, %arg2: tensor<8xf32>, %arg3: tensor<8x64x128xbf16>, %arg4: tensor<8x64x64xbf16>, %arg5: tensor<64x256xbf16>, %arg6: tensor<128x64xbf16>) -> tensor<37x64xbf16> {
  %weights, %experts, %logits = moe.router %arg0, %arg1 bias(%arg2 : tensor<8xf32>) {routing = #moe.routing<scoring = sigmoid, top_k = 2, renormalize = true, num_groups = 4, topk_groups = 2, scaling_factor = 2.500000e+00>} : tensor<37x64xbf16>, tensor<64x8xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x8xf32>
  %token_ids, %offsets, %rows = moe.dispatch %experts {num_experts = 8 : i64} : tensor<37x2xi32> -> tensor<74xi32>, tensor<9xi32>, tensor<37x2xi32>
  %y, %h = moe.expert_ffn %arg0, %token_ids, %offsets, %arg3, %arg4 {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<9xi32>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16> -> tensor<74x64xbf16>, tensor<74x128xbf16>
  %0 = moe.combine %y, %weights, %rows : tensor<74x64xbf16>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x64xbf16>
  %y_0, %h_1 = moe.shared_expert %arg0, %arg5, %arg6 {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16> -> tensor<37x64xbf16>, tensor<37x256xbf16>
  %1 = arith.addf %0, %y_0 : tensor<37x64xbf16>
  return %1 : tensor<37x64xbf16>
}

// -----

// DeepSeek's backward: the second add folds into the router's gradient, which
// makes the first sum the X of a fold: it folds into the experts' gradient.
// CHECK-LABEL: func.func @ds_like_backward(
// CHECK: %[[SDX:.*]], %{{.*}}, %{{.*}} = moe.shared_expert_grad
// CHECK: %[[EDX:.*]], %{{.*}}, %{{.*}}, %{{.*}} = moe.expert_combine_grad %{{.*}} accumulate(%[[SDX]] : tensor<37x64xbf16>)
// CHECK: %[[RDX:.*]], %{{.*}} = moe.router_grad %{{.*}} accumulate(%[[EDX]] : tensor<37x64xbf16>)
// CHECK-NOT: arith.addf
// CHECK: return %[[RDX]],
func.func @ds_like_backward(%arg0: tensor<37x64xbf16>, %arg1: tensor<64x8xbf16>, %arg2: tensor<8x64x128xbf16>, %arg3: tensor<8x64x64xbf16>, %arg4: tensor<64x256xbf16>, %arg5: tensor<128x64xbf16>, %arg6: tensor<37x2xf32>, %arg7: tensor<37x2xi32>, %arg8: tensor<37x8xf32>, %arg9: tensor<74xi32>, %arg10: tensor<9xi32>, %arg11: tensor<37x2xi32>, %arg12: tensor<74x128xbf16>, %arg13: tensor<37x256xbf16>, %arg14: tensor<37x64xbf16>) -> (tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16>) {
  %dx, %d_w_gate_up, %d_w_down = moe.shared_expert_grad %arg0, %arg4, %arg5, %arg13, %arg14 {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16>, tensor<37x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16>
  %dx_0, %d_weights, %d_w_gate_up_1, %d_w_down_2 = moe.expert_combine_grad %arg0, %arg9, %arg10, %arg11, %arg6, %arg2, %arg3, %arg12, %arg14 {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<9xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16>, tensor<74x128xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16>
  %0 = arith.addf %dx, %dx_0 : tensor<37x64xbf16>
  %dx_3, %d_router_weight = moe.router_grad %arg0, %arg1, %arg8, %arg7, %d_weights {routing = #moe.routing<scoring = sigmoid, top_k = 2, renormalize = true, num_groups = 4, topk_groups = 2, scaling_factor = 2.500000e+00>} : tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<37x8xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x8xbf16>
  %1 = arith.addf %0, %dx_3 : tensor<37x64xbf16>
  return %1, %d_router_weight, %d_w_gate_up_1, %d_w_down_2, %d_w_gate_up, %d_w_down : tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16>
}

// -----

// The router's dx is returned too: the add stays.
// CHECK-LABEL: func.func @router_dx_returned(
// CHECK-NOT: accumulate
// CHECK: arith.addf
func.func @router_dx_returned(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<37x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %dx, %dxr : tensor<37x64xbf16>
  return %sum, %dwr, %dwgu, %dwd, %dxr : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<37x64xbf16>
}

// -----

// X is returned too: the add stays.
// CHECK-LABEL: func.func @x_used_twice(
// CHECK-NOT: accumulate
// CHECK: arith.addf
func.func @x_used_twice(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<37x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %dx, %dxr : tensor<37x64xbf16>
  return %sum, %dwr, %dwgu, %dwd, %dx : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<37x64xbf16>
}

// -----

// X is an argument: the add stays.
// CHECK-LABEL: func.func @x_argument(
// CHECK-NOT: accumulate
// CHECK: arith.addf
func.func @x_argument(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>, %dshared: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %dshared, %dxr : tensor<37x64xbf16>
  return %sum, %dwr, %dwgu, %dwd : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
}

// -----

// X comes after the router's gradient, whose results nothing reads before the
// add: the router's gradient moves to right before it.
// CHECK-LABEL: func.func @router_moves(
// CHECK: moe.expert_combine_grad
// CHECK: %[[OTHER:.*]] = arith.addf
// CHECK-NEXT: moe.router_grad %{{.*}} accumulate(%[[OTHER]] : tensor<37x64xbf16>)
// CHECK-NEXT: return
func.func @router_moves(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>, %dshared: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %other = arith.addf %dx, %dshared : tensor<37x64xbf16>
  %sum = arith.addf %other, %dxr : tensor<37x64xbf16>
  return %sum, %dwr, %dwgu, %dwd : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
}

// -----

// The experts' gradient would have to move past the router's, which reads its
// d_weights: nothing moves and the adds stay.
// CHECK-LABEL: func.func @experts_dx_read_before(
// CHECK-NOT: accumulate
// CHECK: arith.addf
// CHECK: arith.addf
func.func @experts_dx_read_before(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>, %dshared: tensor<37x64xbf16>, %dother: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<37x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %other = arith.addf %dshared, %dother : tensor<37x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %dx, %other : tensor<37x64xbf16>
  return %sum, %dwr, %dwgu, %dwd, %dxr : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<37x64xbf16>
}

// -----

// The sum is neither returned nor the X of a fold: the adds stay.
// CHECK-LABEL: func.func @sum_not_returned(
// CHECK-NOT: accumulate
// CHECK: arith.addf
// CHECK: arith.addf
func.func @sum_not_returned(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %dx, %dxr : tensor<37x64xbf16>
  %twice = arith.addf %sum, %sum : tensor<37x64xbf16>
  return %twice, %dwr, %dwgu, %dwd : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
}

// -----

// A dx config stored by bulk row copies cannot accumulate: the add stays. One
// stored by TMA boxes (with two stages) can.
// CHECK-LABEL: func.func @dx_config(
// CHECK: moe.router_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {moe_gpu.kernels
// CHECK: arith.addf
// CHECK: moe.router_grad %{{.*}} accumulate(
// CHECK-NOT: arith.addf
// CHECK: return
func.func @dx_config(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %l: tensor<37x4xf32>,
                     %e: tensor<37x2xi32>, %dw: tensor<37x2xf32>, %a: tensor<37x64xbf16>, %b: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x64xbf16>, tensor<64x4xbf16>) {
  %other = arith.addf %a, %b : tensor<37x64xbf16>
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>,
      moe_gpu.kernels = {dx = #moe_gpu.gemm<a = rows, b = w_k, epilogue = store_bf16, problem = varlen_m, store = bulk_rows>}}
      : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %other, %dx : tensor<37x64xbf16>
  %other2 = arith.addf %a, %b : tensor<37x64xbf16>
  %dx2, %dwr2 = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>,
      moe_gpu.kernels = {dx = #moe_gpu.gemm<a = rows, b = w_k, epilogue = store_bf16, problem = varlen_m, stages = 2>}}
      : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum2 = arith.addf %other2, %dx2 : tensor<37x64xbf16>
  return %sum, %dwr, %sum2, %dwr2 : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x64xbf16>, tensor<64x4xbf16>
}
