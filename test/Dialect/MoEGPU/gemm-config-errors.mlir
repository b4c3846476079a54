// RUN: moe-opt %s -split-input-file -verify-diagnostics

// The errors of #moe_gpu.gemm: one invalid config per split, each breaking
// one rule of the kernel code and keeping the others.

//===----------------------------------------------------------------------===//
// GemmConfigAttr::verify: numbers
//===----------------------------------------------------------------------===//

// expected-error @+1 {{tile 128x128x64 is not built yet: the kernels build 128x256x64 tiles only}}
func.func private @tile() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, tile = [128, 128, 64]>}

// -----

// expected-error @+1 {{stages must be at least 2 (one slot is read while the next loads), got 1}}
func.func private @stages_one() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, stages = 1>}

// -----

// expected-error @+1 {{group_m must be in [1, 2147483647] (the raster is computed in i32), got 0}}
func.func private @group_m_zero() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, group_m = 0>}

// -----

// expected-error @+1 {{dact_unroll must be 1, 2, 4 or 8, got 3}}
func.func private @dact_unroll_three() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_k, epilogue = dswiglu, problem = varlen_m, dact_unroll = 3>}

//===----------------------------------------------------------------------===//
// GemmConfigAttr::verify: operands, problem and epilogue
//===----------------------------------------------------------------------===//

// -----

// expected-error @+1 {{a = mn (an expert's rows along K) needs problem = varlen_k}}
func.func private @mn_varlen_m() attributes {moe_gpu.config = #moe_gpu.gemm<a = mn, b = w_mn, epilogue = store_bf16, problem = varlen_m>}

// -----

// expected-error @+1 {{problem = varlen_k needs a = mn (an expert's rows along K), got a = rows}}
func.func private @varlen_k_rows() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = rows_mn, epilogue = store_bf16_w, problem = varlen_k>}

// -----

// expected-error @+1 {{b = w_k comes by TMA boxes of the expert weights, which only problem = varlen_m builds}}
func.func private @tma_b_varlen_k() attributes {moe_gpu.config = #moe_gpu.gemm<a = mn, b = w_k, epilogue = store_bf16_w, problem = varlen_k>}

// -----

// expected-error @+1 {{b = rows_mn (token rows along K) needs problem = varlen_k}}
func.func private @rows_mn_varlen_m() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = rows_mn, epilogue = store_bf16, problem = varlen_m>}

// -----

// expected-error @+1 {{gathered = a needs problem = varlen_k (varlen_m gathers by a = gather)}}
func.func private @gathered_varlen_m() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, gathered = a, epilogue = store_bf16, problem = varlen_m>}

// -----

// expected-error @+1 {{epilogue = swiglu needs b = w_mn_swiglu (gate and up columns in one tile), got b = w_mn}}
func.func private @swiglu_w_mn() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = swiglu, problem = varlen_m>}

// -----

// expected-error @+1 {{b = w_mn_swiglu (gate and up columns in one tile) needs epilogue = swiglu, got store_bf16}}
func.func private @w_mn_swiglu_store() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn_swiglu, epilogue = store_bf16, problem = varlen_m>}

// -----

// expected-error @+1 {{epilogue = store_bf16_w writes an expert's [M, N] block of a weight gradient: it needs problem = varlen_k}}
func.func private @store_bf16_w_varlen_m() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16_w, problem = varlen_m>}

// -----

// expected-error @+1 {{problem = varlen_k computes a weight gradient: it needs epilogue = store_bf16_w, got store_bf16}}
func.func private @varlen_k_store_bf16() attributes {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, epilogue = store_bf16, problem = varlen_k>}

//===----------------------------------------------------------------------===//
// GemmConfigAttr::verify: epilogue flags and options
//===----------------------------------------------------------------------===//

// -----

// expected-error @+1 {{store_a (A = silu(gate) * up) needs epilogue = swiglu, got store_bf16}}
func.func private @store_a() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, store_a = true>}

// -----

// expected-error @+1 {{with_router_weight needs epilogue = dswiglu, got store_f32}}
func.func private @with_router_weight() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_f32, problem = varlen_m, with_router_weight = true>}

// -----

// expected-error @+1 {{with_ds needs epilogue = dswiglu, got swiglu}}
func.func private @with_ds() attributes {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m, with_ds = true>}

// -----

// expected-error @+1 {{dact_unroll configures the dSwiGLU epilogue: it needs epilogue = dswiglu, got store_bf16}}
func.func private @dact_unroll() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, dact_unroll = 8>}

//===----------------------------------------------------------------------===//
// GemmConfigAttr::verify: warp specialisation and setmaxnreg
//===----------------------------------------------------------------------===//

// -----

// expected-error @+1 {{warp_specialized needs a persistent epilogue (store_bf16, store_bf16_w or swiglu), got store_f32}}
func.func private @ws_one_tile() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_f32, problem = varlen_m, warp_specialized = true>}

// -----

// expected-error @+1 {{registers apply to warp-specialized kernels only}}
func.func private @registers_no_ws() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_f32, problem = varlen_m, registers = [80, 208]>}

// -----

// expected-error @+1 {{registers [70, 216]: setmaxnreg takes multiples of 8 from 24 to 256}}
func.func private @registers_multiple_of_8() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, registers = [70, 216]>}

// -----

// expected-error @+1 {{registers [176, 216]: the producer gives registers away and the consumers take them (P <= 168 <= C)}}
func.func private @registers_above_launch() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, registers = [176, 216]>}

// -----

// expected-error @+1 {{registers [64, 232]: the consumers would wait for registers the producer never frees (128 (168 - P) must be >= 256 (C - 168))}}
func.func private @registers_unbalanced() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, registers = [64, 232]>}

//===----------------------------------------------------------------------===//
// GemmConfigAttr::verify: schedule and rows by TMA
//===----------------------------------------------------------------------===//

// -----

// expected-error @+1 {{schedule = dynamic needs warp_specialized = true (the producer claims the tiles)}}
func.func private @dynamic_no_ws() attributes {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m, warp_specialized = false, schedule = dynamic>}

// -----

// expected-error @+1 {{schedule = dynamic needs problem = varlen_m}}
func.func private @dynamic_varlen_k() attributes {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, epilogue = store_bf16_w, problem = varlen_k, schedule = dynamic>}

// -----

// expected-error @+1 {{idle_skip needs schedule = dynamic}}
func.func private @idle_skip_static() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, idle_skip = true>}

// -----

// expected-error @+1 {{rows_tma needs warp_specialized = true}}
func.func private @rows_tma_no_ws() attributes {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, gathered = b, epilogue = store_bf16_w, problem = varlen_k, warp_specialized = false, rows_tma = true>}

// -----

// expected-error @+1 {{rows_tma loads the operand that a gathered varlen_k GEMM does not gather: it needs gathered = a or b}}
func.func private @rows_tma_not_gathered() attributes {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, epilogue = store_bf16_w, problem = varlen_k, rows_tma = true>}

//===----------------------------------------------------------------------===//
// GemmConfigAttr::verify: store path
//===----------------------------------------------------------------------===//

// -----

// expected-error @+1 {{store = ring stages C in the ring after the k-loop, which only the one-tile epilogues (store_f32, dswiglu) do; got epilogue = store_bf16}}
func.func private @ring_persistent() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, store = ring>}

// -----

// expected-error @+1 {{epilogue = dswiglu computes one tile a CTA and stages C in the ring: it needs store = ring, got threads}}
func.func private @threads_one_tile() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_k, epilogue = dswiglu, problem = varlen_m, store = threads>}

// -----

// expected-error @+1 {{store = bulk_rows needs warp_specialized = true (a staging buffer of its own)}}
func.func private @bulk_no_ws() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, warp_specialized = false, store = bulk_rows>}

// -----

// expected-error @+1 {{store = tma_boxes needs epilogue = store_bf16 or store_bf16_w, got swiglu}}
func.func private @tma_boxes_swiglu() attributes {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m, store = tma_boxes>}

// -----

// expected-error @+1 {{store = tma_boxes of a weight gradient without a gathered operand is not built yet}}
func.func private @tma_boxes_wgrad_rows() attributes {moe_gpu.config = #moe_gpu.gemm<a = mn, b = rows_mn, epilogue = store_bf16_w, problem = varlen_k, store = tma_boxes>}

// -----

// expected-error @+1 {{accumulate adds the tile by TMA reduce-add boxes: it needs epilogue = store_bf16 and store = tma_boxes, got epilogue = store_bf16, store = bulk_rows}}
func.func private @accumulate_bulk_rows() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_k, epilogue = store_bf16, problem = varlen_m, accumulate = true, store = bulk_rows>}

//===----------------------------------------------------------------------===//
// GemmConfigAttr::verify: shared memory
//===----------------------------------------------------------------------===//

// -----

// expected-error @+1 {{C staged in f32 (131072 bytes) does not fit the ring of 2 stages (98304 bytes)}}
func.func private @ring_too_small() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_f32, problem = varlen_m, stages = 2>}

// -----

// expected-error @+1 {{needs 267392 bytes of shared memory, over the 232448 (227 KiB) a CTA gets on sm_90a}}
func.func private @over_227_kib() attributes {moe_gpu.config = #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m, stages = 4>}

//===----------------------------------------------------------------------===//
// GemmConfigAttr::parse
//===----------------------------------------------------------------------===//

// -----

// expected-error @+1 {{#moe_gpu.gemm needs parameter 'a'}}
func.func private @missing_a() attributes {moe_gpu.config = #moe_gpu.gemm<b = w_mn, epilogue = store_bf16, problem = varlen_m>}

// -----

// expected-error @+1 {{unknown #moe_gpu.gemm parameter 'stage'}}
func.func private @unknown_key() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, stage = 3>}

// -----

// expected-error @+1 {{#moe_gpu.gemm parameter 'a' given twice}}
func.func private @key_twice() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, a = gather>}

// -----

// expected-error @+1 {{expected 'true' or 'false'}}
func.func private @bad_bool() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, rows_tma = 1>}

// -----

// expected-error @+1 {{expected one of [store_bf16, store_bf16_w, store_f32, swiglu, dswiglu]}}
func.func private @bad_enum() attributes {moe_gpu.config = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = bf16, problem = varlen_m>}
