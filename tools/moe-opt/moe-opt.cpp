//===- moe-opt.cpp - moe-mlir optimizer driver --------------*- C++ -*-===//

#include "moe/InitAll.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/PrettyStackTrace.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  registry.insert<mlir::arith::ArithDialect, mlir::func::FuncDialect,
                  mlir::scf::SCFDialect, mlir::tensor::TensorDialect>();
  mlir::moe::registerAllMoEDialects(registry);
  mlir::registerTransformsPasses();
  mlir::moe::registerAllMoEPasses();
  llvm::setBugReportMsg(
      "Please report this moe-mlir bug and attach the file written by "
      "--mlir-pass-pipeline-crash-reproducer=<file>.\n");
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "moe-mlir optimizer driver\n", registry));
}
