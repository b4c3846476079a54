// convert-moe-to-gpu lowers the auxiliary losses to calls of
// __moe_gpu_aux_loss and __moe_gpu_aux_loss_grad: the logits and experts as
// dynamic memrefs, the scoring as an i32 (0 softmax, 1 sigmoid) after the
// tensors, the scalar losses and their gradients as memref<f32>; a static or
// a dynamic token count (the host functions read T from the logits).
// RUN: rm -rf %t && split-file %s %t
// RUN: moe-opt %t/ops.mlir --convert-moe-to-gpu | FileCheck %s
// RUN: moe-opt %t/layer.mlir --moe-generate-backward --moe-gpu-select-kernels --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=LAYER
// The library's host functions, and the kernels they launch.
// RUN: echo 'module {}' | moe-opt --moe-gpu-emit-library | FileCheck %s --check-prefix=LIB

//--- ops.mlir
func.func @aux(%l: tensor<37x8xf32>, %e: tensor<37x2xi32>) -> (tensor<f32>, tensor<f32>) {
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<sigmoid>}
      : tensor<37x8xf32>, tensor<37x2xi32> -> tensor<f32>, tensor<f32>
  return %lb, %z : tensor<f32>, tensor<f32>
}

func.func @aux_grad(%l: tensor<37x8xf32>, %e: tensor<37x2xi32>, %dlb: tensor<f32>,
                    %dz: tensor<f32>) -> tensor<37x8xf32> {
  %dl = moe.aux_loss_grad %l, %e, %dlb, %dz {scoring = #moe.scoring<softmax>}
      : tensor<37x8xf32>, tensor<37x2xi32>, tensor<f32>, tensor<f32> -> tensor<37x8xf32>
  return %dl : tensor<37x8xf32>
}

func.func @aux_dynamic(%l: tensor<?x64xf32>, %e: tensor<?x8xi32>) -> (tensor<f32>, tensor<f32>)
    attributes {moe.max_tokens = 256 : i64} {
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<softmax>}
      : tensor<?x64xf32>, tensor<?x8xi32> -> tensor<f32>, tensor<f32>
  return %lb, %z : tensor<f32>, tensor<f32>
}

func.func @aux_grad_dynamic(%l: tensor<?x64xf32>, %e: tensor<?x8xi32>, %dlb: tensor<f32>,
                            %dz: tensor<f32>) -> tensor<?x64xf32>
    attributes {moe.max_tokens = 256 : i64} {
  %dl = moe.aux_loss_grad %l, %e, %dlb, %dz {scoring = #moe.scoring<sigmoid>}
      : tensor<?x64xf32>, tensor<?x8xi32>, tensor<f32>, tensor<f32> -> tensor<?x64xf32>
  return %dl : tensor<?x64xf32>
}

// CHECK-LABEL: func.func @aux(
// CHECK-SAME: %[[L:[a-z0-9]+]]: memref<37x8xf32>, %[[E:[a-z0-9]+]]: memref<37x2xi32>, %[[LB:[a-z0-9]+]]: memref<f32>, %[[Z:[a-z0-9]+]]: memref<f32>)
// CHECK-SAME: name = "result0", role = "output", shape = array<i64>
// CHECK-SAME: name = "result1", role = "output", shape = array<i64>
// CHECK-DAG: %[[LD:.*]] = memref.cast %[[L]] : memref<37x8xf32> to memref<?x?xf32>
// CHECK-DAG: %[[ED:.*]] = memref.cast %[[E]] : memref<37x2xi32> to memref<?x?xi32>
// CHECK-DAG: %[[SIGMOID:.*]] = arith.constant 1 : i32
// CHECK: call @__moe_gpu_aux_loss(%{{.*}}, %[[LD]], %[[ED]], %[[SIGMOID]], %{{.*}}, %{{.*}}) : (!gpu.async.token, memref<?x?xf32>, memref<?x?xi32>, i32, memref<f32>, memref<f32>) -> !gpu.async.token

// CHECK-LABEL: func.func @aux_grad(
// CHECK-SAME: %{{.*}}: memref<37x8xf32>, %{{.*}}: memref<37x2xi32>, %{{.*}}: memref<f32>, %{{.*}}: memref<f32>, %{{.*}}: memref<37x8xf32>)
// CHECK-DAG: %[[SOFTMAX:.*]] = arith.constant 0 : i32
// CHECK: call @__moe_gpu_aux_loss_grad(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[SOFTMAX]], %{{.*}}) : (!gpu.async.token, memref<?x?xf32>, memref<?x?xi32>, memref<f32>, memref<f32>, i32, memref<?x?xf32>) -> !gpu.async.token

// With a dynamic T the logits and experts keep their leading size (a token
// each), and the losses none.
// CHECK-LABEL: func.func @aux_dynamic(
// CHECK-SAME: %{{.*}}: memref<?x64xf32>, %{{.*}}: memref<?x8xi32>, %{{.*}}: memref<f32>, %{{.*}}: memref<f32>)
// CHECK-SAME: moe.gpu.max_tokens = 256 : i64
// CHECK-SAME: {dtype = "f32", name = "arg0", role = "input", rows_per_token = 1 : i64, shape = array<i64: -9223372036854775808, 64>}
// CHECK-SAME: {dtype = "f32", name = "result0", role = "output", shape = array<i64>}
// CHECK: call @__moe_gpu_aux_loss(%{{.*}}) : (!gpu.async.token, memref<?x?xf32>, memref<?x?xi32>, i32, memref<f32>, memref<f32>) -> !gpu.async.token

// CHECK-LABEL: func.func @aux_grad_dynamic(
// CHECK-SAME: %{{.*}}: memref<?x64xf32>, %{{.*}}: memref<?x8xi32>, %{{.*}}: memref<f32>, %{{.*}}: memref<f32>, %{{.*}}: memref<?x64xf32>)
// CHECK-SAME: {dtype = "f32", name = "result0", role = "output", rows_per_token = 1 : i64, shape = array<i64: -9223372036854775808, 64>}
// CHECK: call @__moe_gpu_aux_loss_grad(%{{.*}}) : (!gpu.async.token, memref<?x?xf32>, memref<?x?xi32>, memref<f32>, memref<f32>, i32, memref<?x?xf32>) -> !gpu.async.token

// LIB-LABEL: func.func private @__moe_gpu_aux_loss(
// LIB-SAME: %{{.*}}: !gpu.async.token, %{{.*}}: memref<?x?xf32>, %{{.*}}: memref<?x?xi32>, %{{.*}}: i32, %{{.*}}: memref<f32>, %{{.*}}: memref<f32>) -> !gpu.async.token
// LIB: gpu.memset async
// LIB: gpu.launch_func async [%{{.*}}] @moe_kernels::@moe_aux_counts
// LIB: gpu.launch_func async [%{{.*}}] @moe_kernels::@moe_aux_partials
// LIB: gpu.launch_func async [%{{.*}}] @moe_kernels::@moe_aux_columns
// LIB: gpu.launch_func async [%{{.*}}] @moe_kernels::@moe_aux_finish
// LIB-LABEL: func.func private @__moe_gpu_aux_loss_grad(
// LIB-SAME: %{{.*}}: !gpu.async.token, %{{.*}}: memref<?x?xf32>, %{{.*}}: memref<?x?xi32>, %{{.*}}: memref<f32>, %{{.*}}: memref<f32>, %{{.*}}: i32, %{{.*}}: memref<?x?xf32>) -> !gpu.async.token
// LIB: gpu.launch_func async [%{{.*}}] @moe_kernels::@moe_aux_counts
// LIB: gpu.launch_func async [%{{.*}}] @moe_kernels::@moe_aux_loss_grad

//--- layer.mlir
// A layer that returns its losses: backward's d_logits from aux_loss_grad,
// a temporary of the arena, feeds the router's gradient.
func.func @layer(%x: tensor<37x64xbf16>, %wr: tensor<64x8xbf16>,
                 %wgu: tensor<8x64x256xbf16>, %wd: tensor<8x128x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<f32>, tensor<f32>) {
  %w, %e, %logits = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x64xbf16>, tensor<64x8xbf16>
      -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x8xf32>
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 8 : i64}
      : tensor<37x2xi32> -> tensor<74xi32>, tensor<9xi32>, tensor<37x2xi32>
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd
      {activation = #moe.activation<swiglu>}
      : tensor<37x64xbf16>, tensor<74xi32>, tensor<9xi32>, tensor<8x64x256xbf16>,
        tensor<8x128x64xbf16> -> tensor<74x64xbf16>, tensor<74x256xbf16>
  %out = moe.combine %y, %w, %rows
      : tensor<74x64xbf16>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x64xbf16>
  %lb, %z = moe.aux_loss %logits, %e {scoring = #moe.scoring<softmax>}
      : tensor<37x8xf32>, tensor<37x2xi32> -> tensor<f32>, tensor<f32>
  return %out, %lb, %z : tensor<37x64xbf16>, tensor<f32>, tensor<f32>
}

// The router's kernels compute the losses too (aux-fused.mlir).
// LAYER-LABEL: func.func @layer_forward(
// LAYER: call @__moe_gpu_router_aux(
// LAYER-NOT: call @__moe_gpu_aux_loss(
// LAYER: call @__moe_gpu_combine(
// LAYER-NOT: call @__moe_gpu_aux_loss(
// Its gradient too: the router's gradient adds aux_loss_grad's d_logits in
// its own pass, from the cotangents of the losses.
// LAYER-LABEL: func.func @layer_backward(
// LAYER-SAME: %[[DLB:arg12]]: memref<f32>, %[[DZ:arg13]]: memref<f32>
// LAYER-DAG: %[[DLBD:.*]] = memref.cast %[[DLB]] : memref<f32> to memref<f32>
// LAYER-DAG: %[[DZD:.*]] = memref.cast %[[DZ]] : memref<f32> to memref<f32>
// LAYER-NOT: call @__moe_gpu_aux_loss_grad(
// LAYER: call @__moe_gpu_router_grad_aux{{(_acc)?}}(%{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}, %[[DLBD]], %[[DZD]],
// LAYER-NOT: call @__moe_gpu_aux_loss_grad(
