//===- ArenaPlacement.h - Static offsets in one arena -------*- C++ -*-===//
//
// Buffers with known sizes and lifetimes (inclusive op indices) placed in one
// arena: moe-plan-memory places each function's temporaries, and
// convert-moe-to-gpu checks the placement it is given.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_SUPPORT_ARENAPLACEMENT_H
#define MOE_SUPPORT_ARENAPLACEMENT_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <optional>
#include <utility>

namespace mlir::moe {

/// A buffer to place: its bytes, and the first and last op that use it.
struct ArenaBuffer {
  uint64_t size = 0;
  unsigned first = 0, last = 0;
};

/// Offsets for `buffers`, multiples of `alignment`: largest first (then
/// earliest, then in the order given), each into the smallest gap between
/// the already placed buffers live at the same time that holds it. Returns
/// the arena's size, the end of the highest buffer.
uint64_t placeInArena(llvm::ArrayRef<ArenaBuffer> buffers, uint64_t alignment,
                      llvm::SmallVectorImpl<uint64_t> &offsets);

/// Two buffers that are live at one op and share a byte at `offsets`, or
/// nullopt: the check of a placement.
std::optional<std::pair<unsigned, unsigned>>
findArenaOverlap(llvm::ArrayRef<ArenaBuffer> buffers,
                 llvm::ArrayRef<uint64_t> offsets);

} // namespace mlir::moe

#endif // MOE_SUPPORT_ARENAPLACEMENT_H
