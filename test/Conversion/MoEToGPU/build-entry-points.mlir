// moe-gpu-build-entry-points gives the forward and backward host functions of a
// layer C entry points: pointer checks (null, 16-byte alignment) that return a
// moeStatus with a message naming the parameter, the call on memref
// descriptors of the static shapes on the caller's stream, and the
// workspace-bytes constants; the host functions become internal and their
// moe.gpu.* attributes move to the entry points.
// RUN: moe-opt %s --split-input-file --moe-gpu-build-entry-points --verify-diagnostics | FileCheck %s

// CHECK-DAG: llvm.mlir.global private constant @__moe_message_0("my_layer_forward: parameter 1 'x' (input, bf16 [4, 64]) is a null pointer\00")
// CHECK-DAG: llvm.mlir.global private constant @__moe_message_1("my_layer_forward: parameter 1 'x' (input, bf16 [4, 64]) is not 16-byte aligned\00")
// CHECK-DAG: llvm.func @moeClearLastError()
// CHECK-LABEL: llvm.func internal @__moe_host_my_layer_forward(
// CHECK-NOT: moe.gpu
// CHECK-LABEL: llvm.func internal @__moe_host_my_layer_backward(
// CHECK-LABEL: llvm.func @my_layer_forward(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr) -> i32
// CHECK-SAME: moe.gpu.entry = "forward"
// CHECK-SAME: moe.gpu.layer_name = "my.layer"
// CHECK-SAME: moe.gpu.workspace_bytes = 256 : i64
// CHECK: llvm.call @moeClearLastError()
// CHECK: llvm.icmp "eq"
// CHECK: llvm.cond_br
// CHECK: llvm.and
// CHECK: llvm.icmp "ne"
// CHECK: llvm.cond_br
// CHECK: llvm.call @moeSetLaunchStream(
// CHECK: llvm.call @__moe_host_my_layer_forward(
// CHECK: llvm.call @moeGetLastStatus()
// CHECK: llvm.return
// CHECK: llvm.call @moeSetErrorMessage(
// CHECK-LABEL: llvm.func @my_layer_forward_workspace_bytes() -> i64
// CHECK: llvm.mlir.constant(256 : i64)
// CHECK-LABEL: llvm.func @my_layer_backward(
// CHECK-SAME: moe.gpu.entry = "backward"
// CHECK-LABEL: llvm.func @my_layer_backward_workspace_bytes() -> i64
module {
  llvm.func @my_layer_forward(%p0: !llvm.ptr, %p1: !llvm.ptr, %o: i64, %s0: i64, %s1: i64, %t0: i64, %t1: i64)
      attributes {moe.gpu.entry = "forward", moe.gpu.layer_name = "my.layer",
                  moe.gpu.params = [{dtype = "bf16", name = "x", role = "input", shape = array<i64: 4, 64>}],
                  moe.gpu.workspace_bytes = 256 : i64, moe.gpu.layer = {T = 4 : i64}} {
    llvm.return
  }
  llvm.func @my_layer_backward(%p0: !llvm.ptr, %p1: !llvm.ptr, %o: i64, %s0: i64, %t0: i64)
      attributes {moe.gpu.entry = "backward", moe.gpu.layer_name = "my.layer",
                  moe.gpu.params = [{dtype = "f32", name = "d", role = "gradient", shape = array<i64: 8>}],
                  moe.gpu.workspace_bytes = 0 : i64} {
    llvm.return
  }
}

// -----

// expected-error @+1 {{moe-gpu-build-entry-points: no moe layer function to compile (a func.func of moe ops on tensors)}}
module {
  llvm.func @f() {
    llvm.return
  }
}

// -----

// expected-error @+1 {{moe-gpu-build-entry-points: more than one layer (@a, @b); a module compiles one}}
module {
  llvm.func @a_forward() attributes {moe.gpu.entry = "forward", moe.gpu.layer_name = "a", moe.gpu.params = [], moe.gpu.workspace_bytes = 0 : i64} {
    llvm.return
  }
  llvm.func @b_forward() attributes {moe.gpu.entry = "forward", moe.gpu.layer_name = "b", moe.gpu.params = [], moe.gpu.workspace_bytes = 0 : i64} {
    llvm.return
  }
}

// -----

module {
  // expected-error @+1 {{the host function lacks the moe.gpu.* attributes of convert-moe-to-gpu}}
  llvm.func @a_forward() attributes {moe.gpu.entry = "forward", moe.gpu.layer_name = "a"} {
    llvm.return
  }
}

// -----

module {
  // expected-error @+1 {{expected a host function with 7 arguments (expanded memref descriptors)}}
  llvm.func @a_forward(%p0: !llvm.ptr) attributes {moe.gpu.entry = "forward", moe.gpu.layer_name = "a",
      moe.gpu.params = [{dtype = "bf16", name = "x", role = "input", shape = array<i64: 4, 64>}],
      moe.gpu.workspace_bytes = 0 : i64} {
    llvm.return
  }
}

// -----

module {
  llvm.func @a_forward() attributes {moe.gpu.entry = "forward", moe.gpu.layer_name = "a", moe.gpu.params = [], moe.gpu.workspace_bytes = 0 : i64} {
    llvm.return
  }
  // expected-error @+1 {{moe-gpu-build-entry-points: @__moe_host_a_forward exists already}}
  llvm.func @__moe_host_a_forward() {
    llvm.return
  }
}
