// The generator's GEMM variants that docs/gpu-kernels.md times beside the default
// (MOE_GEMM_WS=gather: only the kernels with a gathered operand warp-specialised, here
// with MOE_GEMM_BULK_STORE=0, C out by 16-byte stores from every consumer thread;
// MOE_GEMM_WS=none: none of them; MOE_GEMM_ROWS_TMA=1, the default: the weight gradients'
// row-wise operand by TMA, and =0, by cp.async; MOE_GEMM_BULK_STORE=1, the default: C
// out by bulk copies, one a row where MOE_GEMM_TMA_STORE=0, the experts' weight gradients
// by four TMA box stores where it is 1, the default; the last two in one library, which
// also has the router's dX GEMM that adds into dx and the gather-sum that starts from what
// out holds; MOE_GEMM_DACT_UNROLL=8 and 1 with the first two: the dSwiGLU epilogue's rows
// loaded 8 and 1 at a time; MOE_GEMM_DYNAMIC=all) still compile for sm_90a with no spill,
// no local stack and no wgmma serialisation warning (check_ptxas.py fails on any).
// REQUIRES: ptxas
// RUN: env MOE_GEMM_WS=gather MOE_GEMM_BULK_STORE=0 MOE_GEMM_DACT_UNROLL=8 %PYTHON %moe_src_root/lib/Conversion/MoEToGPU/gen_gpu_library.py -o %t.gather.mlir
// RUN: %PYTHON %moe_src_root/test/GPU/gen_ops_harness.py %t.gather.mlir > %t.gather.ops.mlir
// RUN: mlir-opt %t.gather.ops.mlir --inline --gpu-lower-to-nvvm-pipeline="cubin-chip=sm_90a cubin-features=+ptx80 cubin-format=isa opt-level=3" -o %t.gather.isa.mlir
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t.gather.isa.mlir %t.gather
// RUN: %ptxas -arch=sm_90a -v %t.gather.moe_kernels.ptx -o %t.gather.cubin 2>&1 | %PYTHON %S/Inputs/check_ptxas.py > %t.gather.txt
// RUN: FileCheck %s --check-prefix=GATHER < %t.gather.txt
// RUN: env MOE_GEMM_WS=none MOE_GEMM_DACT_UNROLL=1 %PYTHON %moe_src_root/lib/Conversion/MoEToGPU/gen_gpu_library.py -o %t.none.mlir
// RUN: %PYTHON %moe_src_root/test/GPU/gen_ops_harness.py %t.none.mlir > %t.none.ops.mlir
// RUN: mlir-opt %t.none.ops.mlir --inline --gpu-lower-to-nvvm-pipeline="cubin-chip=sm_90a cubin-features=+ptx80 cubin-format=isa opt-level=3" -o %t.none.isa.mlir
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t.none.isa.mlir %t.none
// RUN: %ptxas -arch=sm_90a -v %t.none.moe_kernels.ptx -o %t.none.cubin 2>&1 | %PYTHON %S/Inputs/check_ptxas.py > %t.none.txt
// RUN: FileCheck %s --check-prefix=NONE < %t.none.txt
// RUN: not grep "Used 168 registers" %t.none.txt
// RUN: env MOE_GEMM_ROWS_TMA=1 %PYTHON %moe_src_root/lib/Conversion/MoEToGPU/gen_gpu_library.py -o %t.rows.mlir
// RUN: %PYTHON %moe_src_root/test/GPU/gen_ops_harness.py %t.rows.mlir > %t.rows.ops.mlir
// RUN: mlir-opt %t.rows.ops.mlir --inline --gpu-lower-to-nvvm-pipeline="cubin-chip=sm_90a cubin-features=+ptx80 cubin-format=isa opt-level=3" -o %t.rows.isa.mlir
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t.rows.isa.mlir %t.rows
// RUN: %ptxas -arch=sm_90a -v %t.rows.moe_kernels.ptx -o %t.rows.cubin 2>&1 | %PYTHON %S/Inputs/check_ptxas.py > %t.rows.txt
// RUN: FileCheck %s --check-prefix=ROWS --input-file=%t.rows.moe_kernels.ptx
// RUN: FileCheck %s --check-prefix=TSTORE --input-file=%t.rows.moe_kernels.ptx
// RUN: FileCheck %s --check-prefix=ACC --input-file=%t.rows.moe_kernels.ptx
// RUN: env MOE_GEMM_ROWS_TMA=0 MOE_GEMM_BULK_STORE=1 MOE_GEMM_TMA_STORE=0 %PYTHON %moe_src_root/lib/Conversion/MoEToGPU/gen_gpu_library.py -o %t.bulk.mlir
// RUN: %PYTHON %moe_src_root/test/GPU/gen_ops_harness.py %t.bulk.mlir > %t.bulk.ops.mlir
// RUN: mlir-opt %t.bulk.ops.mlir --inline --gpu-lower-to-nvvm-pipeline="cubin-chip=sm_90a cubin-features=+ptx80 cubin-format=isa opt-level=3" -o %t.bulk.isa.mlir
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t.bulk.isa.mlir %t.bulk
// RUN: %ptxas -arch=sm_90a -v %t.bulk.moe_kernels.ptx -o %t.bulk.cubin 2>&1 | %PYTHON %S/Inputs/check_ptxas.py > %t.bulk.txt
// RUN: FileCheck %s --check-prefix=BULK --input-file=%t.bulk.moe_kernels.ptx
// RUN: env MOE_GEMM_DYNAMIC=all %PYTHON %moe_src_root/lib/Conversion/MoEToGPU/gen_gpu_library.py -o %t.dyn.mlir
// RUN: %PYTHON %moe_src_root/test/GPU/gen_ops_harness.py %t.dyn.mlir > %t.dyn.ops.mlir
// RUN: mlir-opt %t.dyn.ops.mlir --inline --gpu-lower-to-nvvm-pipeline="cubin-chip=sm_90a cubin-features=+ptx80 cubin-format=isa opt-level=3" -o %t.dyn.isa.mlir
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t.dyn.isa.mlir %t.dyn
// RUN: %ptxas -arch=sm_90a -v %t.dyn.moe_kernels.ptx -o %t.dyn.cubin 2>&1 | %PYTHON %S/Inputs/check_ptxas.py > %t.dyn.txt
// RUN: FileCheck %s --check-prefix=DYN --input-file=%t.dyn.moe_kernels.ptx

// The gathered kernels launch with 168 registers a thread (384 threads) and move them
// with setmaxnreg; the row-wise ones keep the 256-thread kernel.
// GATHER-DAG: Compiling entry function 'moe_gemm_up_gather' for 'sm_90a'
// GATHER-DAG: Compiling entry function 'moe_gemm_wgrad_gather_a' for 'sm_90a'
// GATHER-DAG: Compiling entry function 'moe_gemm_rows_k_bf16' for 'sm_90a'
// GATHER-DAG: Used 168 registers
// GATHER-DAG: Compiling entry function 'moe_gemm_dact_gather' for 'sm_90a'
// NONE-DAG: Compiling entry function 'moe_gemm_dact_gather' for 'sm_90a'
// NONE-DAG: Compiling entry function 'moe_gemm_up_gather' for 'sm_90a'
// NONE-DAG: Compiling entry function 'moe_gemm_wgrad_gather_a' for 'sm_90a'

// The row-wise operand of the two gathered weight gradients comes as 2D boxes (w*A: two
// of 64 columns, dH: four), armed by the TMA thread's expect_tx. Their maps are not
// prefetched: without rows the host passes a null map.
// ROWS-LABEL: .entry moe_gemm_wgrad_gather(
// ROWS-NOT: prefetch.tensormap
// ROWS: mbarrier.arrive.expect_tx.shared.b64
// ROWS-COUNT-2: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// C leaves as four 128x64 boxes by TMA stores of a [E][M][N] map, after stmatrix and the
// generic-proxy fence, and by no row-wise bulk copy.
// ROWS: stmatrix.sync.aligned.m8n8.x4.shared.b16
// ROWS: fence.proxy.async.shared::cta
// ROWS-COUNT-4: cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group
// ROWS-NOT: cp.async.bulk.global.shared::cta
// ROWS-LABEL: .entry moe_gemm_wgrad_gather_a(
// ROWS-NOT: prefetch.tensormap
// ROWS: mbarrier.arrive.expect_tx.shared.b64
// ROWS-COUNT-4: cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// ROWS: stmatrix.sync.aligned.m8n8.x4.shared.b16
// ROWS-COUNT-4: cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group
// ROWS-NOT: cp.async.bulk.global.shared::cta
// ROWS-LABEL: .entry moe_gemm_wgrad_rows(
// ROWS-NOT: cp.async.bulk.tensor
// ROWS: .entry

// The varlen-M GEMMs' row-wise C (down, dX): a whole tile as four boxes of a 2D map, an
// expert's partial last tile row by row (the row-wise fp32 C of the router stays as it was).
// TSTORE-LABEL: .entry moe_gemm_rows_mn_bf16(
// TSTORE-DAG: cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group
// TSTORE-DAG: cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group
// TSTORE-DAG: cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group
// TSTORE-DAG: cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group
// TSTORE-DAG: cp.async.bulk.global.shared::cta.bulk_group
// TSTORE-LABEL: .entry moe_gemm_rows_mn_f32(
// TSTORE-NOT: cp.async.bulk.tensor.2d.global.shared::cta
// TSTORE-LABEL: .entry moe_gemm_rows_k_bf16(
// TSTORE-DAG: cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group
// TSTORE-DAG: cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group
// TSTORE-DAG: cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group
// TSTORE-DAG: cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group
// TSTORE-DAG: cp.async.bulk.global.shared::cta.bulk_group
// TSTORE-LABEL: .entry moe_gemm_dact_gather(

// The router's accumulating dX GEMM adds every tile, the partial last one too, into dx by
// four TMA reduce-add boxes, and stores nothing otherwise.
// ACC-LABEL: .entry moe_gemm_rows_k_bf16_acc(
// ACC-NOT: cp.async.bulk.global.shared::cta
// ACC-NOT: cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group
// ACC-COUNT-4: cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group
// ACC-NOT: cp.async.bulk.global.shared::cta
// ACC-NOT: cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group
// ACC: .entry
// The accumulating gather-sum reads and writes out 16 bytes at a time.
// ACC-LABEL: .entry moe_gather_sum_acc(
// ACC-DAG: ld.global.v4.b32
// ACC-DAG: st.global.v4.b32
// ACC: .entry

// Without rows by TMA the weight gradients take both operands by cp.async; with bulk
// stores C leaves by stmatrix and one bulk copy a row, after the generic-proxy fence.
// BULK-LABEL: .entry moe_gemm_wgrad_gather(
// BULK-NOT: cp.async.bulk.tensor
// BULK: stmatrix.sync.aligned.m8n8.x4.shared.b16
// BULK: fence.proxy.async.shared::cta
// BULK: cp.async.bulk.global.shared::cta.bulk_group
// BULK: cp.async.bulk.commit_group
// BULK: cp.async.bulk.wait_group 0
// BULK-LABEL: .entry moe_gemm_wgrad_gather_a(
// BULK-NOT: cp.async.bulk.tensor
// BULK: cp.async.bulk.global.shared::cta.bulk_group

// MOE_GEMM_DYNAMIC=all (with the idle-warpgroup skip): the varlen-M GEMMs claim tiles from
// the counter, pass them on through barrier 2 of the producer warpgroup and read them
// through redux.sync; the weight gradients keep the static schedule.
// DYN-LABEL: .entry moe_gemm_up_gather(
// DYN-DAG: atom.global.add.u32
// DYN-DAG: bar.sync 2, 128;
// DYN-DAG: redux.sync.min.u32
// DYN-DAG: vote.sync.all.pred
// DYN-LABEL: .entry moe_gemm_rows_mn_bf16(
// DYN-DAG: atom.global.add.u32
// DYN-DAG: redux.sync.min.u32
// DYN-LABEL: .entry moe_gemm_rows_k_bf16(
// DYN-DAG: atom.global.add.u32
// DYN-DAG: redux.sync.min.u32
// The dSwiGLU GEMM (static tiles) loads its first rows of H, stages dA by 16 stmatrix.x4 a
// thread and reads it back 16 bytes a row, loads the next rows, and sums dS and forms
// d silu / dg with fused multiply-adds.
// DYN-LABEL: .entry moe_gemm_dact_gather(
// DYN-NOT: atom.global.add
// DYN-COUNT-8: ld.global.v4.b32
// DYN: bar.sync
// DYN-COUNT-16: stmatrix.sync.aligned.m8n8.x4.shared.b16
// DYN: bar.sync
// DYN-COUNT-8: ld.global.v4.b32
// DYN: ld.shared.v4.b32
// DYN: fma.rn.f32
// DYN-LABEL: .entry moe_gemm_wgrad_gather(
// DYN-NOT: atom.global.add
// DYN: .entry
