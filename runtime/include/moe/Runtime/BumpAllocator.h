//===- BumpAllocator.h - Offset and alignment math of the arena -*- C++ -*-===//
//
// The device arena (moeArena*) is one cuMemAlloc block handed out by bumping
// an offset. This class is that bookkeeping alone, on plain integers, so that
// it is tested without a GPU. Header-only: the runtime exports only its C API.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_RUNTIME_BUMPALLOCATOR_H
#define MOE_RUNTIME_BUMPALLOCATOR_H

#include "moe/Runtime/Runtime.h"

#include <cstddef>
#include <cstdint>

namespace moe::runtime {

/// True for 1, 2, 4, ...; false for 0.
inline bool isPowerOfTwo(uint64_t value) {
  return value != 0 && (value & (value - 1)) == 0;
}

/// Rounds `value` up to a multiple of the power of two `alignment`. Returns
/// false (and leaves `result` alone) if that overflows 64 bits.
inline bool alignUp(uint64_t value, uint64_t alignment, uint64_t &result) {
  uint64_t mask = alignment - 1;
  if (value > UINT64_MAX - mask)
    return false;
  result = (value + mask) & ~mask;
  return true;
}

/// Hands out [base, base + capacity) in increasing addresses. Alignment is
/// of the absolute address (base + offset), so a base that is less aligned
/// than a request is padded correctly.
class BumpAllocator {
public:
  BumpAllocator() = default;
  BumpAllocator(uint64_t base, uint64_t capacity)
      : base(base), capacity(capacity) {}

  /// Reserves `bytes` at an address that is a multiple of `alignment` (a
  /// power of two; 0 means MOE_ARENA_DEFAULT_ALIGNMENT). On success stores
  /// the address in `address`. Errors: bytes == 0 or a bad alignment give
  /// MOE_ERROR_INVALID_ARGUMENT, not enough room MOE_ERROR_OUT_OF_MEMORY;
  /// the state is unchanged then.
  moeStatus allocate(uint64_t bytes, uint64_t alignment, uint64_t &address) {
    if (alignment == 0)
      alignment = MOE_ARENA_DEFAULT_ALIGNMENT;
    if (bytes == 0 || !isPowerOfTwo(alignment))
      return MOE_ERROR_INVALID_ARGUMENT;
    uint64_t start;
    if (base > UINT64_MAX - offset || !alignUp(base + offset, alignment, start))
      return MOE_ERROR_OUT_OF_MEMORY;
    uint64_t newOffset = start - base;
    if (newOffset > capacity || bytes > capacity - newOffset)
      return MOE_ERROR_OUT_OF_MEMORY;
    offset = newOffset + bytes;
    if (offset > highWater)
      highWater = offset;
    ++count;
    address = start;
    return MOE_SUCCESS;
  }

  /// Frees everything; the high-water mark stays.
  void reset() {
    offset = 0;
    count = 0;
  }

  uint64_t getBase() const { return base; }
  uint64_t getCapacity() const { return capacity; }
  /// Bytes from base to the end of the last allocation (padding included).
  uint64_t getUsed() const { return offset; }
  uint64_t getHighWater() const { return highWater; }
  uint64_t getAllocationCount() const { return count; }
  uint64_t getAvailable() const { return capacity - offset; }

private:
  uint64_t base = 0;
  uint64_t capacity = 0;
  uint64_t offset = 0;
  uint64_t highWater = 0;
  uint64_t count = 0;
};

} // namespace moe::runtime

#endif // MOE_RUNTIME_BUMPALLOCATOR_H
