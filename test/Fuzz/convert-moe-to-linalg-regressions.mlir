// Inputs found by fuzzing and the reliability probes (docs/reliability.md) on which
// convert-moe-to-linalg went wrong. Each case says what happened before its
// fix.

// RUN: moe-opt %s -split-input-file -verify-diagnostics --convert-moe-to-linalg

// Found by moe-parser-fuzzer. A kernel the module defines itself is kept, but
// this one has another type than the kernel it stands in for: the pass
// "succeeded" with a func.call whose operand types do not match its callee.
func.func @combine_own_kernel(%y: tensor<12x4xf32>, %w: tensor<6x2xf32>,
                              %rows: tensor<6x2xi32>) -> tensor<6x4xf32> {
  %out = moe.combine %y, %w, %rows
      : tensor<12x4xf32>, tensor<6x2xf32>, tensor<6x2xi32> -> tensor<6x4xf32>
  return %out : tensor<6x4xf32>
}
// expected-error @+1 {{@__moe_cpu_combine has type '(tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xi54>) -> tensor<?x?xf32>', but the CPU kernels call it with type '(tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xi32>) -> tensor<?x?xf32>'}}
func.func private @__moe_cpu_combine(%y: tensor<?x?xf32>, %w: tensor<?x?xf32>,
                                     %rows: tensor<?x?xi54>) -> tensor<?x?xf32> {
  return %w : tensor<?x?xf32>
}

// -----

// The same with a symbol that is not a function at all.
func.func @combine_module_kernel(%y: tensor<12x4xf32>, %w: tensor<6x2xf32>,
                                 %rows: tensor<6x2xi32>) -> tensor<6x4xf32> {
  %out = moe.combine %y, %w, %rows
      : tensor<12x4xf32>, tensor<6x2xf32>, tensor<6x2xi32> -> tensor<6x4xf32>
  return %out : tensor<6x4xf32>
}
// expected-error @+1 {{@__moe_cpu_combine is not a function, but the CPU kernels call it as one of type '(tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xi32>) -> tensor<?x?xf32>'}}
module @__moe_cpu_combine {
}
