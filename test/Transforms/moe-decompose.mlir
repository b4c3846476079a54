// RUN: moe-opt %s --moe-decompose -split-input-file -verify-diagnostics | FileCheck %s

// CHECK-LABEL: func.func @mixtral_like
// CHECK-SAME: (%[[X:.*]]: tensor<37x48xf32>, %[[WR:.*]]: tensor<48x5xf32>, %[[WGU:.*]]: tensor<5x48x80xf32>, %[[WD:.*]]: tensor<5x40x48xf32>)
// CHECK-NOT: moe.layer
// CHECK: %[[W:.*]], %[[E:.*]], %[[L:.*]] = moe.router %[[X]], %[[WR]] {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
// CHECK: %[[IDS:.*]], %[[OFF:.*]], %[[ROWS:.*]] = moe.dispatch %[[E]] {num_experts = 5 : i64} : tensor<37x2xi32> -> tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>
// CHECK: %[[Y:.*]], %{{.*}} = moe.expert_ffn %[[X]], %[[IDS]], %[[OFF]], %[[WGU]], %[[WD]] {activation = #moe.activation<swiglu>} : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<74x48xf32>, tensor<74x80xf32>
// CHECK: %[[OUT:.*]] = moe.combine %[[Y]], %[[W]], %[[ROWS]] : tensor<74x48xf32>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x48xf32>
// CHECK: return %[[OUT]], %[[L]]
func.func @mixtral_like(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>,
                        %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>)
    -> (tensor<37x48xf32>, tensor<37x5xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>,
        tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return %out, %logits : tensor<37x48xf32>, tensor<37x5xf32>
}

// -----

// Selection bias, group-limited sigmoid routing, a shared expert and a
// capacity factor all reach the right op; the bound on the dynamic token
// count goes to the function.
// CHECK-LABEL: func.func @deepseek_like
// CHECK-SAME: (%[[X:.*]]: tensor<?x64xbf16>, %[[WR:.*]]: tensor<64x16xbf16>, %[[B:.*]]: tensor<16xf32>, %[[WGU:.*]]: tensor<16x64x32xbf16>, %[[WD:.*]]: tensor<16x16x64xbf16>, %[[SGU:.*]]: tensor<64x48xbf16>, %[[SD:.*]]: tensor<24x64xbf16>)
// CHECK-SAME: attributes {moe.max_tokens = 4096 : i64}
// CHECK: %[[W:.*]], %[[E:.*]], %[[L:.*]] = moe.router %[[X]], %[[WR]] bias(%[[B]] : tensor<16xf32>) {routing = #moe.routing<scoring = sigmoid, top_k = 4, renormalize = true, num_groups = 4, topk_groups = 2, scaling_factor = 2.5{{0*}}e+00>} : tensor<?x64xbf16>, tensor<64x16xbf16> -> tensor<?x4xf32>, tensor<?x4xi32>, tensor<?x16xf32>
// CHECK: %[[IDS:.*]], %[[OFF:.*]], %[[ROWS:.*]] = moe.dispatch %[[E]] {capacity_factor = 1.5{{0*}}e+00 : f64, num_experts = 16 : i64} : tensor<?x4xi32> -> tensor<?xi32>, tensor<17xi32>, tensor<?x4xi32>
// CHECK: %[[Y:.*]], %{{.*}} = moe.expert_ffn %[[X]], %[[IDS]], %[[OFF]], %[[WGU]], %[[WD]] {{.*}} -> tensor<?x64xbf16>, tensor<?x32xbf16>
// CHECK: %[[ROUTED:.*]] = moe.combine %[[Y]], %[[W]], %[[ROWS]] : tensor<?x64xbf16>, tensor<?x4xf32>, tensor<?x4xi32> -> tensor<?x64xbf16>
// CHECK: %[[SY:.*]], %{{.*}} = moe.shared_expert %[[X]], %[[SGU]], %[[SD]] {activation = #moe.activation<swiglu>} : tensor<?x64xbf16>, tensor<64x48xbf16>, tensor<24x64xbf16> -> tensor<?x64xbf16>, tensor<?x48xbf16>
// CHECK: %[[SUM:.*]] = arith.addf %[[ROUTED]], %[[SY]] : tensor<?x64xbf16>
// CHECK: return %[[SUM]], %[[L]]
func.func @deepseek_like(%x: tensor<?x64xbf16>, %wr: tensor<64x16xbf16>,
                         %bias: tensor<16xf32>, %wgu: tensor<16x64x32xbf16>,
                         %wd: tensor<16x16x64xbf16>, %sgu: tensor<64x48xbf16>,
                         %sd: tensor<24x64xbf16>)
    -> (tensor<?x64xbf16>, tensor<?x16xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd bias(%bias : tensor<16xf32>)
      shared(%sgu, %sd : tensor<64x48xbf16>, tensor<24x64xbf16>)
      {activation = #moe.activation<swiglu>, capacity_factor = 1.5 : f64,
       max_tokens = 4096,
       routing = #moe.routing<scoring = sigmoid, top_k = 4, renormalize = true,
                              num_groups = 4, topk_groups = 2, scaling_factor = 2.5>}
      : tensor<?x64xbf16>, tensor<64x16xbf16>, tensor<16x64x32xbf16>,
        tensor<16x16x64xbf16> -> tensor<?x64xbf16>, tensor<?x16xf32>
  return %out, %logits : tensor<?x64xbf16>, tensor<?x16xf32>
}

// -----

// Plain GELU experts keep an h of width n; layers inside other ops are
// decomposed too; ops that are not layers are left alone.
// CHECK-LABEL: func.func @gelu_nested
// CHECK: scf.execute_region
// CHECK: moe.expert_ffn {{.*}} {activation = #moe.activation<gelu>} {{.*}} -> tensor<8x16xf32>, tensor<8x24xf32>
// CHECK: moe.aux_loss
func.func @gelu_nested(%x: tensor<8x16xf32>, %wr: tensor<16x4xf32>,
                       %wgu: tensor<4x16x24xf32>, %wd: tensor<4x24x16xf32>,
                       %e: tensor<8x1xi32>, %l: tensor<8x4xf32>) -> tensor<8x16xf32> {
  %r = scf.execute_region -> tensor<8x16xf32> {
    %out, %logits = moe.layer %x, %wr, %wgu, %wd
        {activation = #moe.activation<gelu>,
         routing = #moe.routing<scoring = softmax, top_k = 1>}
        : tensor<8x16xf32>, tensor<16x4xf32>, tensor<4x16x24xf32>,
          tensor<4x24x16xf32> -> tensor<8x16xf32>, tensor<8x4xf32>
    scf.yield %out : tensor<8x16xf32>
  }
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<softmax>}
      : tensor<8x4xf32>, tensor<8x1xi32> -> tensor<f32>, tensor<f32>
  return %r : tensor<8x16xf32>
}

// -----

func.func @dynamic_experts(%x: tensor<8x16xf32>, %wr: tensor<16x?xf32>,
                           %wgu: tensor<?x16x48xf32>, %wd: tensor<?x24x16xf32>)
    -> tensor<8x16xf32> {
  // expected-error @+1 {{cannot be decomposed: the number of experts must be static}}
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 1>}
      : tensor<8x16xf32>, tensor<16x?xf32>, tensor<?x16x48xf32>,
        tensor<?x24x16xf32> -> tensor<8x16xf32>, tensor<8x?xf32>
  return %out : tensor<8x16xf32>
}

// -----

// Two layers of one function share its bound.
func.func @two_bounds(%x: tensor<?x16xf32>, %wr: tensor<16x4xf32>,
                      %wgu: tensor<4x16x48xf32>, %wd: tensor<4x24x16xf32>)
    -> (tensor<?x16xf32>, tensor<?x16xf32>) {
  %a, %la = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, max_tokens = 64,
       routing = #moe.routing<scoring = softmax, top_k = 1>}
      : tensor<?x16xf32>, tensor<16x4xf32>, tensor<4x16x48xf32>,
        tensor<4x24x16xf32> -> tensor<?x16xf32>, tensor<?x4xf32>
  // expected-error @+1 {{has max_tokens = 128 but its function's moe.max_tokens is 64 (the layers of one function share one bound)}}
  %b, %lb = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, max_tokens = 128,
       routing = #moe.routing<scoring = softmax, top_k = 1>}
      : tensor<?x16xf32>, tensor<16x4xf32>, tensor<4x16x48xf32>,
        tensor<4x24x16xf32> -> tensor<?x16xf32>, tensor<?x4xf32>
  return %a, %b : tensor<?x16xf32>, tensor<?x16xf32>
}

// -----

// Expert-parallel over 2 ranks: the router sees all 8 experts, the weights
// are this rank's 4; the rows go to their experts' ranks (at most 16 to each)
// and come back before the combine.
// CHECK-LABEL: func.func @expert_parallel
// CHECK-SAME: (%[[X:.*]]: tensor<?x16xf32>, %[[WR:.*]]: tensor<16x8xf32>, %[[WGU:.*]]: tensor<4x16x24xf32>, %[[WD:.*]]: tensor<4x12x16xf32>)
// CHECK: %[[W:.*]], %[[E:.*]], %[[L:.*]] = moe.router %[[X]], %[[WR]]
// CHECK: %[[IDS:.*]], %[[OFF:.*]], %[[ROWS:.*]] = moe.dispatch %[[E]] {num_experts = 8 : i64}
// CHECK: %[[RECV:.*]], %[[COUNTS:.*]], %{{.*}} = moe.ep_dispatch %[[X]], %[[OFF]] gather(%[[IDS]] : tensor<?xi32>) {capacity = 16 : i64, ep_size = 2 : i64, overflow = #moe.ep_overflow<drop>}
// CHECK-SAME: -> tensor<32x16xf32>, tensor<2x4xi32>, tensor<2xi32>
// CHECK: %[[QIDS:.*]], %[[QOFF:.*]] = moe.ep_queues %[[COUNTS]] {capacity = 16 : i64} : tensor<2x4xi32> -> tensor<32xi32>, tensor<5xi32>
// CHECK: %[[Y:.*]], %{{.*}} = moe.expert_ffn %[[RECV]], %[[QIDS]], %[[QOFF]], %[[WGU]], %[[WD]]
// CHECK-SAME: -> tensor<32x16xf32>, tensor<32x24xf32>
// CHECK: %[[BACK:.*]] = moe.scatter_rows %[[Y]], %[[QIDS]] : tensor<32x16xf32>, tensor<32xi32> -> tensor<32x16xf32>
// CHECK: %[[YG:.*]] = moe.ep_combine %[[BACK]], %[[OFF]] {capacity = 16 : i64, ep_size = 2 : i64} : tensor<32x16xf32>, tensor<9xi32> -> tensor<?x16xf32>
// CHECK: %[[OUT:.*]] = moe.combine %[[YG]], %[[W]], %[[ROWS]]
// CHECK: return %[[OUT]], %[[L]]
func.func @expert_parallel(%x: tensor<?x16xf32>, %wr: tensor<16x8xf32>,
                           %wgu: tensor<4x16x24xf32>, %wd: tensor<4x12x16xf32>)
    -> (tensor<?x16xf32>, tensor<?x8xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, max_tokens = 32,
       ep_size = 2, ep_capacity = 16, ep_overflow = #moe.ep_overflow<drop>,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x16xf32>, tensor<16x8xf32>, tensor<4x16x24xf32>,
        tensor<4x12x16xf32> -> tensor<?x16xf32>, tensor<?x8xf32>
  return %out, %logits : tensor<?x16xf32>, tensor<?x8xf32>
}

// -----

// A chunked expert-parallel layer is compiled for one chunk: a step of up to
// 100 tokens runs as chunks of at most 32, so the function's bound is the
// chunk's and the step's is recorded beside it. The capacity (8 rows from one
// rank to one rank) is a chunk's.
// CHECK-LABEL: func.func @chunked
// CHECK-SAME: attributes {moe.ep_step_tokens = 100 : i64, moe.max_tokens = 32 : i64}
// CHECK: moe.ep_dispatch
// CHECK-SAME: {capacity = 8 : i64, ep_size = 2 : i64}
// CHECK-SAME: -> tensor<16x16xf32>, tensor<2x4xi32>, tensor<2xi32>
// CHECK: moe.ep_combine
func.func @chunked(%x: tensor<?x16xf32>, %wr: tensor<16x8xf32>,
                   %wgu: tensor<4x16x24xf32>, %wd: tensor<4x12x16xf32>)
    -> (tensor<?x16xf32>, tensor<?x8xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, max_tokens = 100,
       ep_size = 2, ep_capacity = 8, ep_chunk_tokens = 32,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x16xf32>, tensor<16x8xf32>, tensor<4x16x24xf32>,
        tensor<4x12x16xf32> -> tensor<?x16xf32>, tensor<?x8xf32>
  return %out, %logits : tensor<?x16xf32>, tensor<?x8xf32>
}

// -----

// Two layers of one function share its chunk as well as its bound.
func.func @two_chunks(%x: tensor<?x16xf32>, %wr: tensor<16x8xf32>,
                      %wgu: tensor<4x16x24xf32>, %wd: tensor<4x12x16xf32>)
    -> (tensor<?x16xf32>, tensor<?x16xf32>) {
  %a, %la = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, max_tokens = 100,
       ep_size = 2, ep_capacity = 8, ep_chunk_tokens = 32,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x16xf32>, tensor<16x8xf32>, tensor<4x16x24xf32>,
        tensor<4x12x16xf32> -> tensor<?x16xf32>, tensor<?x8xf32>
  // expected-error @+1 {{has max_tokens = 32 but its function's moe.max_tokens is 32 and moe.ep_step_tokens is 100 (the layers of one function share one bound and chunk)}}
  %b, %lb = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, max_tokens = 32,
       ep_size = 2, ep_capacity = 8,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x16xf32>, tensor<16x8xf32>, tensor<4x16x24xf32>,
        tensor<4x12x16xf32> -> tensor<?x16xf32>, tensor<?x8xf32>
  return %a, %b : tensor<?x16xf32>, tensor<?x16xf32>
}
