// One warpgroup: a 128x64 f16 A tile and two 64x64 B boxes loaded by TMA into
// 128B-swizzled shared memory, one mbarrier, a 128x128x64 wgmma
// (docs/gpu-kernels.md §6.1). The golden kernel of the NVVM pipeline: what it must compile to, and
// the first kernel run on the H200 through the runtime.
!mbar = !nvgpu.mbarrier.group<memorySpace = #gpu.address_space<workgroup>, num_barriers = 1>
!tmaA = !nvgpu.tensormap.descriptor<tensor = memref<128x64xf16, 3>, swizzle = swizzle_128b, l2promo = none, oob = zero, interleave = none>
!tmaB = !nvgpu.tensormap.descriptor<tensor = memref<64x64xf16, 3>, swizzle = swizzle_128b, l2promo = none, oob = zero, interleave = none>
!acc  = !nvgpu.warpgroup.accumulator<fragmented = vector<128x128xf32>>
!smem = memref<?xi8, #gpu.address_space<workgroup>>
!sA   = memref<128x64xf16, #gpu.address_space<workgroup>>
!sB   = memref<64x64xf16, #gpu.address_space<workgroup>>
!sBB  = memref<64x128xf16, #gpu.address_space<workgroup>>
module attributes {gpu.container_module} {
  gpu.module @moe_kernels {
    gpu.func @gemm_tile(%pA: !llvm.ptr, %pB: !llvm.ptr, %out: memref<128x128xf32>) kernel
        attributes {known_block_size = array<i32: 128, 1, 1>} {
      // Descriptors arrive as pointers (P4: no descriptor-typed arguments).
      %dA = builtin.unrealized_conversion_cast %pA : !llvm.ptr to !tmaA
      %dB = builtin.unrealized_conversion_cast %pB : !llvm.ptr to !tmaB
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %c64 = arith.constant 64 : index
      %c16k = arith.constant 16384 : index
      %c24k = arith.constant 24576 : index
      %tx = arith.constant 32768 : index  // 16384 + 2 * 8192 bytes
      %ticks = arith.constant 10000000 : index
      %false = arith.constant false
      %tid = gpu.thread_id x
      %is0 = arith.cmpi eq, %tid, %c0 : index
      %smem = gpu.dynamic_shared_memory : !smem
      %sA  = memref.view %smem[%c0][]   : !smem to !sA
      %sB0 = memref.view %smem[%c16k][] : !smem to !sB
      %sB1 = memref.view %smem[%c24k][] : !smem to !sB
      // Both B boxes as one [K=64, N=128] tile.
      %sBB = memref.view %smem[%c16k][] : !smem to !sBB
      %bar = nvgpu.mbarrier.create -> !mbar
      scf.if %is0 {
        nvgpu.mbarrier.init %bar[%c0], %c1 : !mbar
        nvgpu.tma.prefetch.descriptor %dA : !tmaA
        nvgpu.tma.prefetch.descriptor %dB : !tmaB
      }
      gpu.barrier
      scf.if %is0 {
        nvgpu.mbarrier.arrive.expect_tx %bar[%c0], %tx : !mbar
        nvgpu.tma.async.load %dA[%c0, %c0],  %bar[%c0] to %sA  : !tmaA, !mbar -> !sA
        nvgpu.tma.async.load %dB[%c0, %c0],  %bar[%c0] to %sB0 : !tmaB, !mbar -> !sB
        nvgpu.tma.async.load %dB[%c64, %c0], %bar[%c0] to %sB1 : !tmaB, !mbar -> !sB
      }
      nvgpu.mbarrier.try_wait.parity %bar[%c0], %false, %ticks : !mbar
      %acc0 = nvgpu.warpgroup.mma.init.accumulator -> !acc
      %gA = nvgpu.warpgroup.generate.descriptor %sA, %dA : !sA, !tmaA -> !nvgpu.warpgroup.descriptor<tensor = !sA>
      %gB = nvgpu.warpgroup.generate.descriptor %sBB, %dB : !sBB, !tmaB -> !nvgpu.warpgroup.descriptor<tensor = !sBB>
      %acc1 = nvgpu.warpgroup.mma %gA, %gB, %acc0 {transposeB} : <tensor = !sA>, <tensor = !sBB>, !acc -> !acc
      nvvm.wgmma.wait.group.sync.aligned 0
      // Scalar stores (P9): fine for a test kernel, not for production.
      nvgpu.warpgroup.mma.store %acc1, %out : !acc to memref<128x128xf32>
      gpu.return
    }
  }
}
