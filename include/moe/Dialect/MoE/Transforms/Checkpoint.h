//===- Checkpoint.h - moe.checkpoint regions ----------------*- C++ -*-===//

#ifndef MOE_DIALECT_MOE_TRANSFORMS_CHECKPOINT_H
#define MOE_DIALECT_MOE_TRANSFORMS_CHECKPOINT_H

#include "mlir/IR/Operation.h"

namespace mlir::moe {

/// Replaces every moe.checkpoint under `root` with the ops of its region.
/// After moe-generate-backward a checkpoint only marks what backward
/// recomputes; the conversions to kernels (CPU and GPU) run its ops in place.
void inlineCheckpoints(Operation *root);

} // namespace mlir::moe

#endif // MOE_DIALECT_MOE_TRANSFORMS_CHECKPOINT_H
