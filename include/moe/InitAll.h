//===- InitAll.h - Register everything moe-mlir defines -----*- C++ -*-===//

#ifndef MOE_INITALL_H
#define MOE_INITALL_H

#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Pipelines/Pipelines.h"

#include "mlir/IR/DialectRegistry.h"

namespace mlir::moe {

/// The moe dialect and the dialects its passes produce.
inline void registerAllMoEDialects(DialectRegistry &registry) {
  registry.insert<MoEDialect>();
}

/// moe-* passes and pipelines.
inline void registerAllMoEPasses() {
  registerMoEPasses();
  registerMoEConversionPasses();
  registerMoEPipelines();
}

} // namespace mlir::moe

#endif // MOE_INITALL_H
