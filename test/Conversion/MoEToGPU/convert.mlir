// convert-moe-to-gpu on the output of moe-decompose + moe-generate-backward:
// host functions on device memrefs, results as out-parameters, one async
// token through every library call, temporaries in one arena at the offsets
// moe-plan-memory gave them (docs/gpu-path.md section 1).
// RUN: moe-opt %s --split-input-file --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu | FileCheck %s

// A DeepSeek-like layer: selection bias, grouped sigmoid routing, a shared
// expert whose output is added, no router-logits result. @ds is dropped: the
// training forward computes the same result.

// CHECK-LABEL: module attributes {gpu.container_module}
// CHECK-NOT: func.func @ds(

// The saved inputs arg0, arg1, arg3..arg6 are not returned again: the
// out-parameters are result0 and the computed saved values.
// CHECK-LABEL: func.func @ds_forward(
// CHECK-SAME: %[[X:[a-z0-9]+]]: memref<37x64xbf16>, %[[WR:[a-z0-9]+]]: memref<64x8xbf16>, %[[BIAS:[a-z0-9]+]]: memref<8xf32>,
// CHECK-SAME: %[[WGU:[a-z0-9]+]]: memref<8x64x128xbf16>, %[[WD:[a-z0-9]+]]: memref<8x64x64xbf16>, %{{.*}}: memref<64x256xbf16>, %{{.*}}: memref<128x64xbf16>,
// CHECK-SAME: %[[OUT:[a-z0-9]+]]: memref<37x64xbf16>, %[[W:[a-z0-9]+]]: memref<37x2xf32>, %[[E:[a-z0-9]+]]: memref<37x2xi32>, %[[L:[a-z0-9]+]]: memref<37x8xf32>,
// CHECK-SAME: %[[IDS:[a-z0-9]+]]: memref<74xi32>, %[[OFF:[a-z0-9]+]]: memref<9xi32>, %[[ROWS:[a-z0-9]+]]: memref<37x2xi32>, %[[H:[a-z0-9]+]]: memref<74x128xbf16>, %[[SH:[a-z0-9]+]]: memref<37x256xbf16>)
// CHECK-SAME: moe.gpu.entry = "forward"
// CHECK-SAME: moe.gpu.layer = {E = 8 : i64, T = 37 : i64, activation = "swiglu", d = 64 : i64, expert_bias = false, has_bias = true,
// CHECK-SAME: inputs = {bias = "arg2", shared_w_down = "arg6", shared_w_gate_up = "arg5", w_down = "arg4", w_gate_up = "arg3", w_router = "arg1", x = "arg0"},
// CHECK-SAME: k = 2 : i64, n = 64 : i64, num_groups = 4 : i64, renormalize = true, round_logits = false, scaling_factor = 2.500000e+00 : f64, scoring = "sigmoid", shared_n = 128 : i64, topk_groups = 2 : i64}
// CHECK-SAME: moe.gpu.layer_name = "ds"
// CHECK-SAME: moe.gpu.params = [{dtype = "bf16", name = "arg0", role = "input", shape = array<i64: 37, 64>},
// CHECK-SAME: {dtype = "bf16", name = "result0", role = "output", shape = array<i64: 37, 64>}, {dtype = "f32", name = "moe.router.weights", role = "saved", shape = array<i64: 37, 2>},
// CHECK-SAME: {dtype = "bf16", name = "moe.shared_expert.h", role = "saved", shape = array<i64: 37, 256>}]
// The one temporary is y [74x64], 9472 bytes: the add is folded (the
// library's accumulating host functions, accumulate.mlir), so neither the
// combine's output nor the shared expert's is a temporary.
// CHECK-SAME: moe.gpu.workspace_bytes = 9472 : i64
// The temporaries live in one arena at moe-plan-memory's static offsets:
// its allocation comes first and its free last.
// CHECK: %[[T0W:.*]] = gpu.wait async
// CHECK-NEXT: %[[ARENA:.*]], %[[T0:.*]] = gpu.alloc async [%[[T0W]]] () : memref<9472xi8>
// CHECK-DAG: %[[XD:.*]] = memref.cast %[[X]] : memref<37x64xbf16> to memref<?x?xbf16>
// CHECK-DAG: %[[BIASD:.*]] = memref.cast %[[BIAS]] : memref<8xf32> to memref<?xf32>
// CHECK-DAG: %[[SIGMOID:.*]] = arith.constant 1 : i32
// CHECK-DAG: %[[RENORM:.*]] = arith.constant true
// CHECK-DAG: %[[GROUPS:.*]] = arith.constant 4 : index
// CHECK-DAG: %[[TOPKG:.*]] = arith.constant 2 : index
// CHECK-DAG: %[[SCALE:.*]] = arith.constant 2.500000e+00 : f32
// CHECK-DAG: %[[NOROUND:.*]] = arith.constant false
// CHECK: %[[T1:.*]] = call @__moe_gpu_router(%[[T0]], %[[XD]], %{{.*}}, %[[BIASD]], %[[SIGMOID]], %[[RENORM]], %[[GROUPS]], %[[TOPKG]], %[[SCALE]], %[[NOROUND]], %{{.*}}, %{{.*}}, %{{.*}}) : (!gpu.async.token, memref<?x?xbf16>, memref<?x?xbf16>, memref<?xf32>, i32, i1, index, index, f32, i1, memref<?x?xf32>, memref<?x?xi32>, memref<?x?xf32>) -> !gpu.async.token
// CHECK: %[[T2:.*]] = call @__moe_gpu_dispatch(%[[T1]],
// The expert outputs y are neither returned nor saved: a temporary at 0.
// CHECK: %[[Y:.*]] = memref.view %[[ARENA]][%c0{{.*}}][] : memref<9472xi8> to memref<74x64xbf16>
// CHECK: %[[YD:.*]] = memref.cast %[[Y]] : memref<74x64xbf16> to memref<?x?xbf16>
// CHECK: %[[HD:.*]] = memref.cast %[[H]] : memref<74x128xbf16> to memref<?x?xbf16>
// CHECK: %[[T4:.*]] = call @__moe_gpu_expert_ffn(%[[T2]], {{.*}}, %[[YD]], %[[HD]])
// The shared expert writes its output into the out-parameter, and the combine
// (moved after it) adds the experts' rows there.
// CHECK: %[[SD:.*]] = memref.cast %[[OUT]] : memref<37x64xbf16> to memref<?x?xbf16>
// CHECK: %[[T5:.*]] = call @__moe_gpu_shared_expert(%[[T4]], {{.*}}, %[[SD]], %{{[a-z0-9_]+}})
// CHECK: %[[YD2:.*]] = memref.cast %[[Y]] : memref<74x64xbf16> to memref<?x?xbf16>
// CHECK: %[[OUTD:.*]] = memref.cast %[[OUT]] : memref<37x64xbf16> to memref<?x?xbf16>
// CHECK: %[[T6:.*]] = call @__moe_gpu_combine_acc(%[[T5]], %[[YD2]], %{{.*}}, %{{.*}}, %[[OUTD]])
// CHECK-NEXT: %[[T7:.*]] = gpu.dealloc async [%[[T6]]] %[[ARENA]] : memref<9472xi8>
// CHECK: gpu.wait [%[[T7]]]
// CHECK-NEXT: return{{$}}

// Backward: the saved tensors, then the cotangent of result0; the gradients
// of arg0, arg1, arg3..arg6 (the bias has none) as out-parameters.
// CHECK-LABEL: func.func @ds_backward(
// CHECK-SAME: %[[LOGITS:[a-z0-9]+]]: memref<37x8xf32>, %{{.*}}: memref<74xi32>, %{{.*}}: memref<9xi32>, %{{.*}}: memref<37x2xi32>, %{{.*}}: memref<74x128xbf16>, %{{.*}}: memref<37x256xbf16>,
// CHECK-SAME: %[[DOUT:[a-z0-9]+]]: memref<37x64xbf16>, %[[DX:[a-z0-9]+]]: memref<37x64xbf16>, %[[DWR:[a-z0-9]+]]: memref<64x8xbf16>,
// CHECK-SAME: moe.gpu.entry = "backward"
// CHECK-SAME: moe.gpu.params = [{dtype = "bf16", forward_param = "arg0", name = "arg0", role = "saved", shape = array<i64: 37, 64>},
// CHECK-SAME: {dtype = "bf16", forward_param = "arg3", name = "arg3", role = "saved", shape = array<i64: 8, 64, 128>}
// CHECK-SAME: {dtype = "bf16", name = "d_result0", of = "result0", role = "cotangent", shape = array<i64: 37, 64>},
// CHECK-SAME: {dtype = "bf16", name = "d_arg0", of = "arg0", role = "gradient", shape = array<i64: 37, 64>},
// CHECK-SAME: {dtype = "bf16", name = "d_arg3", of = "arg3", role = "gradient", shape = array<i64: 8, 64, 128>}
// The shared expert's gradient writes dx, the experts' and the router's add
// theirs to it (folded adds): only d_weights [37x2xf32] is a temporary.
// CHECK-SAME: moe.gpu.workspace_bytes = 296 : i64
// CHECK: gpu.wait async
// CHECK: call @__moe_gpu_shared_expert_grad(
// CHECK: call @__moe_gpu_expert_combine_grad_acc(
// No logits gradient: a size-0 view of the logits.
// CHECK: %[[NONE:.*]] = memref.reinterpret_cast %[[LOGITS]] to offset: [0], sizes: [0, 0], strides: [0, 1] : memref<37x8xf32> to memref<0x0xf32>
// CHECK: %[[NONED:.*]] = memref.cast %[[NONE]] : memref<0x0xf32> to memref<?x?xf32>
// CHECK: %[[DXD:.*]] = memref.cast %[[DX]] : memref<37x64xbf16> to memref<?x?xbf16>
// CHECK: call @__moe_gpu_router_grad_acc(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[NONED]], %{{.*}}, %{{.*}}, %{{.*}}, %[[DXD]], %{{.*}})
// CHECK-NOT: gpu.alloc
// CHECK-NOT: call @__moe_gpu_add(
// CHECK: gpu.wait [
// CHECK-NEXT: return

// The library: the kernels and every host function called, private.
// CHECK-DAG: gpu.module @moe_kernels
// CHECK-DAG: func.func private @__moe_gpu_router(
// CHECK-DAG: func.func private @__moe_gpu_dispatch(
// CHECK-DAG: func.func private @__moe_gpu_expert_ffn(
// CHECK-DAG: func.func private @__moe_gpu_combine_acc(
// CHECK-DAG: func.func private @__moe_gpu_shared_expert(
// CHECK-DAG: func.func private @__moe_gpu_expert_combine_grad_acc(
// CHECK-DAG: func.func private @__moe_gpu_shared_expert_grad(
// CHECK-DAG: func.func private @__moe_gpu_router_grad_acc(
func.func @ds(%arg0: tensor<37x64xbf16>, %arg1: tensor<64x8xbf16>, %arg2: tensor<8xf32>, %arg3: tensor<8x64x128xbf16>, %arg4: tensor<8x64x64xbf16>, %arg5: tensor<64x256xbf16>, %arg6: tensor<128x64xbf16>) -> tensor<37x64xbf16> {
  %weights, %experts, %logits = moe.router %arg0, %arg1 bias(%arg2 : tensor<8xf32>) {routing = #moe.routing<scoring = sigmoid, top_k = 2, renormalize = true, num_groups = 4, topk_groups = 2, scaling_factor = 2.500000e+00>} : tensor<37x64xbf16>, tensor<64x8xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x8xf32>
  %token_ids, %offsets, %rows = moe.dispatch %experts {num_experts = 8 : i64} : tensor<37x2xi32> -> tensor<74xi32>, tensor<9xi32>, tensor<37x2xi32>
  %y, %h = moe.expert_ffn %arg0, %token_ids, %offsets, %arg3, %arg4 {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<9xi32>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16> -> tensor<74x64xbf16>, tensor<74x128xbf16>
  %0 = moe.combine %y, %weights, %rows : tensor<74x64xbf16>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x64xbf16>
  %y_0, %h_1 = moe.shared_expert %arg0, %arg5, %arg6 {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16> -> tensor<37x64xbf16>, tensor<37x256xbf16>
  %1 = arith.addf %0, %y_0 : tensor<37x64xbf16>
  return %1 : tensor<37x64xbf16>
}
func.func @ds_forward(%arg0: tensor<37x64xbf16>, %arg1: tensor<64x8xbf16>, %arg2: tensor<8xf32>, %arg3: tensor<8x64x128xbf16>, %arg4: tensor<8x64x64xbf16>, %arg5: tensor<64x256xbf16>, %arg6: tensor<128x64xbf16>) -> (tensor<37x64xbf16>, tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16>, tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x8xf32>, tensor<74xi32>, tensor<9xi32>, tensor<37x2xi32>, tensor<74x128xbf16>, tensor<37x256xbf16>) attributes {moe.num_saved = 14 : i64} {
  %weights, %experts, %logits = moe.router %arg0, %arg1 bias(%arg2 : tensor<8xf32>) {routing = #moe.routing<scoring = sigmoid, top_k = 2, renormalize = true, num_groups = 4, topk_groups = 2, scaling_factor = 2.500000e+00>} : tensor<37x64xbf16>, tensor<64x8xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x8xf32>
  %token_ids, %offsets, %rows = moe.dispatch %experts {num_experts = 8 : i64} : tensor<37x2xi32> -> tensor<74xi32>, tensor<9xi32>, tensor<37x2xi32>
  %y, %h = moe.expert_ffn %arg0, %token_ids, %offsets, %arg3, %arg4 {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<9xi32>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16> -> tensor<74x64xbf16>, tensor<74x128xbf16>
  %0 = moe.combine %y, %weights, %rows : tensor<74x64xbf16>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x64xbf16>
  %y_0, %h_1 = moe.shared_expert %arg0, %arg5, %arg6 {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16> -> tensor<37x64xbf16>, tensor<37x256xbf16>
  %1 = arith.addf %0, %y_0 : tensor<37x64xbf16>
  return %1, %arg0, %arg1, %arg3, %arg4, %arg5, %arg6, %weights, %experts, %logits, %token_ids, %offsets, %rows, %h, %h_1 : tensor<37x64xbf16>, tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16>, tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x8xf32>, tensor<74xi32>, tensor<9xi32>, tensor<37x2xi32>, tensor<74x128xbf16>, tensor<37x256xbf16>
}
func.func @ds_backward(%arg0: tensor<37x64xbf16> {moe.saved = "arg0"}, %arg1: tensor<64x8xbf16> {moe.saved = "arg1"}, %arg2: tensor<8x64x128xbf16> {moe.saved = "arg3"}, %arg3: tensor<8x64x64xbf16> {moe.saved = "arg4"}, %arg4: tensor<64x256xbf16> {moe.saved = "arg5"}, %arg5: tensor<128x64xbf16> {moe.saved = "arg6"}, %arg6: tensor<37x2xf32> {moe.saved = "moe.router.weights"}, %arg7: tensor<37x2xi32> {moe.saved = "moe.router.experts"}, %arg8: tensor<37x8xf32> {moe.saved = "moe.router.logits"}, %arg9: tensor<74xi32> {moe.saved = "moe.dispatch.token_ids"}, %arg10: tensor<9xi32> {moe.saved = "moe.dispatch.offsets"}, %arg11: tensor<37x2xi32> {moe.saved = "moe.dispatch.rows"}, %arg12: tensor<74x128xbf16> {moe.saved = "moe.expert_ffn.h"}, %arg13: tensor<37x256xbf16> {moe.saved = "moe.shared_expert.h"}, %arg14: tensor<37x64xbf16>) -> (tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16>) attributes {moe.gradient_args = array<i64: 0, 1, 3, 4, 5, 6>} {
  %dx, %d_w_gate_up, %d_w_down = moe.shared_expert_grad %arg0, %arg4, %arg5, %arg13, %arg14 {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16>, tensor<37x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16>
  %dx_0, %d_weights, %d_w_gate_up_1, %d_w_down_2 = moe.expert_combine_grad %arg0, %arg9, %arg10, %arg11, %arg6, %arg2, %arg3, %arg12, %arg14 {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<9xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16>, tensor<74x128xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16>
  %0 = arith.addf %dx, %dx_0 : tensor<37x64xbf16>
  %dx_3, %d_router_weight = moe.router_grad %arg0, %arg1, %arg8, %arg7, %d_weights {routing = #moe.routing<scoring = sigmoid, top_k = 2, renormalize = true, num_groups = 4, topk_groups = 2, scaling_factor = 2.500000e+00>} : tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<37x8xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x8xbf16>
  %1 = arith.addf %0, %dx_3 : tensor<37x64xbf16>
  return %1, %d_router_weight, %d_w_gate_up_1, %d_w_down_2, %d_w_gate_up, %d_w_down : tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<8x64x128xbf16>, tensor<8x64x64xbf16>, tensor<64x256xbf16>, tensor<128x64xbf16>
}

// -----

// An OLMoE-like layer that returns its router logits, which backward also
// saves: the logits are written into result1 and copied into the saved
// out-parameter. Without a selection bias the router gets a size-0 view; the
// logits cotangent reaches moe.router_grad. Without @layer (already dropped
// here) nothing else changes.

// CHECK-LABEL: func.func @layer_forward(
// CHECK-SAME: %[[RESULT1:[a-z0-9]+]]: memref<37x4xf32>, %[[W:[a-z0-9]+]]: memref<37x2xf32>, %{{.*}}: memref<37x2xi32>, %[[SAVEDL:[a-z0-9]+]]: memref<37x4xf32>,
// CHECK-SAME: moe.gpu.layer = {E = 4 : i64, T = 37 : i64, activation = "swiglu", d = 64 : i64, expert_bias = false, has_bias = false, inputs = {w_down = "arg3", w_gate_up = "arg2", w_router = "arg1", x = "arg0"}, k = 2 : i64, n = 128 : i64, num_groups = 1 : i64, renormalize = true, round_logits = true, scaling_factor = 1.000000e+00 : f64, scoring = "softmax", shared_n = 0 : i64, topk_groups = 1 : i64}
// CHECK-SAME: {dtype = "f32", name = "result1", role = "output", shape = array<i64: 37, 4>}, {dtype = "f32", name = "moe.router.weights", role = "saved"
// CHECK: gpu.wait async
// CHECK: %[[ARENA:.*]], %[[T0:.*]] = gpu.alloc async
// CHECK: %[[NOBIAS:.*]] = memref.reinterpret_cast %[[W]] to offset: [0], sizes: [0], strides: [1] : memref<37x2xf32> to memref<0xf32>
// CHECK: %[[NOBIASD:.*]] = memref.cast %[[NOBIAS]] : memref<0xf32> to memref<?xf32>
// CHECK: %[[SOFTMAX:.*]] = arith.constant 0 : i32
// CHECK: %[[LD:.*]] = memref.cast %[[RESULT1]] : memref<37x4xf32> to memref<?x?xf32>
// round_logits = true reaches the router (the i1 after the scaling factor).
// CHECK: call @__moe_gpu_router(%[[T0]], %{{.*}}, %{{.*}}, %[[NOBIASD]], %[[SOFTMAX]], {{.*}}, %cst{{[_0-9]*}}, %true{{[_0-9]*}}, %{{.*}}, %{{.*}}, %[[LD]])
// CHECK: %[[TC:.*]] = call @__moe_gpu_combine(
// CHECK: %[[TM:.*]] = gpu.memcpy async [%[[TC]]] %[[SAVEDL]], %[[RESULT1]] : memref<37x4xf32>, memref<37x4xf32>
// CHECK: %[[TF:.*]] = gpu.dealloc async [%[[TM]]] %[[ARENA]]
// CHECK: gpu.wait [%[[TF]]]

// CHECK-LABEL: func.func @layer_backward(
// CHECK-SAME: %[[DOUT:[a-z0-9]+]]: memref<37x64xbf16>, %[[DLOGITS:[a-z0-9]+]]: memref<37x4xf32>, %{{.*}}: memref<37x64xbf16>, %{{.*}}: memref<64x4xbf16>,
// CHECK-SAME: {dtype = "bf16", name = "d_result0", of = "result0", role = "cotangent", shape = array<i64: 37, 64>}, {dtype = "f32", name = "d_result1", of = "result1", role = "cotangent", shape = array<i64: 37, 4>}
// CHECK: %[[DLD:.*]] = memref.cast %[[DLOGITS]] : memref<37x4xf32> to memref<?x?xf32>
// CHECK: call @__moe_gpu_router_grad_acc(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[DLD]],

func.func @layer_forward(%arg0: tensor<37x64xbf16>, %arg1: tensor<64x4xbf16>, %arg2: tensor<4x64x256xbf16>, %arg3: tensor<4x128x64xbf16>) -> (tensor<37x64xbf16>, tensor<37x4xf32>, tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<74x256xbf16>) attributes {moe.num_saved = 11 : i64} {
  %weights, %experts, %logits = moe.router %arg0, %arg1 {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true, round_logits = true>} : tensor<37x64xbf16>, tensor<64x4xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>
  %token_ids, %offsets, %rows = moe.dispatch %experts {num_experts = 4 : i64} : tensor<37x2xi32> -> tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>
  %y, %h = moe.expert_ffn %arg0, %token_ids, %offsets, %arg2, %arg3 {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16> -> tensor<74x64xbf16>, tensor<74x256xbf16>
  %0 = moe.combine %y, %weights, %rows : tensor<74x64xbf16>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x64xbf16>
  return %0, %logits, %arg0, %arg1, %arg2, %arg3, %weights, %experts, %logits, %token_ids, %offsets, %rows, %h : tensor<37x64xbf16>, tensor<37x4xf32>, tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<74x256xbf16>
}
func.func @layer_backward(%arg0: tensor<37x64xbf16> {moe.saved = "arg0"}, %arg1: tensor<64x4xbf16> {moe.saved = "arg1"}, %arg2: tensor<4x64x256xbf16> {moe.saved = "arg2"}, %arg3: tensor<4x128x64xbf16> {moe.saved = "arg3"}, %arg4: tensor<37x2xf32> {moe.saved = "moe.router.weights"}, %arg5: tensor<37x2xi32> {moe.saved = "moe.router.experts"}, %arg6: tensor<37x4xf32> {moe.saved = "moe.router.logits"}, %arg7: tensor<74xi32> {moe.saved = "moe.dispatch.token_ids"}, %arg8: tensor<5xi32> {moe.saved = "moe.dispatch.offsets"}, %arg9: tensor<37x2xi32> {moe.saved = "moe.dispatch.rows"}, %arg10: tensor<74x256xbf16> {moe.saved = "moe.expert_ffn.h"}, %arg11: tensor<37x64xbf16>, %arg12: tensor<37x4xf32>) -> (tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>) attributes {moe.gradient_args = array<i64: 0, 1, 2, 3>} {
  %dx, %d_weights, %d_w_gate_up, %d_w_down = moe.expert_combine_grad %arg0, %arg7, %arg8, %arg9, %arg4, %arg2, %arg3, %arg10, %arg11 {activation = #moe.activation<swiglu>} : tensor<37x64xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>, tensor<74x256xbf16>, tensor<37x64xbf16> -> tensor<37x64xbf16>, tensor<37x2xf32>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
  %dx_0, %d_router_weight = moe.router_grad %arg0, %arg1, %arg6, %arg5, %d_weights logits_grad(%arg12 : tensor<37x4xf32>) {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>} : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  %0 = arith.addf %dx, %dx_0 : tensor<37x64xbf16>
  return %0, %d_router_weight, %d_w_gate_up, %d_w_down : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<4x64x256xbf16>, tensor<4x128x64xbf16>
}

// -----

// A function without a training pair is converted as it is. A returned
// argument, and a value returned twice, are copied into their
// out-parameters.

// CHECK-LABEL: func.func @plain(
// CHECK-SAME: %[[A:[a-z0-9]+]]: memref<4x64xbf16>, %[[B:[a-z0-9]+]]: memref<4x64xbf16>, %[[R0:[a-z0-9]+]]: memref<4x64xbf16>, %[[R1:[a-z0-9]+]]: memref<4x64xbf16>, %[[R2:[a-z0-9]+]]: memref<4x64xbf16>)
// CHECK-SAME: moe.gpu.entry = "plain"
// CHECK-SAME: moe.gpu.workspace_bytes = 0 : i64
// CHECK: %[[T0:.*]] = gpu.wait async
// CHECK: %[[T1:.*]] = call @__moe_gpu_add(%[[T0]],
// CHECK: %[[T2:.*]] = gpu.memcpy async [%[[T1]]] %[[R1]], %[[R0]]
// CHECK: %[[T3:.*]] = gpu.memcpy async [%[[T2]]] %[[R2]], %[[A]]
// CHECK: gpu.wait [%[[T3]]]
// CHECK-NOT: gpu.alloc
func.func @plain(%a: tensor<4x64xbf16>, %b: tensor<4x64xbf16>)
    -> (tensor<4x64xbf16>, tensor<4x64xbf16>, tensor<4x64xbf16>) {
  %0 = arith.addf %a, %b : tensor<4x64xbf16>
  return %0, %0, %a : tensor<4x64xbf16>, tensor<4x64xbf16>, tensor<4x64xbf16>
}

// -----

// A module without moe ops gets no library.

// CHECK-LABEL: func.func @nothing(
// CHECK-NOT: gpu.module
// CHECK-NOT: __moe_gpu_
func.func @nothing(%a: i32) -> i32 {
  return %a : i32
}
