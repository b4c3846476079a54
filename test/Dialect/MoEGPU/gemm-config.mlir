// #moe_gpu.gemm printed and parsed back in custom, generic and bytecode form:
// first the library's default configs (the names are what kernelName() gives),
// then configs that differ from them.
// RUN: moe-opt %s | moe-opt | FileCheck %s
// RUN: moe-opt %s --mlir-print-op-generic | moe-opt | FileCheck %s
// RUN: moe-opt %s --emit-bytecode | moe-opt | FileCheck %s

// CHECK-LABEL: func.func private @moe_gemm_up_gather()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m>}
func.func private @moe_gemm_up_gather() attributes {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m>}

// CHECK-LABEL: func.func private @moe_gemm_up_rows()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m>}
func.func private @moe_gemm_up_rows() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m>}

// CHECK-LABEL: func.func private @moe_gemm_up_gather_h()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu, problem = varlen_m>}
func.func private @moe_gemm_up_gather_h() attributes {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu, problem = varlen_m>}

// CHECK-LABEL: func.func private @moe_gemm_up_rows_h()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn_swiglu, epilogue = swiglu, problem = varlen_m>}
func.func private @moe_gemm_up_rows_h() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn_swiglu, epilogue = swiglu, problem = varlen_m>}

// CHECK-LABEL: func.func private @moe_gemm_rows_mn_bf16()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m>}
func.func private @moe_gemm_rows_mn_bf16() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m>}

// CHECK-LABEL: func.func private @moe_gemm_rows_mn_f32()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_f32, problem = varlen_m>}
func.func private @moe_gemm_rows_mn_f32() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_f32, problem = varlen_m>}

// CHECK-LABEL: func.func private @moe_gemm_rows_k_bf16()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_k, epilogue = store_bf16, problem = varlen_m>}
func.func private @moe_gemm_rows_k_bf16() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_k, epilogue = store_bf16, problem = varlen_m>}

// CHECK-LABEL: func.func private @moe_gemm_dact_gather()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_k, epilogue = dswiglu, with_router_weight = true, with_ds = true, problem = varlen_m>}
func.func private @moe_gemm_dact_gather() attributes {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_k, epilogue = dswiglu, with_router_weight = true, with_ds = true, problem = varlen_m>}

// CHECK-LABEL: func.func private @moe_gemm_dact_rows()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_k, epilogue = dswiglu, problem = varlen_m>}
func.func private @moe_gemm_dact_rows() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_k, epilogue = dswiglu, problem = varlen_m>}

// CHECK-LABEL: func.func private @moe_gemm_wgrad_gather()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, gathered = b, epilogue = store_bf16_w, problem = varlen_k>}
func.func private @moe_gemm_wgrad_gather() attributes {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, gathered = b, epilogue = store_bf16_w, problem = varlen_k>}

// CHECK-LABEL: func.func private @moe_gemm_wgrad_gather_a()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, gathered = a, epilogue = store_bf16_w, problem = varlen_k>}
func.func private @moe_gemm_wgrad_gather_a() attributes {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, gathered = a, epilogue = store_bf16_w, problem = varlen_k>}

// CHECK-LABEL: func.func private @moe_gemm_wgrad_rows()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, epilogue = store_bf16_w, problem = varlen_k>}
func.func private @moe_gemm_wgrad_rows() attributes {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, epilogue = store_bf16_w, problem = varlen_k>}

// CHECK-LABEL: func.func private @moe_gemm_rows_k_bf16_acc()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_k, epilogue = store_bf16, accumulate = true, problem = varlen_m>}
func.func private @moe_gemm_rows_k_bf16_acc() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_k, epilogue = store_bf16, accumulate = true, problem = varlen_m>}

// Parameters given at their defaults, in any order, are left out.
// CHECK-LABEL: func.func private @explicit_defaults()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m>}
func.func private @explicit_defaults() attributes {moe_gpu.config = #moe_gpu.gemm<
    problem = varlen_m, epilogue = swiglu, b = w_mn_swiglu, a = gather,
    store_a = true, gathered = none, with_router_weight = false,
    with_ds = false, accumulate = false, tile = [128, 256, 64], stages = 3,
    warp_specialized = true, registers = [72, 216], schedule = static,
    idle_skip = false, group_m = 16, rows_tma = false, store = threads,
    dact_unroll = 4>}

// The defaults of the one-tile kernels: 4 stages, no warp specialisation, C
// through the ring.
// CHECK-LABEL: func.func private @one_tile_defaults()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_f32, problem = varlen_m>}
func.func private @one_tile_defaults() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_f32, problem = varlen_m, stages = 4, warp_specialized = false, store = ring>}

// The defaults of the weight gradients: rows by TMA and TMA box stores with a
// gathered operand, row copies without.
// CHECK-LABEL: func.func private @wgrad_defaults()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, gathered = b, epilogue = store_bf16_w, problem = varlen_k>}
// CHECK-LABEL: func.func private @wgrad_rows_defaults()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, epilogue = store_bf16_w, problem = varlen_k>}
func.func private @wgrad_defaults() attributes {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, gathered = b, epilogue = store_bf16_w, problem = varlen_k, rows_tma = true, store = tma_boxes>}
func.func private @wgrad_rows_defaults() attributes {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, epilogue = store_bf16_w, problem = varlen_k, rows_tma = false, store = bulk_rows>}

// warp_specialized = false: the store and rows_tma defaults follow it.
// CHECK-LABEL: func.func private @moe_gemm_wgrad_gather_nows()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, gathered = b, epilogue = store_bf16_w, problem = varlen_k, warp_specialized = false>}
func.func private @moe_gemm_wgrad_gather_nows() attributes {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, gathered = b, epilogue = store_bf16_w, problem = varlen_k, warp_specialized = false, store = threads>}

// Stages, registers, group_m and the dynamic schedule (idle_skip follows the
// schedule).
// CHECK-LABEL: func.func private @moe_gemm_rows_k_bf16_s2_regs80x208_dyn_g8()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_k, epilogue = store_bf16, problem = varlen_m, stages = 2, registers = [80, 208], schedule = dynamic, group_m = 8>}
func.func private @moe_gemm_rows_k_bf16_s2_regs80x208_dyn_g8() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_k, epilogue = store_bf16, problem = varlen_m, stages = 2, registers = [80, 208], schedule = dynamic, idle_skip = true, group_m = 8>}

// The dynamic schedule without the idle skip.
// CHECK-LABEL: func.func private @moe_gemm_up_gather_dyn_noskip()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m, schedule = dynamic, idle_skip = false>}
func.func private @moe_gemm_up_gather_dyn_noskip() attributes {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m, schedule = dynamic, idle_skip = false>}

// Rows by cp.async, C by bulk row copies, C by thread stores.
// CHECK-LABEL: func.func private @moe_gemm_wgrad_gather_a_norowstma_storebulk()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, gathered = a, epilogue = store_bf16_w, problem = varlen_k, rows_tma = false, store = bulk_rows>}
// CHECK-LABEL: func.func private @moe_gemm_rows_mn_bf16_storethreads()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, store = threads>}
func.func private @moe_gemm_wgrad_gather_a_norowstma_storebulk() attributes {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, gathered = a, epilogue = store_bf16_w, problem = varlen_k, rows_tma = false, store = bulk_rows>}
func.func private @moe_gemm_rows_mn_bf16_storethreads() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, store = threads>}

// dact_unroll = 8, and kernels the library does not use: a gathered down
// projection, a dSwiGLU without dS.
// CHECK-LABEL: func.func private @moe_gemm_dact_gather_nods_s3_u8()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_k, epilogue = dswiglu, with_router_weight = true, problem = varlen_m, stages = 3, dact_unroll = 8>}
// CHECK-LABEL: func.func private @moe_gemm_gather_mn_bf16()
// CHECK-SAME: {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_mn, epilogue = store_bf16, problem = varlen_m>}
func.func private @moe_gemm_dact_gather_nods_s3_u8() attributes {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_k, epilogue = dswiglu, with_router_weight = true, problem = varlen_m, stages = 3, dact_unroll = 8>}
func.func private @moe_gemm_gather_mn_bf16() attributes {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_mn, epilogue = store_bf16, problem = varlen_m>}
