// A small layer for trying things out: 4 experts, top-2 softmax routing renormalised over
// the chosen two. T = 37 tokens, d = 128, n = 128, E = 4, k = 2, bf16. Its forward and
// backward run in milliseconds, and examples/cpp checks them against a host reference.
//
//   moe-opt examples/small.mlir --moe-decompose --moe-generate-backward
//   moe-compile examples/small.mlir -o build/layers/small
func.func @small(
    %x: tensor<37x128xbf16>,
    %w_router: tensor<128x4xbf16>,
    %w_gate_up: tensor<4x128x256xbf16>,
    %w_down: tensor<4x128x128xbf16>)
    -> (tensor<37x128xbf16>, tensor<37x4xf32>) {
  %out, %router_logits = moe.layer %x, %w_router, %w_gate_up, %w_down
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x128xbf16>, tensor<128x4xbf16>, tensor<4x128x256xbf16>,
        tensor<4x128x128xbf16> -> tensor<37x128xbf16>, tensor<37x4xf32>
  return %out, %router_logits : tensor<37x128xbf16>, tensor<37x4xf32>
}
