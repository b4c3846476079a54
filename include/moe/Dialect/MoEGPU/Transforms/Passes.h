//===- Passes.h - moe_gpu passes ----------------------------*- C++ -*-===//

#ifndef MOE_DIALECT_MOEGPU_TRANSFORMS_PASSES_H
#define MOE_DIALECT_MOEGPU_TRANSFORMS_PASSES_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"
#include "moe/Dialect/MoEGPU/IR/MoEGPUDialect.h"

namespace mlir::moe_gpu {

#define GEN_PASS_DECL
#include "moe/Dialect/MoEGPU/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "moe/Dialect/MoEGPU/Transforms/Passes.h.inc"

} // namespace mlir::moe_gpu

#endif // MOE_DIALECT_MOEGPU_TRANSFORMS_PASSES_H
