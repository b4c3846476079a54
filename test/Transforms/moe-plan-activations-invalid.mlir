// RUN: not moe-opt %s -split-input-file --moe-plan-activations=memory-budget=100 2>&1 | FileCheck %s --check-prefix=BUDGET
// RUN: not moe-opt %s -split-input-file --moe-plan-activations="policy=keep memory-budget=0.5KiB" 2>&1 | FileCheck %s --check-prefix=KEEP
// RUN: not moe-opt %s -split-input-file --moe-plan-activations="policy=offload memory-budget=300" 2>&1 | FileCheck %s --check-prefix=OFFLOAD
// RUN: not moe-opt %s -split-input-file --moe-plan-activations=host-gbps=-1 2>&1 | FileCheck %s --check-prefix=GBPS
// RUN: not moe-opt %s -split-input-file --moe-plan-activations=policy=fast 2>&1 | FileCheck %s --check-prefix=POLICY
// RUN: not moe-opt %s -split-input-file --moe-plan-activations=memory-budget=4GiX 2>&1 | FileCheck %s --check-prefix=UNIT
// RUN: not moe-opt %s -split-input-file --moe-plan-activations=gpu-tflops=0 2>&1 | FileCheck %s --check-prefix=TFLOPS

// Every plan saves at least 340 B (x and the routing metadata): a smaller
// budget names it and what each plan needs.
// BUDGET: moe-plan-activations-invalid.mlir:[[@LINE+6]]:1: error: memory-budget 100 B (9.31e-08 GiB) cannot be met with policy=auto: the smallest budget it can meet is 340 B (3.17e-07 GiB)
// BUDGET: note: keep saves 852 B (7.93e-07 GiB), recompute saves 340 B (3.17e-07 GiB) and adds 8192 FLOPs (1.05e-05 us at 780 TFLOP/s), offload saves 340 B (3.17e-07 GiB) and adds 0.0186 us of copies compute does not hide (at 55 GB/s)
// KEEP: error: memory-budget 512 B (4.77e-07 GiB) cannot be met with policy=keep: the smallest budget it can meet is 852 B (7.93e-07 GiB) (policy=recompute, offload or auto needs 340 B (3.17e-07 GiB))
// OFFLOAD: moe-plan-activations-invalid.mlir:[[@LINE+3]]:1: error: memory-budget 300 B (2.79e-07 GiB) cannot be met with policy=offload: the smallest budget it can meet is 340 B (3.17e-07 GiB)
// POLICY: error: moe-plan-activations: unknown policy 'fast' (expected keep, recompute, offload or auto)
// GBPS: moe-plan-activations-invalid.mlir:[[@LINE+1]]:1: error: moe-plan-activations: host-gbps must be positive, got -1
func.func @layer(%x: tensor<4x16xbf16>, %wr: tensor<16x4xbf16>,
                 %wgu: tensor<4x16x16xbf16>, %wd: tensor<4x8x16xbf16>,
                 %sgu: tensor<16x32xbf16>, %sd: tensor<16x16xbf16>)
    -> (tensor<4x16xbf16>, tensor<4x4xf32>) {
  %w, %e, %logits = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<4x16xbf16>, tensor<16x4xbf16>
      -> tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x4xf32>
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 4 : i64}
      : tensor<4x2xi32> -> tensor<8xi32>, tensor<5xi32>, tensor<4x2xi32>
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<4x16xbf16>, tensor<8xi32>, tensor<5xi32>, tensor<4x16x16xbf16>,
        tensor<4x8x16xbf16> -> tensor<8x16xbf16>, tensor<8x16xbf16>
  %out = moe.combine %y, %w, %rows
      : tensor<8x16xbf16>, tensor<4x2xf32>, tensor<4x2xi32> -> tensor<4x16xbf16>
  %sy, %sh = moe.shared_expert %x, %sgu, %sd {activation = #moe.activation<swiglu>}
      : tensor<4x16xbf16>, tensor<16x32xbf16>, tensor<16x16xbf16> -> tensor<4x16xbf16>, tensor<4x32xbf16>
  %sum = arith.addf %out, %sy : tensor<4x16xbf16>
  return %sum, %logits : tensor<4x16xbf16>, tensor<4x4xf32>
}

// -----

// A budget needs static shapes.
// BUDGET: moe-plan-activations-invalid.mlir:[[@LINE+2]]:1: error: cannot plan activations under memory-budget 100 B (9.31e-08 GiB): argument #0 has type 'tensor<?x16xf32>'; the saved bytes need static shapes, or a dynamic token count with its bound (moe.max_tokens)
// TFLOPS: error: moe-plan-activations: gpu-tflops must be positive, got 0
func.func @dynamic(%x: tensor<?x16xf32>, %wr: tensor<16x4xf32>) -> tensor<?x4xf32> {
  %w, %e, %logits = moe.router %x, %wr
      {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<?x16xf32>, tensor<16x4xf32>
      -> tensor<?x2xf32>, tensor<?x2xi32>, tensor<?x4xf32>
  return %logits : tensor<?x4xf32>
}

// -----

// UNIT: error: moe-plan-activations: unknown unit 'GiX' in memory size '4GiX' (use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB)
// BUDGET: moe-plan-activations-invalid.mlir:[[@LINE+3]]:19: error: 'moe.layer' op cannot be planned: moe-plan-activations runs after moe-decompose
func.func @undecomposed(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>,
    %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>) -> (tensor<37x48xf32>, tensor<37x5xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>,
        tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return %out, %logits : tensor<37x48xf32>, tensor<37x5xf32>
}
