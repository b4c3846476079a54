// The tanh form of GELU, #moe.activation<gelu_tanh>: printed and re-parsed in
// custom, generic and bytecode form; not gated (w_gate_up is n wide), which
// the verifier holds it to; decomposed and differentiated like gelu.
// RUN: rm -rf %t && split-file %s %t
// RUN: moe-opt %t/ops.mlir | moe-opt | FileCheck %s
// RUN: moe-opt %t/ops.mlir --mlir-print-op-generic | moe-opt | FileCheck %s
// RUN: moe-opt %t/ops.mlir --emit-bytecode | moe-opt | FileCheck %s
// RUN: moe-opt %t/ops.mlir --moe-decompose --moe-generate-backward | FileCheck %s --check-prefix=BWD
// RUN: moe-opt %t/invalid.mlir -split-input-file -verify-diagnostics

// CHECK-LABEL: func.func @layer
// CHECK: moe.layer {{.*}} {activation = #moe.activation<gelu_tanh>, routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
// CHECK-LABEL: func.func @ops
// CHECK: moe.expert_ffn {{.*}} {activation = #moe.activation<gelu_tanh>}
// CHECK: moe.shared_expert {{.*}} {activation = #moe.activation<gelu_tanh>}

// BWD-LABEL: func.func @layer_forward
// BWD: moe.expert_ffn {{.*}} {activation = #moe.activation<gelu_tanh>} : {{.*}} -> tensor<74x48xf32>, tensor<74x40xf32>
// BWD-LABEL: func.func @layer_backward
// BWD: {activation = #moe.activation<gelu_tanh>}

//--- ops.mlir
func.func @layer(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>,
                 %wgu: tensor<5x48x40xf32>, %wd: tensor<5x40x48xf32>)
    -> (tensor<37x48xf32>, tensor<37x5xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<gelu_tanh>,
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x40xf32>,
        tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return %out, %logits : tensor<37x48xf32>, tensor<37x5xf32>
}

func.func @ops(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>,
               %wgu: tensor<5x48x40xf32>, %wd: tensor<5x40x48xf32>,
               %sgu: tensor<48x24xf32>, %sd: tensor<24x48xf32>)
    -> (tensor<74x48xf32>, tensor<37x48xf32>) {
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd
      {activation = #moe.activation<gelu_tanh>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x40xf32>,
        tensor<5x40x48xf32> -> tensor<74x48xf32>, tensor<74x40xf32>
  %sy, %sh = moe.shared_expert %x, %sgu, %sd
      {activation = #moe.activation<gelu_tanh>}
      : tensor<37x48xf32>, tensor<48x24xf32>, tensor<24x48xf32>
      -> tensor<37x48xf32>, tensor<37x24xf32>
  return %y, %sy : tensor<74x48xf32>, tensor<37x48xf32>
}

//--- invalid.mlir
func.func @layer_gelu_tanh_width(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{w_gate_up width is 80, expected n = 40}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<gelu_tanh>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @shared_expert_gelu_tanh_width(%x: tensor<37x48xf32>, %wgu: tensor<48x64xf32>, %wd: tensor<32x48xf32>) {
  // expected-error @+1 {{w_gate_up width is 64, expected m = 32}}
  %y, %h = moe.shared_expert %x, %wgu, %wd {activation = #moe.activation<gelu_tanh>} : tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32> -> tensor<37x48xf32>, tensor<37x64xf32>
  return
}
