//===- ByteSize.cpp - Checked byte counts of shaped types ---*- C++ -*-===//

#include "moe/Support/ByteSize.h"

#include "llvm/Support/CheckedArithmetic.h"

using namespace mlir;
using namespace mlir::moe;

uint64_t mlir::moe::getByteSize(ShapedType type, ByteSizeStatus &status) {
  Type element = type.getElementType();
  if (!type.hasStaticShape() || !element.isIntOrIndexOrFloat()) {
    status = ByteSizeStatus::Dynamic;
    return 0;
  }
  unsigned bits = element.isIndex() ? 64 : element.getIntOrFloatBitWidth();
  std::optional<int64_t> bytes = static_cast<int64_t>((bits + 7) / 8);
  for (int64_t size : type.getShape()) {
    bytes = llvm::checkedMul(*bytes, size);
    if (!bytes) {
      status = ByteSizeStatus::Overflow;
      return 0;
    }
  }
  status = ByteSizeStatus::Known;
  return static_cast<uint64_t>(*bytes);
}

std::optional<uint64_t> mlir::moe::addByteSizes(uint64_t a, uint64_t b) {
  if (a > kMaxByteSize || b > kMaxByteSize - a)
    return std::nullopt;
  return a + b;
}
