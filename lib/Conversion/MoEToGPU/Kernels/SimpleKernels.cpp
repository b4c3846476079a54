//===- SimpleKernels.cpp - helpers of the non-GEMM kernels ----------------===//

#include "SimpleKernels.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
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
