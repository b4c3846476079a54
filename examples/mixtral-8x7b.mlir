// Mixtral 8x7B: 8 experts, top-2 softmax routing renormalised over the chosen two.
// T = 16384 tokens, d = 4096, n = 14336, E = 8, k = 2; bf16 weights and activations
// (the mixtral-8x7b configuration of the benchmarks). Weights are [K, N], N contiguous;
// w_gate_up holds the gate projection in columns [0, n) and up in [n, 2n).
//
//   moe-opt examples/mixtral-8x7b.mlir --moe-decompose
//   moe-opt examples/mixtral-8x7b.mlir --moe-training-pipeline="chip=sm_90a"
func.func @mixtral_8x7b(
    %x: tensor<16384x4096xbf16>,
    %w_router: tensor<4096x8xbf16>,
    %w_gate_up: tensor<8x4096x28672xbf16>,
    %w_down: tensor<8x14336x4096xbf16>)
    -> (tensor<16384x4096xbf16>, tensor<16384x8xf32>) {
  %out, %router_logits = moe.layer %x, %w_router, %w_gate_up, %w_down
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<16384x4096xbf16>, tensor<4096x8xbf16>, tensor<8x4096x28672xbf16>,
        tensor<8x14336x4096xbf16> -> tensor<16384x4096xbf16>, tensor<16384x8xf32>
  return %out, %router_logits : tensor<16384x4096xbf16>, tensor<16384x8xf32>
}
