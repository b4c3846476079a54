//===- ByteSize.h - Checked byte counts of shaped types -----*- C++ -*-===//
//
// The planners add up the bytes of tensors whose shapes come from user input:
// a count that does not fit in 63 bits is an error, never a wrapped number.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_SUPPORT_BYTESIZE_H
#define MOE_SUPPORT_BYTESIZE_H

#include "mlir/IR/BuiltinTypeInterfaces.h"

#include <cstdint>
#include <optional>

namespace mlir::moe {

/// The largest byte count the planners handle: 2^63 - 1.
constexpr uint64_t kMaxByteSize = static_cast<uint64_t>(INT64_MAX);

/// What a byte count is.
enum class ByteSizeStatus { Known, Dynamic, Overflow };

/// The bytes that a statically shaped `type` holds (sub-byte element types
/// round up to a byte each, index counts 8). `status` says whether the count
/// is known, unknown (a dynamic dimension, or elements that are not
/// integers, indices or floats: Dynamic) or over kMaxByteSize; the result is
/// 0 unless it is known.
uint64_t getByteSize(ShapedType type, ByteSizeStatus &status);

/// a + b, or std::nullopt when the sum is over kMaxByteSize.
std::optional<uint64_t> addByteSizes(uint64_t a, uint64_t b);

} // namespace mlir::moe

#endif // MOE_SUPPORT_BYTESIZE_H
