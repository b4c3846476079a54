// The configs moe-gpu-select-kernels chooses for the four benchmark layers and
// the small example (T=37, d=128, n=128, E=4, k=2), forward and backward: the
// library's kernels for every shape, until the per-shape table has entries
// that won on the GPU (docs/dialect.md).
// RUN: moe-opt %moe_src_root/examples/mixtral-8x7b.mlir --moe-decompose --moe-generate-backward --moe-gpu-select-kernels | FileCheck %s --check-prefixes=CHECK --implicit-check-not=moe.shared_expert -DNAME=mixtral_8x7b
// RUN: moe-opt %moe_src_root/examples/olmoe-1b-7b.mlir --moe-decompose --moe-generate-backward --moe-gpu-select-kernels | FileCheck %s --check-prefixes=CHECK --implicit-check-not=moe.shared_expert -DNAME=olmoe_1b_7b
// RUN: moe-opt %moe_src_root/examples/qwen3-30b-a3b.mlir --moe-decompose --moe-generate-backward --moe-gpu-select-kernels | FileCheck %s --check-prefixes=CHECK --implicit-check-not=moe.shared_expert -DNAME=qwen3_30b_a3b
// RUN: moe-opt %moe_src_root/examples/deepseek-v3.mlir --moe-decompose --moe-generate-backward --moe-gpu-select-kernels | FileCheck %s --check-prefixes=CHECK,SHARED -DNAME=deepseek_v3
// RUN: moe-opt %moe_src_root/examples/small.mlir --moe-decompose --moe-generate-backward --moe-gpu-select-kernels | FileCheck %s --check-prefixes=CHECK --implicit-check-not=moe.shared_expert -DNAME=small

// CHECK: func.func @[[NAME]]_forward(
// CHECK: moe.router {{.*}}moe_gpu.kernels = {logits = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_f32, problem = varlen_m>}
// CHECK: moe.expert_ffn {{.*}}moe_gpu.kernels = {down = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m>, up = #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m>}
// SHARED: moe.shared_expert {{.*}}moe_gpu.kernels = {down = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m>, up = #moe_gpu.gemm<a = rows, b = w_mn_swiglu, epilogue = swiglu, store_a = true, problem = varlen_m>}
// CHECK: func.func @[[NAME]]_backward(
// SHARED: moe.shared_expert_grad {{.*}}moe_gpu.kernels = {dact = #moe_gpu.gemm<a = rows, b = w_k, epilogue = dswiglu, problem = varlen_m>, dw_down = #moe_gpu.gemm<a = mn, b = rows_mn, epilogue = store_bf16_w, problem = varlen_k>, dw_gate_up = #moe_gpu.gemm<a = mn, b = rows_mn, epilogue = store_bf16_w, problem = varlen_k>, dx = #moe_gpu.gemm<a = rows, b = w_k, epilogue = store_bf16, problem = varlen_m>}
// CHECK: moe.expert_combine_grad {{.*}}moe_gpu.kernels = {dact = #moe_gpu.gemm<a = gather, b = w_k, epilogue = dswiglu, with_router_weight = true, with_ds = true, problem = varlen_m>, dw_down = #moe_gpu.gemm<a = mn, b = rows_mn, gathered = b, epilogue = store_bf16_w, problem = varlen_k>, dw_gate_up = #moe_gpu.gemm<a = mn, b = rows_mn, gathered = a, epilogue = store_bf16_w, problem = varlen_k>, dx = #moe_gpu.gemm<a = rows, b = w_k, epilogue = store_bf16, problem = varlen_m>}
// CHECK: moe.router_grad {{.*}}moe_gpu.kernels = {dw = #moe_gpu.gemm<a = mn, b = rows_mn, epilogue = store_bf16_w, problem = varlen_k>, dx = #moe_gpu.gemm<a = rows, b = w_k, epilogue = store_bf16, problem = varlen_m>}
