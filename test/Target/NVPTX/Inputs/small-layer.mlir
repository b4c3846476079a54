// A small layer whose lowering carries every kernel of the GPU library (the
// conversion copies the whole gpu.module): T = 37, d = 128, n = 128, E = 8, k = 2.
func.func @small_layer(%x: tensor<37x128xbf16>, %w_router: tensor<128x8xbf16>,
                       %w_gate_up: tensor<8x128x256xbf16>, %w_down: tensor<8x128x128xbf16>)
    -> (tensor<37x128xbf16>, tensor<37x8xf32>) {
  %out, %logits = moe.layer %x, %w_router, %w_gate_up, %w_down
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x128xbf16>, tensor<128x8xbf16>, tensor<8x128x256xbf16>,
        tensor<8x128x128xbf16> -> tensor<37x128xbf16>, tensor<37x8xf32>
  return %out, %logits : tensor<37x128xbf16>, tensor<37x8xf32>
}
