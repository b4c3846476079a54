// RUN: moe-opt %s -split-input-file -verify-diagnostics

// Verifier errors of the moe dialect: one invalid program per split. Shapes
// used throughout: T = 37 tokens, d = 48, E = 5 experts, n = 40 (swiglu
// w_gate_up width 2n = 80), k = 2, R = T * k = 74 expert-ordered rows.

//===----------------------------------------------------------------------===//
// #moe.routing (RoutingAttr::verify)
//===----------------------------------------------------------------------===//

func.func @routing_top_k_zero(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{top_k must be at least 1, got 0}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 0>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x0xf32>, tensor<37x0xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @routing_top_k_negative(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{top_k must be at least 1, got -2}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = -2>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @routing_num_groups_zero(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{num_groups must be at least 1, got 0}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = sigmoid, top_k = 2, num_groups = 0>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @routing_topk_groups_above_num_groups(%x: tensor<37x48xf32>, %wr: tensor<48x8xf32>) {
  // expected-error @+1 {{topk_groups must be in [1, num_groups = 4], got 5}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = sigmoid, top_k = 2, num_groups = 4, topk_groups = 5>} : tensor<37x48xf32>, tensor<48x8xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x8xf32>
  return
}

// -----

func.func @routing_topk_groups_zero(%x: tensor<37x48xf32>, %wr: tensor<48x8xf32>) {
  // expected-error @+1 {{topk_groups must be in [1, num_groups = 4], got 0}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = sigmoid, top_k = 2, num_groups = 4, topk_groups = 0>} : tensor<37x48xf32>, tensor<48x8xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x8xf32>
  return
}

// -----

func.func @routing_scaling_factor_zero(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{scaling_factor must be a positive finite number, got 0}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2, scaling_factor = 0.0>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @routing_scaling_factor_negative(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{scaling_factor must be a positive finite number, got -2.5}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2, scaling_factor = -2.5>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @routing_scaling_factor_infinite(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{scaling_factor must be a positive finite number, got INF}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2, scaling_factor = 0x7FF0000000000000>} : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// !moe.host_tensor (HostTensorType::verify)
//===----------------------------------------------------------------------===//

// expected-error @+1 {{host tensor element type must be an integer or float, got 'complex<f32>'}}
func.func @host_tensor_complex_element(%h: !moe.host_tensor<4xcomplex<f32>>) {
  return
}

// -----

// expected-error @+1 {{host tensor element type must be an integer or float, got 'vector<4xf32>'}}
func.func @host_tensor_vector_element(%h: !moe.host_tensor<2x?xvector<4xf32>>) {
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.layer
//===----------------------------------------------------------------------===//

func.func @layer_x_wrong_rank(%x: tensor<37x48x1xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{operand #0 must be 2D tensor of bfloat16 type or 16-bit float or 32-bit float values, but got 'tensor<37x48x1xf32>'}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48x1xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_f64_not_allowed(%x: tensor<37x48xf64>, %wr: tensor<48x5xf64>, %wgu: tensor<5x48x80xf64>, %wd: tensor<5x40x48xf64>) {
  // expected-error @+1 {{operand #0 must be 2D tensor of bfloat16 type or 16-bit float or 32-bit float values, but got 'tensor<37x48xf64>'}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf64>, tensor<48x5xf64>, tensor<5x48x80xf64>, tensor<5x40x48xf64> -> tensor<37x48xf64>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_w_gate_up_wrong_rank(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{operand #2 must be 3D tensor of bfloat16 type or 16-bit float or 32-bit float values, but got 'tensor<48x80xf32>'}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_bias_not_f32(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %b: tensor<5xf16>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{operand #2 must be 1D tensor of 32-bit float values, but got 'tensor<5xf16>'}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd bias(%b : tensor<5xf16>) {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_logits_not_f32(%x: tensor<37x48xbf16>, %wr: tensor<48x5xbf16>, %wgu: tensor<5x48x80xbf16>, %wd: tensor<5x40x48xbf16>) {
  // expected-error @+1 {{result #1 must be 2D tensor of 32-bit float values, but got 'tensor<37x5xbf16>'}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xbf16>, tensor<48x5xbf16>, tensor<5x48x80xbf16>, tensor<5x40x48xbf16> -> tensor<37x48xbf16>, tensor<37x5xbf16>
  return
}

// -----

func.func @layer_capacity_factor_zero(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{attribute 'capacity_factor' failed to satisfy constraint: 64-bit float attribute whose value is positive}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, capacity_factor = 0.0 : f64, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_capacity_factor_negative(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{attribute 'capacity_factor' failed to satisfy constraint: 64-bit float attribute whose value is positive}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, capacity_factor = -1.25 : f64, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_router_weight_hidden(%x: tensor<37x48xf32>, %wr: tensor<64x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{router_weight dimension 0 is 64, expected d = 48}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<64x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_w_gate_up_experts(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<4x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{w_gate_up dimension 0 is 4, expected E = 5}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<4x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_w_gate_up_hidden(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x64x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{w_gate_up dimension 1 is 64, expected d = 48}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x64x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_w_down_experts(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<6x40x48xf32>) {
  // expected-error @+1 {{w_down dimension 0 is 6, expected E = 5}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<6x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_w_down_hidden(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x32xf32>) {
  // expected-error @+1 {{w_down dimension 2 is 32, expected d = 48}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x32xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_swiglu_odd_width(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x81xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{w_gate_up width is 81, expected an even width (gate and up halves of 2 * n) for swiglu}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x81xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_swiglu_half_width(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x40xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{w_gate_up width / 2 is 20, expected n = 40}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x40xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_gelu_width(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{w_gate_up width is 80, expected n = 40}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<gelu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_bias_experts(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %b: tensor<4xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{router_bias dimension 0 is 4, expected E = 5}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd bias(%b : tensor<4xf32>) {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_shared_gate_up_without_down(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %sgu: tensor<48x64xf32>) {
  // expected-error @+1 {{expected both shared_gate_up and shared_down, or neither}}
  %out, %l = "moe.layer"(%x, %wr, %wgu, %wd, %sgu) <{activation = #moe.activation<swiglu>, operandSegmentSizes = array<i32: 1, 1, 0, 1, 1, 1, 0, 0, 0>, routing = #moe.routing<scoring = softmax, top_k = 2>}>
      : (tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<48x64xf32>) -> (tensor<37x48xf32>, tensor<37x5xf32>)
  return
}

// -----

func.func @layer_shared_down_without_gate_up(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %sd: tensor<32x48xf32>) {
  // expected-error @+1 {{expected both shared_gate_up and shared_down, or neither}}
  %out, %l = "moe.layer"(%x, %wr, %wgu, %wd, %sd) <{activation = #moe.activation<swiglu>, operandSegmentSizes = array<i32: 1, 1, 0, 1, 1, 0, 1, 0, 0>, routing = #moe.routing<scoring = softmax, top_k = 2>}>
      : (tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<32x48xf32>) -> (tensor<37x48xf32>, tensor<37x5xf32>)
  return
}

// -----

func.func @layer_weight_element_type(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xbf16>, %wd: tensor<5x40x48xbf16>) {
  // expected-error @+1 {{expected one element type for activations and weights, but x has 'f32' and w_gate_up has 'bf16'}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xbf16>, tensor<5x40x48xbf16> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_out_element_type(%x: tensor<37x48xbf16>, %wr: tensor<48x5xbf16>, %wgu: tensor<5x48x80xbf16>, %wd: tensor<5x40x48xbf16>) {
  // expected-error @+1 {{expected one element type for activations and weights, but x has 'bf16' and out has 'f32'}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xbf16>, tensor<48x5xbf16>, tensor<5x48x80xbf16>, tensor<5x40x48xbf16> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_shared_element_type(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %sgu: tensor<48x64xf16>, %sd: tensor<32x48xf16>) {
  // expected-error @+1 {{expected one element type for activations and weights, but x has 'f32' and shared_gate_up has 'f16'}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd shared(%sgu, %sd : tensor<48x64xf16>, tensor<32x48xf16>) {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_out_tokens(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{out dimension 0 is 36, expected T = 37}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<36x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_out_hidden(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{out dimension 1 is 47, expected d = 48}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x47xf32>, tensor<37x5xf32>
  return
}

// -----

// A dynamic x leaves T to the first static size seen: out's.
func.func @layer_logits_tokens(%x: tensor<?x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{router_logits dimension 0 is 36, expected T = 37}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<36x5xf32>
  return
}

// -----

func.func @layer_logits_experts(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{router_logits dimension 1 is 8, expected E = 5}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x8xf32>
  return
}

// -----

func.func @layer_top_k_exceeds_experts(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{top_k (6) exceeds the number of experts (5)}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 6>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

// E is dynamic everywhere except in the bias.
func.func @layer_top_k_exceeds_bias_experts(%x: tensor<37x48xf32>, %wr: tensor<48x?xf32>, %b: tensor<4xf32>, %wgu: tensor<?x48x80xf32>, %wd: tensor<?x40x48xf32>) {
  // expected-error @+1 {{top_k (6) exceeds the number of experts (4)}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd bias(%b : tensor<4xf32>) {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 6>}
      : tensor<37x48xf32>, tensor<48x?xf32>, tensor<?x48x80xf32>, tensor<?x40x48xf32> -> tensor<37x48xf32>, tensor<37x?xf32>
  return
}

// -----

// E is dynamic in the router weight: the weights give it, and the bias is
// checked against them.
func.func @layer_bias_experts_from_weights(%x: tensor<37x48xf32>, %wr: tensor<48x?xf32>, %b: tensor<4xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{router_bias dimension 0 is 4, expected E = 5}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd bias(%b : tensor<4xf32>) {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x?xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x?xf32>
  return
}

// -----

func.func @layer_num_groups_not_dividing(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{num_groups (2) must divide the number of experts (5)}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = sigmoid, top_k = 2, num_groups = 2, topk_groups = 1>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_top_k_exceeds_group_candidates(%x: tensor<37x48xf32>, %wr: tensor<48x8xf32>, %wgu: tensor<8x48x80xf32>, %wd: tensor<8x40x48xf32>) {
  // expected-error @+1 {{top_k (3) exceeds the 2 experts of the topk_groups (1) best groups}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = sigmoid, top_k = 3, num_groups = 4, topk_groups = 1>}
      : tensor<37x48xf32>, tensor<48x8xf32>, tensor<8x48x80xf32>, tensor<8x40x48xf32> -> tensor<37x48xf32>, tensor<37x8xf32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.router
//===----------------------------------------------------------------------===//

func.func @router_experts_i64(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{result #1 must be 2D tensor of 32-bit signless integer values, but got 'tensor<37x2xi64>'}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi64>, tensor<37x5xf32>
  return
}

// -----

func.func @router_weights_not_f32(%x: tensor<37x48xbf16>, %wr: tensor<48x5xbf16>) {
  // expected-error @+1 {{result #0 must be 2D tensor of 32-bit float values, but got 'tensor<37x2xbf16>'}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xbf16>, tensor<48x5xbf16> -> tensor<37x2xbf16>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @router_x_rank_1(%x: tensor<48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{operand #0 must be 2D tensor of bfloat16 type or 16-bit float or 32-bit float values, but got 'tensor<48xf32>'}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<48xf32>, tensor<48x5xf32> -> tensor<1x2xf32>, tensor<1x2xi32>, tensor<1x5xf32>
  return
}

// -----

func.func @router_element_type(%x: tensor<37x48xf32>, %wr: tensor<48x5xbf16>) {
  // expected-error @+1 {{expected one element type for activations and weights, but x has 'f32' and router_weight has 'bf16'}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xbf16> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @router_weight_hidden(%x: tensor<37x48xf32>, %wr: tensor<32x5xf32>) {
  // expected-error @+1 {{router_weight dimension 0 is 32, expected d = 48}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<32x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @router_logits_tokens(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{logits dimension 0 is 38, expected T = 37}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<38x5xf32>
  return
}

// -----

func.func @router_logits_experts(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{logits dimension 1 is 6, expected E = 5}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x6xf32>
  return
}

// -----

// A dynamic x leaves T to the first static size seen: the logits'.
func.func @router_experts_tokens(%x: tensor<?x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{experts dimension 0 is 36, expected T = 37}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<36x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @router_experts_wrong_k(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{experts dimension 1 is 3, expected top_k = 2}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x3xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @router_weights_tokens(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{weights dimension 0 is 1, expected T = 37}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<1x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @router_weights_wrong_k(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{weights dimension 1 is 1, expected top_k = 2}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x1xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @router_top_k_exceeds_experts(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) {
  // expected-error @+1 {{top_k (6) exceeds the number of experts (5)}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 6>}
      : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x6xf32>, tensor<37x6xi32>, tensor<37x5xf32>
  return
}

// -----

func.func @router_num_groups_not_dividing(%x: tensor<37x48xf32>, %wr: tensor<48x6xf32>) {
  // expected-error @+1 {{num_groups (4) must divide the number of experts (6)}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = sigmoid, top_k = 2, num_groups = 4, topk_groups = 2>}
      : tensor<37x48xf32>, tensor<48x6xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x6xf32>
  return
}

// -----

func.func @router_top_k_exceeds_group_candidates(%x: tensor<37x48xf32>, %wr: tensor<48x256xf32>) {
  // expected-error @+1 {{top_k (8) exceeds the 4 experts of the topk_groups (2) best groups}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = sigmoid, top_k = 8, num_groups = 128, topk_groups = 2>}
      : tensor<37x48xf32>, tensor<48x256xf32> -> tensor<37x8xf32>, tensor<37x8xi32>, tensor<37x256xf32>
  return
}

// -----

func.func @router_bias_experts(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %b: tensor<6xf32>) {
  // expected-error @+1 {{bias dimension 0 is 6, expected E = 5}}
  %w, %e, %l = moe.router %x, %wr bias(%b : tensor<6xf32>) {routing = #moe.routing<scoring = sigmoid, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x5xf32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.router_grad
//===----------------------------------------------------------------------===//

func.func @router_grad_experts_i64(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %l: tensor<37x5xf32>, %e: tensor<37x2xi64>, %dw: tensor<37x2xf32>) {
  // expected-error @+1 {{operand #3 must be 2D tensor of 32-bit signless integer values, but got 'tensor<37x2xi64>'}}
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<37x5xf32>, tensor<37x2xi64>, tensor<37x2xf32> -> tensor<37x48xf32>, tensor<48x5xf32>
  return
}

// -----

func.func @router_grad_element_type(%x: tensor<37x48xbf16>, %wr: tensor<48x5xf16>, %l: tensor<37x5xf32>, %e: tensor<37x2xi32>, %dw: tensor<37x2xf32>) {
  // expected-error @+1 {{expected one element type for activations and weights, but x has 'bf16' and router_weight has 'f16'}}
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xbf16>, tensor<48x5xf16>, tensor<37x5xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x48xbf16>, tensor<48x5xf16>
  return
}

// -----

func.func @router_grad_logits_experts(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %l: tensor<37x4xf32>, %e: tensor<37x2xi32>, %dw: tensor<37x2xf32>) {
  // expected-error @+1 {{logits dimension 1 is 4, expected E = 5}}
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x48xf32>, tensor<48x5xf32>
  return
}

// -----

func.func @router_grad_experts_wrong_k(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %l: tensor<37x5xf32>, %e: tensor<37x4xi32>, %dw: tensor<37x2xf32>) {
  // expected-error @+1 {{experts dimension 1 is 4, expected top_k = 2}}
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<37x5xf32>, tensor<37x4xi32>, tensor<37x2xf32> -> tensor<37x48xf32>, tensor<48x5xf32>
  return
}

// -----

func.func @router_grad_d_weights_tokens(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %l: tensor<37x5xf32>, %e: tensor<37x2xi32>, %dw: tensor<74x2xf32>) {
  // expected-error @+1 {{d_weights dimension 0 is 74, expected T = 37}}
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<37x5xf32>, tensor<37x2xi32>, tensor<74x2xf32> -> tensor<37x48xf32>, tensor<48x5xf32>
  return
}

// -----

func.func @router_grad_d_weights_wrong_k(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %l: tensor<37x5xf32>, %e: tensor<37x2xi32>, %dw: tensor<37x5xf32>) {
  // expected-error @+1 {{d_weights dimension 1 is 5, expected top_k = 2}}
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<37x5xf32>, tensor<37x2xi32>, tensor<37x5xf32> -> tensor<37x48xf32>, tensor<48x5xf32>
  return
}

// -----

func.func @router_grad_top_k_exceeds_experts(%x: tensor<37x48xf32>, %wr: tensor<48x2xf32>, %l: tensor<37x2xf32>, %e: tensor<37x3xi32>, %dw: tensor<37x3xf32>) {
  // expected-error @+1 {{top_k (3) exceeds the number of experts (2)}}
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 3>}
      : tensor<37x48xf32>, tensor<48x2xf32>, tensor<37x2xf32>, tensor<37x3xi32>, tensor<37x3xf32> -> tensor<37x48xf32>, tensor<48x2xf32>
  return
}

// -----

func.func @router_grad_dx_type(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %l: tensor<37x5xf32>, %e: tensor<37x2xi32>, %dw: tensor<37x2xf32>) {
  // expected-error @+1 {{expected dx to have the type of x ('tensor<37x48xf32>'), got 'tensor<37x48xbf16>'}}
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<37x5xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x48xbf16>, tensor<48x5xf32>
  return
}

// -----

func.func @router_grad_d_router_weight_type(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %l: tensor<37x5xf32>, %e: tensor<37x2xi32>, %dw: tensor<37x2xf32>) {
  // expected-error @+1 {{expected d_router_weight to have the type of router_weight ('tensor<48x5xf32>'), got 'tensor<5x48xf32>'}}
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<37x5xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x48xf32>, tensor<5x48xf32>
  return
}

// -----

func.func @router_grad_logits_grad_type(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %l: tensor<37x5xf32>, %e: tensor<37x2xi32>, %dw: tensor<37x2xf32>, %dl: tensor<?x5xf32>) {
  // expected-error @+1 {{expected logits_grad to have the type of logits ('tensor<37x5xf32>'), got 'tensor<?x5xf32>'}}
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw logits_grad(%dl : tensor<?x5xf32>) {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<37x5xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x48xf32>, tensor<48x5xf32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.dispatch
//===----------------------------------------------------------------------===//

func.func @dispatch_experts_i64(%e: tensor<37x2xi64>) {
  // expected-error @+1 {{operand #0 must be 2D tensor of 32-bit signless integer values, but got 'tensor<37x2xi64>'}}
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 5 : i64}
      : tensor<37x2xi64> -> tensor<74xi32>, tensor<6xi32>, tensor<37x2xi64>
  return
}

// -----

func.func @dispatch_offsets_i64(%e: tensor<37x2xi32>) {
  // expected-error @+1 {{result #1 must be 1D tensor of 32-bit signless integer values, but got 'tensor<6xi64>'}}
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 5 : i64}
      : tensor<37x2xi32> -> tensor<74xi32>, tensor<6xi64>, tensor<37x2xi32>
  return
}

// -----

func.func @dispatch_num_experts_zero(%e: tensor<37x2xi32>) {
  // expected-error @+1 {{attribute 'num_experts' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1}}
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 0 : i64}
      : tensor<37x2xi32> -> tensor<74xi32>, tensor<1xi32>, tensor<37x2xi32>
  return
}

// -----

func.func @dispatch_num_experts_missing(%e: tensor<37x2xi32>) {
  // expected-error @+1 {{requires attribute 'num_experts'}}
  %ids, %offsets, %rows = moe.dispatch %e
      : tensor<37x2xi32> -> tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>
  return
}

// -----

func.func @dispatch_capacity_factor_zero(%e: tensor<37x2xi32>) {
  // expected-error @+1 {{attribute 'capacity_factor' failed to satisfy constraint: 64-bit float attribute whose value is positive}}
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 5 : i64, capacity_factor = 0.0 : f64}
      : tensor<37x2xi32> -> tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>
  return
}

// -----

func.func @dispatch_capacity_factor_negative(%e: tensor<37x2xi32>) {
  // expected-error @+1 {{attribute 'capacity_factor' failed to satisfy constraint: 64-bit float attribute whose value is positive}}
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 5 : i64, capacity_factor = -0.5 : f64}
      : tensor<37x2xi32> -> tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>
  return
}

// -----

func.func @dispatch_capacity_factor_f32(%e: tensor<37x2xi32>) {
  // expected-error @+1 {{attribute 'capacity_factor' failed to satisfy constraint: 64-bit float attribute whose value is positive}}
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 5 : i64, capacity_factor = 1.0 : f32}
      : tensor<37x2xi32> -> tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>
  return
}

// -----

func.func @dispatch_token_ids(%e: tensor<37x2xi32>) {
  // expected-error @+1 {{token_ids dimension 0 is 37, expected T * k = 74}}
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 5 : i64}
      : tensor<37x2xi32> -> tensor<37xi32>, tensor<6xi32>, tensor<37x2xi32>
  return
}

// -----

func.func @dispatch_offsets(%e: tensor<37x2xi32>) {
  // expected-error @+1 {{offsets dimension 0 is 5, expected num_experts + 1 = 6}}
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 5 : i64}
      : tensor<37x2xi32> -> tensor<74xi32>, tensor<5xi32>, tensor<37x2xi32>
  return
}

// -----

func.func @dispatch_rows_type(%e: tensor<37x2xi32>) {
  // expected-error @+1 {{expected rows to have the type of experts ('tensor<37x2xi32>'), got 'tensor<?x2xi32>'}}
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 5 : i64}
      : tensor<37x2xi32> -> tensor<74xi32>, tensor<6xi32>, tensor<?x2xi32>
  return
}

// -----

func.func @dispatch_top_k_exceeds_experts(%e: tensor<?x6xi32>) {
  // expected-error @+1 {{top_k (6) exceeds the number of experts (5)}}
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 5 : i64}
      : tensor<?x6xi32> -> tensor<?xi32>, tensor<6xi32>, tensor<?x6xi32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.expert_ffn
//===----------------------------------------------------------------------===//

func.func @expert_ffn_token_ids_i64(%x: tensor<37x48xf32>, %ids: tensor<74xi64>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{operand #1 must be 1D tensor of 32-bit signless integer values, but got 'tensor<74xi64>'}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi64>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<74x48xf32>, tensor<74x80xf32>
  return
}

// -----

func.func @expert_ffn_w_down_wrong_rank(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<40x48xf32>) {
  // expected-error @+1 {{operand #4 must be 3D tensor of bfloat16 type or 16-bit float or 32-bit float values, but got 'tensor<40x48xf32>'}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<40x48xf32> -> tensor<74x48xf32>, tensor<74x80xf32>
  return
}

// -----

func.func @expert_ffn_w_gate_up_hidden(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x40x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{w_gate_up dimension 1 is 40, expected d = 48}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x40x80xf32>, tensor<5x40x48xf32> -> tensor<74x48xf32>, tensor<74x80xf32>
  return
}

// -----

func.func @expert_ffn_w_down_experts(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<4x40x48xf32>) {
  // expected-error @+1 {{w_down dimension 0 is 4, expected E = 5}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<4x40x48xf32> -> tensor<74x48xf32>, tensor<74x80xf32>
  return
}

// -----

func.func @expert_ffn_w_down_hidden(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x40xf32>) {
  // expected-error @+1 {{w_down dimension 2 is 40, expected d = 48}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x40xf32> -> tensor<74x48xf32>, tensor<74x80xf32>
  return
}

// -----

func.func @expert_ffn_swiglu_odd_width(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x79xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{w_gate_up width is 79, expected an even width (gate and up halves of 2 * n) for swiglu}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x79xf32>, tensor<5x40x48xf32> -> tensor<74x48xf32>, tensor<74x79xf32>
  return
}

// -----

func.func @expert_ffn_swiglu_half_width(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x160xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{w_gate_up width / 2 is 80, expected n = 40}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x160xf32>, tensor<5x40x48xf32> -> tensor<74x48xf32>, tensor<74x160xf32>
  return
}

// -----

func.func @expert_ffn_silu_width(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{w_gate_up width is 80, expected n = 40}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<silu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<74x48xf32>, tensor<74x80xf32>
  return
}

// -----

func.func @expert_ffn_offsets(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{offsets dimension 0 is 5, expected E + 1 = 6}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<5xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<74x48xf32>, tensor<74x80xf32>
  return
}

// -----

func.func @expert_ffn_row_count(%x: tensor<37x48xf32>, %ids: tensor<75xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{expert-ordered row count (75) must be a multiple of the token count (37)}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<75xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<75x48xf32>, tensor<75x80xf32>
  return
}

// -----

func.func @expert_ffn_rows_without_tokens(%x: tensor<0x48xf32>, %ids: tensor<2xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{expert-ordered row count (2) must be a multiple of the token count (0)}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<0x48xf32>, tensor<2xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<2x48xf32>, tensor<2x80xf32>
  return
}

// -----

func.func @expert_ffn_element_type(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xbf16>) {
  // expected-error @+1 {{expected one element type for activations and weights, but x has 'f32' and w_down has 'bf16'}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xbf16> -> tensor<74x48xf32>, tensor<74x80xf32>
  return
}

// -----

func.func @expert_ffn_h_element_type(%x: tensor<37x48xf16>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf16>, %wd: tensor<5x40x48xf16>) {
  // expected-error @+1 {{expected one element type for activations and weights, but x has 'f16' and h has 'f32'}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf16>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf16>, tensor<5x40x48xf16> -> tensor<74x48xf16>, tensor<74x80xf32>
  return
}

// -----

func.func @expert_ffn_y_rows(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{y dimension 0 is 37, expected R = 74}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<74x80xf32>
  return
}

// -----

func.func @expert_ffn_y_hidden(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{y dimension 1 is 80, expected d = 48}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<74x80xf32>, tensor<74x80xf32>
  return
}

// -----

func.func @expert_ffn_h_rows(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{h dimension 0 is 111, expected R = 74}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<74x48xf32>, tensor<111x80xf32>
  return
}

// -----

func.func @expert_ffn_h_width(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{h dimension 1 is 40, expected the w_gate_up width = 80}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<74x48xf32>, tensor<74x40xf32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.expert_ffn_grad
//===----------------------------------------------------------------------===//

func.func @expert_ffn_grad_offsets(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<7xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %h: tensor<74x80xf32>, %dy: tensor<74x48xf32>) {
  // expected-error @+1 {{offsets dimension 0 is 7, expected E + 1 = 6}}
  %dx, %dwgu, %dwd = moe.expert_ffn_grad %x, %ids, %off, %wgu, %wd, %h, %dy {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<7xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<74x80xf32>, tensor<74x48xf32> -> tensor<37x48xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  return
}

// -----

func.func @expert_ffn_grad_gelu_width(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %h: tensor<74x80xf32>, %dy: tensor<74x48xf32>) {
  // expected-error @+1 {{w_gate_up width is 80, expected n = 40}}
  %dx, %dwgu, %dwd = moe.expert_ffn_grad %x, %ids, %off, %wgu, %wd, %h, %dy {activation = #moe.activation<gelu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<74x80xf32>, tensor<74x48xf32> -> tensor<37x48xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  return
}

// -----

func.func @expert_ffn_grad_row_count(%x: tensor<37x48xf32>, %ids: tensor<100xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %h: tensor<100x80xf32>, %dy: tensor<100x48xf32>) {
  // expected-error @+1 {{expert-ordered row count (100) must be a multiple of the token count (37)}}
  %dx, %dwgu, %dwd = moe.expert_ffn_grad %x, %ids, %off, %wgu, %wd, %h, %dy {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<100xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<100x80xf32>, tensor<100x48xf32> -> tensor<37x48xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  return
}

// -----

func.func @expert_ffn_grad_dy_element_type(%x: tensor<37x48xbf16>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xbf16>, %wd: tensor<5x40x48xbf16>, %h: tensor<74x80xbf16>, %dy: tensor<74x48xf32>) {
  // expected-error @+1 {{expected one element type for activations and weights, but x has 'bf16' and dy has 'f32'}}
  %dx, %dwgu, %dwd = moe.expert_ffn_grad %x, %ids, %off, %wgu, %wd, %h, %dy {activation = #moe.activation<swiglu>}
      : tensor<37x48xbf16>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xbf16>, tensor<5x40x48xbf16>, tensor<74x80xbf16>, tensor<74x48xf32> -> tensor<37x48xbf16>, tensor<5x48x80xbf16>, tensor<5x40x48xbf16>
  return
}

// -----

func.func @expert_ffn_grad_h_rows(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %h: tensor<37x80xf32>, %dy: tensor<74x48xf32>) {
  // expected-error @+1 {{h dimension 0 is 37, expected R = 74}}
  %dx, %dwgu, %dwd = moe.expert_ffn_grad %x, %ids, %off, %wgu, %wd, %h, %dy {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<37x80xf32>, tensor<74x48xf32> -> tensor<37x48xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  return
}

// -----

func.func @expert_ffn_grad_h_width(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %h: tensor<74x40xf32>, %dy: tensor<74x48xf32>) {
  // expected-error @+1 {{h dimension 1 is 40, expected the w_gate_up width = 80}}
  %dx, %dwgu, %dwd = moe.expert_ffn_grad %x, %ids, %off, %wgu, %wd, %h, %dy {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<74x40xf32>, tensor<74x48xf32> -> tensor<37x48xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  return
}

// -----

func.func @expert_ffn_grad_dy_rows(%x: tensor<37x48xf32>, %ids: tensor<?xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %h: tensor<74x80xf32>, %dy: tensor<111x48xf32>) {
  // expected-error @+1 {{dy dimension 0 is 111, expected R = 74}}
  %dx, %dwgu, %dwd = moe.expert_ffn_grad %x, %ids, %off, %wgu, %wd, %h, %dy {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<?xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<74x80xf32>, tensor<111x48xf32> -> tensor<37x48xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  return
}

// -----

func.func @expert_ffn_grad_dy_hidden(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %h: tensor<74x80xf32>, %dy: tensor<74x40xf32>) {
  // expected-error @+1 {{dy dimension 1 is 40, expected d = 48}}
  %dx, %dwgu, %dwd = moe.expert_ffn_grad %x, %ids, %off, %wgu, %wd, %h, %dy {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<74x80xf32>, tensor<74x40xf32> -> tensor<37x48xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  return
}

// -----

func.func @expert_ffn_grad_dx_type(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %h: tensor<74x80xf32>, %dy: tensor<74x48xf32>) {
  // expected-error @+1 {{expected dx to have the type of x ('tensor<37x48xf32>'), got 'tensor<74x48xf32>'}}
  %dx, %dwgu, %dwd = moe.expert_ffn_grad %x, %ids, %off, %wgu, %wd, %h, %dy {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<74x80xf32>, tensor<74x48xf32> -> tensor<74x48xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  return
}

// -----

func.func @expert_ffn_grad_d_w_gate_up_type(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %h: tensor<74x80xf32>, %dy: tensor<74x48xf32>) {
  // expected-error @+1 {{expected d_w_gate_up to have the type of w_gate_up ('tensor<5x48x80xf32>'), got 'tensor<5x48x80xbf16>'}}
  %dx, %dwgu, %dwd = moe.expert_ffn_grad %x, %ids, %off, %wgu, %wd, %h, %dy {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<74x80xf32>, tensor<74x48xf32> -> tensor<37x48xf32>, tensor<5x48x80xbf16>, tensor<5x40x48xf32>
  return
}

// -----

func.func @expert_ffn_grad_d_w_down_type(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %h: tensor<74x80xf32>, %dy: tensor<74x48xf32>) {
  // expected-error @+1 {{expected d_w_down to have the type of w_down ('tensor<5x40x48xf32>'), got 'tensor<5x48x40xf32>'}}
  %dx, %dwgu, %dwd = moe.expert_ffn_grad %x, %ids, %off, %wgu, %wd, %h, %dy {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<74x80xf32>, tensor<74x48xf32> -> tensor<37x48xf32>, tensor<5x48x80xf32>, tensor<5x48x40xf32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.shared_expert
//===----------------------------------------------------------------------===//

func.func @shared_expert_w_gate_up_wrong_rank(%x: tensor<37x48xf32>, %wgu: tensor<1x48x64xf32>, %wd: tensor<32x48xf32>) {
  // expected-error @+1 {{operand #1 must be 2D tensor of bfloat16 type or 16-bit float or 32-bit float values, but got 'tensor<1x48x64xf32>'}}
  %y, %h = moe.shared_expert %x, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<1x48x64xf32>, tensor<32x48xf32> -> tensor<37x48xf32>, tensor<37x64xf32>
  return
}

// -----

func.func @shared_expert_w_gate_up_hidden(%x: tensor<37x48xf32>, %wgu: tensor<64x64xf32>, %wd: tensor<32x48xf32>) {
  // expected-error @+1 {{w_gate_up dimension 0 is 64, expected d = 48}}
  %y, %h = moe.shared_expert %x, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<64x64xf32>, tensor<32x48xf32> -> tensor<37x48xf32>, tensor<37x64xf32>
  return
}

// -----

func.func @shared_expert_w_down_hidden(%x: tensor<37x48xf32>, %wgu: tensor<48x64xf32>, %wd: tensor<32x64xf32>) {
  // expected-error @+1 {{w_down dimension 1 is 64, expected d = 48}}
  %y, %h = moe.shared_expert %x, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x64xf32> -> tensor<37x48xf32>, tensor<37x64xf32>
  return
}

// -----

func.func @shared_expert_swiglu_odd_width(%x: tensor<37x48xf32>, %wgu: tensor<48x63xf32>, %wd: tensor<32x48xf32>) {
  // expected-error @+1 {{w_gate_up width is 63, expected an even width (gate and up halves of 2 * m) for swiglu}}
  %y, %h = moe.shared_expert %x, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<48x63xf32>, tensor<32x48xf32> -> tensor<37x48xf32>, tensor<37x63xf32>
  return
}

// -----

func.func @shared_expert_swiglu_half_width(%x: tensor<37x48xf32>, %wgu: tensor<48x64xf32>, %wd: tensor<64x48xf32>) {
  // expected-error @+1 {{w_gate_up width / 2 is 32, expected m = 64}}
  %y, %h = moe.shared_expert %x, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<48x64xf32>, tensor<64x48xf32> -> tensor<37x48xf32>, tensor<37x64xf32>
  return
}

// -----

func.func @shared_expert_gelu_width(%x: tensor<37x48xf32>, %wgu: tensor<48x64xf32>, %wd: tensor<32x48xf32>) {
  // expected-error @+1 {{w_gate_up width is 64, expected m = 32}}
  %y, %h = moe.shared_expert %x, %wgu, %wd {activation = #moe.activation<gelu>}
      : tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32> -> tensor<37x48xf32>, tensor<37x64xf32>
  return
}

// -----

func.func @shared_expert_element_type(%x: tensor<37x48xf32>, %wgu: tensor<48x64xf16>, %wd: tensor<32x48xf16>) {
  // expected-error @+1 {{expected one element type for activations and weights, but x has 'f32' and w_gate_up has 'f16'}}
  %y, %h = moe.shared_expert %x, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<48x64xf16>, tensor<32x48xf16> -> tensor<37x48xf32>, tensor<37x64xf32>
  return
}

// -----

func.func @shared_expert_y_type(%x: tensor<37x48xf32>, %wgu: tensor<48x64xf32>, %wd: tensor<32x48xf32>) {
  // expected-error @+1 {{expected y to have the type of x ('tensor<37x48xf32>'), got 'tensor<36x48xf32>'}}
  %y, %h = moe.shared_expert %x, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32> -> tensor<36x48xf32>, tensor<37x64xf32>
  return
}

// -----

func.func @shared_expert_h_tokens(%x: tensor<37x48xf32>, %wgu: tensor<48x64xf32>, %wd: tensor<32x48xf32>) {
  // expected-error @+1 {{h dimension 0 is 74, expected T = 37}}
  %y, %h = moe.shared_expert %x, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32> -> tensor<37x48xf32>, tensor<74x64xf32>
  return
}

// -----

func.func @shared_expert_h_width(%x: tensor<37x48xf32>, %wgu: tensor<48x64xf32>, %wd: tensor<32x48xf32>) {
  // expected-error @+1 {{h dimension 1 is 32, expected the w_gate_up width = 64}}
  %y, %h = moe.shared_expert %x, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32> -> tensor<37x48xf32>, tensor<37x32xf32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.shared_expert_grad
//===----------------------------------------------------------------------===//

func.func @shared_expert_grad_silu_width(%x: tensor<37x48xf32>, %wgu: tensor<48x64xf32>, %wd: tensor<32x48xf32>, %h: tensor<37x64xf32>, %dy: tensor<37x48xf32>) {
  // expected-error @+1 {{w_gate_up width is 64, expected m = 32}}
  %dx, %dwgu, %dwd = moe.shared_expert_grad %x, %wgu, %wd, %h, %dy {activation = #moe.activation<silu>}
      : tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32>, tensor<37x64xf32>, tensor<37x48xf32> -> tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32>
  return
}

// -----

func.func @shared_expert_grad_h_element_type(%x: tensor<37x48xf32>, %wgu: tensor<48x64xf32>, %wd: tensor<32x48xf32>, %h: tensor<37x64xbf16>, %dy: tensor<37x48xf32>) {
  // expected-error @+1 {{expected one element type for activations and weights, but x has 'f32' and h has 'bf16'}}
  %dx, %dwgu, %dwd = moe.shared_expert_grad %x, %wgu, %wd, %h, %dy {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32>, tensor<37x64xbf16>, tensor<37x48xf32> -> tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32>
  return
}

// -----

func.func @shared_expert_grad_h_tokens(%x: tensor<37x48xf32>, %wgu: tensor<48x64xf32>, %wd: tensor<32x48xf32>, %h: tensor<38x64xf32>, %dy: tensor<37x48xf32>) {
  // expected-error @+1 {{h dimension 0 is 38, expected T = 37}}
  %dx, %dwgu, %dwd = moe.shared_expert_grad %x, %wgu, %wd, %h, %dy {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32>, tensor<38x64xf32>, tensor<37x48xf32> -> tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32>
  return
}

// -----

func.func @shared_expert_grad_h_width(%x: tensor<37x48xf32>, %wgu: tensor<48x64xf32>, %wd: tensor<32x48xf32>, %h: tensor<37x66xf32>, %dy: tensor<37x48xf32>) {
  // expected-error @+1 {{h dimension 1 is 66, expected the w_gate_up width = 64}}
  %dx, %dwgu, %dwd = moe.shared_expert_grad %x, %wgu, %wd, %h, %dy {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32>, tensor<37x66xf32>, tensor<37x48xf32> -> tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32>
  return
}

// -----

func.func @shared_expert_grad_dy_type(%x: tensor<37x48xf32>, %wgu: tensor<48x64xf32>, %wd: tensor<32x48xf32>, %h: tensor<37x64xf32>, %dy: tensor<?x48xf32>) {
  // expected-error @+1 {{expected dy to have the type of x ('tensor<37x48xf32>'), got 'tensor<?x48xf32>'}}
  %dx, %dwgu, %dwd = moe.shared_expert_grad %x, %wgu, %wd, %h, %dy {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32>, tensor<37x64xf32>, tensor<?x48xf32> -> tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32>
  return
}

// -----

func.func @shared_expert_grad_dx_type(%x: tensor<37x48xf32>, %wgu: tensor<48x64xf32>, %wd: tensor<32x48xf32>, %h: tensor<37x64xf32>, %dy: tensor<37x48xf32>) {
  // expected-error @+1 {{expected dx to have the type of x ('tensor<37x48xf32>'), got 'tensor<37x48xf16>'}}
  %dx, %dwgu, %dwd = moe.shared_expert_grad %x, %wgu, %wd, %h, %dy {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32>, tensor<37x64xf32>, tensor<37x48xf32> -> tensor<37x48xf16>, tensor<48x64xf32>, tensor<32x48xf32>
  return
}

// -----

func.func @shared_expert_grad_d_w_gate_up_type(%x: tensor<37x48xf32>, %wgu: tensor<48x64xf32>, %wd: tensor<32x48xf32>, %h: tensor<37x64xf32>, %dy: tensor<37x48xf32>) {
  // expected-error @+1 {{expected d_w_gate_up to have the type of w_gate_up ('tensor<48x64xf32>'), got 'tensor<48x?xf32>'}}
  %dx, %dwgu, %dwd = moe.shared_expert_grad %x, %wgu, %wd, %h, %dy {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32>, tensor<37x64xf32>, tensor<37x48xf32> -> tensor<37x48xf32>, tensor<48x?xf32>, tensor<32x48xf32>
  return
}

// -----

func.func @shared_expert_grad_d_w_down_type(%x: tensor<37x48xf32>, %wgu: tensor<48x64xf32>, %wd: tensor<32x48xf32>, %h: tensor<37x64xf32>, %dy: tensor<37x48xf32>) {
  // expected-error @+1 {{expected d_w_down to have the type of w_down ('tensor<32x48xf32>'), got 'tensor<48x32xf32>'}}
  %dx, %dwgu, %dwd = moe.shared_expert_grad %x, %wgu, %wd, %h, %dy {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<48x64xf32>, tensor<32x48xf32>, tensor<37x64xf32>, tensor<37x48xf32> -> tensor<37x48xf32>, tensor<48x64xf32>, tensor<48x32xf32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.combine
//===----------------------------------------------------------------------===//

func.func @combine_weights_not_f32(%y: tensor<74x48xf32>, %w: tensor<37x2xbf16>, %r: tensor<37x2xi32>) {
  // expected-error @+1 {{operand #1 must be 2D tensor of 32-bit float values, but got 'tensor<37x2xbf16>'}}
  %out = moe.combine %y, %w, %r : tensor<74x48xf32>, tensor<37x2xbf16>, tensor<37x2xi32> -> tensor<37x48xf32>
  return
}

// -----

func.func @combine_element_type(%y: tensor<74x48xbf16>, %w: tensor<37x2xf32>, %r: tensor<37x2xi32>) {
  // expected-error @+1 {{expected one element type for activations and weights, but y has 'bf16' and out has 'f32'}}
  %out = moe.combine %y, %w, %r : tensor<74x48xbf16>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x48xf32>
  return
}

// -----

func.func @combine_rows_tokens(%y: tensor<74x48xf32>, %w: tensor<37x2xf32>, %r: tensor<36x2xi32>) {
  // expected-error @+1 {{rows dimension 0 is 36, expected T = 37}}
  %out = moe.combine %y, %w, %r : tensor<74x48xf32>, tensor<37x2xf32>, tensor<36x2xi32> -> tensor<37x48xf32>
  return
}

// -----

func.func @combine_rows_wrong_k(%y: tensor<74x48xf32>, %w: tensor<37x2xf32>, %r: tensor<37x3xi32>) {
  // expected-error @+1 {{rows dimension 1 is 3, expected k = 2}}
  %out = moe.combine %y, %w, %r : tensor<74x48xf32>, tensor<37x2xf32>, tensor<37x3xi32> -> tensor<37x48xf32>
  return
}

// -----

func.func @combine_out_tokens(%y: tensor<74x48xf32>, %w: tensor<37x2xf32>, %r: tensor<37x2xi32>) {
  // expected-error @+1 {{out dimension 0 is 74, expected T = 37}}
  %out = moe.combine %y, %w, %r : tensor<74x48xf32>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<74x48xf32>
  return
}

// -----

func.func @combine_y_hidden(%y: tensor<74x40xf32>, %w: tensor<37x2xf32>, %r: tensor<37x2xi32>) {
  // expected-error @+1 {{y dimension 1 is 40, expected d = 48}}
  %out = moe.combine %y, %w, %r : tensor<74x40xf32>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x48xf32>
  return
}

// -----

func.func @combine_y_rows(%y: tensor<37x48xf32>, %w: tensor<37x2xf32>, %r: tensor<37x2xi32>) {
  // expected-error @+1 {{y dimension 0 is 37, expected T * k = 74}}
  %out = moe.combine %y, %w, %r : tensor<37x48xf32>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x48xf32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.combine_grad
//===----------------------------------------------------------------------===//

func.func @combine_grad_element_type(%dout: tensor<37x48xbf16>, %w: tensor<37x2xf32>, %r: tensor<37x2xi32>, %y: tensor<74x48xf32>) {
  // expected-error @+1 {{expected one element type for activations and weights, but y has 'f32' and dout has 'bf16'}}
  %dy, %dw = moe.combine_grad %dout, %w, %r, %y
      : tensor<37x48xbf16>, tensor<37x2xf32>, tensor<37x2xi32>, tensor<74x48xf32> -> tensor<74x48xf32>, tensor<37x2xf32>
  return
}

// -----

func.func @combine_grad_dout_tokens(%dout: tensor<36x48xf32>, %w: tensor<?x2xf32>, %r: tensor<37x2xi32>, %y: tensor<74x48xf32>) {
  // expected-error @+1 {{dout dimension 0 is 36, expected T = 37}}
  %dy, %dw = moe.combine_grad %dout, %w, %r, %y
      : tensor<36x48xf32>, tensor<?x2xf32>, tensor<37x2xi32>, tensor<74x48xf32> -> tensor<74x48xf32>, tensor<?x2xf32>
  return
}

// -----

func.func @combine_grad_y_rows(%dout: tensor<37x48xf32>, %w: tensor<37x2xf32>, %r: tensor<37x2xi32>, %y: tensor<111x48xf32>) {
  // expected-error @+1 {{y dimension 0 is 111, expected T * k = 74}}
  %dy, %dw = moe.combine_grad %dout, %w, %r, %y
      : tensor<37x48xf32>, tensor<37x2xf32>, tensor<37x2xi32>, tensor<111x48xf32> -> tensor<111x48xf32>, tensor<37x2xf32>
  return
}

// -----

func.func @combine_grad_dy_type(%dout: tensor<37x48xf32>, %w: tensor<37x2xf32>, %r: tensor<37x2xi32>, %y: tensor<74x48xf32>) {
  // expected-error @+1 {{expected dy to have the type of y ('tensor<74x48xf32>'), got 'tensor<37x48xf32>'}}
  %dy, %dw = moe.combine_grad %dout, %w, %r, %y
      : tensor<37x48xf32>, tensor<37x2xf32>, tensor<37x2xi32>, tensor<74x48xf32> -> tensor<37x48xf32>, tensor<37x2xf32>
  return
}

// -----

func.func @combine_grad_d_weights_type(%dout: tensor<37x48xf32>, %w: tensor<37x2xf32>, %r: tensor<37x2xi32>, %y: tensor<74x48xf32>) {
  // expected-error @+1 {{expected d_weights to have the type of weights ('tensor<37x2xf32>'), got 'tensor<37x?xf32>'}}
  %dy, %dw = moe.combine_grad %dout, %w, %r, %y
      : tensor<37x48xf32>, tensor<37x2xf32>, tensor<37x2xi32>, tensor<74x48xf32> -> tensor<74x48xf32>, tensor<37x?xf32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.aux_loss and moe.aux_loss_grad
//===----------------------------------------------------------------------===//

func.func @aux_loss_logits_not_f32(%l: tensor<37x5xbf16>, %e: tensor<37x2xi32>) {
  // expected-error @+1 {{operand #0 must be 2D tensor of 32-bit float values, but got 'tensor<37x5xbf16>'}}
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<softmax>} : tensor<37x5xbf16>, tensor<37x2xi32> -> tensor<f32>, tensor<f32>
  return
}

// -----

func.func @aux_loss_result_not_scalar(%l: tensor<37x5xf32>, %e: tensor<37x2xi32>) {
  // expected-error @+1 {{result #0 must be 0D tensor of 32-bit float values, but got 'tensor<1xf32>'}}
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<softmax>} : tensor<37x5xf32>, tensor<37x2xi32> -> tensor<1xf32>, tensor<f32>
  return
}

// -----

func.func @aux_loss_experts_tokens(%l: tensor<37x5xf32>, %e: tensor<36x2xi32>) {
  // expected-error @+1 {{experts dimension 0 is 36, expected T = 37}}
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<softmax>} : tensor<37x5xf32>, tensor<36x2xi32> -> tensor<f32>, tensor<f32>
  return
}

// -----

func.func @aux_loss_top_k_exceeds_experts(%l: tensor<37x5xf32>, %e: tensor<37x6xi32>) {
  // expected-error @+1 {{top_k (6) exceeds the number of experts (5)}}
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<sigmoid>} : tensor<37x5xf32>, tensor<37x6xi32> -> tensor<f32>, tensor<f32>
  return
}

// -----

func.func @aux_loss_grad_scalar_operand(%l: tensor<37x5xf32>, %e: tensor<37x2xi32>, %dlb: tensor<1xf32>, %dz: tensor<f32>) {
  // expected-error @+1 {{operand #2 must be 0D tensor of 32-bit float values, but got 'tensor<1xf32>'}}
  %dl = moe.aux_loss_grad %l, %e, %dlb, %dz {scoring = #moe.scoring<softmax>} : tensor<37x5xf32>, tensor<37x2xi32>, tensor<1xf32>, tensor<f32> -> tensor<37x5xf32>
  return
}

// -----

func.func @aux_loss_grad_d_logits_type(%l: tensor<?x5xf32>, %e: tensor<37x2xi32>, %dlb: tensor<f32>, %dz: tensor<f32>) {
  // expected-error @+1 {{expected d_logits to have the type of logits ('tensor<?x5xf32>'), got 'tensor<37x5xf32>'}}
  %dl = moe.aux_loss_grad %l, %e, %dlb, %dz {scoring = #moe.scoring<softmax>} : tensor<?x5xf32>, tensor<37x2xi32>, tensor<f32>, tensor<f32> -> tensor<37x5xf32>
  return
}

// -----

func.func @aux_loss_grad_experts_tokens(%l: tensor<37x5xf32>, %e: tensor<74x2xi32>, %dlb: tensor<f32>, %dz: tensor<f32>) {
  // expected-error @+1 {{experts dimension 0 is 74, expected T = 37}}
  %dl = moe.aux_loss_grad %l, %e, %dlb, %dz {scoring = #moe.scoring<softmax>} : tensor<37x5xf32>, tensor<74x2xi32>, tensor<f32>, tensor<f32> -> tensor<37x5xf32>
  return
}

// -----

func.func @aux_loss_grad_top_k_exceeds_experts(%l: tensor<37x1xf32>, %e: tensor<37x2xi32>, %dlb: tensor<f32>, %dz: tensor<f32>) {
  // expected-error @+1 {{top_k (2) exceeds the number of experts (1)}}
  %dl = moe.aux_loss_grad %l, %e, %dlb, %dz {scoring = #moe.scoring<softmax>} : tensor<37x1xf32>, tensor<37x2xi32>, tensor<f32>, tensor<f32> -> tensor<37x1xf32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.checkpoint and moe.yield
//===----------------------------------------------------------------------===//

func.func @checkpoint_region_argument_count(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) -> tensor<37x48xf32> {
  // expected-error @+1 {{expected 2 region arguments (one per input), got 1}}
  %r = moe.checkpoint (%x, %wr) : (tensor<37x48xf32>, tensor<48x5xf32>) -> (tensor<37x48xf32>) {
  ^bb0(%a: tensor<37x48xf32>):
    moe.yield %a : tensor<37x48xf32>
  }
  return %r : tensor<37x48xf32>
}

// -----

func.func @checkpoint_region_argument_type(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>) -> tensor<37x48xf32> {
  // expected-error @+1 {{region argument #1 has type 'tensor<48x5xbf16>', but input #1 has type 'tensor<48x5xf32>'}}
  %r = moe.checkpoint (%x, %wr) : (tensor<37x48xf32>, tensor<48x5xf32>) -> (tensor<37x48xf32>) {
  ^bb0(%a: tensor<37x48xf32>, %b: tensor<48x5xbf16>):
    moe.yield %a : tensor<37x48xf32>
  }
  return %r : tensor<37x48xf32>
}

// -----

func.func @checkpoint_yield_count(%x: tensor<37x48xf32>) -> tensor<37x48xf32> {
  // expected-error @+1 {{expected the region to yield one value per result (1), got 2}}
  %r = moe.checkpoint (%x) : (tensor<37x48xf32>) -> (tensor<37x48xf32>) {
  ^bb0(%a: tensor<37x48xf32>):
    moe.yield %a, %a : tensor<37x48xf32>, tensor<37x48xf32>
  }
  return %r : tensor<37x48xf32>
}

// -----

// Without an explicit terminator the region ends in an empty moe.yield.
func.func @checkpoint_implicit_yield_count(%x: tensor<37x48xf32>) -> tensor<37x48xf32> {
  // expected-error @+1 {{expected the region to yield one value per result (1), got 0}}
  %r = moe.checkpoint (%x) : (tensor<37x48xf32>) -> (tensor<37x48xf32>) {
  ^bb0(%a: tensor<37x48xf32>):
  }
  return %r : tensor<37x48xf32>
}

// -----

func.func @checkpoint_yield_type(%x: tensor<37x48xf32>) -> tensor<?x48xf32> {
  // expected-error @+1 {{yielded value #0 has type 'tensor<37x48xf32>', but result #0 has type 'tensor<?x48xf32>'}}
  %r = moe.checkpoint (%x) : (tensor<37x48xf32>) -> (tensor<?x48xf32>) {
  ^bb0(%a: tensor<37x48xf32>):
    moe.yield %a : tensor<37x48xf32>
  }
  return %r : tensor<?x48xf32>
}

// -----

func.func @checkpoint_two_blocks() {
  // expected-error @+1 {{expects region #0 to have 0 or 1 blocks}}
  "moe.checkpoint"() ({
  ^bb0:
    "moe.yield"() : () -> ()
  ^bb1:
    "moe.yield"() : () -> ()
  }) : () -> ()
  return
}

// -----

func.func @checkpoint_not_isolated(%x: tensor<37x48xf32>) -> tensor<37x48xf32> {
  // expected-note @+1 {{required by region isolation constraints}}
  %r = moe.checkpoint () : () -> (tensor<37x48xf32>) {
    // expected-error @+1 {{using value defined outside the region}}
    moe.yield %x : tensor<37x48xf32>
  }
  return %r : tensor<37x48xf32>
}

// -----

func.func @yield_outside_checkpoint(%x: tensor<37x48xf32>) {
  // expected-error @+1 {{expects parent op 'moe.checkpoint'}}
  moe.yield %x : tensor<37x48xf32>
}

// -----

//===----------------------------------------------------------------------===//
// moe.offload and moe.prefetch
//===----------------------------------------------------------------------===//

func.func @offload_shape(%h: tensor<74x80xbf16>) {
  // expected-error @+1 {{device tensor 'tensor<74x80xbf16>' and host tensor '!moe.host_tensor<80x74xbf16>' must have the same shape and element type}}
  %host = moe.offload %h : tensor<74x80xbf16> -> !moe.host_tensor<80x74xbf16>
  return
}

// -----

func.func @offload_element_type(%h: tensor<74x80xbf16>) {
  // expected-error @+1 {{device tensor 'tensor<74x80xbf16>' and host tensor '!moe.host_tensor<74x80xf32>' must have the same shape and element type}}
  %host = moe.offload %h : tensor<74x80xbf16> -> !moe.host_tensor<74x80xf32>
  return
}

// -----

func.func @offload_unranked(%h: tensor<*xbf16>) {
  // expected-error @+1 {{operand #0 must be ranked tensor of any type values, but got 'tensor<*xbf16>'}}
  %host = "moe.offload"(%h) : (tensor<*xbf16>) -> !moe.host_tensor<74x80xbf16>
  return
}

// -----

func.func @prefetch_dynamic_vs_static(%host: !moe.host_tensor<?x80xbf16>) {
  // expected-error @+1 {{device tensor 'tensor<74x80xbf16>' and host tensor '!moe.host_tensor<?x80xbf16>' must have the same shape and element type}}
  %h = moe.prefetch %host : !moe.host_tensor<?x80xbf16> -> tensor<74x80xbf16>
  return
}

// -----

func.func @prefetch_element_type(%host: !moe.host_tensor<74x80xbf16>) {
  // expected-error @+1 {{device tensor 'tensor<74x80xf16>' and host tensor '!moe.host_tensor<74x80xbf16>' must have the same shape and element type}}
  %h = moe.prefetch %host : !moe.host_tensor<74x80xbf16> -> tensor<74x80xf16>
  return
}

// -----

func.func @prefetch_from_device_tensor(%h: tensor<74x80xbf16>) {
  // expected-error @+1 {{operand #0 must be a tensor that lives in pinned host memory, but got 'tensor<74x80xbf16>'}}
  %d = "moe.prefetch"(%h) : (tensor<74x80xbf16>) -> tensor<74x80xbf16>
  return
}

// -----

// E is static only on the bias: routing rules still apply.
func.func @router_bias_gives_experts(%x: tensor<37x48xf32>, %wr: tensor<48x?xf32>, %b: tensor<5xf32>) {
  // expected-error @+1 {{top_k (6) exceeds the number of experts (5)}}
  %w, %e, %l = moe.router %x, %wr bias(%b : tensor<5xf32>) {routing = #moe.routing<scoring = softmax, top_k = 6>} : tensor<37x48xf32>, tensor<48x?xf32> -> tensor<37x6xf32>, tensor<37x6xi32>, tensor<37x?xf32>
  return
}

// -----

func.func @router_bias_groups(%x: tensor<37x48xf32>, %wr: tensor<48x?xf32>, %b: tensor<5xf32>) {
  // expected-error @+1 {{num_groups (2) must divide the number of experts (5)}}
  %w, %e, %l = moe.router %x, %wr bias(%b : tensor<5xf32>) {routing = #moe.routing<scoring = softmax, top_k = 2, num_groups = 2>} : tensor<37x48xf32>, tensor<48x?xf32> -> tensor<37x2xf32>, tensor<37x2xi32>, tensor<37x?xf32>
  return
}

// -----

// Sizes that only the results give are checked too.
func.func @expert_ffn_rows_from_results(%x: tensor<37x48xf32>, %ids: tensor<?xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x?xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{expert-ordered row count (75) must be a multiple of the token count (37)}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<swiglu>} : tensor<37x48xf32>, tensor<?xi32>, tensor<6xi32>, tensor<5x48x?xf32>, tensor<5x40x48xf32> -> tensor<75x48xf32>, tensor<75x80xf32>
  return
}

// -----

func.func @expert_ffn_width_from_h(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x?xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{w_gate_up width is 81, expected an even width (gate and up halves of 2 * n) for swiglu}}
  %y, %h = moe.expert_ffn %x, %ids, %off, %wgu, %wd {activation = #moe.activation<swiglu>} : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x?xf32>, tensor<5x40x48xf32> -> tensor<74x48xf32>, tensor<74x81xf32>
  return
}

// -----

func.func @expert_ffn_grad_rows_from_h(%x: tensor<37x48xf32>, %ids: tensor<?xi32>, %off: tensor<6xi32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %h: tensor<75x80xf32>, %dy: tensor<75x48xf32>) {
  // expected-error @+1 {{expert-ordered row count (75) must be a multiple of the token count (37)}}
  %dx, %dwgu, %dwd = moe.expert_ffn_grad %x, %ids, %off, %wgu, %wd, %h, %dy {activation = #moe.activation<swiglu>} : tensor<37x48xf32>, tensor<?xi32>, tensor<6xi32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<75x80xf32>, tensor<75x48xf32> -> tensor<37x48xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  return
}

// -----

func.func @shared_expert_width_from_h(%x: tensor<37x48xf32>, %wgu: tensor<48x?xf32>, %wd: tensor<32x48xf32>) {
  // expected-error @+1 {{w_gate_up width is 63, expected an even width (gate and up halves of 2 * m) for swiglu}}
  %y, %h = moe.shared_expert %x, %wgu, %wd {activation = #moe.activation<swiglu>} : tensor<37x48xf32>, tensor<48x?xf32>, tensor<32x48xf32> -> tensor<37x48xf32>, tensor<37x63xf32>
  return
}

// -----

// Shared-expert errors of moe.layer name the shared operands.
func.func @layer_shared_names(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %sgu: tensor<64x64xf32>, %sd: tensor<32x48xf32>) {
  // expected-error @+1 {{shared_gate_up dimension 0 is 64, expected d = 48}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd shared(%sgu, %sd : tensor<64x64xf32>, tensor<32x48xf32>) {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>} : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_shared_width(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %sgu: tensor<48x64xf32>, %sd: tensor<30x48xf32>) {
  // expected-error @+1 {{shared_gate_up width / 2 is 32, expected m = 30}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd shared(%sgu, %sd : tensor<48x64xf32>, tensor<30x48xf32>) {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>} : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_shared_down_name(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %sgu: tensor<48x64xf32>, %sd: tensor<32x47xf32>) {
  // expected-error @+1 {{shared_down dimension 1 is 47, expected d = 48}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd shared(%sgu, %sd : tensor<48x64xf32>, tensor<32x47xf32>) {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>} : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

// k = 0 read from a shape.
func.func @dispatch_zero_k(%e: tensor<37x0xi32>) {
  // expected-error @+1 {{k (dimension 1 of experts) must be at least 1, got 0}}
  %ids, %off, %rows = moe.dispatch %e {num_experts = 5 : i64} : tensor<37x0xi32> -> tensor<0xi32>, tensor<6xi32>, tensor<37x0xi32>
  return
}

// -----

func.func @combine_zero_k(%y: tensor<0x48xf32>, %w: tensor<37x0xf32>, %rows: tensor<37x0xi32>) {
  // expected-error @+1 {{k (dimension 1 of weights) must be at least 1, got 0}}
  %out = moe.combine %y, %w, %rows : tensor<0x48xf32>, tensor<37x0xf32>, tensor<37x0xi32> -> tensor<37x48xf32>
  return
}

// -----

func.func @aux_loss_zero_k(%l: tensor<37x5xf32>, %e: tensor<37x0xi32>) {
  // expected-error @+1 {{k (dimension 1 of experts) must be at least 1, got 0}}
  %lb, %z = moe.aux_loss %l, %e {scoring = #moe.scoring<softmax>} : tensor<37x5xf32>, tensor<37x0xi32> -> tensor<f32>, tensor<f32>
  return
}

// -----

func.func @capacity_factor_inf(%e: tensor<37x2xi32>) {
  // expected-error @+1 {{attribute 'capacity_factor' failed to satisfy constraint: 64-bit float attribute whose value is positive and finite}}
  %ids, %off, %rows = moe.dispatch %e {num_experts = 5 : i64, capacity_factor = 0x7FF0000000000000 : f64} : tensor<37x2xi32> -> tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>
  return
}

// -----

func.func @offload_encoding(%x: tensor<4xf32, "a">) {
  // expected-error @+1 {{must have the same shape and element type, and the device tensor no encoding}}
  %h = moe.offload %x : tensor<4xf32, "a"> -> !moe.host_tensor<4xf32>
  return
}

// -----

// Index ranges: rows, experts and offsets are i32.
func.func @dispatch_too_many_experts(%e: tensor<37x2xi32>) {
  // expected-error @+1 {{attribute 'num_experts' failed to satisfy constraint}}
  %ids, %off, %rows = moe.dispatch %e {num_experts = 9223372036854775807 : i64} : tensor<37x2xi32> -> tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>
  return
}

// -----

func.func @dispatch_rows_overflow(%e: tensor<4611686018427387904x2xi32>) {
  // expected-error @+1 {{T * k (4611686018427387904 * 2) exceeds the i32 row index range}}
  %ids, %off, %rows = moe.dispatch %e {num_experts = 4 : i64} : tensor<4611686018427387904x2xi32> -> tensor<?xi32>, tensor<5xi32>, tensor<4611686018427387904x2xi32>
  return
}

// -----

func.func @router_experts_range(%x: tensor<4x8xf32>, %wr: tensor<8x4294967296xf32>) {
  // expected-error @+1 {{the number of experts (4294967296) exceeds the i32 expert index range}}
  %w, %e, %l = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>} : tensor<4x8xf32>, tensor<8x4294967296xf32> -> tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x4294967296xf32>
  return
}

// -----

func.func @expert_combine_grad_rows_tokens(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %rows: tensor<36x2xi32>, %w: tensor<37x2xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %h: tensor<74x80xf32>, %dout: tensor<37x48xf32>) {
  // expected-error @+1 {{rows dimension 0 is 36, expected T = 37}}
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<36x2xi32>, tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<74x80xf32>, tensor<37x48xf32> -> tensor<37x48xf32>, tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  return
}

// -----

func.func @expert_combine_grad_weights_k(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %rows: tensor<37x2xi32>, %w: tensor<37x3xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %h: tensor<74x80xf32>, %dout: tensor<37x48xf32>) {
  // expected-error @+1 {{weights dimension 1 is 3, expected k = 2}}
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>, tensor<37x3xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<74x80xf32>, tensor<37x48xf32> -> tensor<37x48xf32>, tensor<37x3xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  return
}

// -----

func.func @expert_combine_grad_pairs(%x: tensor<37x48xf32>, %ids: tensor<111xi32>, %off: tensor<6xi32>, %rows: tensor<37x2xi32>, %w: tensor<37x2xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %h: tensor<111x80xf32>, %dout: tensor<37x48xf32>) {
  // expected-error @+1 {{the row count R is 111, expected T * k = 74}}
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x48xf32>, tensor<111xi32>, tensor<6xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<111x80xf32>, tensor<37x48xf32> -> tensor<37x48xf32>, tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  return
}

// -----

func.func @expert_combine_grad_dout(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %rows: tensor<37x2xi32>, %w: tensor<37x2xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %h: tensor<74x80xf32>, %dout: tensor<37x47xf32>) {
  // expected-error @+1 {{expected dout to have the type of x ('tensor<37x48xf32>'), got 'tensor<37x47xf32>'}}
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<74x80xf32>, tensor<37x47xf32> -> tensor<37x48xf32>, tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  return
}

// -----

func.func @expert_combine_grad_dweights(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %rows: tensor<37x2xi32>, %w: tensor<37x2xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %h: tensor<74x80xf32>, %dout: tensor<37x48xf32>) {
  // expected-error @+1 {{expected d_weights to have the type of weights}}
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<74x80xf32>, tensor<37x48xf32> -> tensor<37x48xf32>, tensor<37x1xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  return
}

// -----

func.func @expert_combine_grad_h_width(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<6xi32>, %rows: tensor<37x2xi32>, %w: tensor<37x2xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %h: tensor<74x81xf32>, %dout: tensor<37x48xf32>) {
  // expected-error @+1 {{h dimension 1 is 81, expected the w_gate_up width = 80}}
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %off, %rows, %w, %wgu, %wd, %h, %dout {activation = #moe.activation<swiglu>} : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<74x81xf32>, tensor<37x48xf32> -> tensor<37x48xf32>, tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  return
}

// -----

func.func @combine_accumulate_type(%y: tensor<74x48xf32>, %w: tensor<37x2xf32>, %rows: tensor<37x2xi32>, %a: tensor<?x48xf32>) {
  // expected-error @+1 {{expected accumulate to have the type of out ('tensor<37x48xf32>'), got 'tensor<?x48xf32>'}}
  %out = moe.combine %y, %w, %rows accumulate(%a : tensor<?x48xf32>)
      : tensor<74x48xf32>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x48xf32>
  return
}

// -----

func.func @router_grad_accumulate_type(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>, %l: tensor<37x5xf32>, %e: tensor<37x2xi32>, %dw: tensor<37x2xf32>, %a: tensor<37x48xbf16>) {
  // expected-error @+1 {{expected accumulate to have the type of dx ('tensor<37x48xf32>'), got 'tensor<37x48xbf16>'}}
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw accumulate(%a : tensor<37x48xbf16>) {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<37x5xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x48xf32>, tensor<48x5xf32>
  return
}

// -----

func.func @expert_combine_grad_accumulate_type(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %offsets: tensor<6xi32>, %rows: tensor<37x2xi32>, %w: tensor<37x2xf32>, %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>, %h: tensor<74x80xf32>, %dout: tensor<37x48xf32>, %a: tensor<37x40xf32>) {
  // expected-error @+1 {{expected accumulate to have the type of dx ('tensor<37x48xf32>'), got 'tensor<37x40xf32>'}}
  %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %ids, %offsets, %rows, %w, %wgu, %wd, %h, %dout accumulate(%a : tensor<37x40xf32>) {activation = #moe.activation<swiglu>}
      : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>, tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>, tensor<74x80xf32>, tensor<37x48xf32>
      -> tensor<37x48xf32>, tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
  return
}

// -----

// A dynamic token count is served up to a bound, which the layer needs.
func.func @layer_dynamic_without_bound(%x: tensor<?x48xf32>, %wr: tensor<48x5xf32>,
                                       %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{has a dynamic token count and needs max_tokens, the bound it is planned and compiled for}}
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
        -> tensor<?x48xf32>, tensor<?x5xf32>
  return
}

// -----

func.func @layer_static_other_bound(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>,
                                    %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{has max_tokens = 64 but a static token count T = 37 (a static T is its own bound)}}
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, max_tokens = 64,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
        -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_bound_not_positive(%x: tensor<?x48xf32>, %wr: tensor<48x5xf32>,
                                    %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      // expected-error @+1 {{attribute 'max_tokens' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1}}
      {activation = #moe.activation<swiglu>, max_tokens = 0,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
        -> tensor<?x48xf32>, tensor<?x5xf32>
  return
}

// -----

func.func @layer_bound_rows_overflow(%x: tensor<?x48xf32>, %wr: tensor<48x5xf32>,
                                     %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) {
  // expected-error @+1 {{max_tokens * k (1073741824 * 2) exceeds the i32 row index range}}
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>, max_tokens = 1073741824,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>
        -> tensor<?x48xf32>, tensor<?x5xf32>
  return
}

// -----

// The bound on a function: a positive i64, on a function only.
// expected-error @+1 {{'moe.max_tokens' must be a positive i64 on a function (the bound on its layers' token count), got 0 : i64}}
func.func @function_bound_zero() attributes {moe.max_tokens = 0 : i64} {
  return
}

// -----

func.func @bound_on_an_op() {
  // expected-error @+1 {{'moe.max_tokens' must be a positive i64 on a function}}
  %c = arith.constant {moe.max_tokens = 8 : i64} 0 : i32
  return
}

// -----

//===----------------------------------------------------------------------===//
// Expert parallelism. moe.layer: E = 8 experts, ep_size = 2 ranks, so the
// weights hold E / ep_size = 4. The ops: E = 4 (offsets [5]), ep_size = 2
// (E / ep_size = 2), capacity C = 50 (ep_size * C = 100 rows), R = 74.
//===----------------------------------------------------------------------===//

func.func @layer_ep_size_without_capacity(%x: tensor<37x48xf32>, %wr: tensor<48x8xf32>, %wgu: tensor<4x48x80xf32>, %wd: tensor<4x40x48xf32>) {
  // expected-error @+1 {{expected both ep_size and ep_capacity, or neither}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, ep_size = 2, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x8xf32>, tensor<4x48x80xf32>, tensor<4x40x48xf32> -> tensor<37x48xf32>, tensor<37x8xf32>
  return
}

// -----

func.func @layer_ep_capacity_without_size(%x: tensor<37x48xf32>, %wr: tensor<48x8xf32>, %wgu: tensor<8x48x80xf32>, %wd: tensor<8x40x48xf32>) {
  // expected-error @+1 {{expected both ep_size and ep_capacity, or neither}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, ep_capacity = 64, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x8xf32>, tensor<8x48x80xf32>, tensor<8x40x48xf32> -> tensor<37x48xf32>, tensor<37x8xf32>
  return
}

// -----

func.func @layer_ep_overflow_without_size(%x: tensor<37x48xf32>, %wr: tensor<48x8xf32>, %wgu: tensor<8x48x80xf32>, %wd: tensor<8x40x48xf32>) {
  // expected-error @+1 {{has ep_overflow but no ep_size}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, ep_overflow = #moe.ep_overflow<drop>, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x8xf32>, tensor<8x48x80xf32>, tensor<8x40x48xf32> -> tensor<37x48xf32>, tensor<37x8xf32>
  return
}

// -----

// The capacity of an expert-parallel layer is ep_capacity.
func.func @layer_ep_capacity_factor(%x: tensor<37x48xf32>, %wr: tensor<48x8xf32>, %wgu: tensor<4x48x80xf32>, %wd: tensor<4x40x48xf32>) {
  // expected-error @+1 {{is expert-parallel and has a capacity_factor; its capacity is ep_capacity, the rows a rank sends to one rank}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, capacity_factor = 1.25 : f64, ep_capacity = 64, ep_size = 2, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x8xf32>, tensor<4x48x80xf32>, tensor<4x40x48xf32> -> tensor<37x48xf32>, tensor<37x8xf32>
  return
}

// -----

func.func @layer_ep_size_not_dividing(%x: tensor<37x48xf32>, %wr: tensor<48x8xf32>, %wgu: tensor<4x48x80xf32>, %wd: tensor<4x40x48xf32>) {
  // expected-error @+1 {{ep_size (3) must divide the number of experts (8)}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, ep_capacity = 64, ep_size = 3, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x8xf32>, tensor<4x48x80xf32>, tensor<4x40x48xf32> -> tensor<37x48xf32>, tensor<37x8xf32>
  return
}

// -----

// The weights of every expert where the rank holds E / ep_size.
func.func @layer_ep_w_gate_up_experts(%x: tensor<37x48xf32>, %wr: tensor<48x8xf32>, %wgu: tensor<8x48x80xf32>, %wd: tensor<4x40x48xf32>) {
  // expected-error @+1 {{w_gate_up dimension 0 is 8, expected E / ep_size = 4}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, ep_capacity = 64, ep_size = 2, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x8xf32>, tensor<8x48x80xf32>, tensor<4x40x48xf32> -> tensor<37x48xf32>, tensor<37x8xf32>
  return
}

// -----

func.func @layer_ep_w_down_experts(%x: tensor<37x48xf32>, %wr: tensor<48x8xf32>, %wgu: tensor<4x48x80xf32>, %wd: tensor<8x40x48xf32>) {
  // expected-error @+1 {{w_down dimension 0 is 8, expected E / ep_size = 4}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, ep_capacity = 64, ep_size = 2, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x8xf32>, tensor<4x48x80xf32>, tensor<8x40x48xf32> -> tensor<37x48xf32>, tensor<37x8xf32>
  return
}

// -----

// E is dynamic but in the logits: the weights are checked against it there.
func.func @layer_ep_experts_from_logits(%x: tensor<37x48xf32>, %wr: tensor<48x?xf32>, %wgu: tensor<4x48x80xf32>, %wd: tensor<4x40x48xf32>) {
  // expected-error @+1 {{w_gate_up dimension 0 is 4, expected E / ep_size = 3}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, ep_capacity = 64, ep_size = 2, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x?xf32>, tensor<4x48x80xf32>, tensor<4x40x48xf32> -> tensor<37x48xf32>, tensor<37x6xf32>
  return
}

// -----

func.func @layer_ep_w_down_experts_from_bias(%x: tensor<37x48xf32>, %wr: tensor<48x?xf32>, %b: tensor<8xf32>, %wgu: tensor<?x48x80xf32>, %wd: tensor<2x40x48xf32>) {
  // expected-error @+1 {{w_down dimension 0 is 2, expected E / ep_size = 4}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd bias(%b : tensor<8xf32>) {activation = #moe.activation<swiglu>, ep_capacity = 64, ep_size = 2, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x?xf32>, tensor<?x48x80xf32>, tensor<2x40x48xf32> -> tensor<37x48xf32>, tensor<37x?xf32>
  return
}

// -----

func.func @layer_ep_size_not_dividing_logits(%x: tensor<37x48xf32>, %wr: tensor<48x?xf32>, %wgu: tensor<?x48x80xf32>, %wd: tensor<?x40x48xf32>) {
  // expected-error @+1 {{ep_size (2) must divide the number of experts (5)}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, ep_capacity = 64, ep_size = 2, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x?xf32>, tensor<?x48x80xf32>, tensor<?x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return
}

// -----

func.func @layer_ep_chunk_without_size(%x: tensor<?x48xf32>, %wr: tensor<48x8xf32>, %wgu: tensor<8x48x80xf32>, %wd: tensor<8x40x48xf32>) {
  // expected-error @+1 {{has ep_chunk_tokens but no ep_size}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, ep_chunk_tokens = 16, max_tokens = 64, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x48xf32>, tensor<48x8xf32>, tensor<8x48x80xf32>, tensor<8x40x48xf32> -> tensor<?x48xf32>, tensor<?x8xf32>
  return
}

// -----

func.func @layer_ep_chunk_static_tokens(%x: tensor<37x48xf32>, %wr: tensor<48x8xf32>, %wgu: tensor<4x48x80xf32>, %wd: tensor<4x40x48xf32>) {
  // expected-error @+1 {{has ep_chunk_tokens and a static token count T = 37; chunks need a dynamic T (tensor<?x...>) with max_tokens, the step's bound}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, ep_capacity = 64, ep_chunk_tokens = 16, ep_size = 2, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x8xf32>, tensor<4x48x80xf32>, tensor<4x40x48xf32> -> tensor<37x48xf32>, tensor<37x8xf32>
  return
}

// -----

func.func @layer_ep_chunk_past_step(%x: tensor<?x48xf32>, %wr: tensor<48x8xf32>, %wgu: tensor<4x48x80xf32>, %wd: tensor<4x40x48xf32>) {
  // expected-error @+1 {{has ep_chunk_tokens = 65, more than max_tokens = 64 (a chunk is part of a step)}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, ep_capacity = 64, ep_chunk_tokens = 65, ep_size = 2, max_tokens = 64, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x48xf32>, tensor<48x8xf32>, tensor<4x48x80xf32>, tensor<4x40x48xf32> -> tensor<?x48xf32>, tensor<?x8xf32>
  return
}

// -----

func.func @layer_ep_chunk_zero(%x: tensor<?x48xf32>, %wr: tensor<48x8xf32>, %wgu: tensor<4x48x80xf32>, %wd: tensor<4x40x48xf32>) {
  // expected-error @+1 {{attribute 'ep_chunk_tokens' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, ep_capacity = 64, ep_chunk_tokens = 0, ep_size = 2, max_tokens = 64, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x48xf32>, tensor<48x8xf32>, tensor<4x48x80xf32>, tensor<4x40x48xf32> -> tensor<?x48xf32>, tensor<?x8xf32>
  return
}

// -----

// The step's bound of a chunked function: an i64 beside the chunk's, no
// smaller than it.
// expected-error @+1 {{'moe.ep_step_tokens' must be an i64 on a function with 'moe.max_tokens' (a chunk's bound), and no smaller than it, got 16 : i64}}
func.func @step_below_chunk() attributes {moe.ep_step_tokens = 16 : i64, moe.max_tokens = 32 : i64} {
  return
}

// -----

// expected-error @+1 {{'moe.ep_step_tokens' must be an i64 on a function with 'moe.max_tokens'}}
func.func @step_without_chunk() attributes {moe.ep_step_tokens = 16 : i64} {
  return
}

// -----

// Checked whatever E is, here dynamic.
func.func @layer_ep_rows_overflow(%x: tensor<37x48xf32>, %wr: tensor<48x?xf32>, %wgu: tensor<?x48x80xf32>, %wd: tensor<?x40x48xf32>) {
  // expected-error @+1 {{ep_size * ep_capacity (4 * 2147483646) exceeds the i32 row index range}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, ep_capacity = 2147483646, ep_size = 4, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x?xf32>, tensor<?x48x80xf32>, tensor<?x40x48xf32> -> tensor<37x48xf32>, tensor<37x?xf32>
  return
}

// -----

func.func @layer_ep_size_zero(%x: tensor<37x48xf32>, %wr: tensor<48x8xf32>, %wgu: tensor<8x48x80xf32>, %wd: tensor<8x40x48xf32>) {
  // expected-error @+1 {{attribute 'ep_size' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1 whose maximum value is 65536}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, ep_capacity = 64, ep_size = 0, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x8xf32>, tensor<8x48x80xf32>, tensor<8x40x48xf32> -> tensor<37x48xf32>, tensor<37x8xf32>
  return
}

// -----

func.func @layer_ep_size_too_large(%x: tensor<37x48xf32>, %wr: tensor<48x?xf32>, %wgu: tensor<1x48x80xf32>, %wd: tensor<1x40x48xf32>) {
  // expected-error @+1 {{attribute 'ep_size' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1 whose maximum value is 65536}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, ep_capacity = 1, ep_size = 65537, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x?xf32>, tensor<1x48x80xf32>, tensor<1x40x48xf32> -> tensor<37x48xf32>, tensor<37x?xf32>
  return
}

// -----

func.func @layer_ep_capacity_zero(%x: tensor<37x48xf32>, %wr: tensor<48x8xf32>, %wgu: tensor<4x48x80xf32>, %wd: tensor<4x40x48xf32>) {
  // expected-error @+1 {{attribute 'ep_capacity' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1 whose maximum value is 2147483646}}
  %out, %l = moe.layer %x, %wr, %wgu, %wd {activation = #moe.activation<swiglu>, ep_capacity = 0, ep_size = 2, routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<37x48xf32>, tensor<48x8xf32>, tensor<4x48x80xf32>, tensor<4x40x48xf32> -> tensor<37x48xf32>, tensor<37x8xf32>
  return
}

// -----

// moe.ep_dispatch and moe.ep_pack (the blocks' checks are shared with
// moe.ep_combine and moe.ep_unpack).

func.func @ep_dispatch_rows_overflow(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{ep_size * capacity (2 * 2147483646) exceeds the i32 row index range}}
  %r, %c, %d = moe.ep_dispatch %x, %off gather(%ids : tensor<74xi32>) {capacity = 2147483646 : i64, ep_size = 2 : i64} : tensor<37x48xf32>, tensor<5xi32> -> tensor<?x48xf32>, tensor<2x2xi32>, tensor<2xi32>
  return
}

// -----

func.func @ep_dispatch_no_experts(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<1xi32>) {
  // expected-error @+1 {{offsets must have E + 1 >= 2 entries, got 1}}
  %r, %c, %d = moe.ep_dispatch %x, %off gather(%ids : tensor<74xi32>) {capacity = 50 : i64, ep_size = 1 : i64} : tensor<37x48xf32>, tensor<1xi32> -> tensor<50x48xf32>, tensor<1x?xi32>, tensor<1xi32>
  return
}

// -----

func.func @ep_pack_ep_size_not_dividing(%y: tensor<74x48xf32>, %off: tensor<6xi32>) {
  // expected-error @+1 {{ep_size (2) must divide the number of experts (5, offsets has E + 1 entries)}}
  %s, %c, %d = moe.ep_pack %y, %off {capacity = 50 : i64, ep_size = 2 : i64} : tensor<74x48xf32>, tensor<6xi32> -> tensor<100x48xf32>, tensor<2x2xi32>, tensor<2xi32>
  return
}

// -----

func.func @ep_dispatch_received_rows(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{received dimension 0 is 99, expected ep_size * capacity = 100}}
  %r, %c, %d = moe.ep_dispatch %x, %off gather(%ids : tensor<74xi32>) {capacity = 50 : i64, ep_size = 2 : i64} : tensor<37x48xf32>, tensor<5xi32> -> tensor<99x48xf32>, tensor<2x2xi32>, tensor<2xi32>
  return
}

// -----

func.func @ep_pack_send_hidden(%y: tensor<74x48xf32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{send dimension 1 is 47, expected d = 48}}
  %s, %c, %d = moe.ep_pack %y, %off {capacity = 50 : i64, ep_size = 2 : i64} : tensor<74x48xf32>, tensor<5xi32> -> tensor<100x47xf32>, tensor<2x2xi32>, tensor<2xi32>
  return
}

// -----

func.func @ep_pack_counts_ranks(%y: tensor<74x48xf32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{send_counts dimension 0 is 3, expected ep_size = 2}}
  %s, %c, %d = moe.ep_pack %y, %off {capacity = 50 : i64, ep_size = 2 : i64} : tensor<74x48xf32>, tensor<5xi32> -> tensor<100x48xf32>, tensor<3x2xi32>, tensor<2xi32>
  return
}

// -----

func.func @ep_dispatch_counts_local_experts(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{received_counts dimension 1 is 4, expected E / ep_size = 2}}
  %r, %c, %d = moe.ep_dispatch %x, %off gather(%ids : tensor<74xi32>) {capacity = 50 : i64, ep_size = 2 : i64} : tensor<37x48xf32>, tensor<5xi32> -> tensor<100x48xf32>, tensor<2x4xi32>, tensor<2xi32>
  return
}

// -----

// With dynamic offsets only the counts give E / ep_size.
func.func @ep_pack_counts_no_local_experts(%y: tensor<74x48xf32>, %off: tensor<?xi32>) {
  // expected-error @+1 {{send_counts must have E / ep_size >= 1 columns, got 0}}
  %s, %c, %d = moe.ep_pack %y, %off {capacity = 50 : i64, ep_size = 2 : i64} : tensor<74x48xf32>, tensor<?xi32> -> tensor<100x48xf32>, tensor<2x0xi32>, tensor<2xi32>
  return
}

// -----

func.func @ep_dispatch_dropped_ranks(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{dropped dimension 0 is 3, expected ep_size = 2}}
  %r, %c, %d = moe.ep_dispatch %x, %off gather(%ids : tensor<74xi32>) {capacity = 50 : i64, ep_size = 2 : i64} : tensor<37x48xf32>, tensor<5xi32> -> tensor<100x48xf32>, tensor<2x2xi32>, tensor<3xi32>
  return
}

// -----

func.func @ep_dispatch_element_type(%x: tensor<37x48xbf16>, %ids: tensor<74xi32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{expected one element type for activations and weights, but source has 'bf16' and received has 'f32'}}
  %r, %c, %d = moe.ep_dispatch %x, %off gather(%ids : tensor<74xi32>) {capacity = 50 : i64, ep_size = 2 : i64} : tensor<37x48xbf16>, tensor<5xi32> -> tensor<100x48xf32>, tensor<2x2xi32>, tensor<2xi32>
  return
}

// -----

func.func @ep_dispatch_counts_i64(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{result #1 must be 2D tensor of 32-bit signless integer values, but got 'tensor<2x2xi64>'}}
  %r, %c, %d = moe.ep_dispatch %x, %off gather(%ids : tensor<74xi32>) {capacity = 50 : i64, ep_size = 2 : i64} : tensor<37x48xf32>, tensor<5xi32> -> tensor<100x48xf32>, tensor<2x2xi64>, tensor<2xi32>
  return
}

// -----

func.func @ep_dispatch_ep_size_zero(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{attribute 'ep_size' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1 whose maximum value is 65536}}
  %r, %c, %d = moe.ep_dispatch %x, %off gather(%ids : tensor<74xi32>) {capacity = 50 : i64, ep_size = 0 : i64} : tensor<37x48xf32>, tensor<5xi32> -> tensor<100x48xf32>, tensor<2x2xi32>, tensor<2xi32>
  return
}

// -----

func.func @ep_pack_ep_size_too_large(%y: tensor<74x48xf32>, %off: tensor<65538xi32>) {
  // expected-error @+1 {{attribute 'ep_size' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1 whose maximum value is 65536}}
  %s, %c, %d = moe.ep_pack %y, %off {capacity = 1 : i64, ep_size = 65537 : i64} : tensor<74x48xf32>, tensor<65538xi32> -> tensor<65537x48xf32>, tensor<65537x1xi32>, tensor<65537xi32>
  return
}

// -----

func.func @ep_dispatch_capacity_zero(%x: tensor<37x48xf32>, %ids: tensor<74xi32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{attribute 'capacity' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1 whose maximum value is 2147483646}}
  %r, %c, %d = moe.ep_dispatch %x, %off gather(%ids : tensor<74xi32>) {capacity = 0 : i64, ep_size = 2 : i64} : tensor<37x48xf32>, tensor<5xi32> -> tensor<0x48xf32>, tensor<2x2xi32>, tensor<2xi32>
  return
}

// -----

func.func @ep_pack_capacity_past_i32(%y: tensor<74x48xf32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{attribute 'capacity' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1 whose maximum value is 2147483646}}
  %s, %c, %d = moe.ep_pack %y, %off {capacity = 2147483647 : i64, ep_size = 1 : i64} : tensor<74x48xf32>, tensor<5xi32> -> tensor<?x48xf32>, tensor<1x4xi32>, tensor<1xi32>
  return
}

// -----

func.func @ep_pack_overflow_not_enum(%y: tensor<74x48xf32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{attribute 'overflow' failed to satisfy constraint: what an expert-parallel dispatch does with rows past its capacity}}
  %s, %c, %d = moe.ep_pack %y, %off {capacity = 50 : i64, ep_size = 2 : i64, overflow = 1 : i32} : tensor<74x48xf32>, tensor<5xi32> -> tensor<100x48xf32>, tensor<2x2xi32>, tensor<2xi32>
  return
}

// -----

// moe.ep_combine and moe.ep_unpack.

func.func @ep_combine_rows_overflow(%rows: tensor<?x48xf32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{ep_size * capacity (65536 * 2147483646) exceeds the i32 row index range}}
  %y = moe.ep_combine %rows, %off {capacity = 2147483646 : i64, ep_size = 65536 : i64} : tensor<?x48xf32>, tensor<5xi32> -> tensor<74x48xf32>
  return
}

// -----

func.func @ep_unpack_no_experts(%ret: tensor<100x48xf32>, %off: tensor<0xi32>) {
  // expected-error @+1 {{offsets must have E + 1 >= 2 entries, got 0}}
  %y = moe.ep_unpack %ret, %off {capacity = 50 : i64, ep_size = 2 : i64} : tensor<100x48xf32>, tensor<0xi32> -> tensor<74x48xf32>
  return
}

// -----

func.func @ep_combine_ep_size_not_dividing(%rows: tensor<150x48xf32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{ep_size (3) must divide the number of experts (4, offsets has E + 1 entries)}}
  %y = moe.ep_combine %rows, %off {capacity = 50 : i64, ep_size = 3 : i64} : tensor<150x48xf32>, tensor<5xi32> -> tensor<74x48xf32>
  return
}

// -----

func.func @ep_combine_rows(%rows: tensor<98x48xf32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{rows dimension 0 is 98, expected ep_size * capacity = 100}}
  %y = moe.ep_combine %rows, %off {capacity = 50 : i64, ep_size = 2 : i64} : tensor<98x48xf32>, tensor<5xi32> -> tensor<74x48xf32>
  return
}

// -----

func.func @ep_unpack_returned_rows(%ret: tensor<50x48xf32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{returned dimension 0 is 50, expected ep_size * capacity = 100}}
  %y = moe.ep_unpack %ret, %off {capacity = 50 : i64, ep_size = 2 : i64} : tensor<50x48xf32>, tensor<5xi32> -> tensor<74x48xf32>
  return
}

// -----

func.func @ep_unpack_result_hidden(%ret: tensor<100x48xf32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{result dimension 1 is 47, expected d = 48}}
  %y = moe.ep_unpack %ret, %off {capacity = 50 : i64, ep_size = 2 : i64} : tensor<100x48xf32>, tensor<5xi32> -> tensor<74x47xf32>
  return
}

// -----

func.func @ep_combine_element_type(%rows: tensor<100x48xbf16>, %off: tensor<5xi32>) {
  // expected-error @+1 {{expected one element type for activations and weights, but rows has 'bf16' and result has 'f32'}}
  %y = moe.ep_combine %rows, %off {capacity = 50 : i64, ep_size = 2 : i64} : tensor<100x48xbf16>, tensor<5xi32> -> tensor<74x48xf32>
  return
}

// -----

func.func @ep_combine_reduce_tokens(%rows: tensor<100x48xf32>, %off: tensor<5xi32>, %rows_of: tensor<37x2xi32>) {
  // expected-error @+1 {{result dimension 0 is 74, expected T = 37}}
  %y = moe.ep_combine %rows, %off reduce(%rows_of : tensor<37x2xi32>) {capacity = 50 : i64, ep_size = 2 : i64} : tensor<100x48xf32>, tensor<5xi32> -> tensor<74x48xf32>
  return
}

// -----

func.func @ep_unpack_reduce_zero_k(%ret: tensor<100x48xf32>, %off: tensor<5xi32>, %rows_of: tensor<37x0xi32>) {
  // expected-error @+1 {{k (dimension 1 of rows_of) must be at least 1, got 0}}
  %y = moe.ep_unpack %ret, %off reduce(%rows_of : tensor<37x0xi32>) {capacity = 50 : i64, ep_size = 2 : i64} : tensor<100x48xf32>, tensor<5xi32> -> tensor<37x48xf32>
  return
}

// -----

func.func @ep_combine_rows_of_rank(%rows: tensor<100x48xf32>, %off: tensor<5xi32>, %rows_of: tensor<74xi32>) {
  // expected-error @+1 {{operand #2 must be 2D tensor of 32-bit signless integer values, but got 'tensor<74xi32>'}}
  %y = moe.ep_combine %rows, %off reduce(%rows_of : tensor<74xi32>) {capacity = 50 : i64, ep_size = 2 : i64} : tensor<100x48xf32>, tensor<5xi32> -> tensor<37x48xf32>
  return
}

// -----

func.func @ep_unpack_capacity_zero(%ret: tensor<100x48xf32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{attribute 'capacity' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1 whose maximum value is 2147483646}}
  %y = moe.ep_unpack %ret, %off {capacity = 0 : i64, ep_size = 2 : i64} : tensor<100x48xf32>, tensor<5xi32> -> tensor<74x48xf32>
  return
}

// -----

func.func @ep_combine_ep_size_zero(%rows: tensor<100x48xf32>, %off: tensor<5xi32>) {
  // expected-error @+1 {{attribute 'ep_size' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1 whose maximum value is 65536}}
  %y = moe.ep_combine %rows, %off {capacity = 50 : i64, ep_size = 0 : i64} : tensor<100x48xf32>, tensor<5xi32> -> tensor<74x48xf32>
  return
}

// -----

// moe.ep_queues: received_counts [ep_size, E / ep_size].

func.func @ep_queues_no_ranks(%c: tensor<0x2xi32>) {
  // expected-error @+1 {{received_counts must have ep_size in [1, 65536] rows, got 0}}
  %ids, %off = moe.ep_queues %c {capacity = 50 : i64} : tensor<0x2xi32> -> tensor<0xi32>, tensor<3xi32>
  return
}

// -----

func.func @ep_queues_too_many_ranks(%c: tensor<65537x1xi32>) {
  // expected-error @+1 {{received_counts must have ep_size in [1, 65536] rows, got 65537}}
  %ids, %off = moe.ep_queues %c {capacity = 1 : i64} : tensor<65537x1xi32> -> tensor<65537xi32>, tensor<2xi32>
  return
}

// -----

func.func @ep_queues_no_local_experts(%c: tensor<2x0xi32>) {
  // expected-error @+1 {{received_counts must have E / ep_size >= 1 columns, got 0}}
  %ids, %off = moe.ep_queues %c {capacity = 50 : i64} : tensor<2x0xi32> -> tensor<100xi32>, tensor<1xi32>
  return
}

// -----

func.func @ep_queues_rows_overflow(%c: tensor<2x2xi32>) {
  // expected-error @+1 {{the received rows (2 * 2147483646) exceed the i32 row index range}}
  %ids, %off = moe.ep_queues %c {capacity = 2147483646 : i64} : tensor<2x2xi32> -> tensor<?xi32>, tensor<3xi32>
  return
}

// -----

func.func @ep_queues_token_ids(%c: tensor<2x2xi32>) {
  // expected-error @+1 {{token_ids dimension 0 is 99, expected ep_size * capacity = 100}}
  %ids, %off = moe.ep_queues %c {capacity = 50 : i64} : tensor<2x2xi32> -> tensor<99xi32>, tensor<3xi32>
  return
}

// -----

func.func @ep_queues_offsets(%c: tensor<2x2xi32>) {
  // expected-error @+1 {{offsets dimension 0 is 5, expected E / ep_size + 1 = 3}}
  %ids, %off = moe.ep_queues %c {capacity = 50 : i64} : tensor<2x2xi32> -> tensor<100xi32>, tensor<5xi32>
  return
}

// -----

func.func @ep_queues_capacity_zero(%c: tensor<2x2xi32>) {
  // expected-error @+1 {{attribute 'capacity' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 1 whose maximum value is 2147483646}}
  %ids, %off = moe.ep_queues %c {capacity = 0 : i64} : tensor<2x2xi32> -> tensor<0xi32>, tensor<3xi32>
  return
}

// -----

// moe.gather_rows: source [N, d], indices [M], result [M, d].

func.func @gather_rows_element_type(%src: tensor<100x48xf32>, %ids: tensor<74xi32>) {
  // expected-error @+1 {{expected one element type for activations and weights, but source has 'f32' and result has 'bf16'}}
  %g = moe.gather_rows %src, %ids : tensor<100x48xf32>, tensor<74xi32> -> tensor<74x48xbf16>
  return
}

// -----

func.func @gather_rows_result_rows(%src: tensor<100x48xf32>, %ids: tensor<74xi32>) {
  // expected-error @+1 {{result dimension 0 is 100, expected M = 74}}
  %g = moe.gather_rows %src, %ids : tensor<100x48xf32>, tensor<74xi32> -> tensor<100x48xf32>
  return
}

// -----

func.func @gather_rows_result_hidden(%src: tensor<100x48xf32>, %ids: tensor<74xi32>) {
  // expected-error @+1 {{result dimension 1 is 47, expected d = 48}}
  %g = moe.gather_rows %src, %ids : tensor<100x48xf32>, tensor<74xi32> -> tensor<74x47xf32>
  return
}

// -----

func.func @gather_rows_indices_i64(%src: tensor<100x48xf32>, %ids: tensor<74xi64>) {
  // expected-error @+1 {{operand #1 must be 1D tensor of 32-bit signless integer values, but got 'tensor<74xi64>'}}
  %g = moe.gather_rows %src, %ids : tensor<100x48xf32>, tensor<74xi64> -> tensor<74x48xf32>
  return
}

// -----

// moe.scatter_rows: source [M, d], indices [M], result [N, d].

func.func @scatter_rows_element_type(%src: tensor<74x48xbf16>, %ids: tensor<74xi32>) {
  // expected-error @+1 {{expected one element type for activations and weights, but source has 'bf16' and result has 'f16'}}
  %s = moe.scatter_rows %src, %ids : tensor<74x48xbf16>, tensor<74xi32> -> tensor<100x48xf16>
  return
}

// -----

func.func @scatter_rows_indices(%src: tensor<74x48xf32>, %ids: tensor<100xi32>) {
  // expected-error @+1 {{indices dimension 0 is 100, expected M = 74}}
  %s = moe.scatter_rows %src, %ids : tensor<74x48xf32>, tensor<100xi32> -> tensor<100x48xf32>
  return
}

// -----

func.func @scatter_rows_result_hidden(%src: tensor<74x48xf32>, %ids: tensor<74xi32>) {
  // expected-error @+1 {{result dimension 1 is 47, expected d = 48}}
  %s = moe.scatter_rows %src, %ids : tensor<74x48xf32>, tensor<74xi32> -> tensor<100x47xf32>
  return
}

// -----

//===----------------------------------------------------------------------===//
// moe.update_selection_bias
//===----------------------------------------------------------------------===//

func.func @update_selection_bias_result_experts(%b: tensor<5xf32>, %e: tensor<37x2xi32>) {
  // expected-error @+1 {{result dimension 0 is 6, expected E = 5}}
  %r = moe.update_selection_bias %b, %e {rate = 1.0e-3 : f64, rule = #moe.bias_update<sign>} : tensor<5xf32>, tensor<37x2xi32> -> tensor<6xf32>
  return
}

// -----

func.func @update_selection_bias_top_k_exceeds_experts(%b: tensor<5xf32>, %e: tensor<37x6xi32>) {
  // expected-error @+1 {{top_k (6) exceeds the number of experts (5)}}
  %r = moe.update_selection_bias %b, %e {rate = 1.0e-3 : f64, rule = #moe.bias_update<sign>} : tensor<5xf32>, tensor<37x6xi32> -> tensor<5xf32>
  return
}

// -----

func.func @update_selection_bias_no_slots(%b: tensor<5xf32>, %e: tensor<37x0xi32>) {
  // expected-error @+1 {{k (dimension 1 of experts) must be at least 1, got 0}}
  %r = moe.update_selection_bias %b, %e {rate = 1.0e-3 : f64, rule = #moe.bias_update<sign>} : tensor<5xf32>, tensor<37x0xi32> -> tensor<5xf32>
  return
}

// -----

func.func @update_selection_bias_bias_rank(%b: tensor<1x5xf32>, %e: tensor<37x2xi32>) {
  // expected-error @+1 {{operand #0 must be 1D tensor of 32-bit float values, but got 'tensor<1x5xf32>'}}
  %r = moe.update_selection_bias %b, %e {rate = 1.0e-3 : f64, rule = #moe.bias_update<sign>} : tensor<1x5xf32>, tensor<37x2xi32> -> tensor<5xf32>
  return
}

// -----

func.func @update_selection_bias_bias_bf16(%b: tensor<5xbf16>, %e: tensor<37x2xi32>) {
  // expected-error @+1 {{operand #0 must be 1D tensor of 32-bit float values, but got 'tensor<5xbf16>'}}
  %r = moe.update_selection_bias %b, %e {rate = 1.0e-3 : f64, rule = #moe.bias_update<sign>} : tensor<5xbf16>, tensor<37x2xi32> -> tensor<5xf32>
  return
}

// -----

func.func @update_selection_bias_experts_rank(%b: tensor<5xf32>, %e: tensor<74xi32>) {
  // expected-error @+1 {{operand #1 must be 2D tensor of 32-bit signless integer values, but got 'tensor<74xi32>'}}
  %r = moe.update_selection_bias %b, %e {rate = 1.0e-3 : f64, rule = #moe.bias_update<sign>} : tensor<5xf32>, tensor<74xi32> -> tensor<5xf32>
  return
}

// -----

func.func @update_selection_bias_rate_zero(%b: tensor<5xf32>, %e: tensor<37x2xi32>) {
  // expected-error @+1 {{attribute 'rate' failed to satisfy constraint: 64-bit float attribute whose value is positive and finite}}
  %r = moe.update_selection_bias %b, %e {rate = 0.0 : f64, rule = #moe.bias_update<sign>} : tensor<5xf32>, tensor<37x2xi32> -> tensor<5xf32>
  return
}

// -----

func.func @update_selection_bias_rate_negative(%b: tensor<5xf32>, %e: tensor<37x2xi32>) {
  // expected-error @+1 {{attribute 'rate' failed to satisfy constraint: 64-bit float attribute whose value is positive and finite}}
  %r = moe.update_selection_bias %b, %e {rate = -1.0e-3 : f64, rule = #moe.bias_update<proportional>} : tensor<5xf32>, tensor<37x2xi32> -> tensor<5xf32>
  return
}

// -----

func.func @update_selection_bias_rate_infinite(%b: tensor<5xf32>, %e: tensor<37x2xi32>) {
  // expected-error @+1 {{attribute 'rate' failed to satisfy constraint: 64-bit float attribute whose value is positive and finite}}
  %r = moe.update_selection_bias %b, %e {rate = 0x7FF0000000000000 : f64, rule = #moe.bias_update<sign>} : tensor<5xf32>, tensor<37x2xi32> -> tensor<5xf32>
  return
}

// -----

func.func @update_selection_bias_rate_nan(%b: tensor<5xf32>, %e: tensor<37x2xi32>) {
  // expected-error @+1 {{attribute 'rate' failed to satisfy constraint: 64-bit float attribute whose value is positive and finite}}
  %r = moe.update_selection_bias %b, %e {rate = 0x7FF8000000000000 : f64, rule = #moe.bias_update<sign>} : tensor<5xf32>, tensor<37x2xi32> -> tensor<5xf32>
  return
}

// -----

func.func @update_selection_bias_rate_missing(%b: tensor<5xf32>, %e: tensor<37x2xi32>) {
  // expected-error @+1 {{requires attribute 'rate'}}
  %r = moe.update_selection_bias %b, %e {rule = #moe.bias_update<sign>} : tensor<5xf32>, tensor<37x2xi32> -> tensor<5xf32>
  return
}

// -----

func.func @update_selection_bias_rule_missing(%b: tensor<5xf32>, %e: tensor<37x2xi32>) {
  // expected-error @+1 {{requires attribute 'rule'}}
  %r = moe.update_selection_bias %b, %e {rate = 1.0e-3 : f64} : tensor<5xf32>, tensor<37x2xi32> -> tensor<5xf32>
  return
}
