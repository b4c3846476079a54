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

// -----

// A collective over several ranks needs its all-to-all: moe-ep-stages splits
// the function there first.
func.func @ep_dispatch_collective(%x: tensor<6x4xf32>, %offs: tensor<5xi32>,
                                  %ids: tensor<12xi32>) -> tensor<8x4xf32> {
  // expected-error @+1 {{'moe.ep_dispatch' op is a collective over 2 ranks: split the function with moe-ep-stages before lowering it to the CPU}}
  %recv, %counts, %dropped = moe.ep_dispatch %x, %offs gather(%ids : tensor<12xi32>)
      {capacity = 4 : i64, ep_size = 2 : i64}
      : tensor<6x4xf32>, tensor<5xi32> -> tensor<8x4xf32>, tensor<2x2xi32>, tensor<2xi32>
  return %recv : tensor<8x4xf32>
}

// -----

func.func @ep_combine_collective(%rows: tensor<16x4xf32>, %offs: tensor<5xi32>)
    -> tensor<12x4xf32> {
  // expected-error @+1 {{'moe.ep_combine' op is a collective over 4 ranks}}
  %y = moe.ep_combine %rows, %offs {capacity = 4 : i64, ep_size = 4 : i64}
      : tensor<16x4xf32>, tensor<5xi32> -> tensor<12x4xf32>
  return %y : tensor<12x4xf32>
}

// -----

func.func @scatter_rows_dynamic_rows(%src: tensor<6x4xf32>, %ids: tensor<6xi32>)
    -> tensor<?x4xf32> {
  // expected-error @+1 {{'moe.scatter_rows' op has a result of dynamic row count that the CPU path cannot size (no operand gives it)}}
  %r = moe.scatter_rows %src, %ids : tensor<6x4xf32>, tensor<6xi32> -> tensor<?x4xf32>
  return %r : tensor<?x4xf32>
}
