// Expert biases through moe-ep-stages: the expert stage of an expert-parallel
// layer takes this rank's biases (E / ep_size of them) and its backward
// returns their gradients. E = 4 over 2 ranks, T = 7, d = 8, n = 6, k = 2.
// RUN: moe-opt %s --moe-decompose --moe-generate-backward --moe-ep-stages | FileCheck %s

// CHECK-LABEL: func.func @small_forward_stage1(
// CHECK-SAME: %[[BGU:[a-z0-9]+]]: tensor<2x12xf32>, %[[BD:[a-z0-9]+]]: tensor<2x8xf32>)
// CHECK: moe.expert_ffn {{.*}} bias(%[[BGU]], %[[BD]] : tensor<2x12xf32>, tensor<2x8xf32>)
// CHECK-LABEL: func.func @small_backward_stage1(
// CHECK: %{{.*}}, %{{.*}}, %{{.*}}, %[[DBGU:.*]], %[[DBD:.*]] = moe.expert_ffn_grad {{.*}} bias(
// CHECK: return {{.*}}%[[DBGU]], %[[DBD]] :
func.func @small(
    %x: tensor<7x8xf32>,
    %w_router: tensor<8x4xf32>,
    %w_gate_up: tensor<2x8x12xf32>,
    %w_down: tensor<2x6x8xf32>, %bgu: tensor<2x12xf32>, %bd: tensor<2x8xf32>)
    -> (tensor<7x8xf32>, tensor<7x4xf32>) {
  %out, %router_logits = moe.layer %x, %w_router, %w_gate_up, %w_down
      expert_bias(%bgu, %bd : tensor<2x12xf32>, tensor<2x8xf32>)
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>, ep_size = 2, ep_capacity = 8}
      : tensor<7x8xf32>, tensor<8x4xf32>, tensor<2x8x12xf32>,
        tensor<2x6x8xf32> -> tensor<7x8xf32>, tensor<7x4xf32>
  return %out, %router_logits : tensor<7x8xf32>, tensor<7x4xf32>
}
