// RUN: moe-opt %s -split-input-file -verify-diagnostics

// Parser errors of the moe dialect's attributes, types and op syntax: one
// malformed program per split. A parse failure can report a second error
// (the parameter that failed) at the same line; both are expected.

//===----------------------------------------------------------------------===//
// #moe.routing
//===----------------------------------------------------------------------===//

func.func @routing_unknown_key(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{duplicate or unknown struct parameter name: capacity}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2, capacity = 1>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @routing_duplicate_key(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{duplicate or unknown struct parameter name: top_k}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2, top_k = 3>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @routing_missing_top_k(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{struct is missing required parameter: top_k}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, renormalize = true>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @routing_missing_scoring(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{struct is missing required parameter: scoring}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<top_k = 2>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @routing_unknown_scoring(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+2 {{expected ::mlir::moe::ScoringFunc to be one of: softmax, sigmoid}}
  // expected-error @+1 {{failed to parse MoE_RoutingAttr parameter 'scoring'}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = tanh, top_k = 2>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @routing_fractional_top_k(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+2 {{expected integer value}}
  // expected-error @+1 {{failed to parse MoE_RoutingAttr parameter 'top_k'}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2.5>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @routing_top_k_overflows(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+2 {{integer value too large}}
  // expected-error @+1 {{failed to parse MoE_RoutingAttr parameter 'top_k'}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 99999999999999999999>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @routing_scaling_factor_not_a_number(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+2 {{expected floating point literal}}
  // expected-error @+1 {{failed to parse MoE_RoutingAttr parameter 'scaling_factor'}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2, scaling_factor = big>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @routing_scaling_factor_integer(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+3 {{unexpected decimal integer literal for a floating point value}}
  // expected-note @+2 {{add a trailing dot to make the literal a float}}
  // expected-error @+1 {{failed to parse MoE_RoutingAttr parameter 'scaling_factor'}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2, scaling_factor = 2>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @routing_unterminated(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{unbalanced '<' character in pretty dialect name}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @routing_not_an_attribute_of_the_kind(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{attribute 'routing' failed to satisfy constraint: router configuration: scoring, top-k and its refinements}}
  %w, %e, %l = moe.router %x, %wr {routing = 2} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @unknown_attribute(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{unknown attribute `routing_v2` in dialect `moe`}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing_v2<top_k = 2>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

//===----------------------------------------------------------------------===//
// #moe.scoring, #moe.activation and #moe.ep_overflow
//===----------------------------------------------------------------------===//

// -----

func.func @scoring_unknown(%l: tensor<37x5xf32>, %e: tensor<37x2xi32>) {
  // expected-error @+2 {{expected ::mlir::moe::ScoringFunc to be one of: softmax, sigmoid}}
  // expected-error @+1 {{failed to parse MoE_ScoringFuncAttr parameter 'value'}}
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<tanh>} : tensor<37x5xf32>, tensor<37x2xi32> -> tensor<f32>, tensor<f32>
  return
}

// -----

func.func @activation_unknown(%x: tensor<37x48xf32>, %wgu: tensor<48x64xf32>, %wd: tensor<32x48xf32>) {
  // expected-error @+2 {{expected ::mlir::moe::Activation to be one of: swiglu, gelu, silu, gelu_tanh}}
  // expected-error @+1 {{failed to parse MoE_ActivationAttr parameter 'value'}}
  %y, %h = moe.shared_expert %x, %wgu, %wd {activation = #moe.activation<relu>} : tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32> -> tensor<37x48xf32>, tensor<37x64xf32>
  return
}

// -----

func.func @ep_overflow_unknown(%y: tensor<74x48xf32>, %off: tensor<5xi32>) {
  // expected-error @+2 {{expected ::mlir::moe::EPOverflow to be one of: error, drop}}
  // expected-error @+1 {{failed to parse MoE_EPOverflowAttr parameter 'value'}}
  %s, %c, %d = moe.ep_pack %y, %off {capacity = 50 : i64, ep_size = 2 : i64, overflow = #moe.ep_overflow<spill>} : tensor<74x48xf32>, tensor<5xi32> -> tensor<100x48xf32>, tensor<2x2xi32>, tensor<2xi32>
  return
}

// -----

func.func @layer_ep_overflow_unknown(%x: tensor<37x48xf32>, %wr: tensor<48x8xf32>, %wgu: tensor<4x48x80xf32>, %wd: tensor<4x40x48xf32>) {
  // expected-error @+2 {{expected ::mlir::moe::EPOverflow to be one of: error, drop}}
  // expected-error @+1 {{failed to parse MoE_EPOverflowAttr parameter 'value'}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, ep_capacity = 64, ep_overflow = #moe.ep_overflow<block>, ep_size = 2, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x8xf32>, tensor<4x48x80xf32>, tensor<4x40x48xf32> -> tensor<37x48xf32>, tensor<37x8xf32>
  return
}

// -----

// A gather() group without its type.
func.func @ep_pack_gather_without_type(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{expected ':'}}
  %s, %c, %d = moe.ep_pack %x, %off gather(%ids) {capacity = 50 : i64, ep_size = 2 : i64} : tensor<37x48xf32>, tensor<5xi32> -> tensor<100x48xf32>, tensor<2x2xi32>, tensor<2xi32>
  return
}

//===----------------------------------------------------------------------===//
// !moe.host_tensor
//===----------------------------------------------------------------------===//

// -----

// expected-error @+1 {{expected '<'}}
func.func @host_tensor_no_parameters(%h: !moe.host_tensor) {
  return
}

// -----

// expected-error @+1 {{unbalanced '<' character in pretty dialect name}}
func.func @host_tensor_unterminated(%h: !moe.host_tensor<4xf32) {
  return
}

// -----

// expected-error @+1 {{expected 'x' in dimension list}}
func.func @host_tensor_no_element_type(%h: !moe.host_tensor<4x8>) {
  return
}

// -----

// expected-error @+1 {{type `device_tensor` in dialect `moe`}}
func.func @unknown_type(%h: !moe.device_tensor<4xf32>) {
  return
}

//===----------------------------------------------------------------------===//
// Operations
//===----------------------------------------------------------------------===//

// -----

func.func @unknown_op_custom(%x: tensor<4xf32>) {
  // expected-error @+1 {{custom op 'moe.foo' is unknown}}
  %0 = moe.foo %x : tensor<4xf32>
  return
}

// -----

func.func @unknown_op_generic(%x: tensor<4xf32>) {
  // expected-error @+1 {{unregistered operation 'moe.foo' found in dialect ('moe') that does not allow unknown operations}}
  %0 = "moe.foo"(%x) : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @missing_type_list(%y: tensor<74x48xf32>, %w: tensor<37x2xf32>, %r: tensor<37x2xi32>) {
  %out = moe.combine %y, %w, %r
  // expected-error @-1 {{expected ':'}}
  return
}

// -----

func.func @missing_operand_type(%y: tensor<74x48xf32>, %w: tensor<37x2xf32>, %r: tensor<37x2xi32>) {
  // expected-error @+1 {{expected ','}}
  %out = moe.combine %y, %w, %r : tensor<74x48xf32>, tensor<37x2xf32> -> tensor<37x48xf32>
  return
}

// -----

func.func @missing_result_type(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{expected ','}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>
  return
}

// -----

func.func @layer_shared_one_operand(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %sgu: tensor<48x64xf32>) {
  // expected-error @+1 {{expected ','}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd shared(%sgu : tensor<48x64xf32>) {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>} : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @checkpoint_type_count(%x: tensor<4xf32>) {
  // expected-error @+1 {{number of operands and types do not match: got 1 operands and 2 types}}
  %r = moe.checkpoint (%x) : (tensor<4xf32>, tensor<4xf32>) -> (tensor<4xf32>) {
  ^bb0(%a: tensor<4xf32>):
    moe.yield %a : tensor<4xf32>
  }
  return
}

// -----

// renormalize is a keyword, not an integer.
// expected-error @+2 {{expected 'true' or 'false'}}
// expected-error @+1 {{failed to parse}}
#bad_bool = #moe.routing<scoring = softmax, top_k = 2, renormalize = 1>

// -----

func.func @bias_update_unknown(%b: tensor<5xf32>, %e: tensor<37x2xi32>) {
  // expected-error @+2 {{expected ::mlir::moe::BiasUpdate to be one of: sign, proportional}}
  // expected-error @+1 {{failed to parse MoE_BiasUpdateAttr parameter 'value'}}
  %r = moe.update_selection_bias %b, %e {rate = 1.0e-3 : f64, rule = #moe.bias_update<linear>} : tensor<5xf32>, tensor<37x2xi32> -> tensor<5xf32>
  return
}
