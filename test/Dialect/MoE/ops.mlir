// Every moe op in custom form, printed and re-parsed in custom, generic and
// bytecode form.
// RUN: moe-opt %s | moe-opt | FileCheck %s
// RUN: moe-opt %s --mlir-print-op-generic | moe-opt | FileCheck %s
// RUN: moe-opt %s --emit-bytecode | moe-opt | FileCheck %s
// RUN: moe-opt %s --mlir-print-op-generic | FileCheck %s --check-prefix=GENERIC

// CHECK-LABEL: func.func @layer_mixtral
// A dynamic token count, served up to max_tokens.
// CHECK: moe.layer %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {activation = #moe.activation<swiglu>, max_tokens = 16384 : i64, routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true, round_logits = true>} : tensor<?x4096xbf16>, tensor<4096x8xbf16>, tensor<8x4096x28672xbf16>, tensor<8x14336x4096xbf16> -> tensor<?x4096xbf16>, tensor<?x8xf32>
// GENERIC-LABEL: sym_name = "layer_mixtral"
// GENERIC: "moe.layer"(%{{.*}}) <{activation = #moe.activation<swiglu>, max_tokens = 16384 : i64, operandSegmentSizes = array<i32: 1, 1, 0, 1, 1, 0, 0, 0, 0>, routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true, round_logits = true>}>
func.func @layer_mixtral(%x: tensor<?x4096xbf16>, %wr: tensor<4096x8xbf16>,
                         %wgu: tensor<8x4096x28672xbf16>,
                         %wd: tensor<8x14336x4096xbf16>)
    -> (tensor<?x4096xbf16>, tensor<?x8xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, max_tokens = 16384,
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true,
                              round_logits = true>}
      : tensor<?x4096xbf16>, tensor<4096x8xbf16>, tensor<8x4096x28672xbf16>,
        tensor<8x14336x4096xbf16> -> tensor<?x4096xbf16>, tensor<?x8xf32>
  return %out, %logits : tensor<?x4096xbf16>, tensor<?x8xf32>
}

// CHECK-LABEL: func.func @layer_deepseek
// CHECK: moe.layer %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} bias(%{{.*}} : tensor<256xf32>) shared(%{{.*}}, %{{.*}} : tensor<7168x4096xbf16>, tensor<2048x7168xbf16>) {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = sigmoid, top_k = 8, renormalize = true, num_groups = 8, topk_groups = 4, scaling_factor = 2.5{{0*}}e+00>}
func.func @layer_deepseek(%x: tensor<8192x7168xbf16>, %wr: tensor<7168x256xbf16>,
                          %bias: tensor<256xf32>,
                          %wgu: tensor<256x7168x4096xbf16>,
                          %wd: tensor<256x2048x7168xbf16>,
                          %sgu: tensor<7168x4096xbf16>,
                          %sd: tensor<2048x7168xbf16>) -> tensor<8192x7168xbf16> {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd bias(%bias : tensor<256xf32>)
      shared(%sgu, %sd : tensor<7168x4096xbf16>, tensor<2048x7168xbf16>)
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = sigmoid, top_k = 8, renormalize = true,
                              num_groups = 8, topk_groups = 4, scaling_factor = 2.5>}
      : tensor<8192x7168xbf16>, tensor<7168x256xbf16>, tensor<256x7168x4096xbf16>,
        tensor<256x2048x7168xbf16> -> tensor<8192x7168xbf16>, tensor<8192x256xf32>
  return %out : tensor<8192x7168xbf16>
}

// CHECK-LABEL: func.func @layer_gelu_capacity
// CHECK: moe.layer {{.*}} {activation = #moe.activation<gelu>, capacity_factor = 1.25{{0*}}e+00 : f64, routing = #moe.routing<scoring = softmax, top_k = 1>}
func.func @layer_gelu_capacity(%x: tensor<37x48xf16>, %wr: tensor<48x5xf16>,
                               %wgu: tensor<5x48x40xf16>, %wd: tensor<5x40x48xf16>)
    -> tensor<37x48xf16> {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<gelu>, capacity_factor = 1.25 : f64,
       routing = #moe.routing<scoring = softmax, top_k = 1>}
      : tensor<37x48xf16>, tensor<48x5xf16>, tensor<5x48x40xf16>,
        tensor<5x40x48xf16> -> tensor<37x48xf16>, tensor<37x5xf32>
  return %out : tensor<37x48xf16>
}

// CHECK-LABEL: func.func @steps
// CHECK: %[[W:.*]], %[[E:.*]], %[[L:.*]] = moe.router %{{.*}}, %{{.*}} bias(%{{.*}} : tensor<5xf32>) {routing = #moe.routing<scoring = sigmoid, top_k = 2, num_groups = 5, topk_groups = 2>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
// CHECK: %[[IDS:.*]], %[[OFF:.*]], %[[ROWS:.*]] = moe.dispatch %[[E]] {num_experts = 5 : i64} : tensor<37x2xi32> -> tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>
// CHECK: %[[Y:.*]], %[[H:.*]] = moe.expert_ffn %{{.*}}, %[[IDS]], %[[OFF]], %{{.*}}, %{{.*}} {activation = #moe.activation<swiglu>} : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<74x48xf32>, tensor<74x80xf32>
// CHECK: %[[OUT:.*]] = moe.combine %[[Y]], %[[W]], %[[ROWS]] : tensor<74x48xf32>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x48xf32>
// CHECK: moe.shared_expert %{{.*}}, %{{.*}}, %{{.*}} {activation = #moe.activation<silu>} : tensor<37x48xf32>, tensor<48x32xf32>, tensor<32x48xf32> -> tensor<37x48xf32>, tensor<37x32xf32>
// CHECK: moe.aux_loss %[[L]], %[[E]] {scoring = #moe.scoring<sigmoid>} : tensor<37x5xf32>, tensor<37x2xi32> -> tensor<f32>, tensor<f32>
func.func @steps(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %bias: tensor<5xf32>,
                 %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>,
                 %sgu: tensor<48x32xf32>, %sd: tensor<32x48xf32>)
    -> (tensor<37x48xf32>, tensor<37x48xf32>, tensor<f32>, tensor<f32>) {
  %w, %e, %logits = moe.router %x, %wr bias(%bias : tensor<5xf32>)
      {routing = #moe.routing<scoring = sigmoid, top_k = 2, num_groups = 5,
                              topk_groups = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>
      -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 5 : i64}
      : tensor<37x2xi32> -> tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd
      {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>,
        tensor<5x40x48xf32> -> tensor<74x48xf32>, tensor<74x80xf32>
  %out = moe.combine %y, %w, %rows
      : tensor<74x48xf32>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x48xf32>
  %ys, %hs = moe.shared_expert %x, %sgu, %sd {activation = #moe.activation<silu>}
      : tensor<37x48xf32>, tensor<48x32xf32>, tensor<32x48xf32>
      -> tensor<37x48xf32>, tensor<37x32xf32>
  %lb, %z = moe.aux_loss %logits, %e {scoring = #moe.scoring<sigmoid>}
      : tensor<37x5xf32>, tensor<37x2xi32> -> tensor<f32>, tensor<f32>
  return %out, %ys, %lb, %z : tensor<37x48xf32>, tensor<37x48xf32>, tensor<f32>, tensor<f32>
}

// CHECK-LABEL: func.func @dispatch_capacity_dynamic
// CHECK: moe.dispatch %{{.*}} {capacity_factor = 1.{{0*}}e+00 : f64, num_experts = 64 : i64} : tensor<?x8xi32> -> tensor<?xi32>, tensor<65xi32>, tensor<?x8xi32>
func.func @dispatch_capacity_dynamic(%e: tensor<?x8xi32>) -> tensor<?xi32> {
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 64 : i64, capacity_factor = 1.0 : f64}
      : tensor<?x8xi32> -> tensor<?xi32>, tensor<65xi32>, tensor<?x8xi32>
  return %ids : tensor<?xi32>
}

// CHECK-LABEL: func.func @grads
// CHECK: moe.aux_loss_grad %{{.*}} {scoring = #moe.scoring<softmax>} : tensor<37x5xf32>, tensor<37x2xi32>, tensor<f32>, tensor<f32> -> tensor<37x5xf32>
// CHECK: moe.router_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} logits_grad(%{{.*}} : tensor<37x5xf32>) {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x48xf32>, tensor<48x5xf32>, tensor<37x5xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x48xf32>, tensor<48x5xf32>
// CHECK: moe.router_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {routing
// CHECK: moe.expert_ffn_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {activation = #moe.activation<swiglu>} : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<74x80xf32>, tensor<74x48xf32> -> tensor<37x48xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
// CHECK: moe.shared_expert_grad %{{.*}} {activation = #moe.activation<swiglu>} : tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32>, tensor<37x64xf32>, tensor<37x48xf32> -> tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32>
// CHECK: moe.combine_grad %{{.*}} : tensor<37x48xf32>, tensor<37x2xf32>, tensor<37x2xi32>, tensor<74x48xf32> -> tensor<74x48xf32>, tensor<37x2xf32>
// CHECK: moe.expert_combine_grad %{{.*}} {activation = #moe.activation<swiglu>} : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<74x80xf32>, tensor<37x48xf32> -> tensor<37x48xf32>, tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
func.func @grads(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %logits: tensor<37x5xf32>,
                 %e: tensor<37x2xi32>, %w: tensor<37x2xf32>, %dw: tensor<37x2xf32>,
                 %ids: tensor<74xi32>, %offsets: tensor<6xi32>, %rows: tensor<37x2xi32>,
                 %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>,
                 %h: tensor<74x80xf32>, %y: tensor<74x48xf32>, %dout: tensor<37x48xf32>,
                 %sgu: tensor<48x64xf32>, %sd: tensor<32x48xf32>, %hs: tensor<37x64xf32>,
                 %dlb: tensor<f32>, %dz: tensor<f32>) {
  %dlogits = moe.aux_loss_grad %logits, %e, %dlb, %dz {scoring = #moe.scoring<softmax>}
      : tensor<37x5xf32>, tensor<37x2xi32>, tensor<f32>, tensor<f32> -> tensor<37x5xf32>
  %dx0, %dwr0 = moe.router_grad %x, %wr, %logits, %e, %dw
      logits_grad(%dlogits : tensor<37x5xf32>)
      {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<37x5xf32>, tensor<37x2xi32>,
        tensor<37x2xf32> -> tensor<37x48xf32>, tensor<48x5xf32>
  %dx1, %dwr1 = moe.router_grad %x, %wr, %logits, %e, %dw
      {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<37x5xf32>, tensor<37x2xi32>,
        tensor<37x2xf32> -> tensor<37x48xf32>, tensor<48x5xf32>
  %dx2, %dwgu, %dwd = moe.expert_ffn_grad %x, %ids, %offsets, %wgu, %wd, %h, %y
      {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>,
        tensor<5x40x48xf32>, tensor<74x80xf32>, tensor<74x48xf32>
      -> tensor<37x48xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  %dx3, %dsgu, %dsd = moe.shared_expert_grad %x, %sgu, %sd, %hs, %dout
      {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32>, tensor<37x64xf32>,
        tensor<37x48xf32> -> tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32>
  %dy, %dweights = moe.combine_grad %dout, %w, %rows, %y
      : tensor<37x48xf32>, tensor<37x2xf32>, tensor<37x2xi32>, tensor<74x48xf32>
      -> tensor<74x48xf32>, tensor<37x2xf32>
  %dx4, %dw4, %dwgu4, %dwd4 = moe.expert_combine_grad %x, %ids, %offsets, %rows, %w,
      %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>,
        tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>,
        tensor<74x80xf32>, tensor<37x48xf32>
      -> tensor<37x48xf32>, tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  return
}

// CHECK-LABEL: func.func @checkpoint_and_offload
// CHECK: %[[R:.*]]:2 = moe.checkpoint(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (tensor<37x48xbf16>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xbf16>, tensor<5x40x48xbf16>) -> (tensor<74x48xbf16>, tensor<74x80xbf16>) {
// CHECK: ^bb0(%{{.*}}: tensor<37x48xbf16>, %{{.*}}: tensor<74xi32>, %{{.*}}: tensor<6xi32>, %{{.*}}: tensor<5x48x80xbf16>, %{{.*}}: tensor<5x40x48xbf16>):
// CHECK: moe.yield %{{.*}}, %{{.*}} : tensor<74x48xbf16>, tensor<74x80xbf16>
// CHECK: %[[HOST:.*]] = moe.offload %[[R]]#1 : tensor<74x80xbf16> -> !moe.host_tensor<74x80xbf16>
// CHECK: moe.prefetch %[[HOST]] : !moe.host_tensor<74x80xbf16> -> tensor<74x80xbf16>
// CHECK: moe.offload %{{.*}} : tensor<?x48xbf16> -> !moe.host_tensor<?x48xbf16>
// CHECK: moe.checkpoint() : () -> () {
// CHECK-NEXT: }
func.func @checkpoint_and_offload(%x: tensor<37x48xbf16>, %ids: tensor<74xi32>,
                                  %offsets: tensor<6xi32>,
                                  %wgu: tensor<5x48x80xbf16>,
                                  %wd: tensor<5x40x48xbf16>,
                                  %dyn: tensor<?x48xbf16>)
    -> (tensor<74x48xbf16>, tensor<74x80xbf16>, !moe.host_tensor<?x48xbf16>) {
  %r:2 = moe.checkpoint (%x, %ids, %offsets, %wgu, %wd)
      : (tensor<37x48xbf16>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xbf16>,
         tensor<5x40x48xbf16>) -> (tensor<74x48xbf16>, tensor<74x80xbf16>) {
  ^bb0(%a: tensor<37x48xbf16>, %b: tensor<74xi32>, %c: tensor<6xi32>,
       %d: tensor<5x48x80xbf16>, %e: tensor<5x40x48xbf16>):
    %y, %h = moe.expert_ffn %a, %b, %c, %d, %e {activation = #moe.activation<swiglu>}
        : tensor<37x48xbf16>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xbf16>,
          tensor<5x40x48xbf16> -> tensor<74x48xbf16>, tensor<74x80xbf16>
    moe.yield %y, %h : tensor<74x48xbf16>, tensor<74x80xbf16>
  }
  %host = moe.offload %r#1 : tensor<74x80xbf16> -> !moe.host_tensor<74x80xbf16>
  %back = moe.prefetch %host : !moe.host_tensor<74x80xbf16> -> tensor<74x80xbf16>
  %dynHost = moe.offload %dyn : tensor<?x48xbf16> -> !moe.host_tensor<?x48xbf16>
  moe.checkpoint () : () -> () {
  ^bb0:
    moe.yield
  }
  return %r#0, %back, %dynHost : tensor<74x48xbf16>, tensor<74x80xbf16>, !moe.host_tensor<?x48xbf16>
}

// Edge shapes: one token, k = E, a zero-token batch.
// CHECK-LABEL: func.func @edge_shapes
// CHECK: moe.router {{.*}} -> tensor<1x5xf32>, tensor<1x5xi32>, tensor<1x5xf32>
// CHECK: moe.dispatch {{.*}} : tensor<0x2xi32> -> tensor<0xi32>, tensor<6xi32>, tensor<0x2xi32>
func.func @edge_shapes(%x: tensor<1x48xf32>, %wr: tensor<48x5xf32>, %e0: tensor<0x2xi32>) {
  %w, %e, %logits = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 5>}
      : tensor<1x48xf32>, tensor<48x5xf32> -> tensor<1x5xf32>, tensor<1x5xi32>, tensor<1x5xf32>
  %ids, %offsets, %rows = moe.dispatch %e0 {num_experts = 5 : i64}
      : tensor<0x2xi32> -> tensor<0xi32>, tensor<6xi32>, tensor<0x2xi32>
  return
}

// The optional `accumulate` operand (moe-fold-adds): after the other operands
// and groups; router_grad's two optional operands have segment sizes.
// CHECK-LABEL: func.func @accumulate
// CHECK: moe.combine %{{.*}}, %{{.*}}, %{{.*}} accumulate(%{{.*}} : tensor<37x48xf32>) : tensor<74x48xf32>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x48xf32>
// CHECK: moe.router_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} accumulate(%{{.*}} : tensor<37x48xf32>) {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x48xf32>, tensor<48x5xf32>, tensor<37x5xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x48xf32>, tensor<48x5xf32>
// CHECK: moe.router_grad %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} logits_grad(%{{.*}} : tensor<37x5xf32>) accumulate(%{{.*}} : tensor<37x48xf32>) {routing
// CHECK: moe.expert_combine_grad %{{.*}} accumulate(%{{.*}} : tensor<37x48xf32>) {activation = #moe.activation<swiglu>} : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<74x80xf32>, tensor<37x48xf32> -> tensor<37x48xf32>, tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
// GENERIC-LABEL: sym_name = "accumulate"
// GENERIC: "moe.combine"(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (tensor<74x48xf32>, tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x48xf32>) -> tensor<37x48xf32>
// GENERIC: "moe.router_grad"({{.*}}) <{operandSegmentSizes = array<i32: 1, 1, 1, 1, 1, 0, 1>, routing
// GENERIC: "moe.router_grad"({{.*}}) <{operandSegmentSizes = array<i32: 1, 1, 1, 1, 1, 1, 1>, routing
func.func @accumulate(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %logits: tensor<37x5xf32>,
                      %e: tensor<37x2xi32>, %w: tensor<37x2xf32>, %dw: tensor<37x2xf32>,
                      %ids: tensor<74xi32>, %offsets: tensor<6xi32>, %rows: tensor<37x2xi32>,
                      %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>,
                      %h: tensor<74x80xf32>, %y: tensor<74x48xf32>, %dout: tensor<37x48xf32>,
                      %dlogits: tensor<37x5xf32>, %a: tensor<37x48xf32>) {
  %out = moe.combine %y, %w, %rows accumulate(%a : tensor<37x48xf32>)
      : tensor<74x48xf32>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x48xf32>
  %dx0, %dwr0 = moe.router_grad %x, %wr, %logits, %e, %dw accumulate(%a : tensor<37x48xf32>)
      {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<37x5xf32>, tensor<37x2xi32>,
        tensor<37x2xf32> -> tensor<37x48xf32>, tensor<48x5xf32>
  %dx1, %dwr1 = moe.router_grad %x, %wr, %logits, %e, %dw
      logits_grad(%dlogits : tensor<37x5xf32>) accumulate(%a : tensor<37x48xf32>)
      {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<37x5xf32>, tensor<37x2xi32>,
        tensor<37x2xf32> -> tensor<37x48xf32>, tensor<48x5xf32>
  %dx2, %dw2, %dwgu2, %dwd2 = moe.expert_combine_grad %x, %ids, %offsets, %rows, %w,
      %wgu, %wd, %h, %dout accumulate(%a : tensor<37x48xf32>) {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>, tensor<37x2xf32>,
        tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<74x80xf32>, tensor<37x48xf32>
      -> tensor<37x48xf32>, tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  return
}

// Expert parallelism: S = ep_size = 2 ranks, E = 4 experts (El = 2 a rank),
// C = capacity = 50 rows from one rank to one rank (S * C = 100 slots);
// T = 37 tokens, k = 2, R = 74 rows, d = 48.

// The weights hold this rank's E / ep_size experts; the router all E.
// CHECK-LABEL: func.func @layer_expert_parallel(
// CHECK: moe.layer %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {activation = #moe.activation<swiglu>, ep_capacity = 4096 : i64, ep_overflow = #moe.ep_overflow<drop>, ep_size = 4 : i64, routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<8192x4096xbf16>, tensor<4096x8xbf16>, tensor<2x4096x28672xbf16>, tensor<2x14336x4096xbf16> -> tensor<8192x4096xbf16>, tensor<8192x8xf32>
// GENERIC-LABEL: sym_name = "layer_expert_parallel"
// GENERIC: "moe.layer"(%{{.*}}) <{activation = #moe.activation<swiglu>, ep_capacity = 4096 : i64, ep_overflow = #moe.ep_overflow<drop>, ep_size = 4 : i64, operandSegmentSizes = array<i32: 1, 1, 0, 1, 1, 0, 0, 0, 0>, routing
func.func @layer_expert_parallel(%x: tensor<8192x4096xbf16>, %wr: tensor<4096x8xbf16>,
                                 %wgu: tensor<2x4096x28672xbf16>,
                                 %wd: tensor<2x14336x4096xbf16>) -> tensor<8192x4096xbf16> {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, ep_capacity = 4096, ep_overflow = #moe.ep_overflow<drop>,
       ep_size = 4, routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<8192x4096xbf16>, tensor<4096x8xbf16>, tensor<2x4096x28672xbf16>,
        tensor<2x14336x4096xbf16> -> tensor<8192x4096xbf16>, tensor<8192x8xf32>
  return %out : tensor<8192x4096xbf16>
}

// A dynamic token count, one expert a rank, the default overflow (error).
// CHECK-LABEL: func.func @layer_expert_parallel_dynamic
// CHECK: moe.layer %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {activation = #moe.activation<swiglu>, ep_capacity = 64 : i64, ep_size = 8 : i64, max_tokens = 64 : i64, routing = #moe.routing<scoring = softmax, top_k = 2>} : tensor<?x48xf32>, tensor<48x8xf32>, tensor<1x48x80xf32>, tensor<1x40x48xf32> -> tensor<?x48xf32>, tensor<?x8xf32>
// GENERIC-LABEL: sym_name = "layer_expert_parallel_dynamic"
// GENERIC: "moe.layer"(%{{.*}}) <{activation = #moe.activation<swiglu>, ep_capacity = 64 : i64, ep_size = 8 : i64, max_tokens = 64 : i64, operandSegmentSizes
func.func @layer_expert_parallel_dynamic(%x: tensor<?x48xf32>, %wr: tensor<48x8xf32>,
                                         %wgu: tensor<1x48x80xf32>, %wd: tensor<1x40x48xf32>)
    -> tensor<?x48xf32> {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, ep_capacity = 64, ep_size = 8, max_tokens = 64,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x48xf32>, tensor<48x8xf32>, tensor<1x48x80xf32>, tensor<1x40x48xf32>
        -> tensor<?x48xf32>, tensor<?x8xf32>
  return %out : tensor<?x48xf32>
}

// A step of up to 4096 tokens in chunks of at most 1024, 256 rows from one
// rank to one rank a chunk.
// CHECK-LABEL: func.func @layer_expert_parallel_chunked
// CHECK: moe.layer %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} {activation = #moe.activation<swiglu>, ep_capacity = 256 : i64, ep_chunk_tokens = 1024 : i64, ep_size = 8 : i64, max_tokens = 4096 : i64, routing = #moe.routing<scoring = softmax, top_k = 2>} : tensor<?x48xf32>
// GENERIC-LABEL: sym_name = "layer_expert_parallel_chunked"
// GENERIC: "moe.layer"(%{{.*}}) <{activation = #moe.activation<swiglu>, ep_capacity = 256 : i64, ep_chunk_tokens = 1024 : i64, ep_size = 8 : i64, max_tokens = 4096 : i64, operandSegmentSizes
func.func @layer_expert_parallel_chunked(%x: tensor<?x48xf32>, %wr: tensor<48x8xf32>,
                                         %wgu: tensor<1x48x80xf32>, %wd: tensor<1x40x48xf32>)
    -> tensor<?x48xf32> {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, ep_capacity = 256, ep_chunk_tokens = 1024,
       ep_size = 8, max_tokens = 4096, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x48xf32>, tensor<48x8xf32>, tensor<1x48x80xf32>, tensor<1x40x48xf32>
        -> tensor<?x48xf32>, tensor<?x8xf32>
  return %out : tensor<?x48xf32>
}

// A function compiled for one chunk of a step: the step's bound beside the
// chunk's.
// CHECK-LABEL: func.func @chunk_function
// CHECK-SAME: attributes {moe.ep_step_tokens = 4096 : i64, moe.max_tokens = 1024 : i64}
func.func @chunk_function() attributes {moe.ep_step_tokens = 4096 : i64, moe.max_tokens = 1024 : i64} {
  return
}

// The forward of one rank: pack x by token ids (gather), the rows received,
// their queues, the local experts, the rows back to the received layout, the
// rows home in expert order.
// CHECK-LABEL: func.func @ep_forward
// CHECK: %[[RECV:.*]], %[[COUNTS:.*]], %[[DROPPED:.*]] = moe.ep_dispatch %{{.*}}, %[[OFF:.*]] gather(%{{.*}} : tensor<74xi32>) {capacity = 50 : i64, ep_size = 2 : i64} : tensor<37x48xbf16>, tensor<5xi32> -> tensor<100x48xbf16>, tensor<2x2xi32>, tensor<2xi32>
// CHECK: %[[QIDS:.*]], %[[QOFF:.*]] = moe.ep_queues %[[COUNTS]] {capacity = 50 : i64} : tensor<2x2xi32> -> tensor<100xi32>, tensor<3xi32>
// CHECK: %[[Y:.*]], %{{.*}} = moe.expert_ffn %[[RECV]], %[[QIDS]], %[[QOFF]], %{{.*}}, %{{.*}} {activation = #moe.activation<swiglu>}
// CHECK: %[[YRECV:.*]] = moe.scatter_rows %[[Y]], %[[QIDS]] : tensor<100x48xbf16>, tensor<100xi32> -> tensor<100x48xbf16>
// CHECK: moe.gather_rows %[[YRECV]], %[[QIDS]] : tensor<100x48xbf16>, tensor<100xi32> -> tensor<100x48xbf16>
// CHECK: moe.ep_combine %[[YRECV]], %[[OFF]] {capacity = 50 : i64, ep_size = 2 : i64} : tensor<100x48xbf16>, tensor<5xi32> -> tensor<74x48xbf16>
// GENERIC-LABEL: sym_name = "ep_forward"
// GENERIC: "moe.ep_dispatch"(%{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}) <{capacity = 50 : i64, ep_size = 2 : i64, overflow = #moe.ep_overflow<error>}> : (tensor<37x48xbf16>, tensor<5xi32>, tensor<74xi32>) -> (tensor<100x48xbf16>, tensor<2x2xi32>, tensor<2xi32>)
// GENERIC: "moe.ep_queues"(%{{.*}}) <{capacity = 50 : i64}> : (tensor<2x2xi32>) -> (tensor<100xi32>, tensor<3xi32>)
// GENERIC: "moe.scatter_rows"(%{{.*}}, %{{.*}}) : (tensor<100x48xbf16>, tensor<100xi32>) -> tensor<100x48xbf16>
// GENERIC: "moe.gather_rows"(%{{.*}}, %{{.*}}) : (tensor<100x48xbf16>, tensor<100xi32>) -> tensor<100x48xbf16>
// GENERIC: "moe.ep_combine"(%{{[^,]*}}, %{{[^,]*}}) <{capacity = 50 : i64, ep_size = 2 : i64}> : (tensor<100x48xbf16>, tensor<5xi32>) -> tensor<74x48xbf16>
func.func @ep_forward(%x: tensor<37x48xbf16>, %ids: tensor<74xi32>, %offsets: tensor<5xi32>,
                      %wgu: tensor<2x48x80xbf16>, %wd: tensor<2x40x48xbf16>)
    -> (tensor<74x48xbf16>, tensor<2xi32>) {
  %recv, %counts, %dropped = moe.ep_dispatch %x, %offsets gather(%ids : tensor<74xi32>)
      {capacity = 50 : i64, ep_size = 2 : i64}
      : tensor<37x48xbf16>, tensor<5xi32> -> tensor<100x48xbf16>, tensor<2x2xi32>, tensor<2xi32>
  %qids, %qoffsets = moe.ep_queues %counts {capacity = 50 : i64}
      : tensor<2x2xi32> -> tensor<100xi32>, tensor<3xi32>
  %y, %h = moe.expert_ffn %recv, %qids, %qoffsets, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<100x48xbf16>, tensor<100xi32>, tensor<3xi32>, tensor<2x48x80xbf16>,
        tensor<2x40x48xbf16> -> tensor<100x48xbf16>, tensor<100x80xbf16>
  %yrecv = moe.scatter_rows %y, %qids : tensor<100x48xbf16>, tensor<100xi32> -> tensor<100x48xbf16>
  %yq = moe.gather_rows %yrecv, %qids : tensor<100x48xbf16>, tensor<100xi32> -> tensor<100x48xbf16>
  %out = moe.ep_combine %yrecv, %offsets {capacity = 50 : i64, ep_size = 2 : i64}
      : tensor<100x48xbf16>, tensor<5xi32> -> tensor<74x48xbf16>
  return %out, %dropped : tensor<74x48xbf16>, tensor<2xi32>
}

// The backward: rows in expert order out without gather, and back summed per
// token (reduce); overflow = drop.
// CHECK-LABEL: func.func @ep_backward
// CHECK: moe.ep_dispatch %{{.*}}, %{{.*}} {capacity = 50 : i64, ep_size = 2 : i64, overflow = #moe.ep_overflow<drop>} : tensor<74x48xbf16>, tensor<5xi32> -> tensor<100x48xbf16>, tensor<2x2xi32>, tensor<2xi32>
// CHECK: moe.ep_combine %{{.*}}, %{{.*}} reduce(%{{.*}} : tensor<37x2xi32>) {capacity = 50 : i64, ep_size = 2 : i64} : tensor<100x48xbf16>, tensor<5xi32> -> tensor<37x48xbf16>
// GENERIC-LABEL: sym_name = "ep_backward"
// GENERIC: "moe.ep_dispatch"(%{{[^,]*}}, %{{[^,]*}}) <{capacity = 50 : i64, ep_size = 2 : i64, overflow = #moe.ep_overflow<drop>}> : (tensor<74x48xbf16>, tensor<5xi32>) -> (tensor<100x48xbf16>, tensor<2x2xi32>, tensor<2xi32>)
// GENERIC: "moe.ep_combine"(%{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}) <{capacity = 50 : i64, ep_size = 2 : i64}> : (tensor<100x48xbf16>, tensor<5xi32>, tensor<37x2xi32>) -> tensor<37x48xbf16>
func.func @ep_backward(%dy: tensor<74x48xbf16>, %offsets: tensor<5xi32>, %rows: tensor<37x2xi32>,
                       %dx_recv: tensor<100x48xbf16>)
    -> (tensor<100x48xbf16>, tensor<37x48xbf16>) {
  %recv, %counts, %dropped = moe.ep_dispatch %dy, %offsets
      {capacity = 50 : i64, ep_size = 2 : i64, overflow = #moe.ep_overflow<drop>}
      : tensor<74x48xbf16>, tensor<5xi32> -> tensor<100x48xbf16>, tensor<2x2xi32>, tensor<2xi32>
  %dx = moe.ep_combine %dx_recv, %offsets reduce(%rows : tensor<37x2xi32>)
      {capacity = 50 : i64, ep_size = 2 : i64}
      : tensor<100x48xbf16>, tensor<5xi32> -> tensor<37x48xbf16>
  return %recv, %dx : tensor<100x48xbf16>, tensor<37x48xbf16>
}

// The local halves, f32 and dynamic row counts (a `?` leading size); an
// explicit overflow = error is the default and not printed.
// CHECK-LABEL: func.func @ep_local
// CHECK: moe.ep_pack %{{.*}}, %{{.*}} gather(%{{.*}} : tensor<?xi32>) {capacity = 50 : i64, ep_size = 2 : i64} : tensor<?x48xf32>, tensor<5xi32> -> tensor<100x48xf32>, tensor<2x2xi32>, tensor<2xi32>
// CHECK: moe.ep_pack %{{.*}}, %{{.*}} {capacity = 50 : i64, ep_size = 2 : i64, overflow = #moe.ep_overflow<drop>} : tensor<?x48xf32>, tensor<5xi32> -> tensor<100x48xf32>, tensor<2x2xi32>, tensor<2xi32>
// CHECK: moe.ep_unpack %{{.*}}, %{{.*}} {capacity = 50 : i64, ep_size = 2 : i64} : tensor<100x48xf32>, tensor<5xi32> -> tensor<?x48xf32>
// CHECK: moe.ep_unpack %{{.*}}, %{{.*}} reduce(%{{.*}} : tensor<?x2xi32>) {capacity = 50 : i64, ep_size = 2 : i64} : tensor<100x48xf32>, tensor<5xi32> -> tensor<?x48xf32>
// GENERIC-LABEL: sym_name = "ep_local"
// GENERIC: "moe.ep_pack"(%{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}) <{capacity = 50 : i64, ep_size = 2 : i64, overflow = #moe.ep_overflow<error>}> : (tensor<?x48xf32>, tensor<5xi32>, tensor<?xi32>) -> (tensor<100x48xf32>, tensor<2x2xi32>, tensor<2xi32>)
// GENERIC: "moe.ep_pack"(%{{[^,]*}}, %{{[^,]*}}) <{capacity = 50 : i64, ep_size = 2 : i64, overflow = #moe.ep_overflow<drop>}> : (tensor<?x48xf32>, tensor<5xi32>) -> (tensor<100x48xf32>, tensor<2x2xi32>, tensor<2xi32>)
// GENERIC: "moe.ep_unpack"(%{{[^,]*}}, %{{[^,]*}}) <{capacity = 50 : i64, ep_size = 2 : i64}> : (tensor<100x48xf32>, tensor<5xi32>) -> tensor<?x48xf32>
// GENERIC: "moe.ep_unpack"(%{{[^,]*}}, %{{[^,]*}}, %{{[^,]*}}) <{capacity = 50 : i64, ep_size = 2 : i64}> : (tensor<100x48xf32>, tensor<5xi32>, tensor<?x2xi32>) -> tensor<?x48xf32>
func.func @ep_local(%x: tensor<?x48xf32>, %ids: tensor<?xi32>, %offsets: tensor<5xi32>,
                    %rows: tensor<?x2xi32>, %returned: tensor<100x48xf32>) {
  %send, %counts, %dropped = moe.ep_pack %x, %offsets gather(%ids : tensor<?xi32>)
      {capacity = 50 : i64, ep_size = 2 : i64, overflow = #moe.ep_overflow<error>}
      : tensor<?x48xf32>, tensor<5xi32> -> tensor<100x48xf32>, tensor<2x2xi32>, tensor<2xi32>
  %send1, %counts1, %dropped1 = moe.ep_pack %x, %offsets
      {capacity = 50 : i64, ep_size = 2 : i64, overflow = #moe.ep_overflow<drop>}
      : tensor<?x48xf32>, tensor<5xi32> -> tensor<100x48xf32>, tensor<2x2xi32>, tensor<2xi32>
  %y = moe.ep_unpack %returned, %offsets {capacity = 50 : i64, ep_size = 2 : i64}
      : tensor<100x48xf32>, tensor<5xi32> -> tensor<?x48xf32>
  %dx = moe.ep_unpack %returned, %offsets reduce(%rows : tensor<?x2xi32>)
      {capacity = 50 : i64, ep_size = 2 : i64}
      : tensor<100x48xf32>, tensor<5xi32> -> tensor<?x48xf32>
  return
}

// Rows by index with dynamic row counts; ep_queues of dynamic ranks.
// CHECK-LABEL: func.func @rows_dynamic
// CHECK: %[[G:.*]] = moe.gather_rows %{{.*}}, %[[IDS:.*]] : tensor<?x48xf32>, tensor<?xi32> -> tensor<?x48xf32>
// CHECK: moe.scatter_rows %[[G]], %[[IDS]] : tensor<?x48xf32>, tensor<?xi32> -> tensor<37x48xf32>
// CHECK: moe.ep_queues %{{.*}} {capacity = 50 : i64} : tensor<?x2xi32> -> tensor<?xi32>, tensor<3xi32>
func.func @rows_dynamic(%src: tensor<?x48xf32>, %ids: tensor<?xi32>, %counts: tensor<?x2xi32>) {
  %g = moe.gather_rows %src, %ids : tensor<?x48xf32>, tensor<?xi32> -> tensor<?x48xf32>
  %s = moe.scatter_rows %g, %ids : tensor<?x48xf32>, tensor<?xi32> -> tensor<37x48xf32>
  %qids, %qoffsets = moe.ep_queues %counts {capacity = 50 : i64}
      : tensor<?x2xi32> -> tensor<?xi32>, tensor<3xi32>
  return
}

// The selection-bias update of both rules, static and dynamic sizes.
// CHECK-LABEL: func.func @update_selection_bias
// CHECK: %[[B:.*]] = moe.update_selection_bias %{{.*}}, %{{.*}} {rate = 1.{{0*}}e-03 : f64, rule = #moe.bias_update<sign>} : tensor<5xf32>, tensor<37x2xi32> -> tensor<5xf32>
// CHECK: moe.update_selection_bias %[[B]], %{{.*}} {rate = 2.5{{0*}}e-01 : f64, rule = #moe.bias_update<proportional>} : tensor<5xf32>, tensor<?x2xi32> -> tensor<?xf32>
// GENERIC-LABEL: sym_name = "update_selection_bias"
// GENERIC: "moe.update_selection_bias"(%{{.*}}, %{{.*}}) <{rate = 1.{{0*}}e-03 : f64, rule = #moe.bias_update<sign>}>
func.func @update_selection_bias(%b: tensor<5xf32>, %e: tensor<37x2xi32>, %ed: tensor<?x2xi32>) -> tensor<?xf32> {
  %b1 = moe.update_selection_bias %b, %e {rate = 1.0e-3 : f64, rule = #moe.bias_update<sign>}
      : tensor<5xf32>, tensor<37x2xi32> -> tensor<5xf32>
  %b2 = moe.update_selection_bias %b1, %ed {rate = 0.25 : f64, rule = #moe.bias_update<proportional>}
      : tensor<5xf32>, tensor<?x2xi32> -> tensor<?xf32>
  return %b2 : tensor<?xf32>
}
