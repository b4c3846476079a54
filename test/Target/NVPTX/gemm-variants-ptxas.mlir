// GEMM configs off the library's defaults, built into the library by
// moe-gpu-emit-library's `configs` (the host functions of those roles launch them),
// compile for sm_90a with no spill, no local stack and no wgmma serialisation warning
// (check_ptxas.py fails on any): without warp specialisation, with the dSwiGLU
// epilogue's rows loaded 1 at a time (nows); C out by 16-byte stores from every
// consumer thread, dSwiGLU rows 8 at a time (threads); the library's defaults (rows:
// the weight gradients' row-wise operand by TMA, C by TMA boxes, the router's dX that
// adds into dx); C out by one bulk copy a row and the weight gradients' rows by cp.async
// (bulk); the varlen-M GEMMs on the dynamic tile schedule (dyn).
// REQUIRES: ptxas
// RUN: rm -f %t.*.ptx
// RUN: echo 'module {}' | moe-opt --moe-gpu-emit-library="configs=up:warp_specialized=false,down:warp_specialized=false,dx:warp_specialized=false,dw:warp_specialized=false,dw_down:warp_specialized=false,dw_gate_up:warp_specialized=false,dact:dact_unroll=1" --moe-lower-to-nvvm-pipeline="format=isa bare-pointers=false" -o %t.nows.isa.mlir
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t.nows.isa.mlir %t.nows
// RUN: %ptxas -arch=sm_90a -v %t.nows.moe_kernels.ptx -o %t.nows.cubin 2>&1 | %PYTHON %S/Inputs/check_ptxas.py > %t.nows.txt
// RUN: FileCheck %s --check-prefix=NONE < %t.nows.txt
// RUN: echo 'module {}' | moe-opt --moe-gpu-emit-library="configs=down:store=threads,dx:store=threads,dw_down:store=threads,dw_gate_up:store=threads,dact:dact_unroll=8" --moe-lower-to-nvvm-pipeline="format=isa bare-pointers=false" -o %t.threads.isa.mlir
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t.threads.isa.mlir %t.threads
// RUN: %ptxas -arch=sm_90a -v %t.threads.moe_kernels.ptx -o %t.threads.cubin 2>&1 | %PYTHON %S/Inputs/check_ptxas.py > %t.threads.txt
// RUN: FileCheck %s --check-prefix=THREADS < %t.threads.txt
// RUN: echo 'module {}' | moe-opt --moe-gpu-emit-library --moe-lower-to-nvvm-pipeline="format=isa bare-pointers=false" -o %t.rows.isa.mlir
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t.rows.isa.mlir %t.rows
// RUN: %ptxas -arch=sm_90a -v %t.rows.moe_kernels.ptx -o %t.rows.cubin 2>&1 | %PYTHON %S/Inputs/check_ptxas.py > %t.rows.txt
// RUN: FileCheck %s --check-prefix=ROWS --input-file=%t.rows.moe_kernels.ptx
// RUN: FileCheck %s --check-prefix=TSTORE --input-file=%t.rows.moe_kernels.ptx
// RUN: FileCheck %s --check-prefix=ACC --input-file=%t.rows.moe_kernels.ptx
// RUN: echo 'module {}' | moe-opt --moe-gpu-emit-library="configs=down:store=bulk_rows,dx:store=bulk_rows,dw_down:rows_tma=false:store=bulk_rows,dw_gate_up:rows_tma=false:store=bulk_rows" --moe-lower-to-nvvm-pipeline="format=isa bare-pointers=false" -o %t.bulk.isa.mlir
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t.bulk.isa.mlir %t.bulk
// RUN: %ptxas -arch=sm_90a -v %t.bulk.moe_kernels.ptx -o %t.bulk.cubin 2>&1 | %PYTHON %S/Inputs/check_ptxas.py > %t.bulk.txt
// RUN: FileCheck %s --check-prefix=BULK --input-file=%t.bulk.moe_kernels.ptx
// RUN: echo 'module {}' | moe-opt --moe-gpu-emit-library="configs=up:schedule=dynamic,down:schedule=dynamic,dx:schedule=dynamic" --moe-lower-to-nvvm-pipeline="format=isa bare-pointers=false" -o %t.dyn.isa.mlir
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t.dyn.isa.mlir %t.dyn
// RUN: %ptxas -arch=sm_90a -v %t.dyn.moe_kernels.ptx -o %t.dyn.cubin 2>&1 | %PYTHON %S/Inputs/check_ptxas.py > %t.dyn.txt
// RUN: FileCheck %s --check-prefix=DYN --input-file=%t.dyn.moe_kernels.ptx
// RUN: FileCheck %s --check-prefix=STATIC --input-file=%t.dyn.moe_kernels.ptx

// Without warp specialisation a GEMM is the 256-thread kernel: no setmaxnreg.
// NONE-DAG: Compiling entry function 'moe_gemm_up_gather_nows' for 'sm_90a'
// NONE-DAG: Compiling entry function 'moe_gemm_rows_mn_bf16_nows' for 'sm_90a'
// NONE-DAG: Compiling entry function 'moe_gemm_wgrad_gather_a_nows' for 'sm_90a'
// NONE-DAG: Compiling entry function 'moe_gemm_dact_gather_u1' for 'sm_90a'
// THREADS-DAG: Compiling entry function 'moe_gemm_rows_mn_bf16_storethreads' for 'sm_90a'
// THREADS-DAG: Compiling entry function 'moe_gemm_wgrad_gather_storethreads' for 'sm_90a'
// THREADS-DAG: Compiling entry function 'moe_gemm_dact_gather_u8' for 'sm_90a'
// THREADS-DAG: Used 168 registers

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
// BULK-LABEL: .entry moe_gemm_wgrad_gather_norowstma_storebulk(
// BULK-NOT: cp.async.bulk.tensor
// BULK: stmatrix.sync.aligned.m8n8.x4.shared.b16
// BULK: fence.proxy.async.shared::cta
// BULK: cp.async.bulk.global.shared::cta.bulk_group
// BULK: cp.async.bulk.commit_group
// BULK: cp.async.bulk.wait_group 0
// BULK-LABEL: .entry moe_gemm_wgrad_gather_a_norowstma_storebulk(
// BULK-NOT: cp.async.bulk.tensor
// BULK: cp.async.bulk.global.shared::cta.bulk_group

// The static schedule (the defaults in the same library): the dSwiGLU GEMM loads its
// first rows of H, stages dA by 16 stmatrix.x4 a thread and reads it back 16 bytes a
// row, loads the next rows, and sums dS and forms d silu / dg with fused multiply-adds;
// no tile counter there or in the weight gradients.
// STATIC-LABEL: .entry moe_gemm_dact_gather(
// STATIC-NOT: atom.global.add
// STATIC-COUNT-8: ld.global.v4.b32
// STATIC: bar.sync
// STATIC-COUNT-16: stmatrix.sync.aligned.m8n8.x4.shared.b16
// STATIC: bar.sync
// STATIC-COUNT-8: ld.global.v4.b32
// STATIC: ld.shared.v4.b32
// STATIC: fma.rn.f32
// STATIC-LABEL: .entry moe_gemm_wgrad_gather(
// STATIC-NOT: atom.global.add
// STATIC: .entry

// schedule = dynamic (with the idle-warpgroup skip, its default there): the varlen-M
// GEMMs claim tiles from the counter, pass them on through barrier 2 of the producer
// warpgroup and read them through redux.sync.
// DYN-LABEL: .entry moe_gemm_up_gather_dyn(
// DYN-DAG: atom.global.add.u32
// DYN-DAG: bar.sync 2, 128;
// DYN-DAG: redux.sync.min.u32
// DYN-DAG: vote.sync.all.pred
// DYN-LABEL: .entry moe_gemm_rows_mn_bf16_dyn(
// DYN-DAG: atom.global.add.u32
// DYN-DAG: redux.sync.min.u32
// DYN-LABEL: .entry moe_gemm_rows_k_bf16_dyn(
// DYN-DAG: atom.global.add.u32
// DYN-DAG: redux.sync.min.u32
