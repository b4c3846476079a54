// convert-moe-to-gpu on a layer with a capacity factor: its dispatch calls
// __moe_gpu_dispatch_capacity with the pairs an expert keeps,
// ceil(capacity_factor * T * k / E) bounded by T * k. A static T folds it
// (1.25 * 37 * 2 / 8 = 11.5625: 12; 64.0 * 37 * 2 / 8 = 592 is bounded by
// T * k = 74); a dynamic T computes it in f64 from the call's T, the experts'
// leading size. A dropless layer keeps __moe_gpu_dispatch.
// RUN: rm -rf %t && split-file %s %t
// RUN: moe-opt %t/static.mlir --moe-decompose --moe-plan-activations=report=false --moe-generate-backward --moe-gpu-select-kernels --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=STATIC
// RUN: moe-opt %t/dynamic.mlir --moe-decompose --moe-plan-activations=report=false --moe-generate-backward --moe-gpu-select-kernels --moe-fold-adds --moe-plan-memory --convert-moe-to-gpu | FileCheck %s --check-prefix=DYNAMIC
// RUN: moe-opt %t/ops.mlir --convert-moe-to-gpu | FileCheck %s --check-prefix=OPS
// RUN: moe-compile %t/dynamic.mlir -o %t/dyn --format=isa --kernel-cache=none --kernel-library=none --emit=llvm
// RUN: FileCheck %s --check-prefix=LLVM < %t/dyn.ll

//--- static.mlir
func.func @layer(%x: tensor<37x64xbf16>, %wr: tensor<64x8xbf16>,
                 %wgu: tensor<8x64x256xbf16>, %wd: tensor<8x128x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<37x8xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, capacity_factor = 1.25 : f64,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x64xbf16>, tensor<64x8xbf16>, tensor<8x64x256xbf16>,
        tensor<8x128x64xbf16> -> tensor<37x64xbf16>, tensor<37x8xf32>
  return %out, %logits : tensor<37x64xbf16>, tensor<37x8xf32>
}

// The forward dispatches with capacity 12; the backward reads the saved
// rows and offsets of the kept pairs and dispatches nothing.
// STATIC-LABEL: func.func @layer_forward(
// STATIC: %[[CAP:.*]] = arith.constant 12 : index
// STATIC: call @__moe_gpu_dispatch_capacity(%{{.*}}, %{{.*}}, %[[CAP]], %{{.*}}, %{{.*}}, %{{.*}}) : (!gpu.async.token, memref<?x?xi32>, index, memref<?xi32>, memref<?xi32>, memref<?x?xi32>) -> !gpu.async.token
// STATIC-NOT: call @__moe_gpu_dispatch(
// STATIC: call @__moe_gpu_expert_ffn(
// STATIC: call @__moe_gpu_combine(
// STATIC-LABEL: func.func @layer_backward(
// STATIC-NOT: call @__moe_gpu_dispatch
// STATIC: call @__moe_gpu_expert_combine_grad
// The library's host function launches the capped scan and placement.
// STATIC-LABEL: func.func private @__moe_gpu_dispatch_capacity(
// STATIC-SAME: %[[EXP:[a-z0-9]+]]: memref<?x?xi32>, %[[C:[a-z0-9]+]]: index
// STATIC: gpu.launch_func async {{.*}} @moe_kernels::@moe_dispatch_rank
// STATIC: gpu.launch_func async {{.*}} @moe_kernels::@moe_dispatch_scan_capacity {{.*}}, %[[C]] : index,
// STATIC: gpu.launch_func async {{.*}} @moe_kernels::@moe_dispatch_place_capacity {{.*}}, %[[C]] : index,

//--- dynamic.mlir
func.func @layer(%x: tensor<?x64xbf16>, %wr: tensor<64x8xbf16>,
                 %wgu: tensor<8x64x256xbf16>, %wd: tensor<8x128x64xbf16>)
    -> (tensor<?x64xbf16>, tensor<?x8xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, capacity_factor = 1.25 : f64,
       max_tokens = 4096, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x64xbf16>, tensor<64x8xbf16>, tensor<8x64x256xbf16>,
        tensor<8x128x64xbf16> -> tensor<?x64xbf16>, tensor<?x8xf32>
  return %out, %logits : tensor<?x64xbf16>, tensor<?x8xf32>
}

// min(ceil(1.25 * T * 2 / 8), T * 2) from the experts' T, in f64: bounded,
// then rounded up.
// DYNAMIC-LABEL: func.func @layer_forward(
// DYNAMIC-SAME: %{{.*}}: memref<?x2xi32>, %{{.*}}: memref<?x8xf32>,
// DYNAMIC: call @__moe_gpu_router(
// DYNAMIC: %[[T:.*]] = memref.dim %[[EXPERTS:.*]], %c0{{.*}} : memref<?x2xi32>
// DYNAMIC: %[[PAIRS:.*]] = arith.muli %[[T]], %c2 : index
// DYNAMIC: %[[CF:.*]] = arith.constant 1.250000e+00 : f64
// DYNAMIC: %[[TI:.*]] = arith.index_cast %[[T]] : index to i64
// DYNAMIC: %[[TF:.*]] = arith.sitofp %[[TI]] : i64 to f64
// DYNAMIC: %[[P0:.*]] = arith.mulf %[[CF]], %[[TF]] : f64
// DYNAMIC: %[[K:.*]] = arith.constant 2.000000e+00 : f64
// DYNAMIC: %[[P1:.*]] = arith.mulf %[[P0]], %[[K]] : f64
// DYNAMIC: %[[E:.*]] = arith.constant 8.000000e+00 : f64
// DYNAMIC: %[[Q:.*]] = arith.divf %[[P1]], %[[E]] : f64
// DYNAMIC: %[[PI:.*]] = arith.index_cast %[[PAIRS]] : index to i64
// DYNAMIC: %[[PF:.*]] = arith.sitofp %[[PI]] : i64 to f64
// DYNAMIC: %[[B:.*]] = arith.minimumf %[[Q]], %[[PF]] : f64
// DYNAMIC: %[[TR:.*]] = arith.fptosi %[[B]] : f64 to i64
// DYNAMIC: %[[TRF:.*]] = arith.sitofp %[[TR]] : i64 to f64
// DYNAMIC: %[[LT:.*]] = arith.cmpf olt, %[[TRF]], %[[B]] : f64
// DYNAMIC: %[[UP:.*]] = arith.extui %[[LT]] : i1 to i64
// DYNAMIC: %[[CI:.*]] = arith.addi %[[TR]], %[[UP]] : i64
// DYNAMIC: %[[CAP:.*]] = arith.index_cast %[[CI]] : i64 to index
// DYNAMIC: call @__moe_gpu_dispatch_capacity(%{{.*}}, %{{.*}}, %[[CAP]],
// DYNAMIC-LABEL: func.func @layer_backward(

// Lowered to LLVM, the forward computes it from the call's T.
// LLVM: sitofp i64 %{{.*}} to double
// LLVM: fptosi double %{{.*}} to i64

//--- ops.mlir
// A dispatch with and one without a capacity factor in one function.
func.func @two(%e: tensor<37x2xi32>)
    -> (tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>) {
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 4 : i64, capacity_factor = 64.0 : f64}
      : tensor<37x2xi32> -> tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>
  %ids2, %offsets2, %rows2 = moe.dispatch %e {num_experts = 4 : i64}
      : tensor<37x2xi32> -> tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>
  return %ids, %offsets, %rows, %ids2, %offsets2, %rows2
      : tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>, tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>
}

// OPS-LABEL: func.func @two(
// OPS: %[[CAP:.*]] = arith.constant 74 : index
// OPS: call @__moe_gpu_dispatch_capacity(%{{.*}}, %{{.*}}, %[[CAP]],
// OPS: call @__moe_gpu_dispatch(
// OPS-DAG: func.func private @__moe_gpu_dispatch(
// OPS-DAG: func.func private @__moe_gpu_dispatch_capacity(
