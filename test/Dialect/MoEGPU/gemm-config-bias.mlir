// #moe_gpu.gemm's `bias` (the expert biases): printed only when true, parsed
// back in custom, generic and bytecode form; only the up (swiglu) and the
// varlen-M store_bf16 epilogues take it.
// RUN: moe-opt %s --split-input-file --verify-diagnostics | moe-opt --split-input-file | FileCheck %s --check-prefix=ROUND
// RUN: moe-opt %s --split-input-file --verify-diagnostics --mlir-print-op-generic | moe-opt --split-input-file | FileCheck %s --check-prefix=ROUND

// ROUND-LABEL: func.func private @up_bias()
// ROUND-SAME: #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m, bias = true>
func.func private @up_bias() attributes {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m, bias = true>}

// ROUND-LABEL: func.func private @up_gelu_bias()
// ROUND-SAME: #moe_gpu.gemm<a = gather, b = w_mn, epilogue = swiglu, problem = varlen_m, activation = gelu_erf, bias = true>
func.func private @up_gelu_bias() attributes {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_mn, epilogue = swiglu, problem = varlen_m, activation = gelu_erf, bias = true>}

// ROUND-LABEL: func.func private @down_bias()
// ROUND-SAME: #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, bias = true>
func.func private @down_bias() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, bias = true>}

// ROUND-LABEL: func.func private @no_bias()
// ROUND-SAME: #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m>}
func.func private @no_bias() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, bias = false>}

// -----

// expected-error @+1 {{bias = true needs epilogue = swiglu, or store_bf16 with problem = varlen_m and no accumulate, got store_f32}}
func.func private @f32_bias() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_f32, problem = varlen_m, bias = true>}

// -----

// expected-error @+1 {{bias = true needs epilogue = swiglu, or store_bf16 with problem = varlen_m and no accumulate, got store_bf16}}
func.func private @acc_bias() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, accumulate = true, store = tma_boxes, bias = true>}
