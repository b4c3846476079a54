// Inputs from fuzzing and the reliability probes around it
// (docs/reliability.md) that got past the verifier and broke a pass. Each case
// says what went wrong before its fix.

// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-decompose | FileCheck %s

// moe.layer accepted T * k beyond the i32 row index range, and moe-decompose
// then built a moe.dispatch that failed its verifier (the pass "succeeded"
// with invalid IR). The layer verifier now rejects it as moe.dispatch does.
func.func @layer_rows_overflow(%x: tensor<4611686018427387904x16xf32>,
                               %wr: tensor<16x8xf32>,
                               %wgu: tensor<8x16x64xf32>,
                               %wd: tensor<8x32x16xf32>)
    -> tensor<4611686018427387904x16xf32> {
  // expected-error @+1 {{'moe.layer' op T * k (4611686018427387904 * 4) exceeds the i32 row index range}}
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 4>}
      : tensor<4611686018427387904x16xf32>, tensor<16x8xf32>,
        tensor<8x16x64xf32>, tensor<8x32x16xf32>
      -> tensor<4611686018427387904x16xf32>, tensor<4611686018427387904x8xf32>
  return %out : tensor<4611686018427387904x16xf32>
}

// -----

func.func @layer_rows_just_over(%x: tensor<1073741824x16xf32>,
                                %wr: tensor<16x8xf32>,
                                %wgu: tensor<8x16x64xf32>,
                                %wd: tensor<8x32x16xf32>)
    -> tensor<1073741824x16xf32> {
  // expected-error @+1 {{'moe.layer' op T * k (1073741824 * 2) exceeds the i32 row index range}}
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<1073741824x16xf32>, tensor<16x8xf32>, tensor<8x16x64xf32>,
        tensor<8x32x16xf32> -> tensor<1073741824x16xf32>, tensor<1073741824x8xf32>
  return %out : tensor<1073741824x16xf32>
}

// -----

// The largest T * k that fits (2^31 - 1 rows) still decomposes.
// CHECK-LABEL: func.func @layer_rows_at_limit(
// CHECK: moe.dispatch {{.*}} : tensor<2147483647x1xi32> -> tensor<2147483647xi32>, tensor<9xi32>, tensor<2147483647x1xi32>
func.func @layer_rows_at_limit(%x: tensor<2147483647x16xf32>,
                               %wr: tensor<16x8xf32>,
                               %wgu: tensor<8x16x64xf32>,
                               %wd: tensor<8x32x16xf32>)
    -> tensor<2147483647x16xf32> {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 1>}
      : tensor<2147483647x16xf32>, tensor<16x8xf32>, tensor<8x16x64xf32>,
        tensor<8x32x16xf32> -> tensor<2147483647x16xf32>, tensor<2147483647x8xf32>
  return %out : tensor<2147483647x16xf32>
}
