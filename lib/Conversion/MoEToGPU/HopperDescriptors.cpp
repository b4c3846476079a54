//===- HopperDescriptors.cpp - wgmma descriptors, 128B swizzle -*- C++ -*-===//
//
// The field layout follows the PTX ISA's shared memory matrix descriptor
// (wgmma); the IR builders emit the GEMM kernels' ops in their pinned order
// (HopperDescriptors.h).
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/MoEToGPU/HopperDescriptors.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/ErrorHandling.h"

using namespace mlir;
using namespace mlir::moe::hopper;

namespace {

constexpr unsigned kLeadingByteOffsetShift = 16;
constexpr unsigned kStrideByteOffsetShift = 32;
constexpr unsigned kSwizzleShift = 62;
constexpr unsigned kOffsetFieldBits = 14;
/// Offsets are encoded in units of 16 bytes.
constexpr uint64_t kOffsetUnit = 16;

/// The 14-bit field of byte offset `bytes`, or nullopt with `error` set.
std::optional<uint64_t> encodeOffset(const char *name, uint64_t bytes,
                                     std::string *error) {
  auto fail = [&](const llvm::Twine &why) -> std::optional<uint64_t> {
    if (error)
      *error = (llvm::Twine(name) + " " + llvm::Twine(bytes) + " " + why).str();
    return std::nullopt;
  };
  if (bytes % kOffsetUnit != 0)
    return fail("is not a multiple of 16 bytes");
  uint64_t field = bytes / kOffsetUnit;
  if (field >= (uint64_t{1} << kOffsetFieldBits))
    return fail(
        "does not fit the descriptor's 14-bit field (at most " +
        llvm::Twine(((uint64_t{1} << kOffsetFieldBits) - 1) * kOffsetUnit) +
        " bytes)");
  return field;
}

} // namespace

uint64_t mlir::moe::hopper::wgmmaSwizzleField(Swizzle swizzle) {
  switch (swizzle) {
  case Swizzle::None:
    return 0;
  case Swizzle::Bytes128:
    return 1;
  case Swizzle::Bytes64:
    return 2;
  case Swizzle::Bytes32:
    return 3;
  }
  llvm_unreachable("unknown swizzle");
}

std::optional<uint64_t> mlir::moe::hopper::wgmmaDescriptorConstant(
    Swizzle swizzle, uint64_t leadingByteOffset, uint64_t strideByteOffset,
    std::string *error) {
  std::optional<uint64_t> lbo =
      encodeOffset("leading byte offset", leadingByteOffset, error);
  if (!lbo)
    return std::nullopt;
  std::optional<uint64_t> sbo =
      encodeOffset("stride byte offset", strideByteOffset, error);
  if (!sbo)
    return std::nullopt;
  return (wgmmaSwizzleField(swizzle) << kSwizzleShift) |
         (*sbo << kStrideByteOffsetShift) | (*lbo << kLeadingByteOffsetShift);
}

uint64_t mlir::moe::hopper::wgmmaTileDescriptorConstant(OperandMajor major) {
  constexpr uint64_t rowBytes = kSwizzleRowElements * 2;
  constexpr uint64_t atomBytes = kSwizzleRows * rowBytes;
  // K-major: LBO is ignored under a 128B swizzle; 16 KiB is what nvgpu emits
  // and what the kernels were checked with.
  constexpr uint64_t kMajorLeadingBytes = 16 * 1024;
  constexpr uint64_t boxBytes = kBoxElements * 2;
  uint64_t leadingBytes =
      major == OperandMajor::KMajor ? kMajorLeadingBytes : boxBytes;
  // Both offsets are valid by construction.
  return *wgmmaDescriptorConstant(Swizzle::Bytes128, leadingBytes, atomBytes);
}

Value ConstantCache::get(int64_t value, Type type) {
  OpBuilder builder(type.getContext());
  return get(cast<TypedAttr>(builder.getIntegerAttr(type, value)));
}

Value ConstantCache::get(TypedAttr attr) {
  OpBuilder builder(attr.getContext());
  auto it = constants.find(attr);
  if (it != constants.end())
    return it->second;
  if (last)
    builder.setInsertionPointAfter(last);
  else
    builder.setInsertionPointToStart(entry);
  auto constant = arith::ConstantOp::create(builder, loc, attr);
  last = constant;
  constants.try_emplace(attr, constant.getResult());
  return constant.getResult();
}

// The order of the constant requests matters (ConstantCache places constants
// in request order): each is requested just before the op that uses it,
// which fixes the kernels' text.

Value mlir::moe::hopper::buildWgmmaDescriptor(OpBuilder &builder, Location loc,
                                              Value sharedAddressI64,
                                              uint64_t constant,
                                              GetConstantFn getConstant) {
  Type i64 = builder.getI64Type();
  Value mask = getConstant(0x3FFFF, i64);
  Value masked = arith::AndIOp::create(builder, loc, sharedAddressI64, mask);
  Value four = getConstant(4, i64);
  Value field = arith::ShRUIOp::create(builder, loc, masked, four);
  Value bits = getConstant(static_cast<int64_t>(constant), i64);
  return arith::OrIOp::create(builder, loc, field, bits);
}

Value mlir::moe::hopper::buildSwizzle128BChunk(OpBuilder &builder, Location loc,
                                               Value row, Value chunk,
                                               GetConstantFn getConstant) {
  Value rows = getConstant(kSwizzleRows, row.getType());
  Value rowInAtom = arith::RemUIOp::create(builder, loc, row, rows);
  return arith::XOrIOp::create(builder, loc, chunk, rowInAtom);
}

Value mlir::moe::hopper::buildKMajorElementOffset(OpBuilder &builder,
                                                  Location loc, Value row,
                                                  Value chunk,
                                                  GetConstantFn getConstant) {
  Type type = row.getType();
  // kswz, then k_soff = row * 64 + kswz * 8.
  Value swizzled = buildSwizzle128BChunk(builder, loc, row, chunk, getConstant);
  Value rowOffset = arith::MulIOp::create(
      builder, loc, row, getConstant(kSwizzleRowElements, type));
  Value chunkOffset = arith::MulIOp::create(builder, loc, swizzled,
                                            getConstant(kChunkElements, type));
  return arith::AddIOp::create(builder, loc, rowOffset, chunkOffset);
}

Value mlir::moe::hopper::buildMNMajorElementOffset(OpBuilder &builder,
                                                   Location loc, Value box,
                                                   Value row, Value chunk,
                                                   SwizzleOrder order,
                                                   GetConstantFn getConstant) {
  Type type = row.getType();
  Value swizzled;
  if (order == SwizzleOrder::First)
    swizzled = buildSwizzle128BChunk(builder, loc, row, chunk, getConstant);
  Value boxOffset =
      arith::MulIOp::create(builder, loc, box, getConstant(kBoxElements, type));
  Value rowOffset = arith::MulIOp::create(
      builder, loc, row, getConstant(kSwizzleRowElements, type));
  Value base = arith::AddIOp::create(builder, loc, boxOffset, rowOffset);
  if (order == SwizzleOrder::Last)
    swizzled = buildSwizzle128BChunk(builder, loc, row, chunk, getConstant);
  Value chunkOffset = arith::MulIOp::create(builder, loc, swizzled,
                                            getConstant(kChunkElements, type));
  return arith::AddIOp::create(builder, loc, base, chunkOffset);
}
