// ptxas accepts the golden kernel for sm_90a with no spill, no local stack and
// none of the warnings that serialise wgmma (C7515, C7520, C7508). Its nvgpu
// wgmma come without the fences the library's have, so ptxas adds them (C7519,
// C7517): allowed here, a test kernel that is never timed.
// REQUIRES: ptxas
// RUN: moe-opt %S/Inputs/gemm-tile-sm90a.mlir --moe-lower-to-nvvm-pipeline > %t.mlir
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t.mlir %t
// RUN: %ptxas -arch=sm_90a -v %t.moe_kernels.ptx -o %t.cubin 2>&1 | %PYTHON %S/Inputs/check_ptxas.py --allow C7519 --allow C7517 | FileCheck %s

// CHECK: Compiling entry function 'gemm_tile' for 'sm_90a'
// CHECK: 0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
// CHECK: Used {{[0-9]+}} registers
