// RUN: moe-opt %s -split-input-file -verify-diagnostics --moe-offload

// A mark on an op that has no h.
func.func @f_forward(%x: tensor<4x16xf32>, %wr: tensor<16x4xf32>)
    -> (tensor<4x4xf32>, tensor<4x4xf32>) attributes {moe.num_saved = 1 : i64} {
  // expected-error @+1 {{'moe.router' op is marked moe.plan = "offload", but only the h of moe.expert_ffn and moe.shared_expert can be offloaded}}
  %w, %e, %logits = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2>, moe.plan = "offload"}
      : tensor<4x16xf32>, tensor<16x4xf32>
      -> tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x4xf32>
  return %logits, %logits : tensor<4x4xf32>, tensor<4x4xf32>
}
func.func @f_backward(%logits: tensor<4x4xf32>, %d: tensor<4x4xf32>) -> tensor<4x4xf32>
    attributes {moe.gradient_args = array<i64: 0>} {
  return %d : tensor<4x4xf32>
}

// -----

// moe-generate-backward did not run: there is nothing to offload to.
func.func @f(%x: tensor<4x16xf32>, %sgu: tensor<16x32xf32>, %sd: tensor<16x16xf32>)
    -> tensor<4x16xf32> {
  // expected-error @+1 {{'moe.shared_expert' op is marked moe.plan = "offload", but @f has no training forward and backward: run moe-generate-backward before moe-offload}}
  %y, %h = moe.shared_expert %x, %sgu, %sd
      {activation = #moe.activation<swiglu>, moe.plan = "offload"}
      : tensor<4x16xf32>, tensor<16x32xf32>, tensor<16x16xf32> -> tensor<4x16xf32>, tensor<4x32xf32>
  return %y : tensor<4x16xf32>
}

// -----

// h is not among the saved results (here backward recomputes it).
func.func @f_forward(%x: tensor<4x16xf32>, %sgu: tensor<16x32xf32>, %sd: tensor<16x16xf32>)
    -> (tensor<4x16xf32>, tensor<4x16xf32>) attributes {moe.num_saved = 1 : i64} {
  // expected-error @+1 {{'moe.shared_expert' op is marked moe.plan = "offload", but @f_forward does not save its h for backward (nothing to offload)}}
  %y, %h = moe.shared_expert %x, %sgu, %sd
      {activation = #moe.activation<swiglu>, moe.plan = "offload"}
      : tensor<4x16xf32>, tensor<16x32xf32>, tensor<16x16xf32> -> tensor<4x16xf32>, tensor<4x32xf32>
  return %y, %x : tensor<4x16xf32>, tensor<4x16xf32>
}
func.func @f_backward(%x: tensor<4x16xf32>, %d: tensor<4x16xf32>) -> tensor<4x16xf32>
    attributes {moe.gradient_args = array<i64: 0>} {
  return %d : tensor<4x16xf32>
}

// -----

// A training forward without its backward.
// expected-error @+1 {{'func.func' op saves tensors for backward (moe.num_saved) but has no backward function @f_backward to offload them to}}
func.func @f_forward(%x: tensor<4x16xf32>, %sgu: tensor<16x32xf32>, %sd: tensor<16x16xf32>)
    -> (tensor<4x16xf32>, tensor<4x32xf32>) attributes {moe.num_saved = 1 : i64} {
  %y, %h = moe.shared_expert %x, %sgu, %sd
      {activation = #moe.activation<swiglu>, moe.plan = "offload"}
      : tensor<4x16xf32>, tensor<16x32xf32>, tensor<16x16xf32> -> tensor<4x16xf32>, tensor<4x32xf32>
  return %y, %h : tensor<4x16xf32>, tensor<4x32xf32>
}

// -----

// Backward takes the saved h with another type.
func.func @f_forward(%x: tensor<4x16xf32>, %sgu: tensor<16x32xf32>, %sd: tensor<16x16xf32>)
    -> (tensor<4x16xf32>, tensor<4x32xf32>) attributes {moe.num_saved = 1 : i64} {
  %y, %h = moe.shared_expert %x, %sgu, %sd
      {activation = #moe.activation<swiglu>, moe.plan = "offload"}
      : tensor<4x16xf32>, tensor<16x32xf32>, tensor<16x16xf32> -> tensor<4x16xf32>, tensor<4x32xf32>
  return %y, %h : tensor<4x16xf32>, tensor<4x32xf32>
}
// expected-error @+1 {{'func.func' op takes saved argument #0 of type 'tensor<4x16xf32>', but @f_forward saves h of type 'tensor<4x32xf32>' there}}
func.func @f_backward(%h: tensor<4x16xf32>, %d: tensor<4x16xf32>) -> tensor<4x16xf32>
    attributes {moe.gradient_args = array<i64: 0>} {
  return %d : tensor<4x16xf32>
}

// -----

// A mark in a backward function.
func.func @f_backward(%x: tensor<4x16xf32>, %sgu: tensor<16x32xf32>, %sd: tensor<16x16xf32>)
    -> tensor<4x16xf32> attributes {moe.gradient_args = array<i64: 0>} {
  // expected-error @+1 {{'moe.shared_expert' op is marked moe.plan = "offload" in a backward function}}
  %y, %h = moe.shared_expert %x, %sgu, %sd
      {activation = #moe.activation<swiglu>, moe.plan = "offload"}
      : tensor<4x16xf32>, tensor<16x32xf32>, tensor<16x16xf32> -> tensor<4x16xf32>, tensor<4x32xf32>
  return %y : tensor<4x16xf32>
}

// -----

// moe.num_saved larger than what the function returns.
// expected-error @+1 {{'func.func' op has moe.num_saved 3 : i64 but returns 2 values and @f_backward takes 2 arguments}}
func.func @f_forward(%x: tensor<4x16xf32>, %sgu: tensor<16x32xf32>, %sd: tensor<16x16xf32>)
    -> (tensor<4x16xf32>, tensor<4x32xf32>) attributes {moe.num_saved = 3 : i64} {
  %y, %h = moe.shared_expert %x, %sgu, %sd
      {activation = #moe.activation<swiglu>, moe.plan = "offload"}
      : tensor<4x16xf32>, tensor<16x32xf32>, tensor<16x16xf32> -> tensor<4x16xf32>, tensor<4x32xf32>
  return %y, %h : tensor<4x16xf32>, tensor<4x32xf32>
}
func.func @f_backward(%h: tensor<4x32xf32>, %d: tensor<4x16xf32>) -> tensor<4x16xf32>
    attributes {moe.gradient_args = array<i64: 0>} {
  return %d : tensor<4x16xf32>
}
