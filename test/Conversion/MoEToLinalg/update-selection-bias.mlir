// RUN: moe-opt %s --convert-moe-to-linalg | FileCheck %s

// moe.update_selection_bias calls its kernel with the operands cast to
// dynamic shapes, rate rounded to f32 and the rule's code (sign 0,
// proportional 1); the kernel is copied into the module.
// CHECK-LABEL: func.func @update_selection_bias
// CHECK-SAME: (%[[B:.*]]: tensor<64xf32>, %[[E:.*]]: tensor<37x6xi32>)
// CHECK-DAG: %[[BD:.*]] = tensor.cast %[[B]] : tensor<64xf32> to tensor<?xf32>
// CHECK-DAG: %[[ED:.*]] = tensor.cast %[[E]] : tensor<37x6xi32> to tensor<?x?xi32>
// CHECK-DAG: %[[RATE:.*]] = arith.constant 1.000000e-03 : f32
// CHECK-DAG: %[[SIGN:.*]] = arith.constant 0 : i32
// CHECK: %[[R:.*]] = call @__moe_cpu_update_selection_bias(%[[BD]], %[[ED]], %[[RATE]], %[[SIGN]]) : (tensor<?xf32>, tensor<?x?xi32>, f32, i32) -> tensor<?xf32>
// CHECK: %[[RC:.*]] = tensor.cast %[[R]] : tensor<?xf32> to tensor<64xf32>
// CHECK: %[[PROP:.*]] = arith.constant 1 : i32
// CHECK: call @__moe_cpu_update_selection_bias(%{{.*}}, %{{.*}}, %{{.*}}, %[[PROP]])
// CHECK: func.func private @__moe_cpu_update_selection_bias(%{{.*}}: tensor<?xf32>, %{{.*}}: tensor<?x?xi32>, %{{.*}}: f32, %{{.*}}: i32) -> tensor<?xf32>
func.func @update_selection_bias(%b: tensor<64xf32>, %e: tensor<37x6xi32>) -> tensor<64xf32> {
  %b1 = moe.update_selection_bias %b, %e {rate = 1.0e-3 : f64, rule = #moe.bias_update<sign>}
      : tensor<64xf32>, tensor<37x6xi32> -> tensor<64xf32>
  %b2 = moe.update_selection_bias %b1, %e {rate = 0.5 : f64, rule = #moe.bias_update<proportional>}
      : tensor<64xf32>, tensor<37x6xi32> -> tensor<64xf32>
  return %b2 : tensor<64xf32>
}
