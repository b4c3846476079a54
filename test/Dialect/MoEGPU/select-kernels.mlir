// moe-gpu-select-kernels gives each moe op that runs GEMMs on the GPU path a
// config per GEMM role, keeps the roles an op already has, and leaves other
// ops alone.
// RUN: moe-opt %s --split-input-file --moe-gpu-select-kernels | FileCheck %s
// `configs` sets parameters of the chosen configs, for one op's role or for
// every op with the role; a later entry wins, an op's own config over all.
// RUN: moe-opt %s --split-input-file --moe-gpu-select-kernels="configs=down:stages=2,expert_ffn.down:schedule=dynamic:group_m=4,up:group_m=8" | FileCheck %s --check-prefix=CONFIGS
// RUN: not moe-opt %s --split-input-file --moe-gpu-select-kernels="configs=expert_ffn.down:stages=9" 2>&1 | FileCheck %s --check-prefix=INVALID
// INVALID: select-kernels.mlir:[[# @LINE + 27]]:12: error: kernel config 'down' gives #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, stages = 9>: needs {{[0-9]+}} bytes of shared memory
// The module says how many SMs the kernels run on: the chip's, or num-sms.
// RUN: moe-opt %s --split-input-file --moe-gpu-select-kernels | FileCheck %s --check-prefix=SMS
// RUN: moe-opt %s --split-input-file --moe-gpu-select-kernels=num-sms=114 | FileCheck %s --check-prefix=SMS114
// SMS: module attributes {moe_gpu.num_sms = 132 : i64}
// SMS114: module attributes {moe_gpu.num_sms = 114 : i64}
// A training step (forward and backward) through the pipeline's passes.
// RUN: moe-opt %S/../../../examples/small.mlir --moe-decompose --moe-generate-backward --moe-gpu-select-kernels | FileCheck %s --check-prefix=STEP

// CONFIGS-LABEL: func.func @routed
// CONFIGS: moe.expert_ffn {{.*}}moe_gpu.kernels = {down = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, stages = 2, schedule = dynamic, group_m = 4>, up = #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m, group_m = 8>}

// CHECK-LABEL: func.func @routed
// CHECK: moe.router {{.*}}moe_gpu.kernels = {logits = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_f32, problem = varlen_m>}
// CHECK: moe.dispatch
// CHECK-NOT: moe_gpu.kernels
// CHECK: moe.expert_ffn {{.*}}moe_gpu.kernels = {down = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m>, up = #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m>}
// CHECK: moe.combine
// CHECK-NOT: moe_gpu.kernels
// CHECK: return
func.func @routed(%x: tensor<37x128xbf16>, %wr: tensor<128x4xbf16>,
                  %wgu: tensor<4x128x256xbf16>, %wd: tensor<4x128x128xbf16>)
    -> tensor<37x128xbf16> {
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x128xbf16>, tensor<128x4xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 4 : i64}
      : tensor<37x2xi32> -> tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x128xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<4x128x256xbf16>,
        tensor<4x128x128xbf16> -> tensor<74x128xbf16>, tensor<74x256xbf16>
  %out = moe.combine %y, %w, %rows : tensor<74x128xbf16>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x128xbf16>
  return %out : tensor<37x128xbf16>
}

// -----

// Nothing reads y (H recomputed in backward): the up projection writes H only.
// CHECK-LABEL: func.func @h_only
// CHECK: moe.expert_ffn {{.*}}up = #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu, problem = varlen_m>
// CHECK: moe.shared_expert {{.*}}moe_gpu.kernels = {down = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m>, up = #moe_gpu.gemm<a = rows, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m>}
func.func @h_only(%x: tensor<37x128xbf16>, %ids: tensor<74xi32>, %offsets: tensor<5xi32>,
                  %wgu: tensor<4x128x256xbf16>, %wd: tensor<4x128x128xbf16>,
                  %sgu: tensor<128x256xbf16>, %sd: tensor<128x128xbf16>)
    -> (tensor<74x256xbf16>, tensor<37x128xbf16>) {
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x128xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<4x128x256xbf16>,
        tensor<4x128x128xbf16> -> tensor<74x128xbf16>, tensor<74x256xbf16>
  %sy, %sh = moe.shared_expert %x, %sgu, %sd {activation = #moe.activation<swiglu>}
      : tensor<37x128xbf16>, tensor<128x256xbf16>, tensor<128x128xbf16> -> tensor<37x128xbf16>, tensor<37x256xbf16>
  return %h, %sy : tensor<74x256xbf16>, tensor<37x128xbf16>
}

// -----

// A role the op already holds is kept; the others are chosen.
// CHECK-LABEL: func.func @kept
// CHECK: moe.expert_ffn {{.*}}moe_gpu.kernels = {down = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, stages = 2>, up = #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m>}
func.func @kept(%x: tensor<37x128xbf16>, %ids: tensor<74xi32>, %offsets: tensor<5xi32>,
                %wgu: tensor<4x128x256xbf16>, %wd: tensor<4x128x128xbf16>)
    -> (tensor<74x128xbf16>, tensor<74x256xbf16>) {
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd {activation = #moe.activation<swiglu>,
      moe_gpu.kernels = {down = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, stages = 2>}}
      : tensor<37x128xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<4x128x256xbf16>,
        tensor<4x128x128xbf16> -> tensor<74x128xbf16>, tensor<74x256xbf16>
  return %y, %h : tensor<74x128xbf16>, tensor<74x256xbf16>
}

// STEP-LABEL: func.func @small_backward
// STEP: moe.expert_combine_grad {{.*}}moe_gpu.kernels = {dact = #moe_gpu.gemm<a = gather, b = w_k, epilogue = dswiglu, with_router_weight = true, with_ds = true, problem = varlen_m>, dw_down = #moe_gpu.gemm<a = mn, b = rows_mn, gathered = b, epilogue = store_bf16_w, problem = varlen_k>, dw_gate_up = #moe_gpu.gemm<a = mn, b = rows_mn, gathered = a, epilogue = store_bf16_w, problem = varlen_k>, dx = #moe_gpu.gemm<a = rows, b = w_k, epilogue = store_bf16, problem = varlen_m>}
// STEP: moe.router_grad {{.*}}moe_gpu.kernels = {dw = #moe_gpu.gemm<a = mn, b = rows_mn, epilogue = store_bf16_w, problem = varlen_k>, dx = #moe_gpu.gemm<a = rows, b = w_k, epilogue = store_bf16, problem = varlen_m>}
