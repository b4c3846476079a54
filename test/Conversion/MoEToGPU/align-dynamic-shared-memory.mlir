// The dynamic shared memory of lowered kernels becomes one external array
// aligned to 1024 bytes (docs/gpu-kernels.md, pitfall P6); other shared globals are kept.
// RUN: moe-opt %s --split-input-file --pass-pipeline='builtin.module(gpu.module(moe-align-dynamic-shared-memory))' | FileCheck %s
// RUN: moe-opt %s --split-input-file --pass-pipeline='builtin.module(gpu.module(moe-align-dynamic-shared-memory{alignment=128}))' | FileCheck %s --check-prefix=ALIGN128
// RUN: not moe-opt %s --split-input-file --pass-pipeline='builtin.module(gpu.module(moe-align-dynamic-shared-memory{alignment=48}))' 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: moe-opt %s --split-input-file --moe-lower-to-nvvm-pipeline | FileCheck %s --check-prefix=PTX

// CHECK-LABEL: gpu.module @kernels
// CHECK: llvm.mlir.global external @__dynamic_shmem__0() {addr_space = 3 : i32, alignment = 1024 : i64, dso_local} : !llvm.array<0 x i8>
// CHECK: llvm.mlir.global internal @__mbarrier() {addr_space = 3 : i32, alignment = 8 : i64} : !llvm.array<2 x i64>
// ALIGN128: llvm.mlir.global external @__dynamic_shmem__0() {addr_space = 3 : i32, alignment = 128 : i64
// BAD: moe-align-dynamic-shared-memory: alignment 48 is not a power of two
module attributes {gpu.container_module} {
  gpu.module @kernels {
    llvm.mlir.global internal @__dynamic_shmem__0() {addr_space = 3 : i32, alignment = 16 : i64, dso_local} : !llvm.array<0 x i8>
    llvm.mlir.global internal @__mbarrier() {addr_space = 3 : i32, alignment = 8 : i64} : !llvm.array<2 x i64>
  }
}

// -----

// Through moe-lower-to-nvvm-pipeline to PTX.
// PTX: .extern .shared .align 1024 .b8 __dynamic_shmem__0[];
module attributes {gpu.container_module} {
  gpu.module @kernels {
    gpu.func @copy(%a: memref<128xf32>) kernel attributes {known_block_size = array<i32: 128, 1, 1>} {
      %c0 = arith.constant 0 : index
      %t = gpu.thread_id x
      %smem = gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>
      %tile = memref.view %smem[%c0][] : memref<?xi8, #gpu.address_space<workgroup>> to memref<128xf32, #gpu.address_space<workgroup>>
      %v = memref.load %a[%t] : memref<128xf32>
      memref.store %v, %tile[%t] : memref<128xf32, #gpu.address_space<workgroup>>
      gpu.barrier
      %w = memref.load %tile[%t] : memref<128xf32, #gpu.address_space<workgroup>>
      memref.store %w, %a[%t] : memref<128xf32>
      gpu.return
    }
  }
}
