// GPU-bound inputs for moe-parser-fuzzer's seed corpus (test/Fuzz/make-corpus.py
// takes every .mlir here): a bf16 layer of non-gated gelu_tanh experts with a
// capacity factor, and moe.update_selection_bias as the forward (nothing
// saved) and empty backward pair that moe-compile takes; both convert to the
// GPU path.

// RUN: moe-opt %s -split-input-file --moe-decompose --moe-generate-backward --moe-plan-memory --convert-moe-to-gpu | FileCheck %s

// CHECK-LABEL: func.func @capacity_gelu_tanh_forward
// CHECK: call @__moe_gpu_dispatch_capacity
// CHECK-LABEL: func.func @capacity_gelu_tanh_backward
func.func @capacity_gelu_tanh(%x: tensor<37x64xbf16>, %wr: tensor<64x8xbf16>,
                              %wgu: tensor<8x64x128xbf16>, %wd: tensor<8x128x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<37x8xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<gelu_tanh>, capacity_factor = 0.75 : f64,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<8x64x128xbf16>, tensor<8x128x64xbf16>
      -> tensor<37x64xbf16>, tensor<37x8xf32>
  return %out, %logits : tensor<37x64xbf16>, tensor<37x8xf32>
}

// -----

// CHECK-LABEL: func.func @selection_bias_forward
// CHECK: call @__moe_gpu_update_selection_bias
// CHECK-LABEL: func.func @selection_bias_backward
func.func @selection_bias_forward(%b: tensor<64xf32>, %e: tensor<?x8xi32>) -> tensor<64xf32>
    attributes {moe.max_tokens = 128 : i64, moe.num_saved = 0 : i64} {
  %r = moe.update_selection_bias %b, %e {rate = 1.0e-3 : f64, rule = #moe.bias_update<proportional>}
      : tensor<64xf32>, tensor<?x8xi32> -> tensor<64xf32>
  return %r : tensor<64xf32>
}
func.func @selection_bias_backward(%d: tensor<64xf32>)
    attributes {moe.max_tokens = 128 : i64, moe.gradient_args = array<i64>} {
  return
}
