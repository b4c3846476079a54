// RUN: moe-opt %s --convert-moe-to-linalg -split-input-file | FileCheck %s

// Router: operands cast to dynamic shapes, the missing bias is a zero
// tensor, the routing configuration becomes scalar arguments.
// CHECK-LABEL: func.func @router
// CHECK-SAME: (%[[X:.*]]: tensor<6x4xf32>, %[[WR:.*]]: tensor<4x8xf32>)
// CHECK-NOT: moe.router
// CHECK-DAG: %[[XC:.*]] = tensor.cast %[[X]] : tensor<6x4xf32> to tensor<?x?xf32>
// CHECK-DAG: %[[WRC:.*]] = tensor.cast %[[WR]] : tensor<4x8xf32> to tensor<?x?xf32>
// CHECK-DAG: %[[C1:.*]] = arith.constant 1 : index
// CHECK-DAG: %[[E:.*]] = tensor.dim %[[WRC]], %[[C1]]
// CHECK-DAG: %[[EMPTY:.*]] = tensor.empty(%[[E]]) : tensor<?xf32>
// CHECK-DAG: %[[BIAS:.*]] = linalg.fill ins(%{{.*}} : f32) outs(%[[EMPTY]] : tensor<?xf32>)
// CHECK-DAG: %[[SIGMOID:.*]] = arith.constant 1 : i32
// CHECK-DAG: %[[K:.*]] = arith.constant 2 : index
// CHECK-DAG: %[[RENORM:.*]] = arith.constant true
// CHECK-DAG: %[[GROUPS:.*]] = arith.constant 4 : index
// CHECK-DAG: %[[TOPKG:.*]] = arith.constant 2 : index
// CHECK-DAG: %[[SCALE:.*]] = arith.constant 2.500000e+00 : f32
// CHECK-DAG: %[[NOROUND:.*]] = arith.constant false
// CHECK: %[[R:.*]]:3 = call @__moe_cpu_router(%[[XC]], %[[WRC]], %[[BIAS]], %[[SIGMOID]], %[[K]], %[[RENORM]], %[[GROUPS]], %[[TOPKG]], %[[SCALE]], %[[NOROUND]])
// CHECK-SAME: : (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?xf32>, i32, index, i1, index, index, f32, i1) -> (tensor<?x?xf32>, tensor<?x?xi32>, tensor<?x?xf32>)
// CHECK-DAG: %[[W:.*]] = tensor.cast %[[R]]#0 : tensor<?x?xf32> to tensor<6x2xf32>
// CHECK-DAG: %[[EX:.*]] = tensor.cast %[[R]]#1 : tensor<?x?xi32> to tensor<6x2xi32>
// CHECK-DAG: %[[L:.*]] = tensor.cast %[[R]]#2 : tensor<?x?xf32> to tensor<6x8xf32>
// CHECK: return %[[W]], %[[EX]], %[[L]]
// CHECK-LABEL: func.func private @__moe_cpu_router
// CHECK-SAME: (%{{.*}}: tensor<?x?xf32>, %{{.*}}: tensor<?x?xf32>, %{{.*}}: tensor<?xf32>, %{{.*}}: i32, %{{.*}}: index, %{{.*}}: i1, %{{.*}}: index, %{{.*}}: index, %{{.*}}: f32, %{{.*}}: i1) -> (tensor<?x?xf32>, tensor<?x?xi32>, tensor<?x?xf32>)
// The helpers the kernel calls come along.
// CHECK-DAG: func.func private @__moe_cpu_mm(
// CHECK-DAG: func.func private @__moe_cpu_scores(
// CHECK-DAG: func.func private @__moe_cpu_softmax(
// CHECK-DAG: func.func private @__moe_cpu_beats(
func.func @router(%x: tensor<6x4xf32>, %wr: tensor<4x8xf32>)
    -> (tensor<6x2xf32>, tensor<6x2xi32>, tensor<6x8xf32>) {
  %w, %e, %l = moe.router %x, %wr
      {routing = #moe.routing<scoring = sigmoid, top_k = 2, renormalize = true,
                              num_groups = 4, topk_groups = 2,
                              scaling_factor = 2.5>}
      : tensor<6x4xf32>, tensor<4x8xf32>
      -> tensor<6x2xf32>, tensor<6x2xi32>, tensor<6x8xf32>
  return %w, %e, %l : tensor<6x2xf32>, tensor<6x2xi32>, tensor<6x8xf32>
}

// -----

// bf16 data is extended to f32 for the kernel and truncated back; the bias
// operand is passed as it is.
// CHECK-LABEL: func.func @router_bf16_bias
// CHECK-SAME: (%[[X:.*]]: tensor<6x4xbf16>, %[[WR:.*]]: tensor<4x8xbf16>, %[[B:.*]]: tensor<8xf32>)
// CHECK-DAG: %[[XE:.*]] = arith.extf %[[X]] : tensor<6x4xbf16> to tensor<6x4xf32>
// CHECK-DAG: %[[XC:.*]] = tensor.cast %[[XE]] : tensor<6x4xf32> to tensor<?x?xf32>
// CHECK-DAG: %[[WRE:.*]] = arith.extf %[[WR]] : tensor<4x8xbf16> to tensor<4x8xf32>
// CHECK-DAG: %[[WRC:.*]] = tensor.cast %[[WRE]] : tensor<4x8xf32> to tensor<?x?xf32>
// CHECK-DAG: %[[BC:.*]] = tensor.cast %[[B]] : tensor<8xf32> to tensor<?xf32>
// CHECK-DAG: %[[SOFTMAX:.*]] = arith.constant 0 : i32
// CHECK-DAG: %[[RENORM:.*]] = arith.constant false
// CHECK-DAG: %[[GROUPS:.*]] = arith.constant 1 : index
// CHECK-DAG: %[[SCALE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK: call @__moe_cpu_router(%[[XC]], %[[WRC]], %[[BC]], %[[SOFTMAX]], %{{.*}}, %[[RENORM]], %[[GROUPS]], %{{.*}}, %[[SCALE]], %false{{[_0-9]*}})
func.func @router_bf16_bias(%x: tensor<6x4xbf16>, %wr: tensor<4x8xbf16>,
                            %b: tensor<8xf32>) -> tensor<6x2xi32> {
  %w, %e, %l = moe.router %x, %wr bias(%b : tensor<8xf32>)
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<6x4xbf16>, tensor<4x8xbf16>
      -> tensor<6x2xf32>, tensor<6x2xi32>, tensor<6x8xf32>
  return %e : tensor<6x2xi32>
}

// -----

// round_logits on bf16 activations: the kernel rounds its f32 logits to bf16
// (its last argument); on f32 activations the flag is a no-op and passes false.
// (The constants are not uniqued: their printed names say their values.)
// CHECK-LABEL: func.func @router_round_logits
// CHECK: call @__moe_cpu_router({{.*}}, %{{[0-9a-z_]+}}, %true{{[_0-9]*}})
// CHECK-LABEL: func.func @router_round_logits_f32
// CHECK: call @__moe_cpu_router({{.*}}, %{{[0-9a-z_]+}}, %false{{[_0-9]*}})
func.func @router_round_logits(%x: tensor<6x4xbf16>, %wr: tensor<4x8xbf16>)
    -> tensor<6x8xf32> {
  %w, %e, %l = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2, round_logits = true>}
      : tensor<6x4xbf16>, tensor<4x8xbf16>
      -> tensor<6x2xf32>, tensor<6x2xi32>, tensor<6x8xf32>
  return %l : tensor<6x8xf32>
}
func.func @router_round_logits_f32(%x: tensor<6x4xf32>, %wr: tensor<4x8xf32>)
    -> tensor<6x8xf32> {
  %w, %e, %l = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2, round_logits = true>}
      : tensor<6x4xf32>, tensor<4x8xf32>
      -> tensor<6x2xf32>, tensor<6x2xi32>, tensor<6x8xf32>
  return %l : tensor<6x8xf32>
}

// -----

// Capacity: ceil(1.25 * 6 * 2 / 4) = 4; T * k = 12 without a factor.
// CHECK-LABEL: func.func @dispatch
// CHECK-SAME: (%[[EX:.*]]: tensor<6x2xi32>)
// CHECK: %[[EXC:.*]] = tensor.cast %[[EX]] : tensor<6x2xi32> to tensor<?x?xi32>
// CHECK: %[[CAP:.*]] = arith.constant 4 : index
// CHECK: %[[E:.*]] = arith.constant 4 : index
// CHECK: %[[D0:.*]]:3 = call @__moe_cpu_dispatch(%[[EXC]], %[[E]], %[[CAP]])
// CHECK-SAME: : (tensor<?x?xi32>, index, index) -> (tensor<?xi32>, tensor<?xi32>, tensor<?x?xi32>)
// CHECK-DAG: tensor.cast %[[D0]]#0 : tensor<?xi32> to tensor<12xi32>
// CHECK-DAG: tensor.cast %[[D0]]#1 : tensor<?xi32> to tensor<5xi32>
// CHECK-DAG: tensor.cast %[[D0]]#2 : tensor<?x?xi32> to tensor<6x2xi32>
// CHECK: %[[C12:.*]] = arith.constant 12 : index
// CHECK: call @__moe_cpu_dispatch(%{{.*}}, %{{.*}}, %[[C12]])
// CHECK-LABEL: func.func private @__moe_cpu_dispatch
func.func @dispatch(%e: tensor<6x2xi32>)
    -> (tensor<12xi32>, tensor<5xi32>, tensor<6x2xi32>, tensor<12xi32>) {
  %ids, %offs, %rows = moe.dispatch %e
      {num_experts = 4 : i64, capacity_factor = 1.25}
      : tensor<6x2xi32> -> tensor<12xi32>, tensor<5xi32>, tensor<6x2xi32>
  %ids2, %offs2, %rows2 = moe.dispatch %e {num_experts = 4 : i64}
      : tensor<6x2xi32> -> tensor<12xi32>, tensor<5xi32>, tensor<6x2xi32>
  return %ids, %offs, %rows, %ids2
      : tensor<12xi32>, tensor<5xi32>, tensor<6x2xi32>, tensor<12xi32>
}

// -----

// f64, left to right: 1.1 * 25 * 2 / 5 = 11.000000000000002, so 12.
// CHECK-LABEL: func.func @dispatch_f64
// CHECK: %[[CAP:.*]] = arith.constant 12 : index
// CHECK: %[[E:.*]] = arith.constant 5 : index
// CHECK: call @__moe_cpu_dispatch(%{{.*}}, %[[E]], %[[CAP]])
func.func @dispatch_f64(%e: tensor<25x2xi32>) -> tensor<25x2xi32> {
  %ids, %offs, %rows = moe.dispatch %e
      {num_experts = 5 : i64, capacity_factor = 1.1}
      : tensor<25x2xi32> -> tensor<50xi32>, tensor<6xi32>, tensor<25x2xi32>
  return %rows : tensor<25x2xi32>
}

// -----

// With a dynamic T the capacity is computed at run time, in f64.
// CHECK-LABEL: func.func @dispatch_dynamic
// CHECK-DAG: %[[C0:.*]] = arith.constant 0 : index
// CHECK-DAG: %[[C1:.*]] = arith.constant 1 : index
// CHECK-DAG: %[[T:.*]] = tensor.dim %{{.*}}, %[[C0]] : tensor<?x?xi32>
// CHECK-DAG: %[[K:.*]] = tensor.dim %{{.*}}, %[[C1]] : tensor<?x?xi32>
// CHECK-DAG: %[[CF:.*]] = arith.constant 1.250000e+00 : f64
// CHECK-DAG: %[[EF:.*]] = arith.constant 4.000000e+00 : f64
// CHECK: %[[TF:.*]] = arith.sitofp %{{.*}} : i64 to f64
// CHECK: %[[P0:.*]] = arith.mulf %[[CF]], %[[TF]] : f64
// CHECK: %[[P1:.*]] = arith.mulf %[[P0]], %{{.*}} : f64
// CHECK: %[[Q:.*]] = arith.divf %[[P1]], %[[EF]] : f64
// CHECK: %[[CEIL:.*]] = math.ceil %[[Q]] : f64
// CHECK: %[[MIN:.*]] = arith.minimumf %[[CEIL]], %{{.*}} : f64
// CHECK: %[[CAP64:.*]] = arith.fptosi %[[MIN]] : f64 to i64
// CHECK: %[[CAP:.*]] = arith.index_cast %[[CAP64]] : i64 to index
// CHECK: call @__moe_cpu_dispatch(%{{.*}}, %{{.*}}, %[[CAP]])
func.func @dispatch_dynamic(%e: tensor<?x2xi32>) -> tensor<?x2xi32> {
  %ids, %offs, %rows = moe.dispatch %e
      {num_experts = 4 : i64, capacity_factor = 1.25}
      : tensor<?x2xi32> -> tensor<?xi32>, tensor<5xi32>, tensor<?x2xi32>
  return %rows : tensor<?x2xi32>
}

// -----

// CHECK-LABEL: func.func @experts_bf16
// CHECK-SAME: (%[[X:.*]]: tensor<6x4xbf16>, %[[IDS:.*]]: tensor<12xi32>, %[[OFFS:.*]]: tensor<5xi32>, %[[WGU:.*]]: tensor<4x4x6xbf16>, %[[WD:.*]]: tensor<4x3x4xbf16>,
// CHECK-DAG: %[[XE:.*]] = arith.extf %[[X]] : tensor<6x4xbf16> to tensor<6x4xf32>
// CHECK-DAG: %[[XC:.*]] = tensor.cast %[[XE]] : tensor<6x4xf32> to tensor<?x?xf32>
// CHECK-DAG: %[[IDSC:.*]] = tensor.cast %[[IDS]] : tensor<12xi32> to tensor<?xi32>
// CHECK-DAG: %[[OFFSC:.*]] = tensor.cast %[[OFFS]] : tensor<5xi32> to tensor<?xi32>
// CHECK-DAG: %[[WGUE:.*]] = arith.extf %[[WGU]] : tensor<4x4x6xbf16> to tensor<4x4x6xf32>
// CHECK-DAG: %[[WGUC:.*]] = tensor.cast %[[WGUE]] : tensor<4x4x6xf32> to tensor<?x?x?xf32>
// CHECK-DAG: %[[WDE:.*]] = arith.extf %[[WD]] : tensor<4x3x4xbf16> to tensor<4x3x4xf32>
// CHECK-DAG: %[[WDC:.*]] = tensor.cast %[[WDE]] : tensor<4x3x4xf32> to tensor<?x?x?xf32>
// CHECK-DAG: %[[SWIGLU:.*]] = arith.constant 0 : i32
// Without biases the kernel adds zeros of [E, G] and [E, d].
// CHECK-DAG: %[[BGU:.*]] = linalg.fill ins(%{{.*}} : f32) outs(%{{.*}} : tensor<?x?xf32>)
// CHECK-DAG: %[[BD:.*]] = linalg.fill ins(%{{.*}} : f32) outs(%{{.*}} : tensor<?x?xf32>)
// CHECK: %[[F:.*]]:2 = call @__moe_cpu_expert_ffn(%[[XC]], %[[IDSC]], %[[OFFSC]], %[[WGUC]], %[[WDC]], %[[BGU]], %[[BD]], %[[SWIGLU]])
// CHECK-SAME: : (tensor<?x?xf32>, tensor<?xi32>, tensor<?xi32>, tensor<?x?x?xf32>, tensor<?x?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>, i32) -> (tensor<?x?xf32>, tensor<?x?xf32>)
// CHECK: %[[YC:.*]] = tensor.cast %[[F]]#0 : tensor<?x?xf32> to tensor<12x4xf32>
// CHECK: %[[Y:.*]] = arith.truncf %[[YC]] : tensor<12x4xf32> to tensor<12x4xbf16>
// CHECK: %[[HC:.*]] = tensor.cast %[[F]]#1 : tensor<?x?xf32> to tensor<12x6xf32>
// CHECK: %[[H:.*]] = arith.truncf %[[HC]] : tensor<12x6xf32> to tensor<12x6xbf16>
// CHECK: %[[G:.*]]:5 = call @__moe_cpu_expert_ffn_grad(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (tensor<?x?xf32>, tensor<?xi32>, tensor<?xi32>, tensor<?x?x?xf32>, tensor<?x?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>, i32) -> (tensor<?x?xf32>, tensor<?x?x?xf32>, tensor<?x?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>)
// CHECK: arith.truncf %{{.*}} : tensor<6x4xf32> to tensor<6x4xbf16>
// CHECK: arith.truncf %{{.*}} : tensor<4x4x6xf32> to tensor<4x4x6xbf16>
// CHECK: arith.truncf %{{.*}} : tensor<4x3x4xf32> to tensor<4x3x4xbf16>
// CHECK: %[[CG:.*]]:6 = call @__moe_cpu_expert_combine_grad(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (tensor<?x?xf32>, tensor<?xi32>, tensor<?xi32>, tensor<?x?xi32>, tensor<?x?xf32>, tensor<?x?x?xf32>, tensor<?x?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>, i32) -> (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?x?xf32>, tensor<?x?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>)
// CHECK: tensor.cast %[[CG]]#1 : tensor<?x?xf32> to tensor<6x2xf32>
// CHECK-DAG: func.func private @__moe_cpu_expert_ffn(
// CHECK-DAG: func.func private @__moe_cpu_expert_ffn_grad(
// CHECK-DAG: func.func private @__moe_cpu_expert_combine_grad(
// CHECK-DAG: func.func private @__moe_cpu_act(
// CHECK-DAG: func.func private @__moe_cpu_act_grad(
func.func @experts_bf16(%x: tensor<6x4xbf16>, %ids: tensor<12xi32>,
                        %offs: tensor<5xi32>, %wgu: tensor<4x4x6xbf16>,
                        %wd: tensor<4x3x4xbf16>, %rows: tensor<6x2xi32>,
                        %w: tensor<6x2xf32>)
    -> (tensor<6x4xbf16>, tensor<4x4x6xbf16>, tensor<4x3x4xbf16>,
        tensor<6x2xf32>) {
  %y, %h = moe.expert_ffn %x, %ids, %offs, %wgu, %wd
      {activation = #moe.activation<swiglu>}
      : tensor<6x4xbf16>, tensor<12xi32>, tensor<5xi32>, tensor<4x4x6xbf16>,
        tensor<4x3x4xbf16> -> tensor<12x4xbf16>, tensor<12x6xbf16>
  %dx, %dwgu, %dwd = moe.expert_ffn_grad %x, %ids, %offs, %wgu, %wd, %h, %y
      {activation = #moe.activation<swiglu>}
      : tensor<6x4xbf16>, tensor<12xi32>, tensor<5xi32>, tensor<4x4x6xbf16>,
        tensor<4x3x4xbf16>, tensor<12x6xbf16>, tensor<12x4xbf16>
      -> tensor<6x4xbf16>, tensor<4x4x6xbf16>, tensor<4x3x4xbf16>
  %dx2, %dw, %dwgu2, %dwd2 = moe.expert_combine_grad %x, %ids, %offs, %rows,
      %w, %wgu, %wd, %h, %dx {activation = #moe.activation<swiglu>}
      : tensor<6x4xbf16>, tensor<12xi32>, tensor<5xi32>, tensor<6x2xi32>,
        tensor<6x2xf32>, tensor<4x4x6xbf16>, tensor<4x3x4xbf16>,
        tensor<12x6xbf16>, tensor<6x4xbf16>
      -> tensor<6x4xbf16>, tensor<6x2xf32>, tensor<4x4x6xbf16>,
         tensor<4x3x4xbf16>
  return %dx2, %dwgu, %dwd, %dw
      : tensor<6x4xbf16>, tensor<4x4x6xbf16>, tensor<4x3x4xbf16>,
        tensor<6x2xf32>
}


// -----
// Experts with biases: the biases reach the kernels as they are, and the
// gradient kernels' bias gradients are the op's d_b_gate_up and d_b_down.
// CHECK-LABEL: func.func @experts_bias
// CHECK-SAME: %[[BGU:[a-z0-9]+]]: tensor<4x6xbf16>, %[[BD:[a-z0-9]+]]: tensor<4x4xbf16>)
// CHECK-DAG: %[[BGUE:.*]] = arith.extf %[[BGU]] : tensor<4x6xbf16> to tensor<4x6xf32>
// CHECK-DAG: %[[BGUC:.*]] = tensor.cast %[[BGUE]] : tensor<4x6xf32> to tensor<?x?xf32>
// CHECK-DAG: %[[BDE:.*]] = arith.extf %[[BD]] : tensor<4x4xbf16> to tensor<4x4xf32>
// CHECK-DAG: %[[BDC:.*]] = tensor.cast %[[BDE]] : tensor<4x4xf32> to tensor<?x?xf32>
// CHECK: call @__moe_cpu_expert_ffn(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[BGUC]], %[[BDC]], %{{.*}})
// CHECK: %[[G:.*]]:5 = call @__moe_cpu_expert_ffn_grad(
// CHECK: tensor.cast %[[G]]#3 : tensor<?x?xf32> to tensor<4x6xf32>
// CHECK: tensor.cast %[[G]]#4 : tensor<?x?xf32> to tensor<4x4xf32>
// CHECK: %[[CG:.*]]:6 = call @__moe_cpu_expert_combine_grad(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[BDC2:.*]], %{{.*}})
// CHECK: tensor.cast %[[CG]]#5 : tensor<?x?xf32> to tensor<4x4xf32>
func.func @experts_bias(%x: tensor<6x4xbf16>, %ids: tensor<12xi32>,
                        %offs: tensor<5xi32>, %wgu: tensor<4x4x6xbf16>,
                        %wd: tensor<4x3x4xbf16>, %rows: tensor<6x2xi32>,
                        %w: tensor<6x2xf32>, %bgu: tensor<4x6xbf16>,
                        %bd: tensor<4x4xbf16>)
    -> (tensor<4x6xbf16>, tensor<4x4xbf16>, tensor<4x6xbf16>, tensor<4x4xbf16>) {
  %y, %h = moe.expert_ffn %x, %ids, %offs, %wgu, %wd
      bias(%bgu, %bd : tensor<4x6xbf16>, tensor<4x4xbf16>)
      {activation = #moe.activation<swiglu>}
      : tensor<6x4xbf16>, tensor<12xi32>, tensor<5xi32>, tensor<4x4x6xbf16>,
        tensor<4x3x4xbf16> -> tensor<12x4xbf16>, tensor<12x6xbf16>
  %dx, %dwgu, %dwd, %dbgu, %dbd = moe.expert_ffn_grad %x, %ids, %offs, %wgu,
      %wd, %h, %y bias(%bgu, %bd : tensor<4x6xbf16>, tensor<4x4xbf16>)
      {activation = #moe.activation<swiglu>}
      : tensor<6x4xbf16>, tensor<12xi32>, tensor<5xi32>, tensor<4x4x6xbf16>,
        tensor<4x3x4xbf16>, tensor<12x6xbf16>, tensor<12x4xbf16>
      -> tensor<6x4xbf16>, tensor<4x4x6xbf16>, tensor<4x3x4xbf16>,
         tensor<4x6xbf16>, tensor<4x4xbf16>
  %dx2, %dw, %dwgu2, %dwd2, %dbgu2, %dbd2 = moe.expert_combine_grad %x, %ids,
      %offs, %rows, %w, %wgu, %wd, %h, %dx
      bias(%bgu, %bd : tensor<4x6xbf16>, tensor<4x4xbf16>)
      {activation = #moe.activation<swiglu>}
      : tensor<6x4xbf16>, tensor<12xi32>, tensor<5xi32>, tensor<6x2xi32>,
        tensor<6x2xf32>, tensor<4x4x6xbf16>, tensor<4x3x4xbf16>,
        tensor<12x6xbf16>, tensor<6x4xbf16>
      -> tensor<6x4xbf16>, tensor<6x2xf32>, tensor<4x4x6xbf16>,
         tensor<4x3x4xbf16>, tensor<4x6xbf16>, tensor<4x4xbf16>
  return %dbgu, %dbd, %dbgu2, %dbd2
      : tensor<4x6xbf16>, tensor<4x4xbf16>, tensor<4x6xbf16>, tensor<4x4xbf16>
}
// -----

// CHECK-LABEL: func.func @shared
// CHECK-DAG: %[[GELU:.*]] = arith.constant 1 : i32
// CHECK: %[[S:.*]]:2 = call @__moe_cpu_shared_expert(%{{.*}}, %{{.*}}, %{{.*}}, %[[GELU]]) : (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>, i32) -> (tensor<?x?xf32>, tensor<?x?xf32>)
// CHECK: %[[SY:.*]] = tensor.cast %[[S]]#0 : tensor<?x?xf32> to tensor<6x4xf32>
// CHECK: arith.truncf %[[SY]] : tensor<6x4xf32> to tensor<6x4xf16>
// CHECK-DAG: %[[SILU:.*]] = arith.constant 2 : i32
// CHECK: call @__moe_cpu_shared_expert_grad(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[SILU]]) : (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>, i32) -> (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>)
// CHECK-DAG: func.func private @__moe_cpu_shared_expert(
// CHECK-DAG: func.func private @__moe_cpu_shared_expert_grad(
// CHECK-DAG: func.func private @__moe_cpu_gelu(
// CHECK-DAG: func.func private @__moe_cpu_dsilu(
func.func @shared(%x: tensor<6x4xf16>, %wgu: tensor<4x3xf16>,
                  %wd: tensor<3x4xf16>) -> (tensor<6x4xf16>, tensor<4x3xf16>) {
  %y, %h = moe.shared_expert %x, %wgu, %wd {activation = #moe.activation<gelu>}
      : tensor<6x4xf16>, tensor<4x3xf16>, tensor<3x4xf16>
      -> tensor<6x4xf16>, tensor<6x3xf16>
  %dx, %dwgu, %dwd = moe.shared_expert_grad %x, %wgu, %wd, %h, %y
      {activation = #moe.activation<silu>}
      : tensor<6x4xf16>, tensor<4x3xf16>, tensor<3x4xf16>, tensor<6x3xf16>,
        tensor<6x4xf16> -> tensor<6x4xf16>, tensor<4x3xf16>, tensor<3x4xf16>
  return %dx, %dwgu : tensor<6x4xf16>, tensor<4x3xf16>
}

// -----

// CHECK-LABEL: func.func @combine
// CHECK-SAME: (%[[Y:.*]]: tensor<12x4xbf16>, %[[W:.*]]: tensor<6x2xf32>, %[[ROWS:.*]]: tensor<6x2xi32>, %[[DOUT:.*]]: tensor<6x4xbf16>)
// CHECK: %[[YE:.*]] = arith.extf %[[Y]] : tensor<12x4xbf16> to tensor<12x4xf32>
// CHECK: %[[YC:.*]] = tensor.cast %[[YE]] : tensor<12x4xf32> to tensor<?x?xf32>
// CHECK: %[[WC:.*]] = tensor.cast %[[W]] : tensor<6x2xf32> to tensor<?x?xf32>
// CHECK: %[[RC:.*]] = tensor.cast %[[ROWS]] : tensor<6x2xi32> to tensor<?x?xi32>
// CHECK: %[[OUT:.*]] = call @__moe_cpu_combine(%[[YC]], %[[WC]], %[[RC]]) : (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xi32>) -> tensor<?x?xf32>
// CHECK: %[[OUTC:.*]] = tensor.cast %[[OUT]] : tensor<?x?xf32> to tensor<6x4xf32>
// CHECK: %[[OUTT:.*]] = arith.truncf %[[OUTC]] : tensor<6x4xf32> to tensor<6x4xbf16>
// CHECK: %[[G:.*]]:2 = call @__moe_cpu_combine_grad(%{{.*}}, %[[WC2:.*]], %[[RC2:.*]], %{{.*}}) : (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xi32>, tensor<?x?xf32>) -> (tensor<?x?xf32>, tensor<?x?xf32>)
// CHECK: %[[DYC:.*]] = tensor.cast %[[G]]#0 : tensor<?x?xf32> to tensor<12x4xf32>
// CHECK: arith.truncf %[[DYC]] : tensor<12x4xf32> to tensor<12x4xbf16>
// CHECK: tensor.cast %[[G]]#1 : tensor<?x?xf32> to tensor<6x2xf32>
func.func @combine(%y: tensor<12x4xbf16>, %w: tensor<6x2xf32>,
                   %rows: tensor<6x2xi32>, %dout: tensor<6x4xbf16>)
    -> (tensor<6x4xbf16>, tensor<12x4xbf16>, tensor<6x2xf32>) {
  %out = moe.combine %y, %w, %rows
      : tensor<12x4xbf16>, tensor<6x2xf32>, tensor<6x2xi32> -> tensor<6x4xbf16>
  %dy, %dw = moe.combine_grad %dout, %w, %rows, %y
      : tensor<6x4xbf16>, tensor<6x2xf32>, tensor<6x2xi32>, tensor<12x4xbf16>
      -> tensor<12x4xbf16>, tensor<6x2xf32>
  return %out, %dy, %dw : tensor<6x4xbf16>, tensor<12x4xbf16>, tensor<6x2xf32>
}

// -----

// CHECK-LABEL: func.func @router_grad_aux
// CHECK-SAME: (%[[X:.*]]: tensor<6x4xf32>, %[[WR:.*]]: tensor<4x8xf32>, %[[L:.*]]: tensor<6x8xf32>, %[[EX:.*]]: tensor<6x2xi32>, %[[DW:.*]]: tensor<6x2xf32>, %[[DLB:.*]]: tensor<f32>, %[[DZ:.*]]: tensor<f32>)
// CHECK: %[[SIGMOID:.*]] = arith.constant 1 : i32
// CHECK: %[[LB:.*]]:2 = call @__moe_cpu_aux_loss(%{{.*}}, %{{.*}}, %[[SIGMOID]]) : (tensor<?x?xf32>, tensor<?x?xi32>, i32) -> (tensor<f32>, tensor<f32>)
// CHECK: %[[SIGMOID2:.*]] = arith.constant 1 : i32
// CHECK: %[[DL:.*]] = call @__moe_cpu_aux_loss_grad(%{{.*}}, %{{.*}}, %[[DLB]], %[[DZ]], %[[SIGMOID2]]) : (tensor<?x?xf32>, tensor<?x?xi32>, tensor<f32>, tensor<f32>, i32) -> tensor<?x?xf32>
// CHECK: %[[DLC:.*]] = tensor.cast %[[DL]] : tensor<?x?xf32> to tensor<6x8xf32>
// CHECK: %[[DLK:.*]] = tensor.cast %[[DLC]] : tensor<6x8xf32> to tensor<?x?xf32>
// CHECK: call @__moe_cpu_router_grad(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[DLK]], %{{.*}}, %{{.*}}, %{{.*}}) : (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xi32>, tensor<?x?xf32>, tensor<?x?xf32>, i32, i1, f32) -> (tensor<?x?xf32>, tensor<?x?xf32>)
// Without logits_grad the extra logits gradient is a zero [T, E] tensor.
// CHECK: %[[ZE:.*]] = tensor.empty(%{{.*}}, %{{.*}}) : tensor<?x?xf32>
// CHECK: %[[Z:.*]] = linalg.fill ins(%{{.*}} : f32) outs(%[[ZE]] : tensor<?x?xf32>)
// CHECK: call @__moe_cpu_router_grad(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[Z]], %{{.*}}, %{{.*}}, %{{.*}})
func.func @router_grad_aux(%x: tensor<6x4xf32>, %wr: tensor<4x8xf32>,
                           %l: tensor<6x8xf32>, %e: tensor<6x2xi32>,
                           %dw: tensor<6x2xf32>, %dlb: tensor<f32>,
                           %dz: tensor<f32>)
    -> (tensor<6x4xf32>, tensor<4x8xf32>, tensor<f32>, tensor<6x4xf32>) {
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<sigmoid>}
      : tensor<6x8xf32>, tensor<6x2xi32> -> tensor<f32>, tensor<f32>
  %dl = moe.aux_loss_grad %l, %e, %dlb, %dz {scoring = #moe.scoring<sigmoid>}
      : tensor<6x8xf32>, tensor<6x2xi32>, tensor<f32>, tensor<f32>
      -> tensor<6x8xf32>
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw logits_grad(%dl : tensor<6x8xf32>)
      {routing = #moe.routing<scoring = sigmoid, top_k = 2>}
      : tensor<6x4xf32>, tensor<4x8xf32>, tensor<6x8xf32>, tensor<6x2xi32>,
        tensor<6x2xf32> -> tensor<6x4xf32>, tensor<4x8xf32>
  %dx2, %dwr2 = moe.router_grad %x, %wr, %l, %e, %dw
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<6x4xf32>, tensor<4x8xf32>, tensor<6x8xf32>, tensor<6x2xi32>,
        tensor<6x2xf32> -> tensor<6x4xf32>, tensor<4x8xf32>
  return %dx, %dwr, %lb, %dx2 : tensor<6x4xf32>, tensor<4x8xf32>, tensor<f32>, tensor<6x4xf32>
}

// -----

// moe.layer is decomposed first, then every step becomes a call.
// CHECK-LABEL: func.func @layer
// CHECK-NOT: moe.
// CHECK: call @__moe_cpu_router
// CHECK: call @__moe_cpu_dispatch
// CHECK: call @__moe_cpu_expert_ffn
// CHECK: call @__moe_cpu_combine
// CHECK: call @__moe_cpu_shared_expert
// CHECK: arith.addf %{{.*}}, %{{.*}} : tensor<6x4xbf16>
// CHECK: return
func.func @layer(%x: tensor<6x4xbf16>, %wr: tensor<4x4xbf16>,
                 %wgu: tensor<4x4x6xbf16>, %wd: tensor<4x3x4xbf16>,
                 %sgu: tensor<4x4xbf16>, %sd: tensor<2x4xbf16>)
    -> (tensor<6x4xbf16>, tensor<6x4xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      shared(%sgu, %sd : tensor<4x4xbf16>, tensor<2x4xbf16>)
      {activation = #moe.activation<swiglu>, capacity_factor = 1.0,
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<6x4xbf16>, tensor<4x4xbf16>, tensor<4x4x6xbf16>,
        tensor<4x3x4xbf16> -> tensor<6x4xbf16>, tensor<6x4xf32>
  return %out, %logits : tensor<6x4xbf16>, tensor<6x4xf32>
}

// -----

// moe.checkpoint is inlined; moe.offload and moe.prefetch become copies and
// !moe.host_tensor becomes the tensor type it mirrors, in signatures too.
// CHECK-LABEL: func.func @placement
// CHECK-SAME: (%[[X:.*]]: tensor<6x4xf32>, %[[IDS:.*]]: tensor<12xi32>, %[[OFFS:.*]]: tensor<5xi32>, %[[WGU:.*]]: tensor<4x4x6xf32>, %[[WD:.*]]: tensor<4x3x4xf32>)
// CHECK-SAME: -> (tensor<12x4xf32>, tensor<12x6xf32>)
// CHECK-NOT: moe.
// CHECK: %[[F:.*]]:2 = call @__moe_cpu_expert_ffn
// CHECK: %[[Y:.*]] = tensor.cast %[[F]]#0 : tensor<?x?xf32> to tensor<12x4xf32>
// CHECK: %[[H:.*]] = tensor.cast %[[F]]#1 : tensor<?x?xf32> to tensor<12x6xf32>
// CHECK: %[[EMPTY:.*]] = tensor.empty() : tensor<12x6xf32>
// CHECK: %[[COPY:.*]] = linalg.copy ins(%[[H]] : tensor<12x6xf32>) outs(%[[EMPTY]] : tensor<12x6xf32>) -> tensor<12x6xf32>
// CHECK: return %[[Y]], %[[COPY]] : tensor<12x4xf32>, tensor<12x6xf32>
func.func @placement(%x: tensor<6x4xf32>, %ids: tensor<12xi32>,
                     %offs: tensor<5xi32>, %wgu: tensor<4x4x6xf32>,
                     %wd: tensor<4x3x4xf32>)
    -> (tensor<12x4xf32>, !moe.host_tensor<12x6xf32>) {
  %y, %h = moe.checkpoint (%x, %ids, %offs, %wgu, %wd)
      : (tensor<6x4xf32>, tensor<12xi32>, tensor<5xi32>, tensor<4x4x6xf32>,
         tensor<4x3x4xf32>) -> (tensor<12x4xf32>, tensor<12x6xf32>) {
  ^bb0(%a: tensor<6x4xf32>, %b: tensor<12xi32>, %c: tensor<5xi32>,
       %d: tensor<4x4x6xf32>, %e: tensor<4x3x4xf32>):
    %0, %1 = moe.expert_ffn %a, %b, %c, %d, %e
        {activation = #moe.activation<swiglu>}
        : tensor<6x4xf32>, tensor<12xi32>, tensor<5xi32>, tensor<4x4x6xf32>,
          tensor<4x3x4xf32> -> tensor<12x4xf32>, tensor<12x6xf32>
    moe.yield %0, %1 : tensor<12x4xf32>, tensor<12x6xf32>
  }
  %host = moe.offload %h : tensor<12x6xf32> -> !moe.host_tensor<12x6xf32>
  return %y, %host : tensor<12x4xf32>, !moe.host_tensor<12x6xf32>
}

// CHECK-LABEL: func.func @backward
// CHECK-SAME: (%[[HOST:.*]]: tensor<?x6xbf16>) -> tensor<?x6xbf16>
// CHECK: %[[C0:.*]] = arith.constant 0 : index
// CHECK: %[[DIM:.*]] = tensor.dim %[[HOST]], %[[C0]] : tensor<?x6xbf16>
// CHECK: %[[EMPTY:.*]] = tensor.empty(%[[DIM]]) : tensor<?x6xbf16>
// CHECK: %[[COPY:.*]] = linalg.copy ins(%[[HOST]] : tensor<?x6xbf16>) outs(%[[EMPTY]] : tensor<?x6xbf16>)
// CHECK: return %[[COPY]]
func.func @backward(%host: !moe.host_tensor<?x6xbf16>) -> tensor<?x6xbf16> {
  %h = moe.prefetch %host : !moe.host_tensor<?x6xbf16> -> tensor<?x6xbf16>
  return %h : tensor<?x6xbf16>
}

// CHECK-LABEL: func.func @caller
// CHECK-SAME: (%[[ARG:.*]]: tensor<?x6xbf16>) -> tensor<?x6xbf16>
// CHECK: %[[R:.*]] = call @backward(%[[ARG]]) : (tensor<?x6xbf16>) -> tensor<?x6xbf16>
// CHECK: return %[[R]] : tensor<?x6xbf16>
func.func @caller(%host: !moe.host_tensor<?x6xbf16>) -> tensor<?x6xbf16> {
  %h = func.call @backward(%host) : (!moe.host_tensor<?x6xbf16>) -> tensor<?x6xbf16>
  return %h : tensor<?x6xbf16>
}

// -----

// A kernel the module already defines is neither replaced nor duplicated.
// CHECK-LABEL: func.func @combine_own_kernel
// CHECK: call @__moe_cpu_combine
// CHECK: func.func private @__moe_cpu_combine(%{{.*}}: tensor<?x?xf32>, %[[W:.*]]: tensor<?x?xf32>, %{{.*}}: tensor<?x?xi32>) -> tensor<?x?xf32> {
// CHECK-NEXT: return %[[W]]
// CHECK-NOT: func.func private @__moe_cpu_combine
// CHECK-NOT: func.func private @__moe_cpu_zeros
func.func @combine_own_kernel(%y: tensor<12x4xf32>, %w: tensor<6x2xf32>,
                              %rows: tensor<6x2xi32>) -> tensor<6x4xf32> {
  %out = moe.combine %y, %w, %rows
      : tensor<12x4xf32>, tensor<6x2xf32>, tensor<6x2xi32> -> tensor<6x4xf32>
  return %out : tensor<6x4xf32>
}
func.func private @__moe_cpu_combine(%y: tensor<?x?xf32>, %w: tensor<?x?xf32>,
                                     %rows: tensor<?x?xi32>) -> tensor<?x?xf32> {
  return %w : tensor<?x?xf32>
}

// -----

// An op with `accumulate` (moe-fold-adds) is the op followed by the add it
// folded: the kernel's result, back in the result's type (bf16 here), then a
// tensor arith.addf with the accumulate operand, as the CPU path runs the add.
// CHECK-LABEL: func.func @accumulate
// CHECK-SAME: %[[A:[a-z0-9]+]]: tensor<37x48xbf16>)
// CHECK: %[[OUT:.*]] = call @__moe_cpu_combine(
// CHECK: %[[OUTC:.*]] = tensor.cast %[[OUT]] : tensor<?x?xf32> to tensor<37x48xf32>
// CHECK: %[[OUTB:.*]] = arith.truncf %[[OUTC]] : tensor<37x48xf32> to tensor<37x48xbf16>
// CHECK: %[[SUM0:.*]] = arith.addf %[[OUTB]], %[[A]] : tensor<37x48xbf16>
// CHECK: %[[R:.*]]:2 = call @__moe_cpu_router_grad(
// CHECK: %[[RC:.*]] = tensor.cast %[[R]]#0 : tensor<?x?xf32> to tensor<37x48xf32>
// CHECK: %[[RB:.*]] = arith.truncf %[[RC]] : tensor<37x48xf32> to tensor<37x48xbf16>
// CHECK: %[[SUM1:.*]] = arith.addf %[[RB]], %[[SUM0]] : tensor<37x48xbf16>
// CHECK: %[[E:.*]]:6 = call @__moe_cpu_expert_combine_grad(
// CHECK: %[[EC:.*]] = tensor.cast %[[E]]#0 : tensor<?x?xf32> to tensor<37x48xf32>
// CHECK: %[[EB:.*]] = arith.truncf %[[EC]] : tensor<37x48xf32> to tensor<37x48xbf16>
// CHECK: %[[SUM2:.*]] = arith.addf %[[EB]], %[[SUM1]] : tensor<37x48xbf16>
// CHECK: return %[[SUM2]]
func.func @accumulate(%x: tensor<37x48xbf16>, %wr: tensor<48x5xbf16>, %logits: tensor<37x5xf32>,
                      %e: tensor<37x2xi32>, %w: tensor<37x2xf32>, %dw: tensor<37x2xf32>,
                      %ids: tensor<74xi32>, %offsets: tensor<6xi32>, %rows: tensor<37x2xi32>,
                      %wgu: tensor<5x48x80xbf16>, %wd: tensor<5x40x48xbf16>,
                      %h: tensor<74x80xbf16>, %y: tensor<74x48xbf16>, %dout: tensor<37x48xbf16>,
                      %a: tensor<37x48xbf16>) -> tensor<37x48xbf16> {
  %out = moe.combine %y, %w, %rows accumulate(%a : tensor<37x48xbf16>)
      : tensor<74x48xbf16>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x48xbf16>
  %dx0, %dwr0 = moe.router_grad %x, %wr, %logits, %e, %dw accumulate(%out : tensor<37x48xbf16>)
      {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x48xbf16>, tensor<48x5xbf16>, tensor<37x5xf32>, tensor<37x2xi32>,
        tensor<37x2xf32> -> tensor<37x48xbf16>, tensor<48x5xbf16>
  %dx1, %dw1, %dwgu1, %dwd1 = moe.expert_combine_grad %x, %ids, %offsets, %rows, %w,
      %wgu, %wd, %h, %dout accumulate(%dx0 : tensor<37x48xbf16>) {activation = #moe.activation<swiglu>}
      : tensor<37x48xbf16>, tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>, tensor<37x2xf32>,
        tensor<5x48x80xbf16>, tensor<5x40x48xbf16>, tensor<74x80xbf16>, tensor<37x48xbf16>
      -> tensor<37x48xbf16>, tensor<37x2xf32>, tensor<5x48x80xbf16>, tensor<5x40x48xbf16>
  return %dx1 : tensor<37x48xbf16>
}

// -----

// moe.ep_pack: the kernel with gather takes x and the token ids; without, the
// expert-order rows. S and C are index arguments; bf16 rows are extended and
// the send rows truncated back (copies: exact). The overflow rule does not
// reach the kernel (the caller reads `dropped`).
// CHECK-LABEL: func.func @ep_pack
// CHECK-SAME: (%[[X:.*]]: tensor<6x4xbf16>, %[[OFFS:.*]]: tensor<5xi32>, %[[IDS:.*]]: tensor<12xi32>, %[[ROWS:.*]]: tensor<12x4xf32>)
// CHECK: %[[XE:.*]] = arith.extf %[[X]] : tensor<6x4xbf16> to tensor<6x4xf32>
// CHECK: %[[XC:.*]] = tensor.cast %[[XE]] : tensor<6x4xf32> to tensor<?x?xf32>
// CHECK: %[[OC:.*]] = tensor.cast %[[OFFS]] : tensor<5xi32> to tensor<?xi32>
// CHECK: %[[S:.*]] = arith.constant 2 : index
// CHECK: %[[C:.*]] = arith.constant 4 : index
// CHECK: %[[IC:.*]] = tensor.cast %[[IDS]] : tensor<12xi32> to tensor<?xi32>
// CHECK: %[[P:.*]]:3 = call @__moe_cpu_ep_pack_gather(%[[XC]], %[[OC]], %[[IC]], %[[S]], %[[C]])
// CHECK-SAME: : (tensor<?x?xf32>, tensor<?xi32>, tensor<?xi32>, index, index) -> (tensor<?x?xf32>, tensor<?x?xi32>, tensor<?xi32>)
// CHECK: %[[SEND:.*]] = tensor.cast %[[P]]#0 : tensor<?x?xf32> to tensor<8x4xf32>
// CHECK: arith.truncf %[[SEND]] : tensor<8x4xf32> to tensor<8x4xbf16>
// CHECK: tensor.cast %[[P]]#1 : tensor<?x?xi32> to tensor<2x2xi32>
// CHECK: tensor.cast %[[P]]#2 : tensor<?xi32> to tensor<2xi32>
// CHECK: %[[RC:.*]] = tensor.cast %[[ROWS]] : tensor<12x4xf32> to tensor<?x?xf32>
// CHECK: call @__moe_cpu_ep_pack(%[[RC]], %{{.*}}, %{{.*}}, %{{.*}}) : (tensor<?x?xf32>, tensor<?xi32>, index, index) -> (tensor<?x?xf32>, tensor<?x?xi32>, tensor<?xi32>)
// CHECK-DAG: func.func private @__moe_cpu_ep_pack_gather(
// CHECK-DAG: func.func private @__moe_cpu_ep_pack(
// CHECK-DAG: func.func private @__moe_cpu_ep_block(
// CHECK-DAG: func.func private @__moe_cpu_copy_row(
// CHECK-DAG: func.func private @__moe_cpu_iota(
func.func @ep_pack(%x: tensor<6x4xbf16>, %offs: tensor<5xi32>,
                   %ids: tensor<12xi32>, %rows: tensor<12x4xf32>)
    -> (tensor<8x4xbf16>, tensor<2x2xi32>, tensor<2xi32>, tensor<8x4xf32>) {
  %send, %counts, %dropped = moe.ep_pack %x, %offs gather(%ids : tensor<12xi32>)
      {capacity = 4 : i64, ep_size = 2 : i64}
      : tensor<6x4xbf16>, tensor<5xi32>
      -> tensor<8x4xbf16>, tensor<2x2xi32>, tensor<2xi32>
  %send2, %counts2, %dropped2 = moe.ep_pack %rows, %offs
      {capacity = 4 : i64, ep_size = 2 : i64,
       overflow = #moe.ep_overflow<drop>}
      : tensor<12x4xf32>, tensor<5xi32>
      -> tensor<8x4xf32>, tensor<2x2xi32>, tensor<2xi32>
  return %send, %counts, %dropped, %send2
      : tensor<8x4xbf16>, tensor<2x2xi32>, tensor<2xi32>, tensor<8x4xf32>
}

// -----

// moe.ep_unpack: without reduce the kernel gets R (here the result's static
// row count); with reduce it takes rows_of and the result is [T, d].
// CHECK-LABEL: func.func @ep_unpack
// CHECK-SAME: (%[[RET:.*]]: tensor<8x4xbf16>, %[[OFFS:.*]]: tensor<5xi32>, %[[ROWS:.*]]: tensor<6x2xi32>)
// CHECK: %[[RE:.*]] = arith.extf %[[RET]] : tensor<8x4xbf16> to tensor<8x4xf32>
// CHECK: %[[RC:.*]] = tensor.cast %[[RE]] : tensor<8x4xf32> to tensor<?x?xf32>
// CHECK: %[[OC:.*]] = tensor.cast %[[OFFS]] : tensor<5xi32> to tensor<?xi32>
// CHECK: %[[S:.*]] = arith.constant 2 : index
// CHECK: %[[C:.*]] = arith.constant 4 : index
// CHECK: %[[R:.*]] = arith.constant 12 : index
// CHECK: %[[Y:.*]] = call @__moe_cpu_ep_unpack(%[[RC]], %[[OC]], %[[R]], %[[S]], %[[C]])
// CHECK-SAME: : (tensor<?x?xf32>, tensor<?xi32>, index, index, index) -> tensor<?x?xf32>
// CHECK: %[[YC:.*]] = tensor.cast %[[Y]] : tensor<?x?xf32> to tensor<12x4xf32>
// CHECK: arith.truncf %[[YC]] : tensor<12x4xf32> to tensor<12x4xbf16>
// CHECK: %[[ROWSC:.*]] = tensor.cast %[[ROWS]] : tensor<6x2xi32> to tensor<?x?xi32>
// CHECK: %[[DX:.*]] = call @__moe_cpu_ep_unpack_reduce(%{{.*}}, %[[ROWSC]], %{{.*}}) : (tensor<?x?xf32>, tensor<?xi32>, tensor<?x?xi32>, index, index) -> tensor<?x?xf32>
// CHECK: %[[DXC:.*]] = tensor.cast %[[DX]] : tensor<?x?xf32> to tensor<6x4xf32>
// CHECK: arith.truncf %[[DXC]] : tensor<6x4xf32> to tensor<6x4xbf16>
// The reduce is the combine with unit weights.
// CHECK-DAG: func.func private @__moe_cpu_ep_unpack_reduce(
// CHECK-DAG: func.func private @__moe_cpu_ep_unpack(
// CHECK-DAG: func.func private @__moe_cpu_combine(
func.func @ep_unpack(%ret: tensor<8x4xbf16>, %offs: tensor<5xi32>,
                     %rows: tensor<6x2xi32>)
    -> (tensor<12x4xbf16>, tensor<6x4xbf16>) {
  %y = moe.ep_unpack %ret, %offs {capacity = 4 : i64, ep_size = 2 : i64}
      : tensor<8x4xbf16>, tensor<5xi32> -> tensor<12x4xbf16>
  %dx = moe.ep_unpack %ret, %offs reduce(%rows : tensor<6x2xi32>)
      {capacity = 4 : i64, ep_size = 2 : i64}
      : tensor<8x4xbf16>, tensor<5xi32> -> tensor<6x4xbf16>
  return %y, %dx : tensor<12x4xbf16>, tensor<6x4xbf16>
}

// -----

// The collectives of one rank are their local halves: moe.ep_dispatch is
// moe.ep_pack, moe.ep_combine is moe.ep_unpack. With a dynamic token count,
// ep_combine's R is offsets[E] (T * k after a dropless dispatch).
// CHECK-LABEL: func.func @ep_one_rank
// CHECK: call @__moe_cpu_dispatch(
// CHECK: call @__moe_cpu_ep_pack_gather(
// CHECK: %[[OFFS:.*]] = tensor.cast %{{.*}} : tensor<5xi32> to tensor<?xi32>
// CHECK: %[[N:.*]] = tensor.dim %[[OFFS]], %{{.*}} : tensor<?xi32>
// CHECK: %[[LAST:.*]] = arith.subi %[[N]], %{{.*}} : index
// CHECK: %[[END:.*]] = tensor.extract %[[OFFS]][%[[LAST]]] : tensor<?xi32>
// CHECK: %[[ENDI:.*]] = arith.index_cast %[[END]] : i32 to index
// CHECK: %[[R:.*]] = arith.maxsi %[[ENDI]], %{{.*}} : index
// CHECK: call @__moe_cpu_ep_unpack(%{{.*}}, %[[OFFS]], %[[R]], %{{.*}}, %{{.*}}) : (tensor<?x?xf32>, tensor<?xi32>, index, index, index)
// CHECK: call @__moe_cpu_ep_unpack_reduce(
// CHECK-NOT: moe.
func.func @ep_one_rank(%e: tensor<?x2xi32>, %x: tensor<?x4xf32>)
    -> (tensor<?x4xf32>, tensor<?x4xf32>) {
  %ids, %offs, %rows = moe.dispatch %e {num_experts = 4 : i64}
      : tensor<?x2xi32> -> tensor<?xi32>, tensor<5xi32>, tensor<?x2xi32>
  %recv, %counts, %dropped = moe.ep_dispatch %x, %offs gather(%ids : tensor<?xi32>)
      {capacity = 6 : i64, ep_size = 1 : i64}
      : tensor<?x4xf32>, tensor<5xi32> -> tensor<6x4xf32>, tensor<1x4xi32>, tensor<1xi32>
  %y = moe.ep_combine %recv, %offs {capacity = 6 : i64, ep_size = 1 : i64}
      : tensor<6x4xf32>, tensor<5xi32> -> tensor<?x4xf32>
  %dx = moe.ep_combine %recv, %offs reduce(%rows : tensor<?x2xi32>)
      {capacity = 6 : i64, ep_size = 1 : i64}
      : tensor<6x4xf32>, tensor<5xi32> -> tensor<?x4xf32>
  return %y, %dx : tensor<?x4xf32>, tensor<?x4xf32>
}

// -----

// moe.ep_queues takes C (S and El are the counts' sizes); moe.gather_rows
// takes its operands; moe.scatter_rows also takes N, its result's row count.
// CHECK-LABEL: func.func @queues_and_rows
// CHECK-SAME: (%[[COUNTS:.*]]: tensor<2x4xi32>, %[[RECV:.*]]: tensor<12x4xbf16>)
// CHECK: %[[CC:.*]] = tensor.cast %[[COUNTS]] : tensor<2x4xi32> to tensor<?x?xi32>
// CHECK: %[[C:.*]] = arith.constant 6 : index
// CHECK: %[[Q:.*]]:2 = call @__moe_cpu_ep_queues(%[[CC]], %[[C]]) : (tensor<?x?xi32>, index) -> (tensor<?xi32>, tensor<?xi32>)
// CHECK: %[[QIDS:.*]] = tensor.cast %[[Q]]#0 : tensor<?xi32> to tensor<12xi32>
// CHECK: tensor.cast %[[Q]]#1 : tensor<?xi32> to tensor<5xi32>
// CHECK: %[[RE:.*]] = arith.extf %[[RECV]] : tensor<12x4xbf16> to tensor<12x4xf32>
// CHECK: %[[RC:.*]] = tensor.cast %[[RE]] : tensor<12x4xf32> to tensor<?x?xf32>
// CHECK: %[[QC:.*]] = tensor.cast %[[QIDS]] : tensor<12xi32> to tensor<?xi32>
// CHECK: %[[G:.*]] = call @__moe_cpu_gather_rows(%[[RC]], %[[QC]]) : (tensor<?x?xf32>, tensor<?xi32>) -> tensor<?x?xf32>
// CHECK: %[[GC:.*]] = tensor.cast %[[G]] : tensor<?x?xf32> to tensor<12x4xf32>
// CHECK: %[[GB:.*]] = arith.truncf %[[GC]] : tensor<12x4xf32> to tensor<12x4xbf16>
// CHECK: %[[GE:.*]] = arith.extf %[[GB]] : tensor<12x4xbf16> to tensor<12x4xf32>
// CHECK: %[[GEC:.*]] = tensor.cast %[[GE]] : tensor<12x4xf32> to tensor<?x?xf32>
// CHECK: %[[N:.*]] = arith.constant 16 : index
// CHECK: call @__moe_cpu_scatter_rows(%[[GEC]], %{{.*}}, %[[N]]) : (tensor<?x?xf32>, tensor<?xi32>, index) -> tensor<?x?xf32>
// CHECK-DAG: func.func private @__moe_cpu_ep_queues(
// CHECK-DAG: func.func private @__moe_cpu_gather_rows(
// CHECK-DAG: func.func private @__moe_cpu_scatter_rows(
// CHECK-DAG: func.func private @__moe_cpu_in_range(
func.func @queues_and_rows(%counts: tensor<2x4xi32>, %recv: tensor<12x4xbf16>)
    -> (tensor<5xi32>, tensor<16x4xbf16>) {
  %ids, %offs = moe.ep_queues %counts {capacity = 6 : i64}
      : tensor<2x4xi32> -> tensor<12xi32>, tensor<5xi32>
  %g = moe.gather_rows %recv, %ids : tensor<12x4xbf16>, tensor<12xi32>
      -> tensor<12x4xbf16>
  %s = moe.scatter_rows %g, %ids : tensor<12x4xbf16>, tensor<12xi32>
      -> tensor<16x4xbf16>
  return %offs, %s : tensor<5xi32>, tensor<16x4xbf16>
}
