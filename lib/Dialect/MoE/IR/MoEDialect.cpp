//===- MoEDialect.cpp - MoE dialect -------------------------*- C++ -*-===//

#include "moe/Dialect/MoE/IR/MoEDialect.h"
#include "moe/Dialect/MoE/IR/MoEAttributes.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/IR/MoETypes.h"

#include "mlir/Interfaces/FunctionInterfaces.h"

using namespace mlir;
using namespace mlir::moe;

#include "moe/Dialect/MoE/IR/MoEOpsDialect.cpp.inc"

void MoEDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "moe/Dialect/MoE/IR/MoEOps.cpp.inc"
      >();
  registerTypes();
  registerAttributes();
}

LogicalResult MoEDialect::verifyOperationAttribute(Operation *op,
                                                   NamedAttribute attr) {
  if (attr.getName() == kEPStepTokensAttr) {
    auto step = dyn_cast<IntegerAttr>(attr.getValue());
    std::optional<int64_t> chunk = getMaxTokens(op);
    if (!isa<FunctionOpInterface>(op) || !step ||
        !step.getType().isSignlessInteger(64) || !chunk ||
        step.getInt() < *chunk)
      return op->emitOpError()
             << "'" << kEPStepTokensAttr
             << "' must be an i64 on a function with '" << kMaxTokensAttr
             << "' (a chunk's bound), and no smaller than it, got "
             << attr.getValue();
    return success();
  }
  if (attr.getName() != kMaxTokensAttr)
    return success();
  auto bound = dyn_cast<IntegerAttr>(attr.getValue());
  if (!isa<FunctionOpInterface>(op) || !bound ||
      !bound.getType().isSignlessInteger(64) || bound.getInt() < 1)
    return op->emitOpError()
           << "'" << kMaxTokensAttr
           << "' must be a positive i64 on a function (the bound on its "
              "layers' token count), got "
           << attr.getValue();
  return success();
}
