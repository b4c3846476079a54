//===- MoEDialect.cpp - MoE dialect -------------------------*- C++ -*-===//

#include "moe/Dialect/MoE/IR/MoEDialect.h"
#include "moe/Dialect/MoE/IR/MoEAttributes.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/IR/MoETypes.h"

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
