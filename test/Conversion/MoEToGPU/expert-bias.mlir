// The GPU library has no biased expert kernels (gpu_contract.json's
// expert_bias_supported): convert-moe-to-gpu refuses each routed expert op
// with biases, naming the feature, and the training pipeline fails on such a
// layer rather than dropping its biases.
// RUN: moe-opt %s --split-input-file --convert-moe-to-gpu --verify-diagnostics
// RUN: not moe-opt %s --split-input-file --moe-decompose --moe-generate-backward --convert-moe-to-gpu 2>&1 | FileCheck %s --check-prefix=PIPELINE

// PIPELINE: error: the GPU path does not run expert biases (b_gate_up, b_down)

func.func @ffn(%x: tensor<64x64xbf16>, %ids: tensor<128xi32>, %offsets: tensor<5xi32>,
               %wgu: tensor<4x64x128xbf16>, %wd: tensor<4x64x64xbf16>,
               %bgu: tensor<4x128xbf16>, %bd: tensor<4x64xbf16>)
    -> tensor<128x64xbf16> {
  // expected-error @+1 {{the GPU path does not run expert biases (b_gate_up, b_down): the expert GEMMs' epilogues add no bias; run this layer on the CPU path}}
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd
      bias(%bgu, %bd : tensor<4x128xbf16>, tensor<4x64xbf16>)
      {activation = #moe.activation<swiglu>}
      : tensor<64x64xbf16>, tensor<128xi32>, tensor<5xi32>, tensor<4x64x128xbf16>,
        tensor<4x64x64xbf16> -> tensor<128x64xbf16>, tensor<128x128xbf16>
  return %y : tensor<128x64xbf16>
}

// -----

func.func @grad(%x: tensor<64x64xbf16>, %ids: tensor<128xi32>, %offsets: tensor<5xi32>,
                %wgu: tensor<4x64x128xbf16>, %wd: tensor<4x64x64xbf16>,
                %h: tensor<128x128xbf16>, %dy: tensor<128x64xbf16>,
                %bgu: tensor<4x128xbf16>, %bd: tensor<4x64xbf16>)
    -> (tensor<4x128xbf16>, tensor<4x64xbf16>) {
  // expected-error @+1 {{the GPU path does not run expert biases}}
  %dx, %dwgu, %dwd, %dbgu, %dbd = moe.expert_ffn_grad %x, %ids, %offsets, %wgu,
      %wd, %h, %dy bias(%bgu, %bd : tensor<4x128xbf16>, tensor<4x64xbf16>)
      {activation = #moe.activation<swiglu>}
      : tensor<64x64xbf16>, tensor<128xi32>, tensor<5xi32>, tensor<4x64x128xbf16>,
        tensor<4x64x64xbf16>, tensor<128x128xbf16>, tensor<128x64xbf16>
      -> tensor<64x64xbf16>, tensor<4x64x128xbf16>, tensor<4x64x64xbf16>,
         tensor<4x128xbf16>, tensor<4x64xbf16>
  return %dbgu, %dbd : tensor<4x128xbf16>, tensor<4x64xbf16>
}
