// Inputs from the issue-8 reliability work (docs/reliability.md) on which
// moe-generate-backward went wrong. Each case says what happened before its
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
