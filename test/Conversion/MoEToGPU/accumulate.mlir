// moe-fold-adds then convert-moe-to-gpu with the accumulating host functions
// of the GPU library: an add `sum = X + P` whose P the router's gradient, the
// experts' gradient (their dx) or the combine can add into X's buffer is
// folded by moe-fold-adds (P's op gets `accumulate(X)`); the conversion writes
// X straight into the sum's buffer and P's op, by its `_acc` host function,
// adds to it; no add runs and neither part is a temporary. P's op moves to
// right before the add where X comes after it and nothing reads P's op's
// results before the add. Where an add cannot be folded it stays. The
// NOROUTER checks run the conversion alone (no fold) with the library file
// moe-gpu-emit-library writes, less __moe_gpu_router_grad_acc (given by the
// pass's `library` option): every add stays; accumulate-errors.mlir has the
// error of an op that accumulates with that library.
// RUN: moe-opt %s --split-input-file --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu | FileCheck %s
// RUN: echo 'module {}' | moe-opt --moe-gpu-emit-library | sed '/func.func private @__moe_gpu_router_grad_acc(/,/^  }$/d' > %t.norouter.mlir
// RUN: not grep -q __moe_gpu_router_grad_acc %t.norouter.mlir
// RUN: moe-opt %s --split-input-file --moe-plan-memory --convert-moe-to-gpu="library=%t.norouter.mlir" | FileCheck %s --check-prefix=NOROUTER
// RUN: not moe-opt %s --split-input-file --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu="library=%t.missing.mlir" 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: echo "module {" > %t.bad.mlir
// RUN: not moe-opt %s --split-input-file --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu="library=%t.bad.mlir" 2>&1 | FileCheck %s --check-prefix=BAD

// MISSING: error: cannot read the GPU library '{{.*}}.missing.mlir': No such file or directory
// BAD: error: cannot parse the GPU library {{.*}}.bad.mlir

// The experts' dx goes into result0 and the router adds its part there: only
// d_weights [37x2xf32] is a temporary.
// CHECK-LABEL: func.func @fold(
// CHECK-SAME: %{{[a-z0-9]+}}: memref<37x64xbf16>, %[[RESULT0:[a-z0-9]+]]: memref<37x64xbf16>, %{{[a-z0-9]+}}: memref<64x4xbf16>,
// CHECK-SAME: moe.gpu.workspace_bytes = 296 : i64
// CHECK: %[[DX:.*]] = memref.cast %[[RESULT0]] : memref<37x64xbf16> to memref<?x?xbf16>
// CHECK: call @__moe_gpu_expert_combine_grad({{.*}}, %[[DX]], %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}}, %{{[a-z0-9_]+}})
// CHECK: %[[DX2:.*]] = memref.cast %[[RESULT0]] : memref<37x64xbf16> to memref<?x?xbf16>
// CHECK: call @__moe_gpu_router_grad_acc({{.*}}, %[[DX2]], %{{[a-z0-9_]+}})
// CHECK-NOT: call @__moe_gpu_add(
// CHECK: return
// CHECK-DAG: func.func private @__moe_gpu_router_grad_acc(
// CHECK-DAG: func.func private @__moe_gpu_expert_combine_grad(
// CHECK-NOT: func.func private @__moe_gpu_expert_combine_grad_acc(
// Without the fold the add stays, and the experts' and the router's dx are
// temporaries (4864 bytes each, aligned).
// NOROUTER-LABEL: func.func @fold(
// NOROUTER-SAME: moe.gpu.workspace_bytes = 10024 : i64
// NOROUTER: call @__moe_gpu_expert_combine_grad(
// NOROUTER: call @__moe_gpu_router_grad(
// NOROUTER: call @__moe_gpu_add(
func.func @fold(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %dx, %dxr : tensor<37x64xbf16>
  return %sum, %dwr, %dwgu, %dwd : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
}

// -----

// The router's dx on the left of the add, X the sum of two others (DeepSeek's
// shared expert): that add writes into result0 and the router adds to it.
// CHECK-LABEL: func.func @fold_after_add(
// CHECK-SAME: %{{[a-z0-9]+}}: memref<37x64xbf16>, %[[RESULT0:[a-z0-9]+]]: memref<37x64xbf16>, %{{[a-z0-9]+}}: memref<64x4xbf16>,
// CHECK: call @__moe_gpu_expert_combine_grad(
// CHECK: %[[SUM:.*]] = memref.collapse_shape %[[RESULT0]]
// CHECK: %[[SUMD:.*]] = memref.cast %[[SUM]]
// CHECK: call @__moe_gpu_add({{.*}}, %[[SUMD]])
// CHECK: %[[DX:.*]] = memref.cast %[[RESULT0]] : memref<37x64xbf16> to memref<?x?xbf16>
// CHECK: call @__moe_gpu_router_grad_acc({{.*}}, %[[DX]], %{{[a-z0-9_]+}})
// CHECK-NOT: call @__moe_gpu_add(
// CHECK: return
// NOROUTER-LABEL: func.func @fold_after_add(
// NOROUTER: call @__moe_gpu_add(
// NOROUTER: call @__moe_gpu_router_grad(
// NOROUTER: call @__moe_gpu_add(
func.func @fold_after_add(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>, %dshared: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %other = arith.addf %dx, %dshared : tensor<37x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %dxr, %other : tensor<37x64xbf16>
  return %sum, %dwr, %dwgu, %dwd : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
}

// -----

// DeepSeek's forward: out = combine + the shared expert's y. The combine moves
// after the shared expert, which writes y into result0, and adds the routed
// experts' rows to it (in f32, before the one rounding): neither the combine's
// output nor the shared expert's y is a temporary any more.
// CHECK-LABEL: func.func @ds_like(
// CHECK-SAME: %[[RESULT0:[a-z0-9]+]]: memref<37x64xbf16>)
// CHECK-SAME: moe.gpu.workspace_bytes = 29988 : i64
// CHECK: call @__moe_gpu_expert_ffn(
// CHECK: %[[Y:.*]] = memref.cast %[[RESULT0]] : memref<37x64xbf16> to memref<?x?xbf16>
// CHECK: call @__moe_gpu_shared_expert({{.*}}, %[[Y]], %{{[a-z0-9_]+}})
// CHECK: %[[OUT:.*]] = memref.cast %[[RESULT0]] : memref<37x64xbf16> to memref<?x?xbf16>
// CHECK: call @__moe_gpu_combine_acc({{.*}}, %[[OUT]])
// CHECK-NOT: call @__moe_gpu_add(
// CHECK: return
// NOROUTER-LABEL: func.func @ds_like(
// NOROUTER: call @__moe_gpu_combine(
// NOROUTER: call @__moe_gpu_shared_expert(
// NOROUTER: call @__moe_gpu_add(
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

// DeepSeek's backward: dx = (the shared expert's + the experts') + the
// router's. The shared expert's gradient writes its dx into result0, the
// experts' gradient and then the router's add theirs: no add, and only
// d_weights [37x2xf32] is a temporary.
// CHECK-LABEL: func.func @ds_like_backward(
// CHECK-SAME: moe.gpu.workspace_bytes = 296 : i64
// CHECK: call @__moe_gpu_shared_expert_grad(
// CHECK: call @__moe_gpu_expert_combine_grad_acc(
// CHECK: call @__moe_gpu_router_grad_acc(
// CHECK-NOT: call @__moe_gpu_add(
// CHECK: return
// Without the fold: both adds stay.
// NOROUTER-LABEL: func.func @ds_like_backward(
// NOROUTER: call @__moe_gpu_expert_combine_grad(
// NOROUTER-COUNT-2: call @__moe_gpu_add(
func.func @ds_like_backward(%arg0: tensor<37x64xbf16>, %arg1: tensor<64x8xbf16>, %arg2: tensor<8x64x128xbf16>, %arg3: tensor<8x64x64xbf16>, %arg4: tensor<64x256xbf16>, %arg5: tensor<128x64xbf16>, %arg6: tensor<37x2xf32>, %arg7: tensor<37x2xi32>, %arg8: tensor<37x8xf32>, %arg9: tensor<74xi32>, %arg10: tensor<9xi32>, %arg11: tensor<37x2xi32>, %arg12: tensor<74x128xbf16>, %arg13: tensor<37x256xbf16>, %arg14: tensor<37x64xbf16>) -> (tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16>) {
  %dx, %d_w_gate_up, %d_w_down = moe.shared_expert_grad %arg0, %arg4, %arg5, %arg13, %arg14 {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16>, tensor<37x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16>
  %dx_0, %d_weights, %d_w_gate_up_1, %d_w_down_2 = moe.expert_combine_grad %arg0, %arg9, %arg10, %arg11, %arg6, %arg2, %arg3, %arg12, %arg14 {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<9xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16>, tensor<74x128xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16>
  %0 = arith.addf %dx, %dx_0 : tensor<37x64xbf16>
  %dx_3, %d_router_weight = moe.router_grad %arg0, %arg1, %arg8, %arg7, %d_weights {routing = #moe.routing<scoring = sigmoid, top_k = 2, renormalize = true, num_groups = 4, topk_groups = 2, scaling_factor = 2.500000e+00>} : tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<37x8xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x8xbf16>
  %1 = arith.addf %0, %dx_3 : tensor<37x64xbf16>
  return %1, %d_router_weight, %d_w_gate_up_1, %d_w_down_2, %d_w_gate_up, %d_w_down : tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16>
}

// -----

// The router's dx is returned too: it needs a buffer of its own. The add stays.
// CHECK-LABEL: func.func @router_dx_returned(
// CHECK: call @__moe_gpu_expert_combine_grad(
// CHECK: call @__moe_gpu_router_grad(
// CHECK: call @__moe_gpu_add(
// CHECK-NOT: _acc(
// CHECK: return
func.func @router_dx_returned(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<37x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %dx, %dxr : tensor<37x64xbf16>
  return %sum, %dwr, %dwgu, %dwd, %dxr : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<37x64xbf16>
}

// -----

// X is returned too. The add stays.
// CHECK-LABEL: func.func @x_used_twice(
// CHECK: call @__moe_gpu_expert_combine_grad(
// CHECK: call @__moe_gpu_router_grad(
// CHECK: call @__moe_gpu_add(
// CHECK-NOT: _acc(
// CHECK: return
func.func @x_used_twice(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<37x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %dx, %dxr : tensor<37x64xbf16>
  return %sum, %dwr, %dwgu, %dwd, %dx : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<37x64xbf16>
}

// -----

// X is an argument, which the add must not overwrite. The add stays.
// CHECK-LABEL: func.func @x_argument(
// CHECK: call @__moe_gpu_expert_combine_grad(
// CHECK: call @__moe_gpu_router_grad(
// CHECK: call @__moe_gpu_add(
// CHECK-NOT: _acc(
// CHECK: return
func.func @x_argument(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>, %dshared: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %dshared, %dxr : tensor<37x64xbf16>
  return %sum, %dwr, %dwgu, %dwd : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
}

// -----

// X is computed after the router's gradient, whose results nothing reads
// before the add: the router's gradient moves to right before it.
// CHECK-LABEL: func.func @router_moves(
// CHECK-SAME: %{{[a-z0-9]+}}: memref<37x64xbf16>, %[[RESULT0:[a-z0-9]+]]: memref<37x64xbf16>, %{{[a-z0-9]+}}: memref<64x4xbf16>,
// CHECK: call @__moe_gpu_expert_combine_grad(
// CHECK: %[[SUM:.*]] = memref.collapse_shape %[[RESULT0]]
// CHECK: %[[SUMD:.*]] = memref.cast %[[SUM]]
// CHECK: call @__moe_gpu_add({{.*}}, %[[SUMD]])
// CHECK: call @__moe_gpu_router_grad_acc(
// CHECK-NOT: call @__moe_gpu_add(
// CHECK: return
func.func @router_moves(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>, %dshared: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %other = arith.addf %dx, %dshared : tensor<37x64xbf16>
  %sum = arith.addf %other, %dxr : tensor<37x64xbf16>
  return %sum, %dwr, %dwgu, %dwd : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
}

// -----

// The experts' dx could only be added after X, made after their gradient,
// but the router's gradient reads their d_weights before the add: nothing
// moves and the add stays (the router's own dx is returned).
// CHECK-LABEL: func.func @experts_dx_read_before(
// CHECK: call @__moe_gpu_expert_combine_grad(
// CHECK: call @__moe_gpu_add(
// CHECK: call @__moe_gpu_router_grad(
// CHECK: call @__moe_gpu_add(
// CHECK-NOT: _acc(
// CHECK: return
func.func @experts_dx_read_before(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>, %dshared: tensor<37x64xbf16>, %dother: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<37x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %other = arith.addf %dshared, %dother : tensor<37x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %dx, %other : tensor<37x64xbf16>
  return %sum, %dwr, %dwgu, %dwd, %dxr : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<37x64xbf16>
}

// -----

// The sum is not an out-parameter but a temporary. The add stays.
// CHECK-LABEL: func.func @sum_not_returned(
// CHECK: call @__moe_gpu_expert_combine_grad(
// CHECK: call @__moe_gpu_router_grad(
// CHECK: call @__moe_gpu_add(
// CHECK-NOT: _acc(
// CHECK: return
func.func @sum_not_returned(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %dx, %dxr : tensor<37x64xbf16>
  %twice = arith.addf %sum, %sum : tensor<37x64xbf16>
  return %twice, %dwr, %dwgu, %dwd : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
}
