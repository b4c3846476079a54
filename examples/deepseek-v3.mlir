// DeepSeek-V3: 256 experts, sigmoid scores with an aux-loss-free selection bias,
// group-limited selection (8 groups, the best 4), weights renormalised and scaled
// by 2.5, plus one always-on shared expert.
// T = 8192 tokens, d = 7168, n = 2048, E = 256, k = 8; bf16 weights and activations
// (the deepseek-v3 configuration of the benchmarks). Weights are [K, N], N contiguous;
// w_gate_up holds the gate projection in columns [0, n) and up in [n, 2n).
//
//   moe-opt examples/deepseek-v3.mlir --moe-decompose
//   moe-opt examples/deepseek-v3.mlir --moe-training-pipeline="chip=sm_90a"
func.func @deepseek_v3(
    %x: tensor<8192x7168xbf16>,
    %w_router: tensor<7168x256xbf16>,
    %router_bias: tensor<256xf32>,
    %w_gate_up: tensor<256x7168x4096xbf16>,
    %w_down: tensor<256x2048x7168xbf16>,
    %shared_gate_up: tensor<7168x4096xbf16>,
    %shared_down: tensor<2048x7168xbf16>)
    -> (tensor<8192x7168xbf16>, tensor<8192x256xf32>) {
  %out, %router_logits = moe.layer %x, %w_router, %w_gate_up, %w_down
      bias(%router_bias : tensor<256xf32>)
      shared(%shared_gate_up, %shared_down : tensor<7168x4096xbf16>, tensor<2048x7168xbf16>)
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = sigmoid, top_k = 8, renormalize = true,
                              num_groups = 8, topk_groups = 4, scaling_factor = 2.5>}
      : tensor<8192x7168xbf16>, tensor<7168x256xbf16>, tensor<256x7168x4096xbf16>,
        tensor<256x2048x7168xbf16> -> tensor<8192x7168xbf16>, tensor<8192x256xf32>
  return %out, %router_logits : tensor<8192x7168xbf16>, tensor<8192x256xf32>
}
