//===- TrainingAttributes.h - forward/backward attribute names --*- C++ -*-===//
//
// The attributes moe-generate-backward puts on @f_forward / @f_backward and
// the activation plan puts on ops; every pass that reads them uses these
// names (docs/dialect.md, docs/memory.md).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_DIALECT_MOE_TRANSFORMS_TRAININGATTRIBUTES_H
#define MOE_DIALECT_MOE_TRANSFORMS_TRAININGATTRIBUTES_H

#include "llvm/ADT/StringRef.h"

namespace mlir::moe {

/// On @f_forward: how many of its last results are saved for backward.
constexpr llvm::StringLiteral kNumSavedAttr = "moe.num_saved";
/// On a saved argument of @f_backward: the name of the saved tensor.
constexpr llvm::StringLiteral kSavedAttr = "moe.saved";
/// On an op or checkpoint: what the activation plan decided ("recompute",
/// "offload").
constexpr llvm::StringLiteral kPlanAttr = "moe.plan";
/// moe-plan-memory's arena: each op's result offsets (-1 outside it) and the
/// step's arena size, on both functions of the pair.
constexpr llvm::StringLiteral kArenaOffsetsAttr = "moe.arena_offsets";
constexpr llvm::StringLiteral kArenaSizeAttr = "moe.arena_size";

} // namespace mlir::moe

#endif // MOE_DIALECT_MOE_TRANSFORMS_TRAININGATTRIBUTES_H
