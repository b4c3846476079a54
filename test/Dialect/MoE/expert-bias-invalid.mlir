// RUN: moe-opt %s -split-input-file -verify-diagnostics

// Verifier errors of the expert biases: T = 7, d = 8, E = 4, n = 6 (swiglu
// G = 12), k = 2, R = 14.

func.func @layer_bias_experts(%x: tensor<7x8xf32>, %wr: tensor<8x4xf32>, %wgu: tensor<4x8x12xf32>, %wd: tensor<4x6x8xf32>, %bgu: tensor<3x12xf32>, %bd: tensor<4x8xf32>) {
  // expected-error @+1 {{b_gate_up dimension 0}}
  %o, %l = moe.layer %x, %wr, %wgu, %wd expert_bias(%bgu, %bd : tensor<3x12xf32>, tensor<4x8xf32>) {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>} : tensor<7x8xf32>, tensor<8x4xf32>, tensor<4x8x12xf32>, tensor<4x6x8xf32> -> tensor<7x8xf32>, tensor<7x4xf32>
  return
}

// -----

func.func @layer_bias_width(%x: tensor<7x8xf32>, %wr: tensor<8x4xf32>, %wgu: tensor<4x8x12xf32>, %wd: tensor<4x6x8xf32>, %bgu: tensor<4x6xf32>, %bd: tensor<4x8xf32>) {
  // expected-error @+1 {{b_gate_up dimension 1}}
  %o, %l = moe.layer %x, %wr, %wgu, %wd expert_bias(%bgu, %bd : tensor<4x6xf32>, tensor<4x8xf32>) {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>} : tensor<7x8xf32>, tensor<8x4xf32>, tensor<4x8x12xf32>, tensor<4x6x8xf32> -> tensor<7x8xf32>, tensor<7x4xf32>
  return
}

// -----

func.func @layer_bias_down(%x: tensor<7x8xf32>, %wr: tensor<8x4xf32>, %wgu: tensor<4x8x12xf32>, %wd: tensor<4x6x8xf32>, %bgu: tensor<4x12xf32>, %bd: tensor<4x6xf32>) {
  // expected-error @+1 {{b_down dimension 1}}
  %o, %l = moe.layer %x, %wr, %wgu, %wd expert_bias(%bgu, %bd : tensor<4x12xf32>, tensor<4x6xf32>) {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>} : tensor<7x8xf32>, tensor<8x4xf32>, tensor<4x8x12xf32>, tensor<4x6x8xf32> -> tensor<7x8xf32>, tensor<7x4xf32>
  return
}

// -----

func.func @layer_bias_type(%x: tensor<7x8xf32>, %wr: tensor<8x4xf32>, %wgu: tensor<4x8x12xf32>, %wd: tensor<4x6x8xf32>, %bgu: tensor<4x12xbf16>, %bd: tensor<4x8xf32>) {
  // expected-error @+1 {{element type}}
  %o, %l = moe.layer %x, %wr, %wgu, %wd expert_bias(%bgu, %bd : tensor<4x12xbf16>, tensor<4x8xf32>) {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>} : tensor<7x8xf32>, tensor<8x4xf32>, tensor<4x8x12xf32>, tensor<4x6x8xf32> -> tensor<7x8xf32>, tensor<7x4xf32>
  return
}

// -----

func.func @layer_bias_one(%x: tensor<7x8xf32>, %wr: tensor<8x4xf32>, %wgu: tensor<4x8x12xf32>, %wd: tensor<4x6x8xf32>, %bgu: tensor<4x12xf32>) {
  // expected-error @+1 {{expected both b_gate_up and b_down, or neither}}
  %o, %l = "moe.layer"(%x, %wr, %wgu, %wd, %bgu) <{activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>, operandSegmentSizes = array<i32: 1, 1, 0, 1, 1, 0, 0, 1, 0>}> : (tensor<7x8xf32>, tensor<8x4xf32>, tensor<4x8x12xf32>, tensor<4x6x8xf32>, tensor<4x12xf32>) -> (tensor<7x8xf32>, tensor<7x4xf32>)
  return
}

// -----

func.func @ffn_bias_experts(%x: tensor<7x8xf32>, %ids: tensor<14xi32>, %offsets: tensor<5xi32>, %wgu: tensor<4x8x12xf32>, %wd: tensor<4x6x8xf32>, %bgu: tensor<4x12xf32>, %bd: tensor<5x8xf32>) {
  // expected-error @+1 {{b_down dimension 0}}
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd bias(%bgu, %bd : tensor<4x12xf32>, tensor<5x8xf32>) {activation = #moe.activation<swiglu>} : tensor<7x8xf32>, tensor<14xi32>, tensor<5xi32>, tensor<4x8x12xf32>, tensor<4x6x8xf32> -> tensor<14x8xf32>, tensor<14x12xf32>
  return
}

// -----

func.func @ffn_bias_width(%x: tensor<7x8xf32>, %ids: tensor<14xi32>, %offsets: tensor<5xi32>, %wgu: tensor<4x8x12xf32>, %wd: tensor<4x6x8xf32>, %bgu: tensor<4x13xf32>, %bd: tensor<4x8xf32>) {
  // expected-error @+1 {{b_gate_up dimension 1}}
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd bias(%bgu, %bd : tensor<4x13xf32>, tensor<4x8xf32>) {activation = #moe.activation<swiglu>} : tensor<7x8xf32>, tensor<14xi32>, tensor<5xi32>, tensor<4x8x12xf32>, tensor<4x6x8xf32> -> tensor<14x8xf32>, tensor<14x12xf32>
  return
}

// -----

func.func @grad_bias_result_type(%x: tensor<7x8xf32>, %ids: tensor<14xi32>, %offsets: tensor<5xi32>, %wgu: tensor<4x8x12xf32>, %wd: tensor<4x6x8xf32>, %h: tensor<14x12xf32>, %dy: tensor<14x8xf32>, %bgu: tensor<4x12xf32>, %bd: tensor<4x8xf32>) {
  // expected-error @+1 {{d_b_down}}
  %dx, %dwgu, %dwd, %dbgu, %dbd = moe.expert_ffn_grad %x, %ids, %offsets, %wgu, %wd, %h, %dy bias(%bgu, %bd : tensor<4x12xf32>, tensor<4x8xf32>) {activation = #moe.activation<swiglu>} : tensor<7x8xf32>, tensor<14xi32>, tensor<5xi32>, tensor<4x8x12xf32>, tensor<4x6x8xf32>, tensor<14x12xf32>, tensor<14x8xf32> -> tensor<7x8xf32>, tensor<4x8x12xf32>, tensor<4x6x8xf32>, tensor<4x12xf32>, tensor<4x7xf32>
  return
}

// -----

func.func @grad_bias_no_results(%x: tensor<7x8xf32>, %ids: tensor<14xi32>, %offsets: tensor<5xi32>, %wgu: tensor<4x8x12xf32>, %wd: tensor<4x6x8xf32>, %h: tensor<14x12xf32>, %dy: tensor<14x8xf32>, %bgu: tensor<4x12xf32>, %bd: tensor<4x8xf32>) {
  // expected-error @+1 {{expected d_b_gate_up and d_b_down results exactly when it has b_gate_up and b_down operands}}
  %dx, %dwgu, %dwd = "moe.expert_ffn_grad"(%x, %ids, %offsets, %wgu, %wd, %h, %dy, %bgu, %bd) <{activation = #moe.activation<swiglu>, operandSegmentSizes = array<i32: 1, 1, 1, 1, 1, 1, 1, 1, 1>, resultSegmentSizes = array<i32: 1, 1, 1, 0, 0>}> : (tensor<7x8xf32>, tensor<14xi32>, tensor<5xi32>, tensor<4x8x12xf32>, tensor<4x6x8xf32>, tensor<14x12xf32>, tensor<14x8xf32>, tensor<4x12xf32>, tensor<4x8xf32>) -> (tensor<7x8xf32>, tensor<4x8x12xf32>, tensor<4x6x8xf32>)
  return
}

// -----

func.func @combine_grad_bias_experts(%x: tensor<7x8xf32>, %ids: tensor<14xi32>, %offsets: tensor<5xi32>, %rows: tensor<7x2xi32>, %w: tensor<7x2xf32>, %wgu: tensor<4x8x12xf32>, %wd: tensor<4x6x8xf32>, %h: tensor<14x12xf32>, %bgu: tensor<2x12xf32>, %bd: tensor<4x8xf32>) {
  // expected-error @+1 {{b_gate_up dimension 0}}
  %dx, %dw, %dwgu, %dwd, %dbgu, %dbd = moe.expert_combine_grad %x, %ids, %offsets, %rows, %w, %wgu, %wd, %h, %x bias(%bgu, %bd : tensor<2x12xf32>, tensor<4x8xf32>) {activation = #moe.activation<swiglu>} : tensor<7x8xf32>, tensor<14xi32>, tensor<5xi32>, tensor<7x2xi32>, tensor<7x2xf32>, tensor<4x8x12xf32>, tensor<4x6x8xf32>, tensor<14x12xf32>, tensor<7x8xf32> -> tensor<7x8xf32>, tensor<7x2xf32>, tensor<4x8x12xf32>, tensor<4x6x8xf32>, tensor<2x12xf32>, tensor<4x8xf32>
  return
}
