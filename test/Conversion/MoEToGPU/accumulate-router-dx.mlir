// convert-moe-to-gpu with a GPU library that has __moe_gpu_router_grad_acc
// (MOE_GPU_ACCUMULATE_DX=1, given by the pass's `library` option): the
// backward's returned dx = X + dx of the router gradient is folded into the
// router gradient, which adds its part into the out-parameter X was written
// to; no add runs and neither X nor the router's dx is a temporary. Where the
// add cannot be folded, or the library lacks the function (the embedded
// default), the add stays.
// RUN: env MOE_GPU_ACCUMULATE_DX=1 %PYTHON %moe_src_root/lib/Conversion/MoEToGPU/gen_gpu_library.py -o %t.acc.mlir
// RUN: moe-opt %s --split-input-file --convert-moe-to-gpu="library=%t.acc.mlir" | FileCheck %s
// RUN: moe-opt %s --split-input-file --convert-moe-to-gpu | FileCheck %s --check-prefix=DEFAULT
// RUN: not moe-opt %s --split-input-file --convert-moe-to-gpu="library=%t.missing.mlir" 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: echo "module {" > %t.bad.mlir
// RUN: not moe-opt %s --split-input-file --convert-moe-to-gpu="library=%t.bad.mlir" 2>&1 | FileCheck %s --check-prefix=BAD

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
// The embedded library has no __moe_gpu_router_grad_acc: the add stays, and
// the experts' and the router's dx are temporaries (4864 bytes each, aligned).
// DEFAULT-LABEL: func.func @fold(
// DEFAULT-SAME: moe.gpu.workspace_bytes = 10024 : i64
// DEFAULT: call @__moe_gpu_router_grad(
// DEFAULT: call @__moe_gpu_add(
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
// DEFAULT-LABEL: func.func @fold_after_add(
// DEFAULT: call @__moe_gpu_router_grad(
// DEFAULT-COUNT-2: call @__moe_gpu_add(
func.func @fold_after_add(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>, %dshared: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %other = arith.addf %dx, %dshared : tensor<37x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %dxr, %other : tensor<37x64xbf16>
  return %sum, %dwr, %dwgu, %dwd : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
}

// -----

// The router's dx is returned too: it needs a buffer of its own. The add stays.
// CHECK-LABEL: func.func @router_dx_returned(
// CHECK: call @__moe_gpu_router_grad(
// CHECK: call @__moe_gpu_add(
// CHECK-NOT: __moe_gpu_router_grad_acc
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
// CHECK: call @__moe_gpu_router_grad(
// CHECK: call @__moe_gpu_add(
// CHECK-NOT: __moe_gpu_router_grad_acc
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
// CHECK: call @__moe_gpu_router_grad(
// CHECK: call @__moe_gpu_add(
// CHECK-NOT: __moe_gpu_router_grad_acc
// CHECK: return
func.func @x_argument(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>, %dshared: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %dshared, %dxr : tensor<37x64xbf16>
  return %sum, %dwr, %dwgu, %dwd : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
}

// -----

// X is computed after the router's gradient. The add stays.
// CHECK-LABEL: func.func @x_after_router(
// CHECK: call @__moe_gpu_router_grad(
// CHECK: call @__moe_gpu_add(
// CHECK-NOT: __moe_gpu_router_grad_acc
// CHECK: return
func.func @x_after_router(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>, %dshared: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %other = arith.addf %dx, %dshared : tensor<37x64xbf16>
  %sum = arith.addf %other, %dxr : tensor<37x64xbf16>
  return %sum, %dwr, %dwgu, %dwd : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
}

// -----

// The sum is not an out-parameter but a temporary. The add stays.
// CHECK-LABEL: func.func @sum_not_returned(
// CHECK: call @__moe_gpu_router_grad(
// CHECK: call @__moe_gpu_add(
// CHECK-NOT: __moe_gpu_router_grad_acc
// CHECK: return
func.func @sum_not_returned(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %wgu: tensor<4x64x256xbf16>, %wd: tensor<4x128x64xbf16>, %w: tensor<37x2xf32>, %e: tensor<37x2xi32>, %l: tensor<37x4xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %rows: tensor<37x2xi32>, %h: tensor<74x256xbf16>, %dout: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>) {
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %dxr, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %sum = arith.addf %dx, %dxr : tensor<37x64xbf16>
  %twice = arith.addf %sum, %sum : tensor<37x64xbf16>
  return %twice, %dwr, %dwgu, %dwd : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
}
