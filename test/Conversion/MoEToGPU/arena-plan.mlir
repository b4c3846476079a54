// convert-moe-to-gpu allocates each function's temporaries at the offsets
// moe-plan-memory gave them (moe.arena_offsets, moe.arena_size) and plans
// nothing itself: a plan that is missing, stale or wrong is an error at the
// op, never a wrong placement.
// RUN: rm -rf %t && split-file %s %t
// RUN: moe-opt %t/given.mlir --convert-moe-to-gpu | FileCheck %s
// RUN: moe-opt %t/given.mlir --moe-plan-memory=alignment=1024 --convert-moe-to-gpu | FileCheck %s --check-prefix=REPLANNED
// RUN: moe-opt %t/errors.mlir --split-input-file --convert-moe-to-gpu --verify-diagnostics

//--- given.mlir
// A plan the conversion did not make: the logits at 0, the routing metadata
// at 4096 and up. The router's weights are never read, but still written.
func.func @route(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>) -> tensor<74xi32>
    attributes {moe.arena_size = 8192 : i64} {
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>,
                                   moe.arena_offsets = array<i64: 6144, 4096, 0>}
      : tensor<37x64xbf16>, tensor<64x4xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 4 : i64,
                                           moe.arena_offsets = array<i64: -1, 7168, 5120>}
      : tensor<37x2xi32> -> tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>
  return %ids : tensor<74xi32>
}
// CHECK-LABEL: func.func @route(
// CHECK-SAME: moe.gpu.workspace_bytes = 8192 : i64
// CHECK: %[[ARENA:.*]], %{{.*}} = gpu.alloc async [%{{.*}}] () : memref<8192xi8>
// CHECK-DAG: memref.view %[[ARENA]][%c6144{{.*}}][] : memref<8192xi8> to memref<37x2xf32>
// CHECK-DAG: memref.view %[[ARENA]][%c4096{{.*}}][] : memref<8192xi8> to memref<37x2xi32>
// CHECK-DAG: memref.view %[[ARENA]][%c0{{.*}}][] : memref<8192xi8> to memref<37x4xf32>
// CHECK: call @__moe_gpu_router(
// CHECK-DAG: memref.view %[[ARENA]][%c7168{{.*}}][] : memref<8192xi8> to memref<5xi32>
// CHECK-DAG: memref.view %[[ARENA]][%c5120{{.*}}][] : memref<8192xi8> to memref<37x2xi32>
// CHECK: call @__moe_gpu_dispatch(

// moe-plan-memory run again replaces the plan: the three router results at
// 1024-B steps, the dispatch's two in the places the weights and the logits
// left (the arena ends with e, at 2048 + 296 B).
// REPLANNED-LABEL: func.func @route(
// REPLANNED-SAME: moe.gpu.workspace_bytes = 2344 : i64
// REPLANNED: %[[ARENA:.*]], %{{.*}} = gpu.alloc async [%{{.*}}] () : memref<2344xi8>
// REPLANNED-DAG: memref.view %[[ARENA]][%c1024{{.*}}][] : memref<2344xi8> to memref<37x2xf32>
// REPLANNED-DAG: memref.view %[[ARENA]][%c2048{{.*}}][] : memref<2344xi8> to memref<37x2xi32>
// REPLANNED-DAG: memref.view %[[ARENA]][%c0{{.*}}][] : memref<2344xi8> to memref<37x4xf32>
// REPLANNED: call @__moe_gpu_router(
// REPLANNED-DAG: memref.view %[[ARENA]][%c1024{{.*}}][] : memref<2344xi8> to memref<5xi32>
// REPLANNED-DAG: memref.view %[[ARENA]][%c0{{.*}}][] : memref<2344xi8> to memref<37x2xi32>
// REPLANNED: call @__moe_gpu_dispatch(

//--- errors.mlir
func.func @unplanned(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>) -> tensor<37x2xi32> {
  // expected-error @+1 {{result #0 has no place in the arena of @unplanned; run moe-plan-memory right before convert-moe-to-gpu (moe-training-pipeline does)}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x64xbf16>, tensor<64x4xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>
  return %e : tensor<37x2xi32>
}

// -----

func.func @count(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>) -> tensor<37x2xi32>
    attributes {moe.arena_size = 1024 : i64} {
  // expected-error @+1 {{has 2 moe.arena_offsets for 3 results}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>,
                                   moe.arena_offsets = array<i64: 0, -1>}
      : tensor<37x64xbf16>, tensor<64x4xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>
  return %e : tensor<37x2xi32>
}

// -----

// Planned before something changed what the function returns.
func.func @returned(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>) -> tensor<37x2xi32>
    attributes {moe.arena_size = 2048 : i64} {
  // expected-error @+1 {{result #1 is planned in the arena, where the GPU path keeps only the function's temporaries; run moe-plan-memory}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>,
                                   moe.arena_offsets = array<i64: 0, 512, 1024>}
      : tensor<37x64xbf16>, tensor<64x4xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>
  return %e : tensor<37x2xi32>
}

// -----

func.func @misaligned(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>) -> tensor<37x2xi32>
    attributes {moe.arena_size = 2048 : i64} {
  // expected-error @+1 {{result #0 (296 B) is planned at offset 16 of an arena of 2048 B; the GPU path needs it inside, at a multiple of 256 B}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>,
                                   moe.arena_offsets = array<i64: 16, -1, 1024>}
      : tensor<37x64xbf16>, tensor<64x4xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>
  return %e : tensor<37x2xi32>
}

// -----

func.func @outside(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>) -> tensor<37x2xi32>
    attributes {moe.arena_size = 1024 : i64} {
  // expected-error @+1 {{result #2 (592 B) is planned at offset 512 of an arena of 1024 B}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>,
                                   moe.arena_offsets = array<i64: 0, -1, 512>}
      : tensor<37x64xbf16>, tensor<64x4xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>
  return %e : tensor<37x2xi32>
}

// -----

// The weights and the logits are both live at the router.
// expected-error @+1 {{has temporaries planned to overlap while both are live}}
func.func @overlap(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>) -> tensor<37x2xi32>
    attributes {moe.arena_size = 1024 : i64} {
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>,
                                   moe.arena_offsets = array<i64: 256, -1, 0>}
      : tensor<37x64xbf16>, tensor<64x4xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x4xf32>
  return %e : tensor<37x2xi32>
}
