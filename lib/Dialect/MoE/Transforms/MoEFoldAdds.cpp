//===- MoEFoldAdds.cpp - moe-fold-adds ------------------------------------===//
//
// Replaces `sum = arith.addf X, P`, where P is the dx of moe.router_grad, the
// dx of moe.expert_combine_grad or the out of moe.combine, by P's op with
// `accumulate(X)`: on the GPU, X is written into the sum's buffer and P's op
// adds into it (its `_acc` host function), so the add runs no kernel.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Dialect/MoE/Transforms/Prefetch.h"
#include "moe/Dialect/MoEGPU/IR/MoEGPUAttributes.h"
#include "moe/Dialect/MoEGPU/Transforms/KernelRoles.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/TypeSwitch.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEFOLDADDS
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

/// Whether the op that makes `value` can add it to what its buffer holds:
/// the router's and the experts' dx, the combine's output, without an
/// `accumulate` already, and, for the router's dx, a chosen dx config
/// (`moe_gpu.kernels`) that can accumulate.
bool canAccumulate(Value value) {
  Operation *op = value.getDefiningOp();
  if (!op || getAccumulateOperand(op))
    return false;
  if (auto grad = dyn_cast<RouterGradOp>(op)) {
    if (value != grad.getDx())
      return false;
    auto kernels = op->getAttrOfType<DictionaryAttr>(moe_gpu::kKernelsAttrName);
    auto config =
        kernels ? kernels.getAs<moe_gpu::GemmConfigAttr>("dx") : nullptr;
    if (!config)
      return true;
    // The library's own config accumulates wherever the library has the
    // accumulating function; another one must be able to.
    auto normalized = [](moe_gpu::GemmConfig c) {
      c = c.resolved();
      c.accumulate = false;
      return c;
    };
    for (const moe_gpu::GemmRole &role : moe_gpu::gemmRolesOf(op))
      if (role.name == "dx" &&
          normalized(config.getConfig()) == normalized(role.libraryConfig))
        return true;
    return moe_gpu::canAccumulate(config.getConfig());
  }
  if (auto grad = dyn_cast<ExpertCombineGradOp>(op))
    return value == grad.getDx();
  return isa<CombineOp>(op);
}

/// Whether `sum` has a buffer of its own: the function returns it, or it is
/// the accumulated X of an op.
bool hasOwnBuffer(Value sum) {
  for (OpOperand &use : sum.getUses()) {
    if (isa<func::ReturnOp>(use.getOwner()))
      return true;
    if (getAccumulateOperand(use.getOwner()) == &use)
      return true;
  }
  return false;
}

/// Sets `accumulate` of the op that makes `part` to `other`.
void setAccumulate(Operation *op, Value other) {
  TypeSwitch<Operation *>(op)
      .Case<CombineOp, RouterGradOp, ExpertCombineGradOp>(
          [&](auto op) { op.getAccumulateMutable().assign(other); });
}

/// Folds the adds of `body`, last first (as convert-moe-to-gpu planned them
/// before this pass).
void foldAdds(Block &body) {
  DenseSet<Operation *> waitsForPrefetch = getPrefetchDependents(body);
  auto canMoveBefore = [&](Operation *op, Operation *add) {
    for (Operation *next = op->getNextNode(); next != add;
         next = next->getNextNode())
      if (llvm::is_contained(op->getUsers(), next) ||
          (waitsForPrefetch.contains(next) && !waitsForPrefetch.contains(op)))
        return false;
    return true;
  };
  auto adds = llvm::to_vector(body.getOps<arith::AddFOp>());
  for (arith::AddFOp add : llvm::reverse(adds)) {
    if (!isa<TensorType>(add.getType()) || !hasOwnBuffer(add.getResult()))
      continue;
    // Either operand as P; an order that needs no move first.
    auto tryFold = [&](Value part, Value other, bool allowMove) {
      Operation *accumulator = part.getDefiningOp();
      Operation *producer = other.getDefiningOp();
      // A prefetch's buffer is the runtime's, not one X could be placed in.
      if (!canAccumulate(part) || !part.hasOneUse() || !other.hasOneUse() ||
          !producer || isa<PrefetchOp>(producer) ||
          accumulator->getBlock() != &body || producer->getBlock() != &body)
        return false;
      if (!producer->isBeforeInBlock(accumulator)) {
        if (!allowMove || !canMoveBefore(accumulator, add))
          return false;
        accumulator->moveBefore(add);
      }
      setAccumulate(accumulator, other);
      add.getResult().replaceAllUsesWith(part);
      add.erase();
      return true;
    };
    Value lhs = add.getLhs(), rhs = add.getRhs();
    for (bool allowMove : {false, true})
      if (tryFold(rhs, lhs, allowMove) || tryFold(lhs, rhs, allowMove))
        break;
  }
}

struct MoEFoldAddsPass
    : public mlir::moe::impl::MoEFoldAddsBase<MoEFoldAddsPass> {
  void runOnOperation() override {
    getOperation().walk([](func::FuncOp func) {
      if (!func.isExternal())
        foldAdds(func.front());
    });
  }
};

} // namespace
