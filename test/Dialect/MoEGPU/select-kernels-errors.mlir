// moe-gpu-select-kernels refuses configs it cannot use, with an error at the op.
// RUN: moe-opt %s --split-input-file --moe-gpu-select-kernels --verify-diagnostics
// RUN: not moe-opt %s --split-input-file --moe-gpu-select-kernels=chip=sm_80 2>&1 | FileCheck %s --check-prefix=CHIP
// RUN: not moe-opt %s --moe-gpu-select-kernels=num-sms=-1 2>&1 | FileCheck %s --check-prefix=SMS
// SMS: error: moe-gpu-select-kernels: num-sms must be 1 to 1024 (0: the chip's), got -1
// RUN: not moe-opt %s --moe-gpu-select-kernels="configs=down" 2>&1 | FileCheck %s --check-prefix=NOPARAMS
// RUN: not moe-opt %s --moe-gpu-select-kernels="configs=gate:stages=2" 2>&1 | FileCheck %s --check-prefix=BADROLE
// RUN: not moe-opt %s --moe-gpu-select-kernels="configs=ffn.down:stages=2" 2>&1 | FileCheck %s --check-prefix=BADOP
// RUN: not moe-opt %s --moe-gpu-select-kernels="configs=down:stages" 2>&1 | FileCheck %s --check-prefix=KEYVALUE
// NOPARAMS: error: kernel config 'down': no parameters (expected [OP.]ROLE:KEY=VALUE[:KEY=VALUE...], e.g. expert_ffn.down:stages=2)
// BADROLE: error: kernel config 'gate:stages=2': 'gate' is no GEMM role (logits, dx, dw, up, down, dact, dw_down, dw_gate_up)
// BADOP: error: kernel config 'ffn.down:stages=2': 'ffn' is no moe op with GEMMs (router, router_grad, expert_ffn, shared_expert, expert_combine_grad, shared_expert_grad)
// KEYVALUE: error: kernel config 'down:stages': 'stages' is not KEY=VALUE

// CHIP: error: moe-gpu-select-kernels: no GEMM kernels for chip 'sm_80' (the GPU path builds sm_90a kernels)

func.func @unknown_role(%x: tensor<37x128xbf16>, %wr: tensor<128x4xbf16>)
    -> tensor<37x2xf32> {
  // expected-error @+1 {{'moe_gpu.kernels' has a config for 'up', which moe.router does not run (its GEMMs: logits)}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>,
      moe_gpu.kernels = {up = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_f32, problem = varlen_m>}}
      : tensor<37x128xbf16>, tensor<128x4xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>
  return %w : tensor<37x2xf32>
}

// -----

func.func @not_a_dictionary(%x: tensor<37x128xbf16>, %wr: tensor<128x4xbf16>)
    -> tensor<37x2xf32> {
  // expected-error @+1 {{'moe_gpu.kernels' must be a dictionary of role = #moe_gpu.gemm<...>, got "default"}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>,
      moe_gpu.kernels = "default"}
      : tensor<37x128xbf16>, tensor<128x4xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>
  return %w : tensor<37x2xf32>
}

// -----

func.func @not_a_config(%x: tensor<37x128xbf16>, %wr: tensor<128x4xbf16>)
    -> tensor<37x2xf32> {
  // expected-error @+1 {{'moe_gpu.kernels' entry 'logits' must be a #moe_gpu.gemm<...>, got 4 : i64}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>,
      moe_gpu.kernels = {logits = 4}}
      : tensor<37x128xbf16>, tensor<128x4xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>
  return %w : tensor<37x2xf32>
}

// -----

func.func @no_gemm(%e: tensor<37x2xi32>) -> tensor<74xi32> {
  // expected-error @+1 {{'moe_gpu.kernels' on moe.dispatch, which runs no GEMM kernel}}
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 4 : i64, moe_gpu.kernels = {}}
      : tensor<37x2xi32> -> tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>
  return %ids : tensor<74xi32>
}
