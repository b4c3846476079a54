//===- Emitter.h - what the kernel and host builders share ---*- C++ -*-===//
//
// Internal to the kernel builder: the emitter that both its GEMM kernels and
// its host functions write through. Constants are hoisted to the function's
// entry in the order of their first request, and each arithmetic helper emits
// one op.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_KERNELS_EMITTER_H
#define MOE_LIB_CONVERSION_MOETOGPU_KERNELS_EMITTER_H

#include "moe/Conversion/MoEToGPU/HopperDescriptors.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/Builders.h"

#include <cassert>
#include <optional>

namespace mlir::moe::kernels {

class Emitter {
public:
  /// The function's constant `attr` / integer `value` of `type`.
  Value constant(TypedAttr attr) {
    assert(constants && "the function's entry is not set");
    return constants->get(attr);
  }
  Value constant(int64_t value, Type type) {
    assert(constants && "the function's entry is not set");
    return constants->get(value, type);
  }
  Value c(int64_t value) { return constant(value, b.getIndexType()); }
  Value cI1(bool value) { return constant(value, b.getI1Type()); }
  Value cI32(int64_t value) { return constant(value, b.getI32Type()); }
  Value cI64(int64_t value) { return constant(value, b.getI64Type()); }

  Value add(Value x, Value y) { return arith::AddIOp::create(b, loc, x, y); }
  Value sub(Value x, Value y) { return arith::SubIOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return arith::MulIOp::create(b, loc, x, y); }
  Value div(Value x, Value y) { return arith::DivUIOp::create(b, loc, x, y); }
  Value minu(Value x, Value y) { return arith::MinUIOp::create(b, loc, x, y); }
  Value maxu(Value x, Value y) { return arith::MaxUIOp::create(b, loc, x, y); }
  Value maxs(Value x, Value y) { return arith::MaxSIOp::create(b, loc, x, y); }
  Value cmp(arith::CmpIPredicate pred, Value x, Value y) {
    return arith::CmpIOp::create(b, loc, pred, x, y);
  }

protected:
  Emitter(OpBuilder &b, Location loc) : b(b), loc(loc) {}

  /// Where the function's constants go: the start of `entry`.
  void setConstantEntry(Block &entry) { constants.emplace(entry, loc); }

  OpBuilder &b;
  Location loc;

private:
  std::optional<hopper::ConstantCache> constants;
};

} // namespace mlir::moe::kernels

#endif // MOE_LIB_CONVERSION_MOETOGPU_KERNELS_EMITTER_H
