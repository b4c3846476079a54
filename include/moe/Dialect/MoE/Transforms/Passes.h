//===- Passes.h - MoE dialect passes ------------------------*- C++ -*-===//

#ifndef MOE_DIALECT_MOE_TRANSFORMS_PASSES_H
#define MOE_DIALECT_MOE_TRANSFORMS_PASSES_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Pass/Pass.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"

namespace mlir::moe {

#define GEN_PASS_DECL
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"

} // namespace mlir::moe

#endif // MOE_DIALECT_MOE_TRANSFORMS_PASSES_H
