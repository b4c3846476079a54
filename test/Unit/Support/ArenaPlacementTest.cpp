//===- ArenaPlacementTest.cpp - placeInArena and findArenaOverlap ---------===//

#include "moe/Support/ArenaPlacement.h"

#include "gtest/gtest.h"

using namespace mlir::moe;
using llvm::SmallVector;

namespace {

TEST(ArenaPlacement, ReusesTheBytesOfDeadBuffers) {
  // a [0, 1], b [1, 2], c [2, 3]: c can take a's place, not b's.
  SmallVector<ArenaBuffer> buffers = {{1000, 0, 1}, {500, 1, 2}, {1000, 2, 3}};
  SmallVector<uint64_t> offsets;
  uint64_t size = placeInArena(buffers, 256, offsets);
  EXPECT_EQ(offsets[0], 0u);
  EXPECT_EQ(offsets[2], 0u);
  EXPECT_EQ(offsets[1], 1024u) << "after a, aligned to 256";
  EXPECT_EQ(size, 1524u);
  EXPECT_FALSE(findArenaOverlap(buffers, offsets));
}

TEST(ArenaPlacement, LargestFirstIntoTheSmallestGap) {
  // Two long-lived buffers with a 4 KiB hole between them after the first
  // short one dies: a later 4 KiB buffer goes into the hole, not the top.
  SmallVector<ArenaBuffer> buffers = {
      {8192, 0, 9}, {4096, 0, 1}, {8192, 0, 9}, {4096, 2, 3}};
  SmallVector<uint64_t> offsets;
  uint64_t size = placeInArena(buffers, 256, offsets);
  EXPECT_EQ(size, 8192u * 2 + 4096u);
  EXPECT_EQ(offsets[3], offsets[1]);
  EXPECT_FALSE(findArenaOverlap(buffers, offsets));
}

TEST(ArenaPlacement, FindsOverlaps) {
  SmallVector<ArenaBuffer> buffers = {{100, 0, 2}, {100, 2, 4}, {100, 3, 4}};
  EXPECT_FALSE(findArenaOverlap(buffers, {0, 100, 0}));
  auto overlap = findArenaOverlap(buffers, {0, 50, 200});
  ASSERT_TRUE(overlap);
  EXPECT_EQ(overlap->first, 0u);
  EXPECT_EQ(overlap->second, 1u);
  // Empty buffers overlap nothing.
  EXPECT_FALSE(findArenaOverlap({{0, 0, 4}, {100, 0, 4}}, {0, 0}));
}

TEST(ArenaPlacement, EmptyAndUnaligned) {
  SmallVector<uint64_t> offsets;
  EXPECT_EQ(placeInArena({}, 256, offsets), 0u);
  EXPECT_TRUE(offsets.empty());
  SmallVector<ArenaBuffer> buffers = {{3, 0, 1}, {5, 0, 1}};
  EXPECT_EQ(placeInArena(buffers, 1, offsets), 8u);
  EXPECT_FALSE(findArenaOverlap(buffers, offsets));
}

} // namespace
