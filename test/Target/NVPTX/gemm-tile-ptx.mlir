// The NVVM pipeline turns the golden TMA + mbarrier + wgmma kernel into PTX for
// sm_90a with what must be there (docs/gpu-kernels.md §6.1).
// RUN: moe-opt %S/Inputs/gemm-tile-sm90a.mlir --moe-lower-to-nvvm-pipeline > %t.mlir
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t.mlir %t
// RUN: FileCheck %s --input-file=%t.moe_kernels.ptx
// RUN: moe-opt %S/Inputs/gemm-tile-sm90a.mlir --moe-lower-to-nvvm-pipeline="chip=sm_90a features=+ptx80 opt-level=3" | FileCheck %s --check-prefix=BINARY
// RUN: not moe-opt %S/Inputs/gemm-tile-sm90a.mlir --moe-lower-to-nvvm-pipeline="chip=sm_90" 2>&1 | FileCheck %s --check-prefix=CHIP

// CHECK: .version 8.0
// CHECK: .target sm_90a
// CHECK: .entry gemm_tile(
// CHECK: .maxntid 128, 1, 1
// CHECK: mbarrier.init.shared.b64
// CHECK-COUNT-3: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// CHECK: mbarrier.try_wait.parity
// CHECK: wgmma.fence.sync.aligned
// CHECK-COUNT-8: wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16
// CHECK: wgmma.commit_group.sync.aligned
// CHECK: wgmma.wait_group.sync.aligned 0

// BINARY: gpu.binary @moe_kernels [#gpu.object<#nvvm.target<O = 3, chip = "sm_90a", features = "+ptx80">

// CHIP: unsupported chip 'sm_90': the kernels use wgmma and setmaxnreg, which need sm_90a
