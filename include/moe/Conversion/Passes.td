//===- Passes.td - moe-mlir conversion passes ---------------*- tablegen -*-===//

#ifndef MOE_CONVERSION_PASSES_TD
#define MOE_CONVERSION_PASSES_TD

include "mlir/Pass/PassBase.td"

def ConvertMoEToLinalg : Pass<"convert-moe-to-linalg", "::mlir::ModuleOp"> {
  let summary = "lower every moe op to linalg, tensor, scf, arith and math (CPU path)";
  let description = [{
    The reference lowering that CI runs on the CPU. TODO: describe.
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
