//===- ArenaTest.cpp - Bump allocation math of the device arena -*- C++ -*-===//

#include "moe/Runtime/BumpAllocator.h"

#include "gtest/gtest.h"

using moe::runtime::alignUp;
using moe::runtime::BumpAllocator;
using moe::runtime::isPowerOfTwo;

namespace {

TEST(RuntimeArena, PowerOfTwo) {
  EXPECT_FALSE(isPowerOfTwo(0));
  EXPECT_TRUE(isPowerOfTwo(1));
  EXPECT_TRUE(isPowerOfTwo(256));
  EXPECT_FALSE(isPowerOfTwo(384));
  EXPECT_TRUE(isPowerOfTwo(uint64_t(1) << 63));
  EXPECT_FALSE(isPowerOfTwo(UINT64_MAX));
}

TEST(RuntimeArena, AlignUp) {
  uint64_t result = 0;
  ASSERT_TRUE(alignUp(0, 256, result));
  EXPECT_EQ(result, 0u);
  ASSERT_TRUE(alignUp(1, 256, result));
  EXPECT_EQ(result, 256u);
  ASSERT_TRUE(alignUp(256, 256, result));
  EXPECT_EQ(result, 256u);
  ASSERT_TRUE(alignUp(1000, 1024, result));
  EXPECT_EQ(result, 1024u);
  result = 7;
  EXPECT_FALSE(alignUp(UINT64_MAX - 10, 256, result));
  EXPECT_EQ(result, 7u);
}

TEST(RuntimeArena, DefaultAlignmentIs256) {
  BumpAllocator arena(0x10000, 4096);
  uint64_t a = 0, b = 0;
  ASSERT_EQ(arena.allocate(10, 0, a), MOE_SUCCESS);
  ASSERT_EQ(arena.allocate(10, 0, b), MOE_SUCCESS);
  EXPECT_EQ(a, 0x10000u);
  EXPECT_EQ(b, 0x10000u + MOE_ARENA_DEFAULT_ALIGNMENT);
  EXPECT_EQ(arena.getUsed(), 256u + 10u);
  EXPECT_EQ(arena.getAllocationCount(), 2u);
}

TEST(RuntimeArena, AlignsTheAbsoluteAddress) {
  // A base that is only 16-byte aligned: a 1024-byte request is padded to
  // the next 1024-byte address, not to base + 1024.
  BumpAllocator arena(0x10010, 8192);
  uint64_t address = 0;
  ASSERT_EQ(arena.allocate(4, 1024, address), MOE_SUCCESS);
  EXPECT_EQ(address % 1024, 0u);
  EXPECT_EQ(address, 0x10400u);
  EXPECT_EQ(arena.getUsed(), 0x10400u - 0x10010u + 4u);
  ASSERT_EQ(arena.allocate(1, 1, address), MOE_SUCCESS);
  EXPECT_EQ(address, 0x10404u);
}

TEST(RuntimeArena, PackedSmallAlignments) {
  BumpAllocator arena(0x1000, 64);
  uint64_t address = 0;
  for (uint64_t i = 0; i < 16; ++i) {
    ASSERT_EQ(arena.allocate(4, 4, address), MOE_SUCCESS);
    EXPECT_EQ(address, 0x1000u + 4 * i);
  }
  EXPECT_EQ(arena.getAvailable(), 0u);
  EXPECT_EQ(arena.allocate(1, 1, address), MOE_ERROR_OUT_OF_MEMORY);
}

TEST(RuntimeArena, ExhaustionLeavesStateUnchanged) {
  BumpAllocator arena(0x100000, 1024);
  uint64_t address = 0;
  ASSERT_EQ(arena.allocate(1000, 256, address), MOE_SUCCESS);
  uint64_t kept = 12345;
  address = kept;
  EXPECT_EQ(arena.allocate(100, 256, address), MOE_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(address, kept);
  EXPECT_EQ(arena.getUsed(), 1000u);
  EXPECT_EQ(arena.getAllocationCount(), 1u);
  // It fits exactly once the padding is counted: 1000 -> 1008 (16-aligned).
  ASSERT_EQ(arena.allocate(16, 16, address), MOE_SUCCESS);
  EXPECT_EQ(address, 0x100000u + 1008u);
  EXPECT_EQ(arena.getUsed(), 1024u);
}

TEST(RuntimeArena, WholeCapacityAndOneMore) {
  BumpAllocator arena(0, 4096);
  uint64_t address = 1;
  EXPECT_EQ(arena.allocate(4097, 1, address), MOE_ERROR_OUT_OF_MEMORY);
  ASSERT_EQ(arena.allocate(4096, 1, address), MOE_SUCCESS);
  EXPECT_EQ(address, 0u);
  EXPECT_EQ(arena.allocate(1, 1, address), MOE_ERROR_OUT_OF_MEMORY);
}

TEST(RuntimeArena, HugeRequestsDoNotOverflow) {
  BumpAllocator arena(UINT64_MAX - 4095, 4096);
  uint64_t address = 0;
  EXPECT_EQ(arena.allocate(UINT64_MAX, 1, address), MOE_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(arena.allocate(16, uint64_t(1) << 63, address),
            MOE_ERROR_OUT_OF_MEMORY);
  ASSERT_EQ(arena.allocate(16, 16, address), MOE_SUCCESS);
  EXPECT_EQ(address, UINT64_MAX - 4095);
}

TEST(RuntimeArena, RejectsZeroBytesAndBadAlignment) {
  BumpAllocator arena(0x1000, 4096);
  uint64_t address = 0;
  EXPECT_EQ(arena.allocate(0, 16, address), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(arena.allocate(16, 3, address), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(arena.allocate(16, 384, address), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(arena.getUsed(), 0u);
  EXPECT_EQ(arena.getAllocationCount(), 0u);
}

TEST(RuntimeArena, ResetKeepsTheHighWaterMark) {
  BumpAllocator arena(0x2000, 1 << 20);
  uint64_t address = 0;
  ASSERT_EQ(arena.allocate(3000, 256, address), MOE_SUCCESS);
  ASSERT_EQ(arena.allocate(5000, 256, address), MOE_SUCCESS);
  uint64_t peak = arena.getUsed();
  EXPECT_EQ(peak, 3072u + 5000u);
  EXPECT_EQ(arena.getHighWater(), peak);
  arena.reset();
  EXPECT_EQ(arena.getUsed(), 0u);
  EXPECT_EQ(arena.getAllocationCount(), 0u);
  EXPECT_EQ(arena.getHighWater(), peak);
  ASSERT_EQ(arena.allocate(100, 256, address), MOE_SUCCESS);
  EXPECT_EQ(address, 0x2000u);
  EXPECT_EQ(arena.getHighWater(), peak);
  ASSERT_EQ(arena.allocate(10000, 256, address), MOE_SUCCESS);
  EXPECT_EQ(arena.getHighWater(), 256u + 10000u);
}

} // namespace
