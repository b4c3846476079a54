//===- moe-reduce.cpp - moe-mlir test case reducer ----------*- C++ -*-===//
//
// mlir-reduce with the dialects and passes of moe-opt, so that a failing
// moe-opt input can be cut down:
//
//   moe-reduce bad.mlir --reduction-tree='traversal-mode=0 test=check.sh'
//
// The interestingness script gets the candidate file as its last argument and
// must exit 1 when the candidate is still interesting.
//
//===----------------------------------------------------------------------===//

#include "moe/InitAll.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Tools/mlir-reduce/MlirReduceMain.h"
#include "mlir/Transforms/Passes.h"

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  mlir::moe::registerAllMoEToolDialects(registry);
  mlir::registerTransformsPasses();
  mlir::moe::registerAllMoEPasses();
  mlir::MLIRContext context(registry);
  return mlir::failed(mlir::mlirReduceMain(argc, argv, context));
}
