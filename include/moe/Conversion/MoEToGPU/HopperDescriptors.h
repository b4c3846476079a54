//===- HopperDescriptors.h - wgmma descriptors and 128B swizzle -*- C++ -*-===//
//
// The arithmetic of the GEMM kernels' shared-memory operands
// (docs/gpu-kernels.md §6.2): wgmma matrix descriptors and the 128B swizzle
// that cp.async copies and TMA boxes write. The pure functions state the
// values; the build* functions emit the same computation as arith ops. Their
// order of ops and of constant requests is fixed: the library's text is pinned
// (the digest in test/Conversion/MoEToGPU/emit-library.mlir) and the kernel
// cache keys on it, so changing the order changes the kernels.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CONVERSION_MOETOGPU_HOPPERDESCRIPTORS_H
#define MOE_CONVERSION_MOETOGPU_HOPPERDESCRIPTORS_H

#include "mlir/IR/Block.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/Location.h"
#include "mlir/IR/Value.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLFunctionalExtras.h"

#include <cstdint>
#include <optional>
#include <string>

namespace mlir::moe::hopper {

/// The swizzle of a shared-memory operand: the span whose 16-byte chunks are
/// permuted. The enumerators are not the PTX encoding (wgmmaSwizzleField).
enum class Swizzle { None, Bytes32, Bytes64, Bytes128 };

/// Which dimension of an operand tile is contiguous in shared memory.
enum class OperandMajor { KMajor, MNMajor };

//===----------------------------------------------------------------------===//
// wgmma matrix descriptors
//===----------------------------------------------------------------------===//

/// The constant parts of the descriptors of the GEMMs' K-major and MN-major
/// tiles (wgmmaTileDescriptorConstant).
constexpr uint64_t kDescriptorKMajor = 0x4000004004000000;
constexpr uint64_t kDescriptorMNMajor = 0x4000004002000000;

/// Bits 62-63 of a descriptor: 0 none, 1 128B, 2 64B, 3 32B (PTX ISA).
uint64_t wgmmaSwizzleField(Swizzle swizzle);

/// The constant part of a wgmma shared-memory matrix descriptor: swizzle
/// (bits 62-63), leading byte offset (bits 16-29) and stride byte offset
/// (bits 32-45), both offsets in bytes; the base offset (bits 49-51) is 0
/// because every tile starts 1024-aligned. An offset must be a multiple of 16
/// whose value / 16 fits its 14-bit field; otherwise returns nullopt and, if
/// `error` is given, says why.
std::optional<uint64_t> wgmmaDescriptorConstant(Swizzle swizzle,
                                                uint64_t leadingByteOffset,
                                                uint64_t strideByteOffset,
                                                std::string *error = nullptr);

/// The constant of the 128B-swizzled tiles the GEMMs use, whose 128-byte rows
/// hold 64 bf16: SBO = 8 rows x 128 B = 1024 B (one swizzle atom) for both;
/// LBO = 16 KiB for a K-major tile (unused with a 128B swizzle; the value
/// nvgpu emits) and 8 KiB for an MN-major tile (the distance between two
/// 64-column boxes of 64 K-rows). Equal to kDescriptorKMajor and
/// kDescriptorMNMajor.
uint64_t wgmmaTileDescriptorConstant(OperandMajor major);

/// A descriptor of the operand at `sharedAddress`: the start-address field is
/// address bits 4-17 (shared addresses stay below 2^18, higher bits are
/// dropped), or-ed into `constant`.
constexpr uint64_t wgmmaDescriptor(uint64_t sharedAddress, uint64_t constant) {
  return ((sharedAddress & 0x3FFFF) >> 4) | constant;
}

//===----------------------------------------------------------------------===//
// 128B swizzle
//===----------------------------------------------------------------------===//

/// A 128B-swizzled row: 128 bytes, 8 chunks of 16 bytes (8 bf16 each); the
/// pattern repeats every 8 rows (one 1024-byte atom).
constexpr uint64_t kSwizzleRowElements = 64;
constexpr uint64_t kChunkElements = 8;
constexpr uint64_t kSwizzleRows = 8;
/// An MN-major box: 64 K-rows of 64 columns (8 KiB, the MN-major LBO).
constexpr uint64_t kBoxElements = 64 * kSwizzleRowElements;

/// The 16-byte chunk where chunk `chunk` of row `row` lands under the 128B
/// swizzle: the XOR with row % 8 spreads the 8 rows of an atom's column
/// over the 8 bank groups, which is what TMA writes and wgmma reads. Bits of
/// `chunk` above the low 3 pass through unchanged.
constexpr uint64_t swizzle128BChunk(uint64_t row, uint64_t chunk) {
  return chunk ^ (row % kSwizzleRows);
}

/// The bf16 element offset of chunk `chunk` of row `row` in a K-major tile
/// (k_soff in the kernels): a row is one 64-element K slice, 128 bytes,
/// so each row is its own swizzle span.
constexpr uint64_t kMajorElementOffset(uint64_t row, uint64_t chunk) {
  return row * kSwizzleRowElements +
         swizzle128BChunk(row, chunk) * kChunkElements;
}

/// The bf16 element offset of chunk `chunk` of K-row `row` in box `box` of an
/// MN-major tile (m_soff of the B tile, 4 boxes; a_soff_mn of the A tile, 2
/// boxes): a 128B swizzle spans only 64 bf16 columns, so wider tiles are
/// stored as boxes of kBoxElements one after another, each swizzled alone.
constexpr uint64_t mnMajorElementOffset(uint64_t box, uint64_t row,
                                        uint64_t chunk) {
  return box * kBoxElements + row * kSwizzleRowElements +
         swizzle128BChunk(row, chunk) * kChunkElements;
}

//===----------------------------------------------------------------------===//
// IR builders
//===----------------------------------------------------------------------===//

/// Returns the arith.constant of `value` (two's complement in `type`'s width)
/// for the function being built. The kernels hold one constant per
/// (value, type) and function, at the top of the function in the order of
/// first request; the build* functions request each constant just before the
/// op that uses it, which fixes that order, and leave caching to this callback
/// (ConstantCache).
using GetConstantFn = llvm::function_ref<Value(int64_t value, Type type)>;

/// The kernels' constant cache: one arith.constant per (value, type) in a
/// function, created on first request after the constants created before it
/// at the start of `entry` (so that every region of the function can use it).
/// Integer and index constants only; they must not be erased while the cache
/// is in use.
class ConstantCache {
public:
  ConstantCache(Block &entry, Location loc) : entry(&entry), loc(loc) {}

  /// The constant `value` of integer or index type `type`.
  Value get(int64_t value, Type type);
  /// The constant `attr` (any type: the GEMMs also hoist f32 and i1).
  Value get(TypedAttr attr);
  Value operator()(int64_t value, Type type) { return get(value, type); }

private:
  Block *entry;
  Location loc;
  /// The last constant created: the next goes after it.
  Operation *last = nullptr;
  llvm::DenseMap<Attribute, Value> constants;
};

/// Emits wgmmaDescriptor(sharedAddressI64, constant), the GEMMs' desc():
/// arith.andi with 0x3FFFF, arith.shrui by 4, arith.ori with `constant`, all
/// i64, requesting each constant just before the op that uses it.
Value buildWgmmaDescriptor(OpBuilder &builder, Location loc,
                           Value sharedAddressI64, uint64_t constant,
                           GetConstantFn getConstant);

/// Emits swizzle128BChunk: arith.remui row, 8; arith.xori chunk, that.
Value buildSwizzle128BChunk(OpBuilder &builder, Location loc, Value row,
                            Value chunk, GetConstantFn getConstant);

/// Emits kMajorElementOffset as k_soff: the swizzled chunk, then
/// row * 64 + swizzled * 8.
Value buildKMajorElementOffset(OpBuilder &builder, Location loc, Value row,
                               Value chunk, GetConstantFn getConstant);

/// Where a kernel computes the swizzle of an MN-major offset, which
/// decides the op order: before the box and row terms (m_soff, the B tile) or
/// after their sum (a_soff_mn, the A tile).
enum class SwizzleOrder { First, Last };

/// Emits mnMajorElementOffset as ((box * 4096 + row * 64) + swizzled * 8),
/// with the swizzled chunk computed as `order` says.
Value buildMNMajorElementOffset(OpBuilder &builder, Location loc, Value box,
                                Value row, Value chunk, SwizzleOrder order,
                                GetConstantFn getConstant);

} // namespace mlir::moe::hopper

#endif // MOE_CONVERSION_MOETOGPU_HOPPERDESCRIPTORS_H
