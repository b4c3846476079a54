//===- TokenShapes.h - how tensor sizes follow the token count -*- C++ -*-===//
//
// With a dynamic token count (moe.layer's max_tokens) the leading dimension of
// a tensor is T (x, the routing pairs, the logits, the outputs and their
// gradients), T * k (the expert-ordered rows: the token ids, the experts' y
// and h and their gradients) or not tied to T at all (weights, offsets, and
// with expert parallelism the [ep_size * capacity] rows a rank sends and
// receives, its counts and queues, and what its experts compute on them).
// The plans count and place bytes at the bound and report them as functions
// of T; the GPU path sizes its buffers from the T of a call.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_DIALECT_MOE_IR_TOKENSHAPES_H
#define MOE_DIALECT_MOE_IR_TOKENSHAPES_H

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Value.h"

#include <cstdint>
#include <optional>

namespace mlir::moe {

/// Rows of `value`'s leading dimension a token: 1 for [T, ...], k for
/// [T * k, ...], 0 for a tensor whose size does not follow T (and for
/// anything that is no tensor). nullopt where the rows follow T * k but k is
/// not known (no routing of the function says it, or two say different k).
/// The answer comes from what the moe ops compute, so it holds whether the
/// dimension is static or dynamic.
std::optional<int64_t> getRowsPerToken(Value value);

/// The bytes of a tensor as a function of T: `perToken * T + fixed`.
struct TokenBytes {
  uint64_t perToken = 0, fixed = 0;

  /// The bytes at `tokens` tokens; nullopt past 2^63 - 1.
  std::optional<uint64_t> at(uint64_t tokens) const;
};

/// The bytes of `value`'s tensor (the device tensor of a host tensor) as a
/// function of T: a leading dimension that follows T counts `rows a token *
/// T`, every other dimension must be static. nullopt where it cannot be told
/// (another dynamic dimension, k unknown, past 2^63 - 1 bytes).
std::optional<TokenBytes> getTokenBytes(Value value);

/// `value`'s ranked tensor type (the device type of a host tensor) at
/// `tokens` tokens: the leading dimension `rows a token * tokens` where it
/// follows T. nullopt where getTokenBytes is.
std::optional<RankedTensorType> getTypeAtTokens(Value value, int64_t tokens);

} // namespace mlir::moe

#endif // MOE_DIALECT_MOE_IR_TOKENSHAPES_H
