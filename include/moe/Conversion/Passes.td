//===- Passes.td - moe-mlir conversion passes ---------------*- tablegen -*-===//

#ifndef MOE_CONVERSION_PASSES_TD
#define MOE_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

def ConvertMoEToLinalg : Pass<"convert-moe-to-linalg", "::mlir::ModuleOp"> {
  let summary = "lower every moe op to linalg, tensor, scf, arith and math (CPU path)";
  let description = [{
    The reference lowering that CI runs on the CPU (docs/cpu-path.md). Every
    moe op becomes a `func.call` of a kernel written once in MLIR (linalg,
    tensor, scf, arith, math) in `lib/Conversion/MoEToLinalg/MoECPULibrary.mlir`,
    which is embedded in the compiler; the kernels the module calls, and the
    helpers they call, are copied into it as private functions (a function
    of the same name that the module already has is kept).

    Kernels take dynamically shaped f32 tensors (i32 for indices) and scalar
    configuration, so each call is wrapped in `arith.extf`/`arith.truncf` for
    bf16/f16 data and `tensor.cast` to and from the op's static shapes.
    Before the conversion, `moe.layer` is decomposed as by `moe-decompose`
    and `moe.checkpoint` regions are inlined. `moe.offload` and
    `moe.prefetch` become tensor copies, and `!moe.host_tensor` becomes the
    tensor type it mirrors everywhere, function signatures included. A
    missing router bias is a zero tensor; the dispatch capacity is
    `ceil(capacity_factor * T * k / E)` (f64, at run time when T is dynamic),
    or `T * k` without a capacity factor.

    ```mlir
    %out = moe.combine %y, %w, %rows
        : tensor<8x4xbf16>, tensor<4x2xf32>, tensor<4x2xi32> -> tensor<4x4xbf16>
    ```

    becomes

    ```mlir
    %0 = arith.extf %y : tensor<8x4xbf16> to tensor<8x4xf32>
    %1 = tensor.cast %0 : tensor<8x4xf32> to tensor<?x?xf32>
    %2 = tensor.cast %w : tensor<4x2xf32> to tensor<?x?xf32>
    %3 = tensor.cast %rows : tensor<4x2xi32> to tensor<?x?xi32>
    %4 = call @__moe_cpu_combine(%1, %2, %3)
        : (tensor<?x?xf32>, tensor<?x?xf32>, tensor<?x?xi32>) -> tensor<?x?xf32>
    %5 = tensor.cast %4 : tensor<?x?xf32> to tensor<4x4xf32>
    %out = arith.truncf %5 : tensor<4x4xf32> to tensor<4x4xbf16>
    ...
    func.func private @__moe_cpu_combine(%y: tensor<?x?xf32>,
        %weights: tensor<?x?xf32>, %rows: tensor<?x?xi32>) -> tensor<?x?xf32>
    ```

    A layer whose number of experts is not static cannot be decomposed and
    gets an error.
  }];
  let dependentDialects = [
    "::mlir::arith::ArithDialect",
    "::mlir::func::FuncDialect",
    "::mlir::linalg::LinalgDialect",
    "::mlir::math::MathDialect",
    "::mlir::scf::SCFDialect",
    "::mlir::tensor::TensorDialect"
  ];
}

#endif // MOE_CONVERSION_PASSES_TD
