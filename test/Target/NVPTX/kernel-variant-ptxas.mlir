// The kernel convert-moe-to-gpu builds for an op's own config (here the down
// projection with `schedule = dynamic`, moe_gemm_rows_mn_bf16_dyn, beside the
// library's kernels in @moe_kernels) compiles for sm_90a with no spill, no
// local stack and no wgmma serialisation warning (check_ptxas.py fails on any).
// REQUIRES: ptxas
// RUN: moe-opt %s --moe-gpu-select-kernels --moe-plan-memory --convert-moe-to-gpu -o %t.converted.mlir
// RUN: echo 'module attributes {gpu.container_module} {' > %t.kernels.mlir
// RUN: sed -n '/^  gpu.module @moe_kernels/,/^  }$/p' %t.converted.mlir >> %t.kernels.mlir
// RUN: echo '}' >> %t.kernels.mlir
// RUN: mlir-opt %t.kernels.mlir --inline --gpu-lower-to-nvvm-pipeline="cubin-chip=sm_90a cubin-features=+ptx80 cubin-format=isa opt-level=3" -o %t.isa.mlir
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t.isa.mlir %t
// RUN: %ptxas -arch=sm_90a -v %t.moe_kernels.ptx -o %t.cubin 2>&1 | %PYTHON %S/Inputs/check_ptxas.py > %t.txt
// RUN: FileCheck %s < %t.txt

// CHECK: Compiling entry function 'moe_gemm_rows_mn_bf16_dyn' for 'sm_90a'
// CHECK-NEXT: Function properties for moe_gemm_rows_mn_bf16_dyn
// CHECK-NEXT: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads

func.func @layer(%x: tensor<37x128xbf16>, %ids: tensor<74xi32>, %offsets: tensor<5xi32>,
                 %wgu: tensor<4x128x256xbf16>, %wd: tensor<4x128x128xbf16>)
    -> (tensor<74x128xbf16>, tensor<74x256xbf16>) {
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd {activation = #moe.activation<swiglu>,
      moe_gpu.kernels = {down = #moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, schedule = dynamic>}}
      : tensor<37x128xbf16>, tensor<74xi32>, tensor<5xi32>, tensor<4x128x256xbf16>,
        tensor<4x128x128xbf16> -> tensor<74x128xbf16>, tensor<74x256xbf16>
  return %y, %h : tensor<74x128xbf16>, tensor<74x256xbf16>
}
