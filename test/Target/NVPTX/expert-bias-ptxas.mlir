// The expert-bias kernels convert-moe-to-gpu builds for layers with b_gate_up
// and b_down (the up GEMM adding b_gate_up before SwiGLU and before gelu,
// the H-only form, and the down GEMM adding b_down), beside the library's
// kernels in @moe_kernels, compile for sm_90a with no spill, no local stack
// and no wgmma serialisation warning (check_ptxas.py fails on any).
// REQUIRES: ptxas
// RUN: moe-opt %s --moe-plan-memory --convert-moe-to-gpu -o %t.converted.mlir
// RUN: echo 'module attributes {gpu.container_module} {' > %t.kernels.mlir
// RUN: sed -n '/^  gpu.module @moe_kernels/,/^  }$/p' %t.converted.mlir >> %t.kernels.mlir
// RUN: echo '}' >> %t.kernels.mlir
// RUN: mlir-opt %t.kernels.mlir --inline --gpu-lower-to-nvvm-pipeline="cubin-chip=sm_90a cubin-features=+ptx80 cubin-format=isa opt-level=3" -o %t.isa.mlir
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t.isa.mlir %t
// RUN: %ptxas -arch=sm_90a -v %t.moe_kernels.ptx -o %t.cubin 2>&1 | %PYTHON %S/Inputs/check_ptxas.py > %t.txt
// RUN: FileCheck %s < %t.txt

// CHECK-DAG: Function properties for moe_gemm_up_gather_bias{{$}}
// CHECK-DAG: Function properties for moe_gemm_up_gather_h_bias{{$}}
// CHECK-DAG: Function properties for moe_gemm_up_gather_gelu_erf_bias{{$}}
// CHECK-DAG: Function properties for moe_gemm_rows_mn_bf16_bias{{$}}

func.func @layer(%x: tensor<37x128xbf16>, %ids: tensor<74xi32>, %offsets: tensor<5xi32>,
                 %wgu: tensor<4x128x384xbf16>, %wd: tensor<4x192x128xbf16>,
                 %bgu: tensor<4x384xbf16>, %bd: tensor<4x128xbf16>,
                 %wgu1: tensor<4x128x192xbf16>, %bgu1: tensor<4x192xbf16>)
    -> (tensor<74x128xbf16>, tensor<74x384xbf16>, tensor<74x384xbf16>,
        tensor<74x128xbf16>) {
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd
      bias(%bgu, %bd : tensor<4x384xbf16>, tensor<4x128xbf16>)
      {activation = #moe.activation<swiglu>}
      : tensor<37x128xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<4x128x384xbf16>,
        tensor<4x192x128xbf16> -> tensor<74x128xbf16>, tensor<74x384xbf16>
  %y2, %h2 = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd
      bias(%bgu, %bd : tensor<4x384xbf16>, tensor<4x128xbf16>)
      {activation = #moe.activation<swiglu>}
      : tensor<37x128xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<4x128x384xbf16>,
        tensor<4x192x128xbf16> -> tensor<74x128xbf16>, tensor<74x384xbf16>
  %y3, %h3 = moe.expert_ffn %x, %ids, %offsets, %wgu1, %wd
      bias(%bgu1, %bd : tensor<4x192xbf16>, tensor<4x128xbf16>)
      {activation = #moe.activation<gelu>}
      : tensor<37x128xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<4x128x192xbf16>,
        tensor<4x192x128xbf16> -> tensor<74x128xbf16>, tensor<74x192xbf16>
  return %y, %h, %h2, %y3 : tensor<74x128xbf16>, tensor<74x384xbf16>, tensor<74x384xbf16>,
      tensor<74x128xbf16>
}
