// convert-moe-to-gpu on a layer of dynamic token count (moe.layer's
// max_tokens): the host functions take memrefs whose leading size follows T,
// compute T of the call from x's, size the arena's views from it, allocate
// the arena (placed at the bound) at what T needs, and record the bound and
// each parameter's rows a token for the entry points.
// RUN: rm -rf %t && split-file %s %t
// RUN: moe-opt %t/layer.mlir --moe-decompose --moe-plan-activations=report=false --moe-generate-backward --moe-gpu-select-kernels --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu | FileCheck %s
// RUN: moe-opt %t/layer.mlir --moe-decompose --moe-plan-activations="report=false policy=recompute" --moe-generate-backward --moe-gpu-select-kernels --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=RECOMPUTE
// RUN: moe-opt %t/errors.mlir --split-input-file --convert-moe-to-gpu --verify-diagnostics

//--- layer.mlir
func.func @layer(%x: tensor<?x64xbf16>, %wr: tensor<64x8xbf16>,
                 %wgu: tensor<8x64x256xbf16>, %wd: tensor<8x128x64xbf16>)
    -> (tensor<?x64xbf16>, tensor<?x8xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, max_tokens = 4096,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x64xbf16>, tensor<64x8xbf16>, tensor<8x64x256xbf16>,
        tensor<8x128x64xbf16> -> tensor<?x64xbf16>, tensor<?x8xf32>
  return %out, %logits : tensor<?x64xbf16>, tensor<?x8xf32>
}

// The saved token ids and h have T * 2 rows, the rest of T's sizes T.
// CHECK-LABEL: func.func @layer_forward(
// CHECK-SAME: %[[X:[a-z0-9]+]]: memref<?x64xbf16>, %{{.*}}: memref<64x8xbf16>,
// CHECK-SAME: memref<?xi32>, %{{.*}}: memref<9xi32>, %{{.*}}: memref<?x2xi32>, %{{.*}}: memref<?x256xbf16>)
// CHECK-SAME: moe.gpu.layer = {E = 8 : i64, T = 4096 : i64,
// CHECK-SAME: max_tokens = 4096 : i64
// CHECK-SAME: moe.gpu.max_tokens = 4096 : i64
// CHECK-SAME: {dtype = "bf16", name = "arg0", role = "input", rows_per_token = 1 : i64, shape = array<i64: -9223372036854775808, 64>}
// CHECK-SAME: {dtype = "i32", name = "moe.dispatch.token_ids", role = "saved", rows_per_token = 2 : i64, shape = array<i64: -9223372036854775808>}
// CHECK-SAME: {dtype = "i32", name = "moe.dispatch.offsets", role = "saved", shape = array<i64: 9>}
// The workspace at the bound: y, 4096 * 2 rows of 64 bf16.
// CHECK-SAME: moe.gpu.workspace_bytes = 1048576 : i64
// CHECK: %[[T0:.*]] = gpu.wait async
// CHECK: %[[DIM:.*]] = memref.dim %[[X]], %c0 : memref<?x64xbf16>
// CHECK: %[[T:.*]] = arith.divui %[[DIM]], %c1 : index
// The arena, placed at the bound (1 MiB), is allocated at what the call's T
// needs: y's end, T * 256 B, rounded to 256 B.
// CHECK: %[[YB:.*]] = arith.muli %[[T]], %c256 : index
// CHECK: %[[YEND:.*]] = arith.addi %[[YB]], %c0
// CHECK: %[[END:.*]] = arith.maxui %c0{{.*}}, %[[YEND]] : index
// CHECK: %[[UP:.*]] = arith.addi %[[END]], %c255 : index
// CHECK: %[[SIZE:.*]] = arith.andi %[[UP]], %{{.*}} : index
// CHECK-NEXT: %[[ARENA:.*]], %{{.*}} = gpu.alloc async [%[[T0]]] (%[[SIZE]]) : memref<?xi8>
// CHECK: call @__moe_gpu_dispatch(
// y, at offset 0, has T * 2 rows of the call.
// CHECK: %[[ROWS:.*]] = arith.muli %[[T]], %c2 : index
// CHECK-NEXT: memref.view %[[ARENA]][%c0{{.*}}][%[[ROWS]]] : memref<?xi8> to memref<?x64xbf16>
// CHECK: call @__moe_gpu_expert_ffn(
// CHECK-LABEL: func.func @layer_backward(
// CHECK-SAME: moe.gpu.max_tokens = 4096 : i64

// With h recomputed, backward's arena holds h (1024 B a token, at 0) and
// d_weights (8 B a token, at 4194304, the end of h at the bound): the arena
// ends at the further of the two at T.
// RECOMPUTE-LABEL: func.func @layer_backward(
// RECOMPUTE: %[[T:.*]] = arith.divui
// RECOMPUTE: %[[HB:.*]] = arith.muli %[[T]], %c1024 : index
// RECOMPUTE: %[[HEND:.*]] = arith.addi %[[HB]], %c0
// RECOMPUTE: %[[E1:.*]] = arith.maxui %c0{{.*}}, %[[HEND]] : index
// RECOMPUTE: %[[DB:.*]] = arith.muli %[[T]], %c8 : index
// RECOMPUTE: %[[DEND:.*]] = arith.addi %[[DB]], %c4194304 : index
// RECOMPUTE: %[[E2:.*]] = arith.maxui %[[E1]], %[[DEND]] : index
// RECOMPUTE: %[[UP:.*]] = arith.addi %[[E2]], %c255 : index
// RECOMPUTE: %[[SIZE:.*]] = arith.andi %[[UP]], %{{.*}} : index
// RECOMPUTE-NEXT: gpu.alloc async [%{{.*}}] (%[[SIZE]]) : memref<?xi8>
// RECOMPUTE: memref.view %{{.*}}[%c4194304{{.*}}][%{{.*}}] : memref<?xi8> to memref<?x2xf32>

//--- errors.mlir
// Only the leading size may follow T.
func.func @wide(%x: tensor<?x?xbf16>, %wr: tensor<64x8xbf16>)
    -> (tensor<?x2xf32>, tensor<?x2xi32>, tensor<?x8xf32>)
    attributes {moe.max_tokens = 64 : i64} {
  // expected-error @+1 {{the GPU path needs static shapes but for the token count, got 'tensor<?x?xbf16>'}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x?xbf16>, tensor<64x8xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>, tensor<?x8xf32>
  return %w, %e, %l : tensor<?x2xf32>, tensor<?x2xi32>, tensor<?x8xf32>
}

// -----

// Without the bound, a dynamic T is refused.
func.func @unbounded(%x: tensor<?x64xbf16>, %wr: tensor<64x8xbf16>)
    -> (tensor<?x2xf32>, tensor<?x2xi32>, tensor<?x8xf32>) {
  // expected-error @+1 {{the GPU path needs static shapes (or a dynamic token count with its bound, moe.layer's max_tokens), got 'tensor<?x64xbf16>'}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x64xbf16>, tensor<64x8xbf16> -> tensor<?x2xf32>, tensor<?x2xi32>, tensor<?x8xf32>
  return %w, %e, %l : tensor<?x2xf32>, tensor<?x2xi32>, tensor<?x8xf32>
}
