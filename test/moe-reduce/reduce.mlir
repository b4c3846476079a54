// RUN: moe-reduce %s --reduction-tree='traversal-mode=0 test=/bin/sh test-arg=%S/Inputs/backward-needs-decompose.sh' | FileCheck %s
// RUN: /bin/sh %S/Inputs/backward-needs-decompose.sh %s; test $? -eq 1

// moe-reduce keeps only what makes moe-generate-backward fail with "must be
// decomposed first": the function holding the moe.layer, and in it the layer
// and the return that uses it. The other functions and the ops the layer does
// not need are gone. The script must exit 1 for "interesting".

// CHECK-NOT: func.func @router
// CHECK-NOT: func.func @scale
// CHECK-LABEL: func.func @layer(
// CHECK-NOT: arith.
// CHECK: moe.layer
// CHECK: return
// CHECK-NOT: func.func

func.func @router(%x: tensor<8x16xf32>, %wr: tensor<16x4xf32>)
    -> (tensor<8x2xf32>, tensor<8x2xi32>, tensor<8x4xf32>) {
  %w, %e, %logits = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<8x16xf32>, tensor<16x4xf32>
      -> tensor<8x2xf32>, tensor<8x2xi32>, tensor<8x4xf32>
  return %w, %e, %logits : tensor<8x2xf32>, tensor<8x2xi32>, tensor<8x4xf32>
}

func.func @layer(%x: tensor<8x16xf32>, %wr: tensor<16x4xf32>,
                 %wgu: tensor<4x16x64xf32>, %wd: tensor<4x32x16xf32>)
    -> (tensor<8x16xf32>, tensor<8x4xf32>) {
  %scaled = arith.addf %x, %x : tensor<8x16xf32>
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<8x16xf32>, tensor<16x4xf32>, tensor<4x16x64xf32>,
        tensor<4x32x16xf32> -> tensor<8x16xf32>, tensor<8x4xf32>
  return %out, %logits : tensor<8x16xf32>, tensor<8x4xf32>
}

func.func @scale(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %y = arith.mulf %x, %x : tensor<8x16xf32>
  return %y : tensor<8x16xf32>
}
