// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-plan-memory
// RUN: not moe-opt %s -split-input-file --moe-plan-memory=alignment=3 2>&1 | FileCheck %s --check-prefix=ALIGN
// RUN: not moe-opt %s -split-input-file --moe-plan-memory=memory-report=%t.missing/report 2>&1 | FileCheck %s --check-prefix=FILE

// A dynamic size: the buffer has no static size.
// ALIGN: moe-plan-memory-invalid.mlir:[[@LINE+2]]:1: error: moe-plan-memory: alignment must be a power of two, got 3
// FILE: moe-plan-memory-invalid.mlir:[[@LINE+1]]:1: error: moe-plan-memory: cannot write the memory report to '{{.*}}.missing/report': {{.*}}
func.func @dynamic(%x: tensor<?x16xf32>, %wr: tensor<16x4xf32>) -> tensor<?x4xf32> {
  // expected-error @+1 {{'moe.router' op moe-plan-memory needs static shapes, or a dynamic token count with its bound (moe.max_tokens), but moe.router.weights has type 'tensor<?x2xf32>'}}
  %w, %e, %logits = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x16xf32>, tensor<16x4xf32>
      -> tensor<?x2xf32>, tensor<?x2xi32>, tensor<?x4xf32>
  return %logits : tensor<?x4xf32>
}

// -----

// A training forward without its backward.
// expected-error @+1 {{'func.func' op saves tensors for backward (moe.num_saved) but has no backward function @f_backward}}
func.func @f_forward(%x: tensor<4x16xf32>, %wr: tensor<16x4xf32>)
    -> (tensor<4x4xf32>, tensor<4x4xf32>) attributes {moe.num_saved = 1 : i64} {
  %w, %e, %logits = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<4x16xf32>, tensor<16x4xf32>
      -> tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x4xf32>
  return %logits, %logits : tensor<4x4xf32>, tensor<4x4xf32>
}

// -----

// More saved tensors than the functions pass.
// expected-error @+1 {{'func.func' op has moe.num_saved 3 but returns 2 values and @f_backward takes 2 arguments}}
func.func @f_forward(%x: tensor<4x16xf32>, %wr: tensor<16x4xf32>)
    -> (tensor<4x4xf32>, tensor<4x4xf32>) attributes {moe.num_saved = 3 : i64} {
  %w, %e, %logits = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<4x16xf32>, tensor<16x4xf32>
      -> tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x4xf32>
  return %logits, %logits : tensor<4x4xf32>, tensor<4x4xf32>
}
func.func @f_backward(%logits: tensor<4x4xf32>, %d: tensor<4x4xf32>) -> tensor<4x4xf32>
    attributes {moe.gradient_args = array<i64: 0>} {
  return %d : tensor<4x4xf32>
}

// -----

// Bytes past 63 bits: 2^62 tokens' routing weights wrapped to a small
// count before they were checked.
func.func @bytes_wrap(%x: tensor<4611686018427387904x16xf32>, %wr: tensor<16x4xf32>)
    -> tensor<4611686018427387904x4xf32> {
  // expected-error @+1 {{'moe.router' op moe-plan-memory: the bytes of moe.router.weights ('tensor<4611686018427387904x2xf32>') do not fit in 63 bits}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<4611686018427387904x16xf32>, tensor<16x4xf32>
      -> tensor<4611686018427387904x2xf32>, tensor<4611686018427387904x2xi32>,
         tensor<4611686018427387904x4xf32>
  return %l : tensor<4611686018427387904x4xf32>
}
