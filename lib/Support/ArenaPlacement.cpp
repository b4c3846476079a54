//===- ArenaPlacement.cpp - Static offsets in one arena -----------------===//

#include "moe/Support/ArenaPlacement.h"

#include "llvm/ADT/STLExtras.h"

#include <algorithm>
#include <numeric>
#include <tuple>

using namespace mlir::moe;

namespace {

bool overlapInTime(const ArenaBuffer &a, const ArenaBuffer &b) {
  return a.first <= b.last && b.first <= a.last;
}

} // namespace

uint64_t mlir::moe::placeInArena(llvm::ArrayRef<ArenaBuffer> buffers,
                                 uint64_t alignment,
                                 llvm::SmallVectorImpl<uint64_t> &offsets) {
  offsets.assign(buffers.size(), 0);
  llvm::SmallVector<unsigned> order(buffers.size());
  std::iota(order.begin(), order.end(), 0u);
  llvm::sort(order, [&](unsigned a, unsigned b) {
    return std::make_tuple(~buffers[a].size, buffers[a].first, a) <
           std::make_tuple(~buffers[b].size, buffers[b].first, b);
  });
  auto alignUp = [&](uint64_t offset) {
    return alignment > 1 ? (offset + alignment - 1) / alignment * alignment
                         : offset;
  };
  uint64_t arenaSize = 0;
  llvm::SmallVector<unsigned> placed;
  for (unsigned index : order) {
    const ArenaBuffer &buffer = buffers[index];
    llvm::SmallVector<unsigned> live;
    for (unsigned other : placed)
      if (overlapInTime(buffer, buffers[other]))
        live.push_back(other);
    llvm::sort(live, [&](unsigned a, unsigned b) {
      return std::make_pair(offsets[a], buffers[a].size) <
             std::make_pair(offsets[b], buffers[b].size);
    });
    // Best fit: the smallest gap between live buffers that holds it.
    std::optional<std::pair<uint64_t, uint64_t>> best; // (gap, offset)
    uint64_t end = 0;
    for (unsigned other : live) {
      uint64_t start = alignUp(end);
      if (offsets[other] >= start && offsets[other] - start >= buffer.size) {
        uint64_t gap = offsets[other] - start;
        if (!best || gap < best->first)
          best = std::make_pair(gap, start);
      }
      end = std::max(end, offsets[other] + buffers[other].size);
    }
    offsets[index] = best ? best->second : alignUp(end);
    placed.push_back(index);
    arenaSize = std::max(arenaSize, offsets[index] + buffer.size);
  }
  return arenaSize;
}

std::optional<std::pair<unsigned, unsigned>>
mlir::moe::findArenaOverlap(llvm::ArrayRef<ArenaBuffer> buffers,
                            llvm::ArrayRef<uint64_t> offsets) {
  for (unsigned a = 0; a < buffers.size(); ++a)
    for (unsigned b = a + 1; b < buffers.size(); ++b)
      if (overlapInTime(buffers[a], buffers[b]) && buffers[a].size &&
          buffers[b].size && offsets[a] < offsets[b] + buffers[b].size &&
          offsets[b] < offsets[a] + buffers[a].size)
        return std::make_pair(a, b);
  return std::nullopt;
}
