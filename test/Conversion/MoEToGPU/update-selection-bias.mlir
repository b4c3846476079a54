// convert-moe-to-gpu on moe.update_selection_bias: a call of its host
// function with the rate rounded to f32 and the rule's code (sign 0,
// proportional 1). The host function zeroes the loads, counts the slots a
// thread each (moe_selection_bias_count) and moves the bias in one block
// (moe_selection_bias_update).
// RUN: moe-opt %s --split-input-file --moe-plan-memory --convert-moe-to-gpu | FileCheck %s

// CHECK-LABEL: func.func @update(
// CHECK-SAME: %[[B:[a-z0-9]+]]: memref<64xf32>, %[[E:[a-z0-9]+]]: memref<37x6xi32>, %[[R:[a-z0-9]+]]: memref<64xf32>)
// CHECK: %[[T0:.*]] = gpu.wait async
// CHECK-DAG: %[[BD:.*]] = memref.cast %[[B]] : memref<64xf32> to memref<?xf32>
// CHECK-DAG: %[[ED:.*]] = memref.cast %[[E]] : memref<37x6xi32> to memref<?x?xi32>
// CHECK-DAG: %[[RATE:.*]] = arith.constant 1.000000e-03 : f32
// CHECK-DAG: %[[SIGN:.*]] = arith.constant 0 : i32
// CHECK-DAG: %[[RD:.*]] = memref.cast %[[R]] : memref<64xf32> to memref<?xf32>
// CHECK: %[[T1:.*]] = call @__moe_gpu_update_selection_bias(%[[T0]], %[[BD]], %[[ED]], %[[RATE]], %[[SIGN]], %[[RD]]) : (!gpu.async.token, memref<?xf32>, memref<?x?xi32>, f32, i32, memref<?xf32>) -> !gpu.async.token
// CHECK: gpu.wait [%[[T1]]]
// CHECK: gpu.func @moe_selection_bias_count(
// CHECK: memref.atomic_rmw addi
// CHECK: gpu.func @moe_selection_bias_update(
// CHECK-LABEL: func.func private @__moe_gpu_update_selection_bias(
// CHECK: gpu.alloc async
// CHECK: gpu.memset async
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@moe_selection_bias_count
// CHECK: gpu.launch_func async [%{{.*}}] @moe_kernels::@moe_selection_bias_update
// CHECK: gpu.dealloc async
func.func @update(%b: tensor<64xf32>, %e: tensor<37x6xi32>) -> tensor<64xf32> {
  %r = moe.update_selection_bias %b, %e {rate = 1.0e-3 : f64, rule = #moe.bias_update<sign>}
      : tensor<64xf32>, tensor<37x6xi32> -> tensor<64xf32>
  return %r : tensor<64xf32>
}

// -----

// Two updates in a row, the second proportional: the first's result is a
// temporary the second reads.
// CHECK-LABEL: func.func @twice(
// CHECK: %[[TMP:.*]] = memref.view
// CHECK: %[[OUT1:.*]] = memref.cast %[[TMP]] : memref<256xf32> to memref<?xf32>
// CHECK: %[[T1:.*]] = call @__moe_gpu_update_selection_bias(%{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %[[OUT1]]) :
// CHECK: %[[IN2:.*]] = memref.cast %[[TMP]] : memref<256xf32> to memref<?xf32>
// CHECK: %[[HALF:.*]] = arith.constant 5.000000e-01 : f32
// CHECK: %[[P:.*]] = arith.constant 1 : i32
// CHECK: call @__moe_gpu_update_selection_bias(%[[T1]], %[[IN2]], %{{.*}}, %[[HALF]], %[[P]], %{{.*}}) :
func.func @twice(%b: tensor<256xf32>, %e: tensor<4095x8xi32>) -> tensor<256xf32> {
  %b1 = moe.update_selection_bias %b, %e {rate = 1.0e-3 : f64, rule = #moe.bias_update<sign>}
      : tensor<256xf32>, tensor<4095x8xi32> -> tensor<256xf32>
  %b2 = moe.update_selection_bias %b1, %e {rate = 0.5 : f64, rule = #moe.bias_update<proportional>}
      : tensor<256xf32>, tensor<4095x8xi32> -> tensor<256xf32>
  return %b2 : tensor<256xf32>
}
