//===- NestedModules.h - moe ops in nested modules ----------*- C++ -*-===//

#ifndef MOE_DIALECT_MOE_TRANSFORMS_NESTEDMODULES_H
#define MOE_DIALECT_MOE_TRANSFORMS_NESTEDMODULES_H

#include "mlir/IR/BuiltinOps.h"

namespace mlir::moe {

/// Fails with an error at the first module nested in `module` that holds moe
/// ops. The module passes (backward generation, offload, memory planning and
/// the conversions) work on the functions of the module they run on; moe ops
/// of an inner module would be left as they are, or lowered to calls of
/// kernels only the outer module gets. The error says how to run `pass` on
/// the inner module instead.
LogicalResult checkNoMoEInNestedModules(ModuleOp module, StringRef pass);

} // namespace mlir::moe

#endif // MOE_DIALECT_MOE_TRANSFORMS_NESTEDMODULES_H
