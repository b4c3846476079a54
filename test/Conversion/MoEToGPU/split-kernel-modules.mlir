// moe-gpu-split-kernel-modules gives each launched kernel a gpu.module of its
// own, with the device functions it calls (in their order) and its module's
// attributes, points the launches there and drops what nothing launches.
// RUN: moe-opt %s --split-input-file --moe-gpu-split-kernel-modules --verify-diagnostics | FileCheck %s

// CHECK-LABEL: module attributes {gpu.container_module}
// CHECK: gpu.module @a [#nvvm.target<chip = "sm_90a">] {
// CHECK-NEXT: func.func private @square(
// CHECK-NEXT: arith.mulf
// CHECK-NEXT: return
// CHECK-NEXT: }
// CHECK-NEXT: func.func private @cube(
// CHECK: gpu.func @a(
// CHECK: func.call @cube(
// CHECK: gpu.module @b [#nvvm.target<chip = "sm_90a">] {
// CHECK-NEXT: gpu.func @b(
// CHECK-NOT: gpu.module
// CHECK-NOT: @unused
// CHECK-NOT: @other
// CHECK-LABEL: func.func @host(
// CHECK: gpu.launch_func @a::@a
// CHECK: gpu.launch_func @b::@b
// CHECK: gpu.launch_func @a::@a
module attributes {gpu.container_module} {
  gpu.module @moe_kernels [#nvvm.target<chip = "sm_90a">] {
    func.func private @square(%v: f32) -> f32 {
      %r = arith.mulf %v, %v : f32
      return %r : f32
    }
    func.func private @other(%v: f32) -> f32 {
      return %v : f32
    }
    func.func private @cube(%v: f32) -> f32 {
      %s = func.call @square(%v) : (f32) -> f32
      %r = arith.mulf %s, %v : f32
      return %r : f32
    }
    gpu.func @unused(%p: memref<?xf32>) kernel {
      gpu.return
    }
    gpu.func @a(%p: memref<?xf32>) kernel {
      %c0 = arith.constant 0 : index
      %v = memref.load %p[%c0] : memref<?xf32>
      %r = func.call @cube(%v) : (f32) -> f32
      memref.store %r, %p[%c0] : memref<?xf32>
      gpu.return
    }
    gpu.func @b(%p: memref<?xf32>) kernel {
      gpu.return
    }
  }
  func.func @host(%p: memref<?xf32>) {
    %c1 = arith.constant 1 : index
    gpu.launch_func @moe_kernels::@a blocks in (%c1, %c1, %c1) threads in (%c1, %c1, %c1) args(%p : memref<?xf32>)
    gpu.launch_func @moe_kernels::@b blocks in (%c1, %c1, %c1) threads in (%c1, %c1, %c1) args(%p : memref<?xf32>)
    gpu.launch_func @moe_kernels::@a blocks in (%c1, %c1, %c1) threads in (%c1, %c1, %c1) args(%p : memref<?xf32>)
    return
  }
}

// -----

// A kernel already alone in a module of its name keeps it.
// CHECK-LABEL: module attributes {gpu.container_module}
// CHECK: gpu.module @k {
// CHECK-NEXT: gpu.func @k(
// CHECK: gpu.launch_func @k::@k
module attributes {gpu.container_module} {
  gpu.module @k {
    gpu.func @k() kernel {
      gpu.return
    }
  }
  func.func @host() {
    %c1 = arith.constant 1 : index
    gpu.launch_func @k::@k blocks in (%c1, %c1, %c1) threads in (%c1, %c1, %c1)
    return
  }
}

// -----

module attributes {gpu.container_module} {
  gpu.module @moe_kernels {
    gpu.func @a() kernel {
      gpu.return
    }
  }
  // expected-error @+1 {{moe-gpu-split-kernel-modules: @a is taken, so the kernel of that name cannot get a gpu.module of it}}
  func.func @a() {
    %c1 = arith.constant 1 : index
    gpu.launch_func @moe_kernels::@a blocks in (%c1, %c1, %c1) threads in (%c1, %c1, %c1)
    return
  }
}
