// OLMoE-1B-7B: 64 fine-grained experts, top-8 softmax routing without renormalisation.
// T = 16384 tokens, d = 2048, n = 1024, E = 64, k = 8; bf16 weights and activations
// (the olmoe-1b-7b configuration of the benchmarks). Weights are [K, N], N contiguous;
// w_gate_up holds the gate projection in columns [0, n) and up in [n, 2n).
//
//   moe-opt examples/olmoe-1b-7b.mlir --moe-decompose
//   moe-opt examples/olmoe-1b-7b.mlir --moe-training-pipeline="chip=sm_90a"
func.func @olmoe_1b_7b(
    %x: tensor<16384x2048xbf16>,
    %w_router: tensor<2048x64xbf16>,
    %w_gate_up: tensor<64x2048x2048xbf16>,
    %w_down: tensor<64x1024x2048xbf16>)
    -> (tensor<16384x2048xbf16>, tensor<16384x64xf32>) {
  %out, %router_logits = moe.layer %x, %w_router, %w_gate_up, %w_down
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 8>}
      : tensor<16384x2048xbf16>, tensor<2048x64xbf16>, tensor<64x2048x2048xbf16>,
        tensor<64x1024x2048xbf16> -> tensor<16384x2048xbf16>, tensor<16384x64xf32>
  return %out, %router_logits : tensor<16384x2048xbf16>, tensor<16384x64xf32>
}
