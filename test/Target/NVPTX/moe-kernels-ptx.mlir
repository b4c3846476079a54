// The sm_90a path lowers a layer to PTX that holds every kernel of the GPU library
// (docs/gpu-path.md): each grouped GEMM copies its A tiles (gathered, row-wise or
// MN-major) with cp.async into the 1024-aligned dynamic buffer, loads the expert
// weights (B of the varlen-M GEMMs) by TMA boxes that complete on one mbarrier a ring
// slot, and multiplies with m64n256k16 wgmma on two warpgroups.
// RUN: moe-opt %S/Inputs/small-layer.mlir --moe-training-pipeline="chip=sm_90a format=isa" > %t.mlir
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t.mlir %t
// RUN: FileCheck %s --input-file=%t.moe_kernels.ptx

// CHECK: .target sm_90a
// CHECK: .extern .shared .align 1024 .b8 __dynamic_shmem__0[];
// CHECK-LABEL: .entry moe_gemm_up_gather(
// CHECK: .maxntid 256, 1, 1
// CHECK: mbarrier.init.shared.b64
// CHECK: prefetch.tensormap
// CHECK: cp.async.cg.shared.global
// CHECK: mbarrier.arrive.expect_tx.shared.b64
// CHECK-COUNT-4: cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// CHECK: mbarrier.try_wait.parity.shared.b64
// CHECK: wgmma.fence.sync.aligned
// CHECK-COUNT-4: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
// CHECK: wgmma.commit_group.sync.aligned
// CHECK: wgmma.wait_group.sync.aligned 0
// CHECK-LABEL: .entry moe_gemm_up_rows(
// CHECK: .maxntid 256, 1, 1
// CHECK: mbarrier.init.shared.b64
// CHECK: prefetch.tensormap
// CHECK: cp.async.cg.shared.global
// CHECK: mbarrier.arrive.expect_tx.shared.b64
// CHECK-COUNT-4: cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// CHECK: mbarrier.try_wait.parity.shared.b64
// CHECK: wgmma.fence.sync.aligned
// CHECK-COUNT-4: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
// CHECK: wgmma.commit_group.sync.aligned
// CHECK: wgmma.wait_group.sync.aligned 0
// CHECK-LABEL: .entry moe_gemm_rows_mn_bf16(
// CHECK: .maxntid 256, 1, 1
// CHECK: mbarrier.init.shared.b64
// CHECK: prefetch.tensormap
// CHECK: cp.async.cg.shared.global
// CHECK: mbarrier.arrive.expect_tx.shared.b64
// CHECK-COUNT-4: cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// CHECK: mbarrier.try_wait.parity.shared.b64
// CHECK: wgmma.fence.sync.aligned
// CHECK-COUNT-4: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
// CHECK: wgmma.commit_group.sync.aligned
// CHECK: wgmma.wait_group.sync.aligned 0
// CHECK-LABEL: .entry moe_gemm_rows_mn_f32(
// CHECK: .maxntid 256, 1, 1
// CHECK: mbarrier.init.shared.b64
// CHECK: prefetch.tensormap
// CHECK: cp.async.cg.shared.global
// CHECK: mbarrier.arrive.expect_tx.shared.b64
// CHECK-COUNT-4: cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// CHECK: mbarrier.try_wait.parity.shared.b64
// CHECK: wgmma.fence.sync.aligned
// CHECK-COUNT-4: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
// CHECK: wgmma.commit_group.sync.aligned
// CHECK: wgmma.wait_group.sync.aligned 0
// CHECK-LABEL: .entry moe_gemm_rows_k_bf16(
// CHECK: .maxntid 256, 1, 1
// CHECK: mbarrier.init.shared.b64
// CHECK: prefetch.tensormap
// CHECK: cp.async.cg.shared.global
// CHECK: mbarrier.arrive.expect_tx.shared.b64
// CHECK: cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// CHECK: mbarrier.try_wait.parity.shared.b64
// CHECK: wgmma.fence.sync.aligned
// CHECK-COUNT-4: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
// CHECK: wgmma.commit_group.sync.aligned
// CHECK: wgmma.wait_group.sync.aligned 0
// CHECK-LABEL: .entry moe_gemm_dact_gather(
// CHECK: .maxntid 256, 1, 1
// CHECK: mbarrier.init.shared.b64
// CHECK: prefetch.tensormap
// CHECK: cp.async.cg.shared.global
// CHECK: mbarrier.arrive.expect_tx.shared.b64
// CHECK: cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// CHECK: mbarrier.try_wait.parity.shared.b64
// CHECK: wgmma.fence.sync.aligned
// CHECK-COUNT-4: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
// CHECK: wgmma.commit_group.sync.aligned
// CHECK: wgmma.wait_group.sync.aligned 0
// CHECK-LABEL: .entry moe_gemm_dact_rows(
// CHECK: .maxntid 256, 1, 1
// CHECK: mbarrier.init.shared.b64
// CHECK: prefetch.tensormap
// CHECK: cp.async.cg.shared.global
// CHECK: mbarrier.arrive.expect_tx.shared.b64
// CHECK: cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// CHECK: mbarrier.try_wait.parity.shared.b64
// CHECK: wgmma.fence.sync.aligned
// CHECK-COUNT-4: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
// CHECK: wgmma.commit_group.sync.aligned
// CHECK: wgmma.wait_group.sync.aligned 0
// CHECK-LABEL: .entry moe_gemm_wgrad_gather(
// CHECK: .maxntid 256, 1, 1
// CHECK: cp.async.cg.shared.global
// CHECK: wgmma.fence.sync.aligned
// Both operands MN-major (transposed by wgmma: imm-trans-a = imm-trans-b = 1).
// CHECK-COUNT-4: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {{.*}}, p, 1, 1, 1, 1;
// CHECK: wgmma.commit_group.sync.aligned
// CHECK-LABEL: .entry moe_gemm_wgrad_gather_a(
// CHECK: .maxntid 256, 1, 1
// CHECK: cp.async.cg.shared.global
// CHECK: wgmma.fence.sync.aligned
// Both operands MN-major (transposed by wgmma: imm-trans-a = imm-trans-b = 1).
// CHECK-COUNT-4: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {{.*}}, p, 1, 1, 1, 1;
// CHECK: wgmma.commit_group.sync.aligned
// CHECK-LABEL: .entry moe_gemm_wgrad_rows(
// CHECK: .maxntid 256, 1, 1
// CHECK: cp.async.cg.shared.global
// CHECK: wgmma.fence.sync.aligned
// Both operands MN-major (transposed by wgmma: imm-trans-a = imm-trans-b = 1).
// CHECK-COUNT-4: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {{.*}}, p, 1, 1, 1, 1;
// CHECK: wgmma.commit_group.sync.aligned
// CHECK-LABEL: .entry moe_router_scores(
// CHECK: .maxntid 128, 1, 1
// CHECK-LABEL: .entry moe_router_select(
// CHECK: .maxntid 128, 1, 1
// CHECK-LABEL: .entry moe_dispatch_rank(
// CHECK: .maxntid 128, 1, 1
// CHECK-LABEL: .entry moe_dispatch_scan(
// CHECK: .maxntid 128, 1, 1
// CHECK-LABEL: .entry moe_dispatch_place(
// CHECK: .maxntid 128, 1, 1
// CHECK-LABEL: .entry moe_gather_sum(
// CHECK: .maxntid 128, 1, 1
// CHECK-LABEL: .entry moe_scatter_weights(
// CHECK: .maxntid 128, 1, 1
// CHECK-LABEL: .entry moe_single_offsets(
// CHECK: .maxntid 128, 1, 1
// CHECK-LABEL: .entry moe_dweights(
// CHECK: .maxntid 128, 1, 1
// CHECK-LABEL: .entry moe_router_grad_logits(
// CHECK: .maxntid 128, 1, 1
// CHECK-LABEL: .entry moe_repack_bf16(
// CHECK: .maxntid 128, 1, 1
// CHECK-LABEL: .entry moe_repack_f32(
// CHECK: .maxntid 128, 1, 1
// CHECK-LABEL: .entry moe_add(
// CHECK: .maxntid 128, 1, 1
// Eight elements a thread: 16-byte loads and store, and the partial group's tail.
// CHECK-DAG: ld.global.b16
// CHECK-DAG: st.global.b16
// CHECK-DAG: ld.global.v4.b32
// CHECK-DAG: st.global.v4.b32
// CHECK-NOT: .entry
