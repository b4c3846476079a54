// moe-compile builds a layer with expert biases (gpt-oss's b_gate_up, b_down):
// the header names them as inputs and the backward returns their gradients,
// which the expert FFN's gradient host function computes
// (__moe_gpu_expert_combine_grad_bias; gpu_contract.json's
// expert_bias_supported).
// RUN: rm -rf %t && mkdir -p %t
// RUN: moe-compile %s -o %t/bias --format=isa --emit=header,manifest
// RUN: FileCheck %s --check-prefix=HEADER < %t/bias.h
// RUN: FileCheck %s --check-prefix=MANIFEST < %t/bias.json

// HEADER: selection bias: no, shared expert width: 0, expert biases
// HEADER-NEXT: inputs: x = arg0; w_router = arg1; w_gate_up = arg2; w_down = arg3; b_gate_up = arg4; b_down = arg5;
// HEADER: void *arg4 /* input, bf16 [4, 128] */,
// HEADER: void *arg5 /* input, bf16 [4, 64] */,
// HEADER: int bias_backward(void *stream,
// HEADER: void *d_arg4 /* gradient of arg4, bf16 [4, 128] */,
// HEADER-NEXT: void *d_arg5 /* gradient of arg5, bf16 [4, 64] */);

// MANIFEST: "expert_bias": true,
// MANIFEST: "b_gate_up": "arg4",
// MANIFEST-NEXT: "b_down": "arg5"
func.func @bias(%x: tensor<64x64xbf16>, %wr: tensor<64x4xbf16>,
                %wgu: tensor<4x64x128xbf16>, %wd: tensor<4x64x64xbf16>,
                %bgu: tensor<4x128xbf16>, %bd: tensor<4x64xbf16>)
    -> (tensor<64x64xbf16>, tensor<64x4xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      expert_bias(%bgu, %bd : tensor<4x128xbf16>, tensor<4x64xbf16>)
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<64x64xbf16>, tensor<64x4xbf16>, tensor<4x64x128xbf16>,
        tensor<4x64x64xbf16> -> tensor<64x64xbf16>, tensor<64x4xf32>
  return %out, %logits : tensor<64x64xbf16>, tensor<64x4xf32>
}
