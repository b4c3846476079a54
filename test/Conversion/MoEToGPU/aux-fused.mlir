// convert-moe-to-gpu computes a moe.aux_loss in its router's kernels
// (__moe_gpu_router_aux, the losses after the router's arguments) where the
// loss takes the router's logits and experts with the router's scoring and
// the function returns both losses; any other moe.aux_loss stays a call of
// __moe_gpu_aux_loss. Likewise a moe.aux_loss_grad whose d_logits only a
// moe.router_grad of the same logits, experts and scoring reads, with the
// losses' gradients function arguments: __moe_gpu_router_grad_aux adds them
// in its d_logits pass (the gradients where d_logits was).
// RUN: moe-opt %s --moe-plan-memory --convert-moe-to-gpu | FileCheck %s
// The library's fused host function and the kernels it launches.
// RUN: echo 'module {}' | moe-opt --moe-gpu-emit-library | FileCheck %s --check-prefix=LIB

// CHECK-LABEL: func.func @fused(
// CHECK-SAME: %{{[a-z0-9]+}}: memref<37x64xbf16>, %{{[a-z0-9]+}}: memref<64x8xbf16>, %[[LB:[a-z0-9]+]]: memref<f32>, %[[Z:[a-z0-9]+]]: memref<f32>)
// CHECK: call @__moe_gpu_router_aux(%{{.*}}) : (!gpu.async.token, memref<?x?xbf16>, memref<?x?xbf16>, memref<?xf32>, i32, i1, index, index, f32, i1, memref<?x?xf32>, memref<?x?xi32>, memref<?x?xf32>, memref<f32>, memref<f32>) -> !gpu.async.token
// CHECK-NOT: call @__moe_gpu_aux_loss(
// CHECK-NOT: call @__moe_gpu_router(
// CHECK: return
func.func @fused(%x: tensor<37x64xbf16>, %wr: tensor<64x8xbf16>)
    -> (tensor<f32>, tensor<f32>) {
  %w, %e, %l = moe.router %x, %wr
      {routing = #moe.routing<scoring = sigmoid, top_k = 2>}
      : tensor<37x64xbf16>, tensor<64x8xbf16>
      -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x8xf32>
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<sigmoid>}
      : tensor<37x8xf32>, tensor<37x2xi32> -> tensor<f32>, tensor<f32>
  return %lb, %z : tensor<f32>, tensor<f32>
}

// The logits read by something else too (here returned) still fuse.
// CHECK-LABEL: func.func @logits_returned(
// CHECK: call @__moe_gpu_router_aux(
// CHECK-NOT: call @__moe_gpu_aux_loss(
// CHECK: return
func.func @logits_returned(%x: tensor<37x64xbf16>, %wr: tensor<64x8xbf16>)
    -> (tensor<37x8xf32>, tensor<f32>, tensor<f32>) {
  %w, %e, %l = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x64xbf16>, tensor<64x8xbf16>
      -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x8xf32>
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<softmax>}
      : tensor<37x8xf32>, tensor<37x2xi32> -> tensor<f32>, tensor<f32>
  return %l, %lb, %z : tensor<37x8xf32>, tensor<f32>, tensor<f32>
}

// Logits that are not a router's: standalone.
// CHECK-LABEL: func.func @not_router(
// CHECK: call @__moe_gpu_router(
// CHECK: call @__moe_gpu_aux_loss(
func.func @not_router(%x: tensor<37x64xbf16>, %wr: tensor<64x8xbf16>,
                      %l: tensor<37x8xf32>)
    -> (tensor<37x2xf32>, tensor<f32>, tensor<f32>) {
  %w, %e, %rl = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x64xbf16>, tensor<64x8xbf16>
      -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x8xf32>
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<softmax>}
      : tensor<37x8xf32>, tensor<37x2xi32> -> tensor<f32>, tensor<f32>
  return %w, %lb, %z : tensor<37x2xf32>, tensor<f32>, tensor<f32>
}

// Experts that are not the router's: standalone.
// CHECK-LABEL: func.func @other_experts(
// CHECK: call @__moe_gpu_router(
// CHECK: call @__moe_gpu_aux_loss(
func.func @other_experts(%x: tensor<37x64xbf16>, %wr: tensor<64x8xbf16>,
                         %e2: tensor<37x2xi32>)
    -> (tensor<37x2xf32>, tensor<f32>, tensor<f32>) {
  %w, %e, %l = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x64xbf16>, tensor<64x8xbf16>
      -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x8xf32>
  %lb, %z = moe.aux_loss %l, %e2 {scoring = #moe.scoring<softmax>}
      : tensor<37x8xf32>, tensor<37x2xi32> -> tensor<f32>, tensor<f32>
  return %w, %lb, %z : tensor<37x2xf32>, tensor<f32>, tensor<f32>
}

// Another scoring than the router's: standalone.
// CHECK-LABEL: func.func @other_scoring(
// CHECK: call @__moe_gpu_router(
// CHECK: call @__moe_gpu_aux_loss(
func.func @other_scoring(%x: tensor<37x64xbf16>, %wr: tensor<64x8xbf16>)
    -> (tensor<f32>, tensor<f32>) {
  %w, %e, %l = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x64xbf16>, tensor<64x8xbf16>
      -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x8xf32>
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<sigmoid>}
      : tensor<37x8xf32>, tensor<37x2xi32> -> tensor<f32>, tensor<f32>
  return %lb, %z : tensor<f32>, tensor<f32>
}

// Two losses of one router: the first is fused, the second standalone.
// CHECK-LABEL: func.func @two_losses(
// CHECK: call @__moe_gpu_router_aux(
// CHECK: call @__moe_gpu_aux_loss(
// CHECK-NOT: call @__moe_gpu_aux_loss(
// CHECK: return
func.func @two_losses(%x: tensor<37x64xbf16>, %wr: tensor<64x8xbf16>)
    -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>) {
  %w, %e, %l = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x64xbf16>, tensor<64x8xbf16>
      -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x8xf32>
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<softmax>}
      : tensor<37x8xf32>, tensor<37x2xi32> -> tensor<f32>, tensor<f32>
  %lb2, %z2 = moe.aux_loss %l, %e {scoring = #moe.scoring<softmax>}
      : tensor<37x8xf32>, tensor<37x2xi32> -> tensor<f32>, tensor<f32>
  return %lb, %z, %lb2, %z2 : tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>
}

// CHECK-LABEL: func.func @fused_grad(
// CHECK-SAME: %[[DLB:[a-z0-9]+]]: memref<f32>, %[[DZ:[a-z0-9]+]]: memref<f32>, %{{[a-z0-9]+}}: memref<37x64xbf16>, %{{[a-z0-9]+}}: memref<64x8xbf16>)
// CHECK-NOT: call @__moe_gpu_aux_loss_grad(
// CHECK: call @__moe_gpu_router_grad_aux(%{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}, %{{.*}}) : (!gpu.async.token, memref<?x?xbf16>, memref<?x?xbf16>, memref<?x?xf32>, memref<?x?xi32>, memref<?x?xf32>, memref<f32>, memref<f32>, i32, i1, f32, memref<?x?xbf16>, memref<?x?xbf16>) -> !gpu.async.token
// CHECK-NOT: call @__moe_gpu_aux_loss_grad(
// CHECK: return
func.func @fused_grad(%x: tensor<37x64xbf16>, %wr: tensor<64x8xbf16>,
                      %l: tensor<37x8xf32>, %e: tensor<37x2xi32>,
                      %dw: tensor<37x2xf32>, %dlb: tensor<f32>, %dz: tensor<f32>)
    -> (tensor<37x64xbf16>, tensor<64x8xbf16>) {
  %dl = moe.aux_loss_grad %l, %e, %dlb, %dz {scoring = #moe.scoring<sigmoid>}
      : tensor<37x8xf32>, tensor<37x2xi32>, tensor<f32>, tensor<f32> -> tensor<37x8xf32>
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw logits_grad(%dl : tensor<37x8xf32>)
      {routing = #moe.routing<scoring = sigmoid, top_k = 2>}
      : tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<37x8xf32>, tensor<37x2xi32>,
        tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x8xbf16>
  return %dx, %dwr : tensor<37x64xbf16>, tensor<64x8xbf16>
}

// d_logits read by something else too (here returned): standalone.
// CHECK-LABEL: func.func @grad_read_twice(
// CHECK: call @__moe_gpu_aux_loss_grad(
// CHECK: call @__moe_gpu_router_grad(
func.func @grad_read_twice(%x: tensor<37x64xbf16>, %wr: tensor<64x8xbf16>,
                           %l: tensor<37x8xf32>, %e: tensor<37x2xi32>,
                           %dw: tensor<37x2xf32>, %dlb: tensor<f32>, %dz: tensor<f32>)
    -> (tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<37x8xf32>) {
  %dl = moe.aux_loss_grad %l, %e, %dlb, %dz {scoring = #moe.scoring<softmax>}
      : tensor<37x8xf32>, tensor<37x2xi32>, tensor<f32>, tensor<f32> -> tensor<37x8xf32>
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw logits_grad(%dl : tensor<37x8xf32>)
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<37x8xf32>, tensor<37x2xi32>,
        tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x8xbf16>
  return %dx, %dwr, %dl : tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<37x8xf32>
}

// Another scoring than the router's, or other logits: standalone.
// CHECK-LABEL: func.func @grad_other(
// CHECK: call @__moe_gpu_aux_loss_grad(
// CHECK: call @__moe_gpu_router_grad(
// CHECK: call @__moe_gpu_aux_loss_grad(
// CHECK: call @__moe_gpu_router_grad(
func.func @grad_other(%x: tensor<37x64xbf16>, %wr: tensor<64x8xbf16>,
                      %l: tensor<37x8xf32>, %l2: tensor<37x8xf32>, %e: tensor<37x2xi32>,
                      %dw: tensor<37x2xf32>, %dlb: tensor<f32>, %dz: tensor<f32>)
    -> (tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<37x64xbf16>, tensor<64x8xbf16>) {
  %dl = moe.aux_loss_grad %l, %e, %dlb, %dz {scoring = #moe.scoring<sigmoid>}
      : tensor<37x8xf32>, tensor<37x2xi32>, tensor<f32>, tensor<f32> -> tensor<37x8xf32>
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw logits_grad(%dl : tensor<37x8xf32>)
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<37x8xf32>, tensor<37x2xi32>,
        tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x8xbf16>
  %dl2 = moe.aux_loss_grad %l2, %e, %dlb, %dz {scoring = #moe.scoring<softmax>}
      : tensor<37x8xf32>, tensor<37x2xi32>, tensor<f32>, tensor<f32> -> tensor<37x8xf32>
  %dx2, %dwr2 = moe.router_grad %x, %wr, %l, %e, %dw logits_grad(%dl2 : tensor<37x8xf32>)
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<37x8xf32>, tensor<37x2xi32>,
        tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x8xbf16>
  return %dx, %dwr, %dx2, %dwr2
      : tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<37x64xbf16>, tensor<64x8xbf16>
}

// LIB-LABEL: func.func private @__moe_gpu_router_aux(
// LIB-SAME: %{{.*}}: !gpu.async.token, %{{.*}}: memref<?x?xbf16>, %{{.*}}: memref<?x?xbf16>, %{{.*}}: memref<?xf32>, %{{.*}}: i32, %{{.*}}: i1, %{{.*}}: index, %{{.*}}: index, %{{.*}}: f32, %{{.*}}: i1, %{{.*}}: memref<?x?xf32>, %{{.*}}: memref<?x?xi32>, %{{.*}}: memref<?x?xf32>, %{{.*}}: memref<f32>, %{{.*}}: memref<f32>) -> !gpu.async.token
// LIB: gpu.memset async
// LIB: gpu.launch_func async [%{{.*}}] @moe_kernels::@moe_router_scores_aux
// LIB: gpu.launch_func async [%{{.*}}] @moe_kernels::@moe_router_select_counts
// LIB: gpu.launch_func async [%{{.*}}] @moe_kernels::@moe_aux_columns
// LIB: gpu.launch_func async [%{{.*}}] @moe_kernels::@moe_aux_finish
// LIB-NOT: gpu.launch_func
// LIB: return
// LIB-LABEL: func.func private @__moe_gpu_router_grad_aux(
// LIB-SAME: %{{.*}}: !gpu.async.token, %{{.*}}: memref<?x?xbf16>, %{{.*}}: memref<?x?xbf16>, %{{.*}}: memref<?x?xf32>, %{{.*}}: memref<?x?xi32>, %{{.*}}: memref<?x?xf32>, %{{.*}}: memref<f32>, %{{.*}}: memref<f32>, %{{.*}}: i32, %{{.*}}: i1, %{{.*}}: f32, %{{.*}}: memref<?x?xbf16>, %{{.*}}: memref<?x?xbf16>) -> !gpu.async.token
// LIB: gpu.memset async
// LIB: gpu.launch_func async [%{{.*}}] @moe_kernels::@moe_aux_counts
// LIB: gpu.launch_func async [%{{.*}}] @moe_kernels::@moe_router_grad_logits_aux
// LIB-NOT: @moe_aux_loss_grad
// LIB: return
