// Expert biases on the GPU path. Forward: moe.expert_ffn with b_gate_up and
// b_down calls the host function variant whose up GEMM adds b_gate_up[e] to
// H before the activation and whose down GEMM adds b_down[e] to y (the
// kernels' `bias` config, `_bias` in their names), passing the biases after
// the weights; its H-only form (H recomputed) adds b_gate_up alike. The
// down GEMM's bias row is d wide (the tile is not SwiGLU's gate and up). The
// library's kernels stay as they are. Backward: a biased
// moe.expert_ffn_grad / moe.expert_combine_grad calls the library's `_bias`
// host function (`_bias_acc` where it accumulates), the biases after dout (dy)
// and their gradients after the weights' (the accumulate operand, before the
// biases, is no argument), which launch the column sums and the routing
// weights' <dout, b_down[e]> after the plain function's GEMMs.
// RUN: rm -rf %t && split-file %s %t
// RUN: moe-opt %t/ffn.mlir --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=FWD
// RUN: sed 's/<swiglu>/<gelu>/; s/4x64x128xbf16/4x64x64xbf16/; s/128x128xbf16/128x64xbf16/; s/4x128xbf16/4x64xbf16/' %t/ffn.mlir | moe-opt --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=GELU
// RUN: moe-opt %t/ffn-h.mlir --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=HONLY
// RUN: moe-opt %t/grad.mlir --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=GRAD
// RUN: moe-opt %t/layer.mlir --moe-decompose --canonicalize --moe-generate-backward --moe-gpu-select-kernels --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=PIPELINE
// RUN: sed '/ shared(/d' %t/layer.mlir | moe-opt --moe-decompose --canonicalize --moe-generate-backward --moe-gpu-select-kernels --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=NOSHARED
// RUN: echo 'module {}' | moe-opt '--moe-gpu-emit-library=configs=expert_ffn.up:bias=true,expert_ffn.down:bias=true' -o %t/harness.mlir
// RUN: FileCheck %s --check-prefix=HARNESS < %t/harness.mlir
// RUN: FileCheck %s --check-prefix=DOWNBIAS < %t/harness.mlir
// RUN: echo 'module {}' | not moe-opt '--moe-gpu-emit-library=configs=expert_ffn.up:bias=true' 2>&1 | FileCheck %s --check-prefix=HALFBIAS
// RUN: echo 'module {}' | not moe-opt '--moe-gpu-emit-library=configs=expert_ffn.down:bias=true' 2>&1 | FileCheck %s --check-prefix=HALFBIAS
// RUN: echo 'module {}' | not moe-opt '--moe-gpu-emit-library=configs=expert_combine_grad.dact:bias=true' 2>&1 | FileCheck %s --check-prefix=BADCONFIG
// RUN: not moe-opt %t/ffn.mlir --moe-gpu-select-kernels=configs=up:bias=false --moe-plan-memory --convert-moe-to-gpu 2>&1 | FileCheck %s --check-prefix=NOBIAS
// RUN: not moe-opt %t/ffn.mlir --moe-gpu-select-kernels=configs=down:bias=false --moe-plan-memory --convert-moe-to-gpu 2>&1 | FileCheck %s --check-prefix=NOBIAS-DOWN

// FWD: call @__moe_gpu_expert_ffn__moe_gemm_up_gather_bias__moe_gemm_rows_mn_bf16_bias(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[BGU:.*]], %[[BD:.*]], %c0_i32, %{{.*}}, %{{.*}}) : (!gpu.async.token, memref<?x?xbf16>, memref<?xi32>, memref<?xi32>, memref<?x?x?xbf16>, memref<?x?x?xbf16>, memref<?x?xbf16>, memref<?x?xbf16>, i32, memref<?x?xbf16>, memref<?x?xbf16>)
// The library's kernels, and the up and down GEMMs' bias variants with the
// bias row last.
// FWD-DAG: gpu.func @moe_gemm_up_gather(%{{[^)]*}}: memref<?xbf16>, %{{[^)]*}}: memref<?xbf16>) kernel
// FWD-DAG: gpu.func @moe_gemm_up_gather_bias({{.*}}, %arg9: memref<?xbf16>, %arg10: memref<?xbf16>, %arg11: memref<?xbf16>) kernel
// FWD-DAG: gpu.func @moe_gemm_rows_mn_bf16_bias({{.*}}, %arg10: !llvm.ptr, %arg11: memref<?xbf16>) kernel
// FWD-DAG: func.func private @__moe_gpu_expert_ffn__moe_gemm_up_gather_bias__moe_gemm_rows_mn_bf16_bias(
// FWD-DAG: gpu.launch_func {{.*}} @moe_kernels::@moe_gemm_up_gather_bias
// FWD-DAG: gpu.launch_func {{.*}} @moe_kernels::@moe_gemm_rows_mn_bf16_bias blocks

// GELU: call @__moe_gpu_expert_ffn__moe_gemm_up_gather_gelu_erf_bias__moe_gemm_rows_mn_bf16_bias(
// GELU-DAG: gpu.func @moe_gemm_up_gather_gelu_erf_bias(

// HONLY: call @__moe_gpu_expert_ffn_h__moe_gemm_up_gather_h_bias(
// HONLY-DAG: gpu.func @moe_gemm_up_gather_h_bias(

// GRAD: call @__moe_gpu_expert_ffn_grad_bias(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %c0_i32, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (!gpu.async.token, memref<?x?xbf16>, memref<?xi32>, memref<?xi32>, memref<?x?x?xbf16>, memref<?x?x?xbf16>, memref<?x?xbf16>, memref<?x?xbf16>, memref<?x?xbf16>, memref<?x?xbf16>, i32, memref<?x?xbf16>, memref<?x?x?xbf16>, memref<?x?x?xbf16>, memref<?x?xbf16>, memref<?x?xbf16>)
// GRAD-DAG: func.func private @__moe_gpu_expert_ffn_grad_bias(
// GRAD-DAG: gpu.launch_func {{.*}} @moe_kernels::@moe_segment_colsum
// GRAD-DAG: gpu.launch_func {{.*}} @moe_kernels::@moe_sum_splits_f32

// The training pipeline: the forward's bias variant, and the experts'
// gradient adding its dx into the shared expert's (accumulate) with the
// biases' gradients among its results.
// PIPELINE: call @__moe_gpu_expert_ffn__moe_gemm_up_gather_bias__moe_gemm_rows_mn_bf16_bias(
// PIPELINE: call @__moe_gpu_shared_expert_grad(
// PIPELINE: call @__moe_gpu_expert_combine_grad_bias_acc(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %c0_i32{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}) : (!gpu.async.token, memref<?x?xbf16>, memref<?xi32>, memref<?xi32>, memref<?x?xi32>, memref<?x?xf32>, memref<?x?x?xbf16>, memref<?x?x?xbf16>, memref<?x?xbf16>, memref<?x?xbf16>, memref<?x?xbf16>, memref<?x?xbf16>, i32, memref<?x?xbf16>, memref<?x?xf32>, memref<?x?x?xbf16>, memref<?x?x?xbf16>, memref<?x?xbf16>, memref<?x?xbf16>)
// PIPELINE: call @__moe_gpu_router_grad_acc(
// PIPELINE-DAG: gpu.launch_func {{.*}} @moe_kernels::@moe_bias_dweights
// NOSHARED: call @__moe_gpu_expert_combine_grad_bias(
// NOSHARED-NOT: call @__moe_gpu_expert_combine_grad_bias_acc(

// The ops harness's library: expert_ffn and expert_ffn_h take the biases
// under their own names; the shared expert keeps the library's down GEMM.
// HARNESS-DAG: func.func private @__moe_gpu_expert_ffn(%{{[^)]*}}, %{{[^)]*}}: memref<?x?x?xbf16>, %{{[^)]*}}: memref<?x?x?xbf16>, %{{[^)]*}}: memref<?x?xbf16>, %{{[^)]*}}: memref<?x?xbf16>, %{{[^)]*}}: i32,
// HARNESS-DAG: func.func private @__moe_gpu_expert_ffn_h(%{{[^)]*}}, %{{[^)]*}}: memref<?x?x?xbf16>, %{{[^)]*}}: memref<?x?x?xbf16>, %{{[^)]*}}: memref<?x?xbf16>, %{{[^)]*}}: memref<?x?xbf16>, %{{[^)]*}}: i32,
// HARNESS-DAG: func.func private @__moe_gpu_shared_expert(%{{[^)]*}}: !gpu.async.token, %{{[^)]*}}: memref<?x?xbf16>, %{{[^)]*}}: memref<?x?xbf16>, %{{[^)]*}}: memref<?x?xbf16>, %{{[^)]*}}: i32,

// The down GEMM's tile is d columns of y (not SwiGLU's gate and up halves,
// although its config keeps the default activation): its bias row starts at
// expert * d (%arg6 = N = d), not at expert * 2d as the up GEMM's.
// DOWNBIAS-LABEL: gpu.func @moe_gemm_rows_mn_bf16_bias(
// DOWNBIAS-NOT: arith.muli %arg6, %c2{{(_[0-9]+)?}} :
// DOWNBIAS: arith.muli %{{[0-9]+}}, %arg6 : index
// DOWNBIAS-NOT: arith.muli %arg6, %c2{{(_[0-9]+)?}} :
// DOWNBIAS-LABEL: gpu.func @moe_gemm_up_gather_h_bias(

// HALFBIAS: in @__moe_gpu_expert_ffn: expert_ffn's up and down GEMMs add the expert biases together (bias = true on both or on neither)
// BADCONFIG: bias = true needs epilogue = swiglu, or store_bf16 with problem = varlen_m and no accumulate, got dswiglu
// NOBIAS: 'moe_gpu.kernels' chooses @moe_gemm_up_gather for 'up', which computes another GEMM than the one moe.expert_ffn runs there (@moe_gemm_up_gather_bias)
// NOBIAS-DOWN: 'moe_gpu.kernels' chooses @moe_gemm_rows_mn_bf16 for 'down', which computes another GEMM than the one moe.expert_ffn runs there (@moe_gemm_rows_mn_bf16_bias)

//--- ffn.mlir
func.func @ffn(%x: tensor<64x64xbf16>, %ids: tensor<128xi32>, %offsets: tensor<5xi32>,
               %wgu: tensor<4x64x128xbf16>, %wd: tensor<4x64x64xbf16>,
               %bgu: tensor<4x128xbf16>, %bd: tensor<4x64xbf16>)
    -> (tensor<128x64xbf16>, tensor<128x128xbf16>) {
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd
      bias(%bgu, %bd : tensor<4x128xbf16>, tensor<4x64xbf16>)
      {activation = #moe.activation<swiglu>}
      : tensor<64x64xbf16>, tensor<128xi32>, tensor<5xi32>, tensor<4x64x128xbf16>,
        tensor<4x64x64xbf16> -> tensor<128x64xbf16>, tensor<128x128xbf16>
  return %y, %h : tensor<128x64xbf16>, tensor<128x128xbf16>
}

//--- ffn-h.mlir
func.func @ffn(%x: tensor<64x64xbf16>, %ids: tensor<128xi32>, %offsets: tensor<5xi32>,
               %wgu: tensor<4x64x128xbf16>, %wd: tensor<4x64x64xbf16>,
               %bgu: tensor<4x128xbf16>, %bd: tensor<4x64xbf16>)
    -> tensor<128x128xbf16> {
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd
      bias(%bgu, %bd : tensor<4x128xbf16>, tensor<4x64xbf16>)
      {activation = #moe.activation<swiglu>}
      : tensor<64x64xbf16>, tensor<128xi32>, tensor<5xi32>, tensor<4x64x128xbf16>,
        tensor<4x64x64xbf16> -> tensor<128x64xbf16>, tensor<128x128xbf16>
  return %h : tensor<128x128xbf16>
}

//--- grad.mlir
func.func @grad(%x: tensor<64x64xbf16>, %ids: tensor<128xi32>, %offsets: tensor<5xi32>,
                %wgu: tensor<4x64x128xbf16>, %wd: tensor<4x64x64xbf16>,
                %h: tensor<128x128xbf16>, %dy: tensor<128x64xbf16>,
                %bgu: tensor<4x128xbf16>, %bd: tensor<4x64xbf16>)
    -> (tensor<4x128xbf16>, tensor<4x64xbf16>) {
  %dx, %dwgu, %dwd, %dbgu, %dbd = moe.expert_ffn_grad %x, %ids, %offsets, %wgu,
      %wd, %h, %dy bias(%bgu, %bd : tensor<4x128xbf16>, tensor<4x64xbf16>)
      {activation = #moe.activation<swiglu>}
      : tensor<64x64xbf16>, tensor<128xi32>, tensor<5xi32>, tensor<4x64x128xbf16>,
        tensor<4x64x64xbf16>, tensor<128x128xbf16>, tensor<128x64xbf16>
      -> tensor<64x64xbf16>, tensor<4x64x128xbf16>, tensor<4x64x64xbf16>,
         tensor<4x128xbf16>, tensor<4x64xbf16>
  return %dbgu, %dbd : tensor<4x128xbf16>, tensor<4x64xbf16>
}

//--- layer.mlir
func.func @bias(%x: tensor<64x64xbf16>, %wr: tensor<64x4xbf16>,
                %wgu: tensor<4x64x128xbf16>, %wd: tensor<4x64x64xbf16>,
                %sgu: tensor<64x128xbf16>, %sd: tensor<64x64xbf16>,
                %bgu: tensor<4x128xbf16>, %bd: tensor<4x64xbf16>)
    -> (tensor<64x64xbf16>, tensor<64x4xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      shared(%sgu, %sd : tensor<64x128xbf16>, tensor<64x64xbf16>)
      expert_bias(%bgu, %bd : tensor<4x128xbf16>, tensor<4x64xbf16>)
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<64x64xbf16>, tensor<64x4xbf16>, tensor<4x64x128xbf16>,
        tensor<4x64x64xbf16> -> tensor<64x64xbf16>, tensor<64x4xf32>
  return %out, %logits : tensor<64x64xbf16>, tensor<64x4xf32>
}
