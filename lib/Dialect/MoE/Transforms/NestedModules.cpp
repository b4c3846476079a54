//===- NestedModules.cpp - moe ops in nested modules --------*- C++ -*-===//

#include "moe/Dialect/MoE/Transforms/NestedModules.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"

using namespace mlir;
using namespace mlir::moe;

LogicalResult mlir::moe::checkNoMoEInNestedModules(ModuleOp module,
                                                   StringRef pass) {
  for (auto inner : module.getBody()->getOps<ModuleOp>()) {
    WalkResult found = inner.walk([](Operation *op) {
      return isa<MoEDialect>(op->getDialect()) ? WalkResult::interrupt()
                                               : WalkResult::advance();
    });
    if (!found.wasInterrupted())
      continue;
    // At the location only: the note with the whole module is noise here.
    InFlightDiagnostic diag = mlir::emitError(inner.getLoc());
    diag << pass << " runs on the functions of the module it is given, and "
         << "this nested module holds moe ops it would not reach; run it on "
         << "the nested module: --pass-pipeline='builtin.module(builtin.module("
         << pass << "))'";
    return failure();
  }
  return success();
}
