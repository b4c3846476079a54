//===- MoEOffload.cpp - Move saved activations to host memory -*- C++ -*-===//
//
// After moe-generate-backward, a training forward `@f_forward` returns its
// saved tensors after its results and `@f_backward` takes them, in the same
// order, as its first arguments (moe.num_saved of them). For every op that
// moe-plan-activations marked moe.plan = "offload", the pass sends its `h`
// through the host on the way: `moe.offload` after h's last forward use,
// the saved result and argument become `!moe.host_tensor`, and
// `moe.prefetch` brings h back in backward.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/IR/MoETypes.h"
#include "moe/Dialect/MoE/Transforms/NestedModules.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Dialect/MoE/Transforms/Prefetch.h"
#include "moe/Dialect/MoE/Transforms/TrainingAttributes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/DenseSet.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEOFFLOAD
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

/// Moves the work of `body` that does not need a prefetched tensor ahead of
/// the work that does (a stable partition, so every operand is still defined
/// before its use): the copies then overlap it. The prefetches stay where
/// they are (early: first), or go with the work that reads them
/// (`withPrefetches`, late: right before their first use). A body with an op
/// that has side effects keeps its order.
void scheduleAroundPrefetches(Block &body, bool withPrefetches) {
  if (body.getOps<PrefetchOp>().empty())
    return;
  for (Operation &op : body.without_terminator())
    if (!isa<PrefetchOp>(op) && !isPure(&op))
      return;
  DenseSet<Operation *> dependent = getPrefetchDependents(body);
  SmallVector<Operation *> later;
  for (Operation &op : body.without_terminator())
    if (dependent.contains(&op) && (withPrefetches || !isa<PrefetchOp>(op)))
      later.push_back(&op);
  for (Operation *op : later)
    op->moveBefore(body.getTerminator());
}

bool isMarkedForOffload(Operation *op) {
  auto plan = op->getAttrOfType<StringAttr>(kPlanAttr);
  return plan && plan.getValue() == "offload";
}

/// The pre-activations an offload plan moves, or null for an op that has
/// none.
Value getOffloadedValue(Operation *op) {
  if (auto experts = dyn_cast<ExpertFFNOp>(op))
    return experts.getH();
  if (auto shared = dyn_cast<SharedExpertOp>(op))
    return shared.getH();
  return nullptr;
}

/// One saved tensor to offload: forward result `resultIndex`, backward
/// argument `argumentIndex`.
struct Offload {
  Operation *op;
  Value value;
  unsigned resultIndex;
  unsigned argumentIndex;
};

struct MoEOffloadPass : public mlir::moe::impl::MoEOffloadBase<MoEOffloadPass> {
  using MoEOffloadBase::MoEOffloadBase;

  void runOnOperation() override;

private:
  /// Offloads the marked tensors of the training pair (forward, backward).
  LogicalResult offloadPair(func::FuncOp forward, func::FuncOp backward,
                            ArrayRef<Operation *> marked);
};

LogicalResult MoEOffloadPass::offloadPair(func::FuncOp forward,
                                          func::FuncOp backward,
                                          ArrayRef<Operation *> marked) {
  if (!forward.getBody().hasOneBlock() || !backward.getBody().hasOneBlock())
    return forward.emitOpError("and @")
           << backward.getSymName()
           << " must have one block each for moe-offload";
  auto numSaved = forward->getAttrOfType<IntegerAttr>(kNumSavedAttr);
  auto returnOp = cast<func::ReturnOp>(forward.front().getTerminator());
  unsigned numResults = returnOp.getNumOperands();
  if (!numSaved || numSaved.getInt() < 0 ||
      static_cast<uint64_t>(numSaved.getInt()) > numResults ||
      static_cast<uint64_t>(numSaved.getInt()) > backward.getNumArguments())
    return forward.emitOpError("has moe.num_saved ")
           << numSaved << " but returns " << numResults << " values and @"
           << backward.getSymName() << " takes " << backward.getNumArguments()
           << " arguments";
  unsigned firstSaved = numResults - numSaved.getInt();

  SmallVector<Offload> offloads;
  for (Operation *op : marked) {
    Value value = getOffloadedValue(op);
    if (!value)
      return op->emitOpError("is marked moe.plan = \"offload\", but only the "
                             "h of moe.expert_ffn and moe.shared_expert can "
                             "be offloaded");
    if (op->getParentOp() != forward)
      return op->emitOpError("is marked moe.plan = \"offload\" inside a "
                             "region; its h is not saved for backward");
    auto type = cast<RankedTensorType>(value.getType());
    if (type.getEncoding())
      return op->emitOpError("has h of type ")
             << type << ", which has an encoding; !moe.host_tensor holds "
             << "plain tensors only";
    std::optional<unsigned> resultIndex;
    bool done = false;
    for (unsigned i = firstSaved; i < numResults; ++i) {
      Value saved = returnOp.getOperand(i);
      if (saved == value)
        resultIndex = i;
      else if (auto offload = saved.getDefiningOp<OffloadOp>())
        done |= offload.getSource() == value;
    }
    if (done)
      continue; // offloaded by an earlier run
    if (!resultIndex)
      return op->emitOpError("is marked moe.plan = \"offload\", but @")
             << forward.getSymName()
             << " does not save its h for backward (nothing to offload)";
    unsigned argumentIndex = *resultIndex - firstSaved;
    Type argumentType = backward.getArgument(argumentIndex).getType();
    if (argumentType != type)
      return backward.emitOpError("takes saved argument #")
             << argumentIndex << " of type " << argumentType << ", but @"
             << forward.getSymName() << " saves h of type " << type << " there";
    offloads.push_back({op, value, *resultIndex, argumentIndex});
  }
  if (offloads.empty())
    return success();

  OpBuilder builder(forward.getContext());
  Block &forwardBody = forward.front();
  Block &backwardBody = backward.front();
  // Forward: the copy starts after h's last forward use.
  for (const Offload &offload : offloads) {
    Operation *last = offload.op;
    for (Operation *user : offload.value.getUsers()) {
      if (user == returnOp)
        continue;
      Operation *inBlock = forwardBody.findAncestorOpInBlock(*user);
      if (inBlock && last->isBeforeInBlock(inBlock))
        last = inBlock;
    }
    auto type = cast<RankedTensorType>(offload.value.getType());
    builder.setInsertionPointAfter(last);
    auto copy = OffloadOp::create(builder, offload.value.getLoc(),
                                  HostTensorType::get(builder.getContext(),
                                                      type.getShape(),
                                                      type.getElementType()),
                                  offload.value);
    returnOp.setOperand(offload.resultIndex, copy);
  }
  forward.setFunctionType(builder.getFunctionType(forward.getArgumentTypes(),
                                                  returnOp.getOperandTypes()));

  // Backward: the copies back start in the order of first use, all at the
  // start (early) or each before its first use (late).
  auto firstUse = [&](BlockArgument argument) -> Operation * {
    Operation *first = nullptr;
    for (Operation *user : argument.getUsers()) {
      Operation *inBlock = backwardBody.findAncestorOpInBlock(*user);
      if (inBlock && (!first || inBlock->isBeforeInBlock(first)))
        first = inBlock;
    }
    return first;
  };
  SmallVector<std::pair<Operation *, const Offload *>> uses;
  for (const Offload &offload : offloads) {
    BlockArgument argument = backward.getArgument(offload.argumentIndex);
    argument.setType(
        cast<OffloadOp>(
            returnOp.getOperand(offload.resultIndex).getDefiningOp())
            .getType());
    backward.setArgAttr(offload.argumentIndex, "moe.offloaded",
                        builder.getUnitAttr());
    if (Operation *first = firstUse(argument))
      uses.emplace_back(first, &offload);
  }
  llvm::sort(uses, [](const auto &a, const auto &b) {
    return a.first != b.first
               ? a.first->isBeforeInBlock(b.first)
               : a.second->argumentIndex < b.second->argumentIndex;
  });
  builder.setInsertionPointToStart(&backwardBody);
  for (auto [first, offload] : uses) {
    if (prefetch == "late")
      builder.setInsertionPoint(first);
    BlockArgument argument = backward.getArgument(offload->argumentIndex);
    auto copy = PrefetchOp::create(builder, argument.getLoc(),
                                   offload->value.getType(), argument);
    argument.replaceAllUsesExcept(copy, copy);
  }
  backward.setFunctionType(builder.getFunctionType(
      backwardBody.getArgumentTypes(), backward.getResultTypes()));
  scheduleAroundPrefetches(backwardBody, /*withPrefetches=*/prefetch == "late");
  return success();
}

void MoEOffloadPass::runOnOperation() {
  ModuleOp module = getOperation();
  if (failed(checkNoMoEInNestedModules(module, "moe-offload")))
    return signalPassFailure();
  if (prefetch != "early" && prefetch != "late") {
    // On the first function: the module of a parsed file has no location.
    auto functions = module.getOps<func::FuncOp>();
    Operation *at = functions.empty() ? module.getOperation()
                                      : (*functions.begin()).getOperation();
    at->emitError("moe-offload: unknown prefetch '")
        << prefetch << "' (expected early or late)";
    return signalPassFailure();
  }
  SymbolTable symbols(module);
  for (auto func : llvm::make_early_inc_range(module.getOps<func::FuncOp>())) {
    if (func.isExternal())
      continue;
    SmallVector<Operation *> marked;
    func.walk([&](Operation *op) {
      if (isMarkedForOffload(op))
        marked.push_back(op);
    });
    if (marked.empty())
      continue;
    StringRef name = func.getSymName();
    if (func->hasAttr("moe.gradient_args")) {
      marked.front()->emitOpError(
          "is marked moe.plan = \"offload\" in a backward function");
      return signalPassFailure();
    }
    if (!func->hasAttr(kNumSavedAttr)) {
      // The source of a training pair keeps its marks; anything else was
      // never differentiated.
      auto forward = symbols.lookup<func::FuncOp>((name + "_forward").str());
      if (forward && forward->hasAttr(kNumSavedAttr))
        continue;
      marked.front()->emitOpError("is marked moe.plan = \"offload\", but @")
          << name
          << " has no training forward and backward: run "
             "moe-generate-backward before moe-offload";
      return signalPassFailure();
    }
    func::FuncOp backward;
    if (name.ends_with("_forward"))
      backward = symbols.lookup<func::FuncOp>(
          (name.drop_back(strlen("_forward")) + "_backward").str());
    if (!backward || !backward->hasAttr("moe.gradient_args")) {
      func.emitOpError("saves tensors for backward (moe.num_saved) but "
                       "has no backward function @")
          << name.drop_back(name.ends_with("_forward") ? strlen("_forward") : 0)
          << "_backward to offload them to";
      return signalPassFailure();
    }
    if (failed(offloadPair(func, backward, marked)))
      return signalPassFailure();
  }
}

} // namespace

DenseSet<Operation *> mlir::moe::getPrefetchDependents(Block &body) {
  DenseSet<Operation *> dependent;
  for (Operation &op : body.without_terminator()) {
    bool reads = isa<PrefetchOp>(op);
    for (Value operand : op.getOperands())
      if (Operation *def = operand.getDefiningOp())
        reads |= dependent.contains(def);
    if (reads)
      dependent.insert(&op);
  }
  return dependent;
}
