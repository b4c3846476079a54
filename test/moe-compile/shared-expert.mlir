// A DeepSeek-like layer (selection bias, grouped sigmoid routing, scaling, a
// shared expert, no logits result): the manifest's layer config and inputs,
// and the bias, which has no gradient.
// RUN: rm -rf %t && mkdir -p %t
// RUN: moe-compile %s -o %t/ds --format=isa --emit=header,manifest
// RUN: FileCheck %s --check-prefix=HEADER < %t/ds.h
// RUN: FileCheck %s --check-prefix=MANIFEST < %t/ds.json

// HEADER: MoE layer @ds_like for sm_90a:
// HEADER-NEXT: T = 37 tokens, d = 64, n = 64, E = 8 experts, top k = 2
// HEADER-NEXT: activation swiglu, scoring sigmoid, renormalize = true, groups 2 of 4, scaling 2.5
// HEADER-NEXT: selection bias: yes, shared expert width: 128
// HEADER-NEXT: inputs: x = arg0; w_router = arg1; bias = arg2; w_gate_up = arg3; w_down = arg4; shared_w_gate_up = arg5; shared_w_down = arg6;
// HEADER: void *arg2 /* input, f32 [8] */,
// HEADER: void *moe_shared_expert_h /* saved, bf16 [37, 256] */);
// HEADER: int ds_like_backward(void *stream,
// HEADER-NOT: d_arg2
// HEADER: void *d_arg6 /* gradient of arg6, bf16 [128, 64] */);

// MANIFEST: "layer": {
// MANIFEST-NEXT: "T": 37,
// MANIFEST-NEXT: "d": 64,
// MANIFEST-NEXT: "n": 64,
// MANIFEST-NEXT: "E": 8,
// MANIFEST-NEXT: "k": 2,
// MANIFEST-NEXT: "activation": "swiglu",
// MANIFEST-NEXT: "scoring": "sigmoid",
// MANIFEST-NEXT: "renormalize": true,
// MANIFEST-NEXT: "num_groups": 4,
// MANIFEST-NEXT: "topk_groups": 2,
// MANIFEST-NEXT: "scaling_factor": 2.5,
// MANIFEST-NEXT: "round_logits": false,
// MANIFEST-NEXT: "has_bias": true,
// MANIFEST-NEXT: "shared_n": 128,
// MANIFEST-NEXT: "expert_bias": false,
// MANIFEST-NEXT: "inputs": {
// MANIFEST-NEXT: "x": "arg0",
// MANIFEST-NEXT: "w_router": "arg1",
// MANIFEST-NEXT: "bias": "arg2",
// MANIFEST-NEXT: "w_gate_up": "arg3",
// MANIFEST-NEXT: "w_down": "arg4",
// MANIFEST-NEXT: "shared_w_gate_up": "arg5",
// MANIFEST-NEXT: "shared_w_down": "arg6"
// MANIFEST-NEXT: }

func.func @ds_like(%x: tensor<37x64xbf16>, %wr: tensor<64x8xbf16>, %b: tensor<8xf32>,
                   %wgu: tensor<8x64x128xbf16>, %wd: tensor<8x64x64xbf16>,
                   %swgu: tensor<64x256xbf16>, %swd: tensor<128x64xbf16>)
    -> tensor<37x64xbf16> {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd bias(%b : tensor<8xf32>)
      shared(%swgu, %swd : tensor<64x256xbf16>, tensor<128x64xbf16>)
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = sigmoid, top_k = 2, renormalize = true,
                              num_groups = 4, topk_groups = 2, scaling_factor = 2.5>}
      : tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<8x64x128xbf16>,
        tensor<8x64x64xbf16> -> tensor<37x64xbf16>, tensor<37x8xf32>
  return %out : tensor<37x64xbf16>
}
