// With --mlir-pass-pipeline-local-reproducer the reproducer holds only the
// pass that failed (moe-decompose, on a layer whose number of experts is
// dynamic) and the IR it saw; --run-reproducer replays it to the same error.

// RUN: rm -f %t
// RUN: not moe-opt %s --pass-pipeline='builtin.module(cse,func.func(moe-decompose),canonicalize)' --mlir-pass-pipeline-crash-reproducer=%t --mlir-pass-pipeline-local-reproducer --mlir-disable-threading 2>&1 | FileCheck %s --check-prefix=FAIL
// RUN: FileCheck %s --check-prefix=REPRO --input-file=%t
// RUN: not moe-opt --run-reproducer %t 2>&1 | FileCheck %s --check-prefix=REPLAY

// FAIL: crash-reproducer-local.mlir:[[@LINE+11]]:19: error: 'moe.layer' op cannot be decomposed: the number of experts must be static
// FAIL: note: Pipeline failed while executing `MoEDecompose` on 'func.func' operation: @dynamic_experts: reproducer generated at

// REPRO: func.func @dynamic_experts(
// REPRO: pipeline: "builtin.module(func.func(moe-decompose))"

// REPLAY: {{.*}}.tmp:{{[0-9]+}}:{{[0-9]+}}: error: 'moe.layer' op cannot be decomposed: the number of experts must be static

func.func @dynamic_experts(%x: tensor<8x16xf32>, %wr: tensor<16x?xf32>,
                           %wgu: tensor<?x16x48xf32>, %wd: tensor<?x24x16xf32>)
    -> tensor<8x16xf32> {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 1>}
      : tensor<8x16xf32>, tensor<16x?xf32>, tensor<?x16x48xf32>,
        tensor<?x24x16xf32> -> tensor<8x16xf32>, tensor<8x?xf32>
  return %out : tensor<8x16xf32>
}
