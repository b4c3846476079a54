//===- Prefetch.h - the work that waits for a moe.prefetch ----*- C++ -*-===//

#ifndef MOE_DIALECT_MOE_TRANSFORMS_PREFETCH_H
#define MOE_DIALECT_MOE_TRANSFORMS_PREFETCH_H

#include "mlir/IR/Block.h"
#include "llvm/ADT/DenseSet.h"

namespace mlir::moe {

/// The ops of `body` that read the result of one of its moe.prefetch ops,
/// directly or through the ops before them (and the prefetches themselves):
/// the work moe-offload schedules after the rest, and that moe-fold-adds does
/// not move an op past.
llvm::DenseSet<Operation *> getPrefetchDependents(Block &body);

} // namespace mlir::moe

#endif // MOE_DIALECT_MOE_TRANSFORMS_PREFETCH_H
