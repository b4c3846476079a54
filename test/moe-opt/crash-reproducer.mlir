// A pass that fails writes a reproducer (the IR the pipeline started from,
// and the pipeline), and --run-reproducer replays it to the same diagnostic.

// RUN: rm -f %t
// RUN: not moe-opt %s --pass-pipeline='builtin.module(canonicalize,moe-generate-backward)' --mlir-pass-pipeline-crash-reproducer=%t 2>&1 | FileCheck %s --check-prefix=FAIL
// RUN: FileCheck %s --check-prefix=REPRO --input-file=%t
// RUN: not moe-opt --run-reproducer %t 2>&1 | FileCheck %s --check-prefix=REPLAY

// FAIL: crash-reproducer.mlir:[[@LINE+13]]:19: error: 'moe.layer' op must be decomposed first: run --moe-decompose before --moe-generate-backward
// FAIL: note: Pipeline failed while executing [`MoEGenerateBackward` on 'builtin.module' operation]: reproducer generated at

// REPRO: func.func @layer(
// REPRO: moe.layer
// REPRO: mlir_reproducer:
// REPRO: pipeline: "builtin.module(canonicalize{{.*}}, moe-generate-backward)"

// REPLAY: {{.*}}.tmp:{{[0-9]+}}:{{[0-9]+}}: error: 'moe.layer' op must be decomposed first: run --moe-decompose before --moe-generate-backward

func.func @layer(%x: tensor<8x16xf32>, %wr: tensor<16x4xf32>,
                 %wgu: tensor<4x16x64xf32>, %wd: tensor<4x32x16xf32>)
    -> (tensor<8x16xf32>, tensor<8x4xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<8x16xf32>, tensor<16x4xf32>, tensor<4x16x64xf32>,
        tensor<4x32x16xf32> -> tensor<8x16xf32>, tensor<8x4xf32>
  return %out, %logits : tensor<8x16xf32>, tensor<8x4xf32>
}
