// Inputs on which moe-plan-activations went wrong before its fix
// (docs/reliability.md). Each case says what happened.

// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-decompose --moe-plan-activations=policy=recompute | FileCheck %s

// A dynamic FFN width with policy=recompute: the report named h after the
// plan had erased the op that made it (a use of a freed op; a crash).
// CHECK-LABEL: func.func @dynamic_width
// CHECK: moe.checkpoint
// CHECK: moe.expert_ffn
// CHECK: moe.yield
// expected-remark @+1 {{activation plan 'recompute' (policy recompute): 1 recomputed, 0 offloaded of 1 expert FFNs; saved bytes unknown (result #1 of 'moe.expert_ffn' has type 'tensor<16x?xf32>')}}
func.func @dynamic_width(%x: tensor<8x16xf32>, %wr: tensor<16x4xf32>,
                         %wgu: tensor<4x16x?xf32>, %wd: tensor<4x?x16xf32>)
    -> (tensor<8x16xf32>, tensor<8x4xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<8x16xf32>, tensor<16x4xf32>, tensor<4x16x?xf32>, tensor<4x?x16xf32>
      -> tensor<8x16xf32>, tensor<8x4xf32>
  return %out, %logits : tensor<8x16xf32>, tensor<8x4xf32>
}

// -----

// x of 37 x 2^62 f32: its bytes wrapped, and the plan said "keep saves
// 25628 B". Now the count is an error at the value.
// expected-error @+1 {{moe-plan-activations: the bytes of argument #0 ('tensor<37x4611686018427387904xf32>'), added up, do not fit in 63 bits}}
func.func @bytes_wrap(%x: tensor<37x4611686018427387904xf32>,
                      %wr: tensor<4611686018427387904x4xf32>,
                      %wgu: tensor<4x4611686018427387904x8xf32>,
                      %wd: tensor<4x4x4611686018427387904xf32>)
    -> (tensor<37x4611686018427387904xf32>, tensor<37x4xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x4611686018427387904xf32>, tensor<4611686018427387904x4xf32>,
        tensor<4x4611686018427387904x8xf32>, tensor<4x4x4611686018427387904xf32>
      -> tensor<37x4611686018427387904xf32>, tensor<37x4xf32>
  return %out, %logits : tensor<37x4611686018427387904xf32>, tensor<37x4xf32>
}
