// Inputs found by fuzzing and the reliability probes (docs/reliability.md) on
// which moe-generate-backward went wrong. Each case says what happened before its
// fix.

// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-generate-backward | FileCheck %s

// The expert FFN was fused with the combine into moe.expert_combine_grad
// before the gradient through %s reached h, and that gradient was dropped
// without a word (the backward computed it and never used it). Unfused, the
// same function was already an error; now the fused one is too.
func.func @h_gradient_after_fusion(%x: tensor<8x16xf32>, %ids: tensor<16xi32>,
                                   %off: tensor<5xi32>,
                                   %wgu: tensor<4x16x64xf32>,
                                   %wd: tensor<4x32x16xf32>,
                                   %w: tensor<8x2xf32>, %rows: tensor<8x2xi32>)
    -> (tensor<8x16xf32>, tensor<16x64xf32>) {
  // expected-error @+1 {{'moe.expert_ffn' op has a gradient into its pre-activations h, which moe-generate-backward does not differentiate}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd
      {activation = #moe.activation<swiglu>}
      : tensor<8x16xf32>, tensor<16xi32>, tensor<5xi32>, tensor<4x16x64xf32>,
        tensor<4x32x16xf32> -> tensor<16x16xf32>, tensor<16x64xf32>
  %s = arith.addf %h, %h : tensor<16x64xf32>
  %out = moe.combine %y, %w, %rows
      : tensor<16x16xf32>, tensor<8x2xf32>, tensor<8x2xi32> -> tensor<8x16xf32>
  return %out, %s : tensor<8x16xf32>, tensor<16x64xf32>
}

// -----

// h read by an op that is not on the gradient path does not block the fusion.
// CHECK-LABEL: func.func @h_read_without_gradient_backward(
// CHECK: moe.expert_combine_grad
// CHECK-NOT: moe.expert_ffn_grad
func.func @h_read_without_gradient(%x: tensor<8x16xf32>, %ids: tensor<16xi32>,
                                   %off: tensor<5xi32>,
                                   %wgu: tensor<4x16x64xf32>,
                                   %wd: tensor<4x32x16xf32>,
                                   %w: tensor<8x2xf32>, %rows: tensor<8x2xi32>)
    -> (tensor<8x16xf32>, tensor<16x64xi32>) {
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd
      {activation = #moe.activation<swiglu>}
      : tensor<8x16xf32>, tensor<16xi32>, tensor<5xi32>, tensor<4x16x64xf32>,
        tensor<4x32x16xf32> -> tensor<16x16xf32>, tensor<16x64xf32>
  %bits = arith.bitcast %h : tensor<16x64xf32> to tensor<16x64xi32>
  %out = moe.combine %y, %w, %rows
      : tensor<16x16xf32>, tensor<8x2xf32>, tensor<8x2xi32> -> tensor<8x16xf32>
  return %out, %bits : tensor<8x16xf32>, tensor<16x64xi32>
}

// -----

// A float argument returned as it is: its gradient is the result's seed,
// which no op consumes. The seed moved to the sorted entry block but the
// gradient map kept the old one, and building the return crashed.
// CHECK-LABEL: func.func @passthrough_forward
// CHECK-SAME: moe.num_saved = 0
// CHECK: return %arg0
// CHECK-LABEL: func.func @passthrough_backward
// CHECK-SAME: (%[[SEED:.*]]: tensor<4xf32>) -> tensor<4xf32>
// CHECK-SAME: moe.gradient_args = array<i64: 0>
// CHECK: return %[[SEED]]
func.func @passthrough(%x: tensor<4xf32>) -> tensor<4xf32> {
  %r = moe.checkpoint (%x) : (tensor<4xf32>) -> (tensor<4xf32>) {
  ^bb0(%a: tensor<4xf32>):
    moe.yield %a : tensor<4xf32>
  }
  return %r : tensor<4xf32>
}

// -----

// The same beside a layer: the router's gradient and the passthrough's seed
// both reach the return.
// CHECK-LABEL: func.func @layer_and_passthrough_backward
// CHECK-SAME: %[[DL:[a-z0-9]+]]: tensor<6x8xf32>, %[[DB:[a-z0-9]+]]: tensor<3xf32>)
// CHECK-SAME: moe.gradient_args = array<i64: 0, 1, 2>
// CHECK: %[[DX:.*]], %[[DW:.*]] = moe.router_grad
// CHECK: return %[[DX]], %[[DW]], %[[DB]]
func.func @layer_and_passthrough(%x: tensor<6x4xf32>, %wr: tensor<4x8xf32>,
                                 %b: tensor<3xf32>)
    -> (tensor<6x8xf32>, tensor<3xf32>) {
  %w, %e, %l = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<6x4xf32>, tensor<4x8xf32>
      -> tensor<6x2xf32>, tensor<6x2xi32>, tensor<6x8xf32>
  return %l, %b : tensor<6x8xf32>, tensor<3xf32>
}
