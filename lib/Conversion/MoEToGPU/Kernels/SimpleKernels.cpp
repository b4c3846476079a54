//===- SimpleKernels.cpp - helpers of the non-GEMM kernels ----------------===//

#include "SimpleKernels.h"

#include "Kernels.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/TypeUtilities.h"

using namespace mlir;
using namespace mlir::moe::kernels;

void mlir::moe::kernels::buildIf(OpBuilder &b, Location loc, Value cond,
                                 llvm::function_ref<void()> thenBody) {
  auto ifOp = scf::IfOp::create(b, loc, cond, /*withElseRegion=*/false);
  OpBuilder::InsertionGuard guard(b);
  // Without results the builder made the then block's scf.yield.
  b.setInsertionPoint(ifOp.thenBlock()->getTerminator());
  thenBody();
}

void mlir::moe::kernels::buildIfElse(OpBuilder &b, Location loc, Value cond,
                                     llvm::function_ref<void()> thenBody,
                                     llvm::function_ref<void()> elseBody) {
  auto ifOp = scf::IfOp::create(b, loc, cond, /*withElseRegion=*/true);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(ifOp.thenBlock()->getTerminator());
  thenBody();
  b.setInsertionPoint(ifOp.elseBlock()->getTerminator());
  elseBody();
}

Value mlir::moe::kernels::buildIfElse(OpBuilder &b, Location loc, Type type,
                                      Value cond,
                                      llvm::function_ref<Value()> thenBody,
                                      llvm::function_ref<Value()> elseBody) {
  auto ifOp = scf::IfOp::create(b, loc, TypeRange{type}, cond,
                                /*withElseRegion=*/true);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(ifOp.thenBlock());
  Value thenValue = thenBody();
  scf::YieldOp::create(b, loc, thenValue);
  b.setInsertionPointToStart(ifOp.elseBlock());
  Value elseValue = elseBody();
  scf::YieldOp::create(b, loc, elseValue);
  return ifOp.getResult(0);
}

void mlir::moe::kernels::buildFor(OpBuilder &b, Location loc, Value lower,
                                  Value upper, Value step,
                                  llvm::function_ref<void(Value iv)> body) {
  auto loop = scf::ForOp::create(b, loc, lower, upper, step);
  OpBuilder::InsertionGuard guard(b);
  // Without iter_args the builder made the body's scf.yield.
  b.setInsertionPoint(loop.getBody()->getTerminator());
  body(loop.getInductionVar());
}

Value mlir::moe::kernels::buildFor(
    OpBuilder &b, Location loc, Value lower, Value upper, Value step,
    Value init, llvm::function_ref<Value(Value iv, Value acc)> body) {
  auto loop = scf::ForOp::create(b, loc, lower, upper, step, ValueRange{init});
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(loop.getBody());
  Value next = body(loop.getInductionVar(), loop.getRegionIterArgs()[0]);
  scf::YieldOp::create(b, loc, next);
  return loop.getResult(0);
}

Value mlir::moe::kernels::buildWarpRowDot(OpBuilder &b, Location loc, Value lhs,
                                          Value lhsBase, Value rhs,
                                          Value rhsBase, Value col0, Value end,
                                          Value stride, Value zeros,
                                          Value zero) {
  auto wideF32 = cast<VectorType>(zeros.getType());
  int64_t columns = wideF32.getDimSize(0);
  auto wideBf16 = VectorType::get({columns}, b.getBF16Type());
  llvm::MaybeAlign align(16);
  Value acc =
      buildFor(b, loc, col0, end, stride, zeros, [&](Value col, Value sum) {
        Value li = arith::AddIOp::create(b, loc, lhsBase, col);
        Value ri = arith::AddIOp::create(b, loc, rhsBase, col);
        Value lv = vector::LoadOp::create(b, loc, wideBf16, lhs, li,
                                          /*nontemporal=*/false, align);
        Value rv = vector::LoadOp::create(b, loc, wideBf16, rhs, ri,
                                          /*nontemporal=*/false, align);
        Value lf = arith::ExtFOp::create(b, loc, wideF32, lv);
        Value rf = arith::ExtFOp::create(b, loc, wideF32, rv);
        // A multiply and an add: ptxas gave fma here a stack frame.
        Value product = arith::MulFOp::create(b, loc, lf, rf);
        return arith::AddFOp::create(b, loc, sum, product).getResult();
      });
  Value part = zero;
  for (int64_t i = 0; i < columns; ++i) {
    Value x = vector::ExtractOp::create(b, loc, acc, i);
    part = arith::AddFOp::create(b, loc, part, x);
  }
  constexpr int32_t kWarp = 32;
  for (int32_t mask : {16, 8, 4, 2, 1}) {
    Value offset =
        arith::ConstantIntOp::create(b, loc, b.getI32Type(), mask).getResult();
    Value width =
        arith::ConstantIntOp::create(b, loc, b.getI32Type(), kWarp).getResult();
    Value other = gpu::ShuffleOp::create(b, loc, part, offset, width,
                                         gpu::ShuffleMode::XOR)
                      .getShuffleResult();
    part = arith::AddFOp::create(b, loc, part, other);
  }
  return part;
}

CheckedIndex mlir::moe::kernels::checkIndex(OpBuilder &b, Location loc,
                                            Value value, Value n) {
  Value index = arith::IndexCastOp::create(b, loc, b.getIndexType(), value);
  Value valid =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, index, n);
  return {index, valid};
}

namespace {
template <typename OpTy>
Value divideU32(OpBuilder &b, Location loc, Value x, Value y) {
  Type i32 = b.getI32Type();
  Value x32 = arith::IndexCastUIOp::create(b, loc, i32, x);
  Value y32 = arith::IndexCastUIOp::create(b, loc, i32, y);
  Value q = OpTy::create(b, loc, x32, y32);
  return arith::IndexCastUIOp::create(b, loc, b.getIndexType(), q);
}
} // namespace

Value mlir::moe::kernels::divU32(OpBuilder &b, Location loc, Value x, Value y) {
  return divideU32<arith::DivUIOp>(b, loc, x, y);
}

Value mlir::moe::kernels::remU32(OpBuilder &b, Location loc, Value x, Value y) {
  return divideU32<arith::RemUIOp>(b, loc, x, y);
}

WarpSlot mlir::moe::kernels::buildWarpSlot(OpBuilder &b, Location loc,
                                           Value rows, Value numSlots) {
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value block = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value cWarp = indexConstant(b, loc, kWarp);
  Value warpsPerBlock = indexConstant(b, loc, kSimpleThreads / kWarp);
  Value warp = arith::DivUIOp::create(b, loc, tid, cWarp);
  Value lane = arith::RemUIOp::create(b, loc, tid, cWarp);
  Value first = arith::MulIOp::create(b, loc, block, warpsPerBlock);
  Value slot = arith::AddIOp::create(b, loc, first, warp);
  Value inSlots =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, slot, numSlots);
  Value row = buildIfElse(
      b, loc, b.getI32Type(), inSlots,
      [&] { return memref::LoadOp::create(b, loc, rows, slot).getResult(); },
      [&] { return i32Constant(b, loc, -1); });
  return {lane, slot, inSlots, row};
}

Value mlir::moe::kernels::floatConstant(OpBuilder &b, Location loc, Type type,
                                        double value) {
  auto element = cast<FloatType>(getElementTypeOrSelf(type));
  llvm::APFloat rounded(value);
  bool losesInfo;
  rounded.convert(element.getFloatSemantics(),
                  llvm::APFloat::rmNearestTiesToEven, &losesInfo);
  if (auto vector = dyn_cast<VectorType>(type))
    return arith::ConstantOp::create(b, loc,
                                     DenseElementsAttr::get(vector, rounded));
  return arith::ConstantFloatOp::create(b, loc, element, rounded);
}
