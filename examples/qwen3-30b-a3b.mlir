// Qwen3-30B-A3B: 128 experts, top-8 softmax routing renormalised.
// T = 16384 tokens, d = 2048, n = 768, E = 128, k = 8; bf16 weights and activations
// (the qwen3-30b-a3b configuration of the benchmarks). Weights are [K, N], N contiguous;
// w_gate_up holds the gate projection in columns [0, n) and up in [n, 2n).
//
//   moe-opt examples/qwen3-30b-a3b.mlir --moe-decompose
//   moe-opt examples/qwen3-30b-a3b.mlir --moe-training-pipeline="chip=sm_90a"
func.func @qwen3_30b_a3b(
    %x: tensor<16384x2048xbf16>,
    %w_router: tensor<2048x128xbf16>,
    %w_gate_up: tensor<128x2048x1536xbf16>,
    %w_down: tensor<128x768x2048xbf16>)
    -> (tensor<16384x2048xbf16>, tensor<16384x128xf32>) {
  %out, %router_logits = moe.layer %x, %w_router, %w_gate_up, %w_down
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 8, renormalize = true>}
      : tensor<16384x2048xbf16>, tensor<2048x128xbf16>, tensor<128x2048x1536xbf16>,
        tensor<128x768x2048xbf16> -> tensor<16384x2048xbf16>, tensor<16384x128xf32>
  return %out, %router_logits : tensor<16384x2048xbf16>, tensor<16384x128xf32>
}
