// moe-compile refuses a layer with expert biases (its forward lowers, but no
// kernel computes the bias gradients: gpu_contract.json's
// expert_bias_supported), naming the feature, with a non-zero exit and no
// output.
// RUN: rm -rf %t && mkdir -p %t
// RUN: not moe-compile %s -o %t/out/bias --format=isa 2>&1 | FileCheck %s
// RUN: not test -e %t/out

// CHECK: error: the GPU path does not run expert biases (b_gate_up, b_down) backward: no kernel computes their gradients; run this layer on the CPU path
// CHECK: moe-compile: error: compiling '{{.*}}expert-bias.mlir' failed
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
