// RUN: moe-opt %s --moe-plan-activations="memory-budget=1408 gpu-tflops=1 report=false" | FileCheck %s
// RUN: moe-opt %s --moe-plan-activations="memory-budget=1408 gpu-tflops=1" -o /dev/null 2>&1 | FileCheck %s --check-prefix=REMARK

// Eleven candidates: more than the exhaustive search takes (10), so auto moves
// the h with the fewest added seconds per byte, one at a time. Every plan
// saves x and the ten inner outputs (1408 B), so all eleven h must go: the
// copies of the first ten hide behind the shared experts after them; the
// last has nothing after it and is recomputed.
func.func @many(%x: tensor<4x16xbf16>, %sgu: tensor<16x32xbf16>, %sd: tensor<16x16xbf16>) -> tensor<4x16xbf16> {
  %y0, %h0 = moe.shared_expert %x, %sgu, %sd {activation = #moe.activation<swiglu>} : tensor<4x16xbf16>, tensor<16x32xbf16>, tensor<16x16xbf16> -> tensor<4x16xbf16>, tensor<4x32xbf16>
  %y1, %h1 = moe.shared_expert %y0, %sgu, %sd {activation = #moe.activation<swiglu>} : tensor<4x16xbf16>, tensor<16x32xbf16>, tensor<16x16xbf16> -> tensor<4x16xbf16>, tensor<4x32xbf16>
  %y2, %h2 = moe.shared_expert %y1, %sgu, %sd {activation = #moe.activation<swiglu>} : tensor<4x16xbf16>, tensor<16x32xbf16>, tensor<16x16xbf16> -> tensor<4x16xbf16>, tensor<4x32xbf16>
  %y3, %h3 = moe.shared_expert %y2, %sgu, %sd {activation = #moe.activation<swiglu>} : tensor<4x16xbf16>, tensor<16x32xbf16>, tensor<16x16xbf16> -> tensor<4x16xbf16>, tensor<4x32xbf16>
  %y4, %h4 = moe.shared_expert %y3, %sgu, %sd {activation = #moe.activation<swiglu>} : tensor<4x16xbf16>, tensor<16x32xbf16>, tensor<16x16xbf16> -> tensor<4x16xbf16>, tensor<4x32xbf16>
  %y5, %h5 = moe.shared_expert %y4, %sgu, %sd {activation = #moe.activation<swiglu>} : tensor<4x16xbf16>, tensor<16x32xbf16>, tensor<16x16xbf16> -> tensor<4x16xbf16>, tensor<4x32xbf16>
  %y6, %h6 = moe.shared_expert %y5, %sgu, %sd {activation = #moe.activation<swiglu>} : tensor<4x16xbf16>, tensor<16x32xbf16>, tensor<16x16xbf16> -> tensor<4x16xbf16>, tensor<4x32xbf16>
  %y7, %h7 = moe.shared_expert %y6, %sgu, %sd {activation = #moe.activation<swiglu>} : tensor<4x16xbf16>, tensor<16x32xbf16>, tensor<16x16xbf16> -> tensor<4x16xbf16>, tensor<4x32xbf16>
  %y8, %h8 = moe.shared_expert %y7, %sgu, %sd {activation = #moe.activation<swiglu>} : tensor<4x16xbf16>, tensor<16x32xbf16>, tensor<16x16xbf16> -> tensor<4x16xbf16>, tensor<4x32xbf16>
  %y9, %h9 = moe.shared_expert %y8, %sgu, %sd {activation = #moe.activation<swiglu>} : tensor<4x16xbf16>, tensor<16x32xbf16>, tensor<16x16xbf16> -> tensor<4x16xbf16>, tensor<4x32xbf16>
  %y10, %h10 = moe.shared_expert %y9, %sgu, %sd {activation = #moe.activation<swiglu>} : tensor<4x16xbf16>, tensor<16x32xbf16>, tensor<16x16xbf16> -> tensor<4x16xbf16>, tensor<4x32xbf16>
  return %y10 : tensor<4x16xbf16>
}

// CHECK-LABEL: func.func @many(
// CHECK-SAME: moe.activation_plan = "partial", moe.offloaded_bytes = 2560 : i64, moe.saved_bytes = 1408 : i64
// CHECK: moe.shared_expert {{.*}}moe.plan = "offload"
// CHECK: moe.shared_expert {{.*}}moe.plan = "offload"
// CHECK: moe.shared_expert {{.*}}moe.plan = "offload"
// CHECK: moe.shared_expert {{.*}}moe.plan = "offload"
// CHECK: moe.shared_expert {{.*}}moe.plan = "offload"
// CHECK: moe.shared_expert {{.*}}moe.plan = "offload"
// CHECK: moe.shared_expert {{.*}}moe.plan = "offload"
// CHECK: moe.shared_expert {{.*}}moe.plan = "offload"
// CHECK: moe.shared_expert {{.*}}moe.plan = "offload"
// CHECK: moe.shared_expert {{.*}}moe.plan = "offload"
// CHECK: moe.checkpoint({{.*}}) {moe.plan = "recompute"}
// REMARK: planned 1408 B (1.31e-06 GiB) on the device and 2560 B (2.38e-06 GiB) on the host, 1 recomputed and 10 offloaded of 11 expert FFNs, 4096 extra FLOPs, 0.0041 us added
