// The bundled examples parse, verify, decompose and go through the pipeline.
// RUN: moe-opt %moe_src_root/examples/mixtral-8x7b.mlir --moe-decompose | FileCheck %s --check-prefix=MIXTRAL
// RUN: moe-opt %moe_src_root/examples/olmoe-1b-7b.mlir --moe-decompose | FileCheck %s --check-prefix=OLMOE
// RUN: moe-opt %moe_src_root/examples/qwen3-30b-a3b.mlir --moe-decompose | FileCheck %s --check-prefix=QWEN
// RUN: moe-opt %moe_src_root/examples/deepseek-v3.mlir --moe-decompose | FileCheck %s --check-prefix=DEEPSEEK
// RUN: moe-opt %moe_src_root/examples/deepseek-v3.mlir --moe-training-pipeline | FileCheck %s --check-prefix=DEEPSEEK
// RUN: moe-opt %moe_src_root/examples/deepseek-v3.mlir --moe-training-pipeline="chip=sm_90a format=isa" | FileCheck %s --check-prefix=DEEPSEEK-GPU
// RUN: moe-opt %moe_src_root/examples/mixtral-8x7b.mlir --moe-training-pipeline="chip=sm_90a format=isa" | FileCheck %s --check-prefix=MIXTRAL-GPU
// RUN: moe-opt %moe_src_root/examples/mixtral-8x7b.mlir --moe-decompose --moe-generate-backward | FileCheck %s --check-prefix=MIXTRAL-BWD
// RUN: moe-opt %moe_src_root/examples/olmoe-1b-7b.mlir --moe-decompose --moe-generate-backward | FileCheck %s --check-prefix=BWD
// RUN: moe-opt %moe_src_root/examples/qwen3-30b-a3b.mlir --moe-decompose --moe-generate-backward | FileCheck %s --check-prefix=BWD
// RUN: moe-opt %moe_src_root/examples/deepseek-v3.mlir --moe-decompose --moe-generate-backward | FileCheck %s --check-prefix=DEEPSEEK-BWD
// RUN: moe-opt %moe_src_root/examples/small.mlir --moe-decompose --moe-generate-backward | FileCheck %s --check-prefix=SMALL-BWD
// RUN: moe-opt %moe_src_root/examples/small.mlir --moe-training-pipeline="chip=sm_90a format=isa" | FileCheck %s --check-prefix=SMALL-GPU

// MIXTRAL: moe.router {{.*}}routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>
// MIXTRAL: moe.dispatch {{.*}}num_experts = 8 : i64} : tensor<16384x2xi32> -> tensor<32768xi32>, tensor<9xi32>, tensor<16384x2xi32>
// MIXTRAL: moe.expert_ffn {{.*}} -> tensor<32768x4096xbf16>, tensor<32768x28672xbf16>
// MIXTRAL: moe.combine {{.*}} -> tensor<16384x4096xbf16>

// OLMOE: moe.router {{.*}}routing = #moe.routing<scoring = softmax, top_k = 8>
// OLMOE: moe.dispatch {{.*}} -> tensor<131072xi32>, tensor<65xi32>, tensor<16384x8xi32>
// OLMOE: moe.expert_ffn {{.*}} -> tensor<131072x2048xbf16>, tensor<131072x2048xbf16>

// QWEN: moe.dispatch {{.*}} -> tensor<131072xi32>, tensor<129xi32>, tensor<16384x8xi32>
// QWEN: moe.expert_ffn {{.*}} -> tensor<131072x2048xbf16>, tensor<131072x1536xbf16>

// DEEPSEEK: moe.router {{.*}} bias({{.*}} : tensor<256xf32>) {routing = #moe.routing<scoring = sigmoid, top_k = 8, renormalize = true, num_groups = 8, topk_groups = 4, scaling_factor = 2.5{{0*}}e+00>}
// DEEPSEEK: moe.dispatch {{.*}} -> tensor<65536xi32>, tensor<257xi32>, tensor<8192x8xi32>
// DEEPSEEK: moe.expert_ffn {{.*}} -> tensor<65536x7168xbf16>, tensor<65536x4096xbf16>
// DEEPSEEK: moe.combine
// DEEPSEEK: moe.shared_expert {{.*}} -> tensor<8192x7168xbf16>, tensor<8192x4096xbf16>
// DEEPSEEK: arith.addf

// DEEPSEEK-GPU: llvm.func @deepseek_v3_forward({{.*}}moe.gpu.entry = "forward", moe.gpu.layer = {E = 256 : i64, T = 8192 : i64, activation = "swiglu", d = 7168 : i64, expert_bias = false, has_bias = true
// DEEPSEEK-GPU-SAME: shared_n = 2048 : i64
// DEEPSEEK-GPU: llvm.func @deepseek_v3_backward(
// DEEPSEEK-GPU: gpu.binary @moe_gemm_up_rows
// MIXTRAL-GPU: llvm.func @mixtral_8x7b_forward({{.*}}moe.gpu.entry = "forward", moe.gpu.layer = {E = 8 : i64, T = 16384 : i64, activation = "swiglu", d = 4096 : i64
// MIXTRAL-GPU: llvm.func @mixtral_8x7b_backward(
// MIXTRAL-GPU: gpu.binary @moe_gemm_up_gather

// The saved set of the Mixtral layer: x and the weights, the router's
// weights, experts and logits, the queues and H [32768, 28672]; never y.
// MIXTRAL-BWD-LABEL: func.func @mixtral_8x7b_forward
// MIXTRAL-BWD-SAME: moe.num_saved = 11
// MIXTRAL-BWD-LABEL: func.func @mixtral_8x7b_backward
// MIXTRAL-BWD-SAME: tensor<32768x28672xbf16> {moe.saved = "moe.expert_ffn.h"}
// MIXTRAL-BWD-SAME: moe.gradient_args = array<i64: 0, 1, 2, 3>
// MIXTRAL-BWD: moe.expert_combine_grad
// MIXTRAL-BWD: moe.router_grad

// BWD: moe.num_saved = 11
// BWD: moe.expert_combine_grad
// BWD: moe.router_grad

// The selection bias (argument 2) gets no gradient; the shared expert adds
// its h to the saved set.
// DEEPSEEK-BWD: moe.num_saved = 14
// DEEPSEEK-BWD-LABEL: func.func @deepseek_v3_backward
// DEEPSEEK-BWD-SAME: tensor<8192x4096xbf16> {moe.saved = "moe.shared_expert.h"}
// DEEPSEEK-BWD-SAME: moe.gradient_args = array<i64: 0, 1, 3, 4, 5, 6>
// DEEPSEEK-BWD: moe.shared_expert_grad
// DEEPSEEK-BWD: moe.expert_combine_grad
// DEEPSEEK-BWD: moe.router_grad

// SMALL-BWD-LABEL: func.func @small_forward
// SMALL-BWD: moe.dispatch {{.*}}num_experts = 4 : i64} : tensor<37x2xi32> -> tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>
// SMALL-BWD-LABEL: func.func @small_backward
// SMALL-BWD: moe.expert_combine_grad
// SMALL-BWD: moe.router_grad
// SMALL-GPU: llvm.func @small_forward({{.*}}moe.gpu.entry = "forward", moe.gpu.layer = {E = 4 : i64, T = 37 : i64, activation = "swiglu", d = 128 : i64
// SMALL-GPU: llvm.func @small_backward(
// SMALL-GPU: gpu.binary @moe_gemm_up_gather
