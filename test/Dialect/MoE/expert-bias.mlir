// Expert biases (gpt-oss): b_gate_up [E, G] and b_down [E, d] on moe.layer,
// moe.expert_ffn and the gradient ops, printed and re-parsed in custom, generic
// and bytecode form, carried by moe-decompose, moe-generate-backward and the
// H recomputation. T = 7, d = 8, E = 4, n = 6 (swiglu G = 12), k = 2.
// RUN: moe-opt %s | moe-opt | FileCheck %s --check-prefix=RT
// RUN: moe-opt %s --mlir-print-op-generic | moe-opt | FileCheck %s --check-prefix=RT
// RUN: moe-opt %s --emit-bytecode | moe-opt | FileCheck %s --check-prefix=RT
// RUN: moe-opt %s --moe-decompose --moe-generate-backward | FileCheck %s --check-prefix=BWD
// RUN: moe-opt %s --moe-decompose --moe-plan-activations="memory-budget=1KiB" --moe-generate-backward | FileCheck %s --check-prefix=RECOMPUTE
// RUN: moe-opt %s --moe-decompose --moe-plan-activations="memory-budget=1KiB" --moe-generate-backward --moe-offload --moe-plan-memory | FileCheck %s --check-prefix=RECOMPUTE

// RT-LABEL: func.func @layer
// RT: moe.layer %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} expert_bias(%{{.*}}, %{{.*}} : tensor<4x12xf32>, tensor<4x8xf32>)
// BWD-LABEL: func.func @layer_forward
// BWD: moe.expert_ffn %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} bias(%arg4, %arg5 : tensor<4x12xf32>, tensor<4x8xf32>)
// BWD-LABEL: func.func @layer_backward
// BWD: %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[DBGU:.*]], %[[DBD:.*]] = moe.expert_combine_grad {{.*}} bias(%arg4, %arg5 : tensor<4x12xf32>, tensor<4x8xf32>) {{.*}} -> tensor<7x8xf32>, tensor<7x2xf32>, tensor<4x8x12xf32>, tensor<4x6x8xf32>, tensor<4x12xf32>, tensor<4x8xf32>
// BWD: return {{.*}}, %[[DBGU]], %[[DBD]] : {{.*}}, tensor<4x12xf32>, tensor<4x8xf32>
// RECOMPUTE-LABEL: func.func @layer_backward
// RECOMPUTE: moe.expert_ffn {{.*}} bias(%{{.*}}, %{{.*}} : tensor<4x12xf32>, tensor<4x8xf32>)
// RECOMPUTE: moe.expert_combine_grad {{.*}} bias(
func.func @layer(%x: tensor<7x8xf32>, %wr: tensor<8x4xf32>,
                 %wgu: tensor<4x8x12xf32>, %wd: tensor<4x6x8xf32>,
                 %bgu: tensor<4x12xf32>, %bd: tensor<4x8xf32>)
    -> (tensor<7x8xf32>, tensor<7x4xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      expert_bias(%bgu, %bd : tensor<4x12xf32>, tensor<4x8xf32>)
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<7x8xf32>, tensor<8x4xf32>, tensor<4x8x12xf32>,
        tensor<4x6x8xf32> -> tensor<7x8xf32>, tensor<7x4xf32>
  return %out, %logits : tensor<7x8xf32>, tensor<7x4xf32>
}

// RT-LABEL: func.func @ops
// RT: moe.expert_ffn %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} bias(%{{.*}}, %{{.*}} : tensor<4x6xbf16>, tensor<4x8xbf16>) {activation = #moe.activation<gelu>} : {{.*}} -> tensor<14x8xbf16>, tensor<14x6xbf16>
// RT: moe.expert_ffn_grad {{.*}} bias(%{{.*}}, %{{.*}} : tensor<4x6xbf16>, tensor<4x8xbf16>) {{.*}} -> tensor<7x8xbf16>, tensor<4x8x6xbf16>, tensor<4x6x8xbf16>, tensor<4x6xbf16>, tensor<4x8xbf16>
// RT: moe.expert_combine_grad {{.*}} accumulate(%{{.*}} : tensor<7x8xbf16>) bias(%{{.*}}, %{{.*}} : tensor<4x6xbf16>, tensor<4x8xbf16>) {{.*}} -> tensor<7x8xbf16>, tensor<7x2xf32>, tensor<4x8x6xbf16>, tensor<4x6x8xbf16>, tensor<4x6xbf16>, tensor<4x8xbf16>
func.func @ops(%x: tensor<7x8xbf16>, %ids: tensor<14xi32>, %offsets: tensor<5xi32>,
               %rows: tensor<7x2xi32>, %w: tensor<7x2xf32>,
               %wgu: tensor<4x8x6xbf16>, %wd: tensor<4x6x8xbf16>,
               %bgu: tensor<4x6xbf16>, %bd: tensor<4x8xbf16>) {
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd
      bias(%bgu, %bd : tensor<4x6xbf16>, tensor<4x8xbf16>)
      {activation = #moe.activation<gelu>}
      : tensor<7x8xbf16>, tensor<14xi32>, tensor<5xi32>, tensor<4x8x6xbf16>,
        tensor<4x6x8xbf16> -> tensor<14x8xbf16>, tensor<14x6xbf16>
  %dx, %dwgu, %dwd, %dbgu, %dbd = moe.expert_ffn_grad %x, %ids, %offsets, %wgu,
      %wd, %h, %y bias(%bgu, %bd : tensor<4x6xbf16>, tensor<4x8xbf16>)
      {activation = #moe.activation<gelu>}
      : tensor<7x8xbf16>, tensor<14xi32>, tensor<5xi32>, tensor<4x8x6xbf16>,
        tensor<4x6x8xbf16>, tensor<14x6xbf16>, tensor<14x8xbf16>
      -> tensor<7x8xbf16>, tensor<4x8x6xbf16>, tensor<4x6x8xbf16>,
         tensor<4x6xbf16>, tensor<4x8xbf16>
  %dx2, %dw, %dwgu2, %dwd2, %dbgu2, %dbd2 = moe.expert_combine_grad %x, %ids,
      %offsets, %rows, %w, %wgu, %wd, %h, %x accumulate(%dx : tensor<7x8xbf16>)
      bias(%bgu, %bd : tensor<4x6xbf16>, tensor<4x8xbf16>)
      {activation = #moe.activation<gelu>}
      : tensor<7x8xbf16>, tensor<14xi32>, tensor<5xi32>, tensor<7x2xi32>,
        tensor<7x2xf32>, tensor<4x8x6xbf16>, tensor<4x6x8xbf16>,
        tensor<14x6xbf16>, tensor<7x8xbf16>
      -> tensor<7x8xbf16>, tensor<7x2xf32>, tensor<4x8x6xbf16>,
         tensor<4x6x8xbf16>, tensor<4x6xbf16>, tensor<4x8xbf16>
  return
}
