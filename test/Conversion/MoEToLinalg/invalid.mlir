// RUN: moe-opt %s --convert-moe-to-linalg -split-input-file -verify-diagnostics

// A layer needs a static number of experts to be decomposed (and so lowered).
func.func @dynamic_experts(%x: tensor<8x16xf32>, %wr: tensor<16x?xf32>,
                           %wgu: tensor<?x16x48xf32>, %wd: tensor<?x24x16xf32>)
    -> tensor<8x16xf32> {
  // expected-error @+1 {{cannot be decomposed: the number of experts must be static}}
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<8x16xf32>, tensor<16x?xf32>, tensor<?x16x48xf32>,
        tensor<?x24x16xf32> -> tensor<8x16xf32>, tensor<8x?xf32>
  return %out : tensor<8x16xf32>
}

// -----

// A host tensor may only reach moe.prefetch, func calls and returns; an op
// that cannot take the mirrored tensor type is not converted.
func.func @host_in_select(%c: i1, %a: !moe.host_tensor<4xf32>,
                          %b: !moe.host_tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{failed to legalize operation 'arith.select'}}
  %s = arith.select %c, %a, %b : !moe.host_tensor<4xf32>
  %t = moe.prefetch %s : !moe.host_tensor<4xf32> -> tensor<4xf32>
  return %t : tensor<4xf32>
}
