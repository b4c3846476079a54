// The GPU library (moe-gpu-emit-library), lowered to PTX as a layer's kernels are
// (docs/gpu-path.md): each grouped GEMM copies its A tiles (gathered, row-wise or
// MN-major) with cp.async into the 1024-aligned dynamic buffer, loads the expert
// weights (B of the varlen-M GEMMs) by TMA boxes that complete on one mbarrier a ring
// slot, and multiplies with m64n256k16 wgmma on two warpgroups. The persistent
// GEMMs (all but dSwiGLU's and the fp32 router GEMM) are warp-specialised: a producer
// warpgroup (setmaxnreg down) issues the copies and signals full[s] through
// cp.async.mbarrier.arrive.noinc; the consumers (setmaxnreg up) wait on full[s], fence
// the generic-proxy writes for wgmma, release the slot of the step before on empty[s]
// and synchronise among themselves only (bar.sync 1, 256).
// RUN: rm -f %t.*.ptx
// RUN: echo 'module {}' | moe-opt --moe-gpu-emit-library --moe-lower-to-nvvm-pipeline="format=isa bare-pointers=false" > %t.mlir
// RUN: %PYTHON %S/Inputs/extract_ptx.py %t.mlir %t
// RUN: FileCheck %s --input-file=%t.moe_kernels.ptx
// The PTX is pinned by its SHA-256 (LLVM 22's NVPTX back end): a change of the
// library's text (emit-library.mlir's digest) that keeps this one changes no
// kernel, so no GPU run has to confirm it.
// RUN: %PYTHON -c "import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())" %t.moe_kernels.ptx | FileCheck %s --check-prefix=DIGEST
// DIGEST: {{^}}543fcef7d6073334110cc8a93c6586b4e79aacd02376ab6be735f11d99b2a0e1{{$}}

// CHECK: .target sm_90a
// CHECK: .extern .shared .align 1024 .b8 __dynamic_shmem__0[];
// CHECK-LABEL: .entry moe_gemm_up_gather(
// CHECK: .maxntid 384, 1, 1
// CHECK-COUNT-6: mbarrier.init.shared.b64
// CHECK: prefetch.tensormap
// CHECK: setmaxnreg.dec.sync.aligned.u32 72;
// CHECK-DAG: mbarrier.try_wait.parity.shared.b64
// CHECK-DAG: cp.async.cg.shared.global
// CHECK-DAG: cp.async.mbarrier.arrive.noinc.shared.b64
// CHECK-DAG: mbarrier.arrive.expect_tx.shared.b64
// CHECK-DAG: cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// CHECK: setmaxnreg.inc.sync.aligned.u32 216;
// CHECK: mbarrier.try_wait.parity.shared.b64
// CHECK: fence.proxy.async.shared::cta;
// CHECK: wgmma.fence.sync.aligned
// CHECK-COUNT-4: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
// CHECK: wgmma.commit_group.sync.aligned
// CHECK: wgmma.wait_group.sync.aligned 1
// CHECK-DAG: mbarrier.arrive.shared.b64
// CHECK-DAG: wgmma.wait_group.sync.aligned 0
// CHECK: bar.sync 1, 256;
// CHECK-LABEL: .entry moe_gemm_up_rows(
// CHECK: .maxntid 384, 1, 1
// CHECK-COUNT-6: mbarrier.init.shared.b64
// CHECK: prefetch.tensormap
// CHECK: setmaxnreg.dec.sync.aligned.u32 72;
// CHECK-DAG: mbarrier.try_wait.parity.shared.b64
// CHECK-DAG: cp.async.cg.shared.global
// CHECK-DAG: cp.async.mbarrier.arrive.noinc.shared.b64
// CHECK-DAG: mbarrier.arrive.expect_tx.shared.b64
// CHECK-DAG: cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// CHECK: setmaxnreg.inc.sync.aligned.u32 216;
// CHECK: mbarrier.try_wait.parity.shared.b64
// CHECK: fence.proxy.async.shared::cta;
// CHECK: wgmma.fence.sync.aligned
// CHECK-COUNT-4: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
// CHECK: wgmma.commit_group.sync.aligned
// CHECK: wgmma.wait_group.sync.aligned 1
// CHECK-DAG: mbarrier.arrive.shared.b64
// CHECK-DAG: wgmma.wait_group.sync.aligned 0
// CHECK: bar.sync 1, 256;
// CHECK-LABEL: .entry moe_gemm_rows_mn_bf16(
// CHECK: .maxntid 384, 1, 1
// CHECK-COUNT-6: mbarrier.init.shared.b64
// CHECK: prefetch.tensormap
// CHECK: setmaxnreg.dec.sync.aligned.u32 72;
// CHECK-DAG: mbarrier.try_wait.parity.shared.b64
// CHECK-DAG: cp.async.cg.shared.global
// CHECK-DAG: cp.async.mbarrier.arrive.noinc.shared.b64
// CHECK-DAG: mbarrier.arrive.expect_tx.shared.b64
// CHECK-DAG: cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// CHECK: setmaxnreg.inc.sync.aligned.u32 216;
// CHECK: mbarrier.try_wait.parity.shared.b64
// CHECK: fence.proxy.async.shared::cta;
// CHECK: wgmma.fence.sync.aligned
// CHECK-COUNT-4: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
// CHECK: wgmma.commit_group.sync.aligned
// CHECK: wgmma.wait_group.sync.aligned 1
// CHECK-DAG: mbarrier.arrive.shared.b64
// CHECK-DAG: wgmma.wait_group.sync.aligned 0
// CHECK: bar.sync 1, 256;
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
// CHECK: .maxntid 384, 1, 1
// CHECK-COUNT-6: mbarrier.init.shared.b64
// CHECK: prefetch.tensormap
// CHECK: setmaxnreg.dec.sync.aligned.u32 72;
// CHECK-DAG: mbarrier.try_wait.parity.shared.b64
// CHECK-DAG: cp.async.cg.shared.global
// CHECK-DAG: cp.async.mbarrier.arrive.noinc.shared.b64
// CHECK-DAG: mbarrier.arrive.expect_tx.shared.b64
// CHECK-DAG: cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes
// CHECK: setmaxnreg.inc.sync.aligned.u32 216;
// CHECK: mbarrier.try_wait.parity.shared.b64
// CHECK: fence.proxy.async.shared::cta;
// CHECK: wgmma.fence.sync.aligned
// CHECK-COUNT-4: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16
// CHECK: wgmma.commit_group.sync.aligned
// CHECK: wgmma.wait_group.sync.aligned 1
// CHECK-DAG: mbarrier.arrive.shared.b64
// CHECK-DAG: wgmma.wait_group.sync.aligned 0
// CHECK: bar.sync 1, 256;
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
// CHECK: .maxntid 384, 1, 1
// CHECK-COUNT-6: mbarrier.init.shared.b64
// CHECK: setmaxnreg.dec.sync.aligned.u32 72;
// CHECK-DAG: mbarrier.try_wait.parity.shared.b64
// CHECK-DAG: cp.async.cg.shared.global
// CHECK-DAG: cp.async.mbarrier.arrive.noinc.shared.b64
// CHECK: setmaxnreg.inc.sync.aligned.u32 216;
// CHECK: mbarrier.try_wait.parity.shared.b64
// CHECK: fence.proxy.async.shared::cta;
// CHECK: wgmma.fence.sync.aligned
// Both operands MN-major (transposed by wgmma: imm-trans-a = imm-trans-b = 1).
// CHECK-COUNT-4: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {{.*}}, p, 1, 1, 1, 1;
// CHECK: wgmma.commit_group.sync.aligned
// CHECK: wgmma.wait_group.sync.aligned 1
// CHECK-DAG: mbarrier.arrive.shared.b64
// CHECK-DAG: wgmma.wait_group.sync.aligned 0
// CHECK: bar.sync 1, 256;
// CHECK-LABEL: .entry moe_gemm_wgrad_gather_a(
// CHECK: .maxntid 384, 1, 1
// CHECK-COUNT-6: mbarrier.init.shared.b64
// CHECK: setmaxnreg.dec.sync.aligned.u32 72;
// CHECK-DAG: mbarrier.try_wait.parity.shared.b64
// CHECK-DAG: cp.async.cg.shared.global
// CHECK-DAG: cp.async.mbarrier.arrive.noinc.shared.b64
// CHECK: setmaxnreg.inc.sync.aligned.u32 216;
// CHECK: mbarrier.try_wait.parity.shared.b64
// CHECK: fence.proxy.async.shared::cta;
// CHECK: wgmma.fence.sync.aligned
// Both operands MN-major (transposed by wgmma: imm-trans-a = imm-trans-b = 1).
// CHECK-COUNT-4: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {{.*}}, p, 1, 1, 1, 1;
// CHECK: wgmma.commit_group.sync.aligned
// CHECK: wgmma.wait_group.sync.aligned 1
// CHECK-DAG: mbarrier.arrive.shared.b64
// CHECK-DAG: wgmma.wait_group.sync.aligned 0
// CHECK: bar.sync 1, 256;
// CHECK-LABEL: .entry moe_gemm_wgrad_rows(
// CHECK: .maxntid 384, 1, 1
// CHECK-COUNT-6: mbarrier.init.shared.b64
// CHECK: setmaxnreg.dec.sync.aligned.u32 72;
// CHECK-DAG: mbarrier.try_wait.parity.shared.b64
// CHECK-DAG: cp.async.cg.shared.global
// CHECK-DAG: cp.async.mbarrier.arrive.noinc.shared.b64
// CHECK: setmaxnreg.inc.sync.aligned.u32 216;
// CHECK: mbarrier.try_wait.parity.shared.b64
// CHECK: fence.proxy.async.shared::cta;
// CHECK: wgmma.fence.sync.aligned
// Both operands MN-major (transposed by wgmma: imm-trans-a = imm-trans-b = 1).
// CHECK-COUNT-4: wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {{.*}}, p, 1, 1, 1, 1;
// CHECK: wgmma.commit_group.sync.aligned
// CHECK: wgmma.wait_group.sync.aligned 1
// CHECK-DAG: mbarrier.arrive.shared.b64
// CHECK-DAG: wgmma.wait_group.sync.aligned 0
// CHECK: bar.sync 1, 256;
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
// The selection-bias update: an integer histogram by global atomics, then one
// block's update in round-to-nearest f32 steps, never fused into an fma, so its
// bits are the reference's.
// CHECK-LABEL: .entry moe_selection_bias_count(
// CHECK: atom.global.add.u32
// CHECK-LABEL: .entry moe_selection_bias_update(
// CHECK-NOT: atom.
// CHECK-NOT: fma.
// CHECK: div.rn.f32
// CHECK-NOT: fma.
// CHECK: mul.rn.f32
// CHECK-NOT: fma.
// CHECK: add.rn.f32
// CHECK-NOT: fma.
// The expert-parallel row moves: a block a row, 16-byte copies or zeros; the
// row sources of scatter_rows and ep_unpack by an atomic max (the last index
// in order wins).
// CHECK-LABEL: .entry moe_gather_rows(
// CHECK: .maxntid 128, 1, 1
// CHECK-DAG: ld.global.v4.b32
// CHECK-DAG: st.global.v4.b32
// CHECK-DAG: st.global.v4.b32 {{.*}}, {0, 0, 0, 0};
// CHECK-LABEL: .entry moe_invert_rows(
// CHECK: atom.global.max.s32
// CHECK-LABEL: .entry moe_ep_pack_rows(
// CHECK: .maxntid 128, 1, 1
// CHECK-LABEL: .entry moe_ep_unpack_rows(
// CHECK: atom.global.max.s32
// CHECK-LABEL: .entry moe_ep_unpack_sum(
// CHECK-DAG: ld.global.v4.b32
// CHECK-DAG: st.global.v4.b32
// CHECK-LABEL: .entry moe_ep_queue_plan(
// CHECK: bar.sync
// CHECK-LABEL: .entry moe_ep_queue_fill(
// CHECK: .maxntid 128, 1, 1
// The unfused combine and expert FFN backward: dy rows scaled from dout in
// 16-byte vectors, d_weights a warp a slot summed by xor shuffles, and dx
// from per-token row lists (an atomic exchange a row) summed in row order.
// CHECK-LABEL: .entry moe_scale_rows(
// CHECK-DAG: ld.global.v4.b32
// CHECK-DAG: st.global.v4.b32
// CHECK-LABEL: .entry moe_row_dots(
// CHECK: shfl.sync.bfly.b32
// CHECK-LABEL: .entry moe_link_rows(
// CHECK: atom.global.exch.b32
// CHECK-LABEL: .entry moe_token_sum(
// CHECK-DAG: ld.global.v4.b32
// CHECK-DAG: st.global.v4.b32
// The auxiliary losses: the selection counts by integer atomics (a chunk's in
// shared memory, then one global add an expert), and no atomic in the float
// sums (per-chunk partials, one block's fixed-order reduction, d_logits a warp
// a token by xor shuffles): the same bits run to run.
// CHECK-LABEL: .entry moe_aux_counts(
// CHECK: atom.shared.add.u32
// CHECK: bar.sync 0;
// CHECK: atom.global.add.u32
// CHECK-LABEL: .entry moe_aux_partials(
// CHECK-NOT: atom.
// CHECK: shfl.sync.bfly.b32
// CHECK-NOT: atom.
// CHECK: lg2.approx.ftz.f32
// CHECK-NOT: atom.
// CHECK-LABEL: .entry moe_aux_columns(
// CHECK-NOT: atom.
// CHECK: shfl.sync.bfly.b32
// CHECK-NOT: atom.
// CHECK-LABEL: .entry moe_aux_finish(
// CHECK-NOT: atom.
// CHECK: bar.sync 0;
// CHECK-NOT: atom.
// CHECK-LABEL: .entry moe_aux_loss_grad(
// CHECK-NOT: atom.
// CHECK: shfl.sync.bfly.b32
// CHECK-NOT: atom.
// The dispatch with a capacity: order-free as the dropless one (no atomics in
// scan and place), so the kept pairs are the same run to run.
// CHECK-LABEL: .entry moe_dispatch_scan_capacity(
// CHECK-NOT: atom.
// CHECK: min.u32
// CHECK-NOT: atom.
// CHECK-LABEL: .entry moe_dispatch_place_capacity(
// CHECK-NOT: atom.
// CHECK: setp.ge.u32
// CHECK-NOT: atom.
// The router's kernels with the auxiliary losses: the partial sums as
// moe_aux_partials makes them (no atomics), the counts as moe_aux_counts
// (integer atomics, in shared memory and then one a block an expert).
// CHECK-LABEL: .entry moe_router_scores_aux(
// CHECK-NOT: atom.
// CHECK: shfl.sync.bfly.b32
// CHECK-NOT: atom.
// CHECK: lg2.approx.ftz.f32
// CHECK-NOT: atom.
// CHECK-LABEL: .entry moe_router_select_counts(
// CHECK: atom.shared.add.u32
// CHECK: bar.sync 0;
// CHECK: atom.global.add.u32
// CHECK-LABEL: .entry moe_router_grad_logits_aux(
// CHECK-NOT: atom.
// CHECK: shfl.sync.bfly.b32
// CHECK-NOT: atom.
// CHECK: lg2.approx.ftz.f32
// CHECK-NOT: atom.
// The expert biases' gradients: per-expert column sums in 16-byte vectors,
// sliced rows then the slices in order, and the routing weight's
// <dout, b_down[e]> a warp a slot by xor shuffles; no atomics, so the same
// bits run to run.
// CHECK-LABEL: .entry moe_segment_colsum(
// CHECK-NOT: atom.
// CHECK: ld.global.v4.b32
// CHECK-NOT: atom.
// CHECK: st.global.v4.b32
// CHECK-NOT: atom.
// CHECK-LABEL: .entry moe_sum_splits_f32(
// CHECK-NOT: atom.
// CHECK-LABEL: .entry moe_bias_dweights(
// CHECK-NOT: atom.
// CHECK: shfl.sync.bfly.b32
// CHECK-NOT: atom.
// CHECK-NOT: .entry
