// convert-moe-to-gpu refuses an op with `accumulate` (moe-fold-adds) that it
// cannot convert: a GPU library without the op's `_acc` host function, a
// chosen dx config that cannot accumulate, a result with no buffer of its own
// (neither returned nor accumulated into), or an `accumulate` operand not
// made by an op of the body for this op alone.
// RUN: rm -rf %t && split-file %s %t
// RUN: echo 'module {}' | moe-opt --moe-gpu-emit-library | sed '/func.func private @__moe_gpu_router_grad_acc(/,/^  }$/d' > %t/norouter.mlir
// RUN: moe-opt %t/no-acc.mlir --convert-moe-to-gpu="library=%t/norouter.mlir" --verify-diagnostics
// RUN: moe-opt %t/errors.mlir --split-input-file --convert-moe-to-gpu --verify-diagnostics

//--- no-acc.mlir
func.func @no_acc(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %l: tensor<37x4xf32>,
                  %e: tensor<37x2xi32>, %dw: tensor<37x2xf32>, %a: tensor<37x64xbf16>, %b: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>) {
  %other = arith.addf %a, %b : tensor<37x64xbf16>
  // expected-error-re @+1 {{the GPU library '{{.*}}norouter.mlir' has no @__moe_gpu_router_grad_acc for an op that accumulates}}
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw accumulate(%other : tensor<37x64xbf16>) {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  return %dx, %dwr : tensor<37x64xbf16>, tensor<64x4xbf16>
}

//--- errors.mlir
func.func @config(%x: tensor<37x64xbf16>, %wr: tensor<64x4xbf16>, %l: tensor<37x4xf32>,
                  %e: tensor<37x2xi32>, %dw: tensor<37x2xf32>, %a: tensor<37x64xbf16>, %b: tensor<37x64xbf16>)
    -> (tensor<37x64xbf16>, tensor<64x4xbf16>) {
  %other = arith.addf %a, %b : tensor<37x64xbf16>
  // expected-error @+1 {{'moe_gpu.kernels' chooses a config of @__moe_gpu_router_grad_acc that cannot accumulate}}
  %dx, %dwr = moe.router_grad %x, %wr, %l, %e, %dw accumulate(%other : tensor<37x64xbf16>) {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>,
      moe_gpu.kernels = {dx = #moe_gpu.gemm<a = rows, b = w_k, epilogue = store_bf16, problem = varlen_m, store = bulk_rows>}}
      : tensor<37x64xbf16>, tensor<64x4xbf16>, tensor<37x4xf32>, tensor<37x2xi32>, tensor<37x2xf32> -> tensor<37x64xbf16>, tensor<64x4xbf16>
  return %dx, %dwr : tensor<37x64xbf16>, tensor<64x4xbf16>
}

// -----

func.func @not_returned(%y: tensor<74x64xbf16>, %w: tensor<37x2xf32>, %rows: tensor<37x2xi32>,
                        %a: tensor<37x64xbf16>, %b: tensor<37x64xbf16>) -> tensor<37x64xbf16> {
  %other = arith.addf %a, %b : tensor<37x64xbf16>
  // expected-error @+1 {{the GPU path needs the result of an op that accumulates returned or accumulated into}}
  %out = moe.combine %y, %w, %rows accumulate(%other : tensor<37x64xbf16>)
      : tensor<74x64xbf16>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x64xbf16>
  %twice = arith.addf %out, %out : tensor<37x64xbf16>
  return %twice : tensor<37x64xbf16>
}

// -----

func.func @argument(%y: tensor<74x64xbf16>, %w: tensor<37x2xf32>, %rows: tensor<37x2xi32>,
                    %a: tensor<37x64xbf16>) -> tensor<37x64xbf16> {
  // expected-error @+1 {{the GPU path needs the accumulate operand made by an op of the function's body (not a moe.prefetch) and read by this op alone}}
  %out = moe.combine %y, %w, %rows accumulate(%a : tensor<37x64xbf16>)
      : tensor<74x64xbf16>, tensor<37x2xf32>, tensor<37x2xi32> -> tensor<37x64xbf16>
  return %out : tensor<37x64xbf16>
}
