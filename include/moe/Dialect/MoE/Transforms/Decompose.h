//===- Decompose.h - moe.layer decomposition ----------------*- C++ -*-===//

#ifndef MOE_DIALECT_MOE_TRANSFORMS_DECOMPOSE_H
#define MOE_DIALECT_MOE_TRANSFORMS_DECOMPOSE_H

#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/IR/PatternMatch.h"

namespace mlir::moe {

/// Replaces `layer` with its moe.router, moe.dispatch, moe.expert_ffn and
/// moe.combine chain (plus moe.shared_expert and an add with shared experts),
/// as `moe-decompose` does. Fails with a diagnostic on the layer when the
/// number of experts is not static.
LogicalResult decomposeLayer(RewriterBase &rewriter, LayerOp layer);

} // namespace mlir::moe

#endif // MOE_DIALECT_MOE_TRANSFORMS_DECOMPOSE_H
