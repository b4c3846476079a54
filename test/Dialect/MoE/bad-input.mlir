// Diagnostics of a bad input carry file:line:col and make moe-opt fail.
// RUN: not moe-opt %s -split-input-file 2>&1 | FileCheck %s

// Malformed IR: an unknown scoring function.
func.func @malformed(%l: tensor<37x5xf32>, %e: tensor<37x2xi32>) {
  // CHECK: bad-input.mlir:[[@LINE+1]]:{{[0-9]+}}: error: expected ::mlir::moe::ScoringFunc to be one of: softmax, sigmoid
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<tanh>} : tensor<37x5xf32>, tensor<37x2xi32> -> tensor<f32>, tensor<f32>
  return
}

// -----

// Verifier error: the weights have 3 slots, the routing top_k is 2.
func.func @invalid(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // CHECK: bad-input.mlir:[[@LINE+1]]:{{[0-9]+}}: error: 'moe.router' op weights dimension 1 is 3, expected top_k = 2
  %w, %e, %logits = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x3xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}
