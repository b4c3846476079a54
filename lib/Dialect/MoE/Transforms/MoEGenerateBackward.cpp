//===- MoEGenerateBackward.cpp - Training forward and backward -*- C++ -*-===//
//
// Reverse-mode differentiation of a function of moe ops. The backward
// function is built op by op from the last forward op to the first; every
// forward value it reads becomes a saved tensor (an argument of backward and
// an extra result of the training forward), unless the value comes from a
// moe.checkpoint region, in which case the ops that compute it are cloned
// into backward instead.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/Transforms/NestedModules.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Dialect/MoE/Transforms/TrainingAttributes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/MapVector.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGENERATEBACKWARD
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

constexpr StringLiteral kRecomputeAttr = "moe.recompute";

bool isFloatTensor(Type type) {
  auto tensor = dyn_cast<RankedTensorType>(type);
  return tensor && isa<FloatType>(tensor.getElementType());
}

/// A readable name for a saved value: the argument name `argN`, or the ODS
/// name of the result (`h`, `token_ids`, ...).
std::string savedName(Value value) {
  if (auto argument = dyn_cast<BlockArgument>(value))
    return ("arg" + Twine(argument.getArgNumber())).str();
  auto result = cast<OpResult>(value);
  std::string name = result.getOwner()->getName().getStringRef().str();
  if (auto asmOp = dyn_cast<OpAsmOpInterface>(result.getOwner())) {
    asmOp.getAsmResultNames([&](Value named, StringRef asmName) {
      if (named == value)
        name += "." + asmName.str();
    });
  }
  return name;
}

/// Inlines every moe.checkpoint of `func` and marks the inlined ops so that
/// backward recomputes what it needs of them instead of saving it.
void inlineCheckpoints(func::FuncOp func) {
  SmallVector<CheckpointOp> checkpoints;
  func.walk([&](CheckpointOp op) { checkpoints.push_back(op); });
  for (CheckpointOp checkpoint : checkpoints) {
    OpBuilder builder(checkpoint);
    IRMapping mapping;
    Block &body = checkpoint.getBody().front();
    mapping.map(body.getArguments(), checkpoint.getInputs());
    for (Operation &op : body.without_terminator()) {
      Operation *clone = builder.clone(op, mapping);
      clone->setAttr(kRecomputeAttr, builder.getUnitAttr());
    }
    auto yield = cast<YieldOp>(body.getTerminator());
    for (auto [result, yielded] :
         llvm::zip(checkpoint.getOutputs(), yield.getValues()))
      result.replaceAllUsesWith(mapping.lookupOrDefault(yielded));
    checkpoint.erase();
  }
}

/// Builds `@f_backward` from the training forward `forward`.
class BackwardBuilder {
public:
  BackwardBuilder(func::FuncOp forward, func::FuncOp backward)
      : forward(forward), backward(backward), builder(backward.getContext()),
        recomputeBuilder(backward.getContext()) {
    Block *entry = backward.addEntryBlock();
    builder.setInsertionPointToEnd(entry);
    // Recomputed ops go before every backward op, in the order they are
    // cloned: insert them before an anchor that stays first.
    recomputeAnchor = UnrealizedConversionCastOp::create(
        builder, backward.getLoc(), TypeRange{}, ValueRange{});
    recomputeBuilder.setInsertionPoint(recomputeAnchor);
  }

  LogicalResult build();

private:
  /// The backward value of forward value `value`: a saved argument, or a
  /// recomputed op of a checkpoint region.
  Value forwardValue(Value value);

  /// Adds `gradient` to the gradient of forward value `value`.
  void accumulate(Value value, Value gradient);

  /// The gradient of `value`, or null when it has none.
  Value gradientOf(Value value) { return gradients.lookup(value); }

  /// The gradient of `value`, or zeros of its type. Dynamic sizes are read
  /// from `shapeLike`, a forward value of the same shape that backward reads
  /// anyway, so that the zeros do not make `value` itself saved.
  Value gradientOrZeros(Value value, Value shapeLike);

  LogicalResult differentiate(Operation *op);

  /// Reorders the saved arguments as the forward defines them: its
  /// arguments first, then op results in program order.
  void sortSavedArguments();

  func::FuncOp forward, backward;
  OpBuilder builder;          // backward ops, appended
  OpBuilder recomputeBuilder; // recomputed forward ops, before all of them
  llvm::MapVector<Value, BlockArgument> saved;
  DenseMap<Value, Value> recomputed;
  DenseMap<Value, Value> gradients;
  DenseSet<Operation *> handled;
  Operation *recomputeAnchor;
};

Value BackwardBuilder::forwardValue(Value value) {
  if (auto it = recomputed.find(value); it != recomputed.end())
    return it->second;
  Operation *def = value.getDefiningOp();
  // A collective is never run again: what backward reads of it is saved.
  if (def && def->hasAttr(kRecomputeAttr) &&
      !isa<EPDispatchOp, EPCombineOp>(def)) {
    IRMapping mapping;
    for (Value operand : def->getOperands())
      mapping.map(operand, forwardValue(operand));
    Operation *clone = recomputeBuilder.clone(*def, mapping);
    clone->removeAttr(kRecomputeAttr);
    for (auto [original, copy] :
         llvm::zip(def->getResults(), clone->getResults()))
      recomputed[original] = copy;
    return recomputed[value];
  }
  if (auto it = saved.find(value); it != saved.end())
    return it->second;
  Block &entry = backward.front();
  BlockArgument argument =
      entry.insertArgument(saved.size(), value.getType(), value.getLoc());
  saved[value] = argument;
  return argument;
}

void BackwardBuilder::accumulate(Value value, Value gradient) {
  auto [it, inserted] = gradients.try_emplace(value, gradient);
  if (!inserted)
    it->second =
        arith::AddFOp::create(builder, value.getLoc(), it->second, gradient);
}

Value BackwardBuilder::gradientOrZeros(Value value, Value shapeLike) {
  if (Value gradient = gradients.lookup(value))
    return gradient;
  auto type = cast<RankedTensorType>(value.getType());
  SmallVector<Value> dynamicSizes;
  Location loc = value.getLoc();
  for (auto [index, size] : llvm::enumerate(type.getShape()))
    if (ShapedType::isDynamic(size))
      dynamicSizes.push_back(
          tensor::DimOp::create(builder, loc, forwardValue(shapeLike), index));
  Value zero = arith::ConstantOp::create(
      builder, loc, builder.getFloatAttr(type.getElementType(), 0.0));
  return tensor::SplatOp::create(builder, loc, type, zero, dynamicSizes);
}

LogicalResult BackwardBuilder::differentiate(Operation *op) {
  Location loc = op->getLoc();
  auto fwd = [&](Value value) { return forwardValue(value); };
  auto fwdOrNull = [&](Value value) {
    return value ? forwardValue(value) : Value();
  };
  auto typeOrNull = [](Value value) {
    return value ? value.getType() : Type();
  };

  if (auto router = dyn_cast<RouterOp>(op)) {
    Value dLogits = gradientOf(router.getLogits());
    Value dWeights = gradientOrZeros(router.getWeights(), router.getExperts());
    auto grad = RouterGradOp::create(
        builder, loc, router.getX().getType(),
        router.getRouterWeight().getType(), fwd(router.getX()),
        fwd(router.getRouterWeight()), fwd(router.getLogits()),
        fwd(router.getExperts()), dWeights, dLogits, /*accumulate=*/Value(),
        router.getRouting());
    accumulate(router.getX(), grad.getDx());
    accumulate(router.getRouterWeight(), grad.getDRouterWeight());
    return success();
  }

  if (auto combine = dyn_cast<CombineOp>(op)) {
    Value dOut = gradientOf(combine.getOut());
    // out = the combine + accumulate: the added tensor gets dOut as it is.
    if (Value added = combine.getAccumulate())
      accumulate(added, dOut);
    auto experts = combine.getY().getDefiningOp<ExpertFFNOp>();
    // The fused backward needs no y: only when nothing else reads y and no
    // gradient reaches h.
    if (experts && combine.getY().hasOneUse() &&
        !gradients.count(experts.getH())) {
      Value bGateUp = experts.getBGateUp(), bDown = experts.getBDown();
      auto grad = ExpertCombineGradOp::create(
          builder, loc, experts.getX().getType(),
          combine.getWeights().getType(), experts.getWGateUp().getType(),
          experts.getWDown().getType(), typeOrNull(bGateUp), typeOrNull(bDown),
          fwd(experts.getX()), fwd(experts.getTokenIds()),
          fwd(experts.getOffsets()), fwd(combine.getRows()),
          fwd(combine.getWeights()), fwd(experts.getWGateUp()),
          fwd(experts.getWDown()), fwd(experts.getH()), dOut,
          /*accumulate=*/Value(), fwdOrNull(bGateUp), fwdOrNull(bDown),
          experts.getActivationAttr());
      accumulate(experts.getX(), grad.getDx());
      accumulate(combine.getWeights(), grad.getDWeights());
      accumulate(experts.getWGateUp(), grad.getDWGateUp());
      accumulate(experts.getWDown(), grad.getDWDown());
      if (bGateUp) {
        accumulate(bGateUp, grad.getDBGateUp());
        accumulate(bDown, grad.getDBDown());
      }
      handled.insert(experts);
      return success();
    }
    auto grad = CombineGradOp::create(
        builder, loc, combine.getY().getType(), combine.getWeights().getType(),
        dOut, fwd(combine.getWeights()), fwd(combine.getRows()),
        fwd(combine.getY()));
    accumulate(combine.getY(), grad.getDy());
    accumulate(combine.getWeights(), grad.getDWeights());
    return success();
  }

  if (auto experts = dyn_cast<ExpertFFNOp>(op)) {
    if (gradients.count(experts.getH()))
      return experts.emitOpError(
          "has a gradient into its pre-activations h, which "
          "moe-generate-backward does not differentiate");
    Value bGateUp = experts.getBGateUp(), bDown = experts.getBDown();
    auto grad = ExpertFFNGradOp::create(
        builder, loc, experts.getX().getType(), experts.getWGateUp().getType(),
        experts.getWDown().getType(), typeOrNull(bGateUp), typeOrNull(bDown),
        fwd(experts.getX()), fwd(experts.getTokenIds()),
        fwd(experts.getOffsets()), fwd(experts.getWGateUp()),
        fwd(experts.getWDown()), fwd(experts.getH()),
        gradientOrZeros(experts.getY(), experts.getY()), fwdOrNull(bGateUp),
        fwdOrNull(bDown), experts.getActivationAttr());
    accumulate(experts.getX(), grad.getDx());
    accumulate(experts.getWGateUp(), grad.getDWGateUp());
    accumulate(experts.getWDown(), grad.getDWDown());
    if (bGateUp) {
      accumulate(bGateUp, grad.getDBGateUp());
      accumulate(bDown, grad.getDBDown());
    }
    return success();
  }

  if (auto shared = dyn_cast<SharedExpertOp>(op)) {
    if (gradients.count(shared.getH()))
      return shared.emitOpError(
          "has a gradient into its pre-activations h, which "
          "moe-generate-backward does not differentiate");
    auto grad = SharedExpertGradOp::create(
        builder, loc, shared.getX().getType(), shared.getWGateUp().getType(),
        shared.getWDown().getType(), fwd(shared.getX()),
        fwd(shared.getWGateUp()), fwd(shared.getWDown()), fwd(shared.getH()),
        gradientOrZeros(shared.getY(), shared.getX()),
        shared.getActivationAttr());
    accumulate(shared.getX(), grad.getDx());
    accumulate(shared.getWGateUp(), grad.getDWGateUp());
    accumulate(shared.getWDown(), grad.getDWDown());
    return success();
  }

  if (auto aux = dyn_cast<AuxLossOp>(op)) {
    auto grad = AuxLossGradOp::create(
        builder, loc, aux.getLogits().getType(), fwd(aux.getLogits()),
        fwd(aux.getExperts()),
        gradientOrZeros(aux.getLoadBalance(), aux.getLoadBalance()),
        gradientOrZeros(aux.getZLoss(), aux.getZLoss()), aux.getScoringAttr());
    accumulate(aux.getLogits(), grad.getDLogits());
    return success();
  }

  // Expert parallelism: a dispatch and a combine are each other's
  // gradient, as are a gather and a scatter of rows.
  if (auto combine = dyn_cast<EPCombineOp>(op)) {
    if (combine.getRowsOf())
      return combine.emitOpError(
          "sums rows per token (reduce), which moe-generate-backward does not "
          "differentiate");
    // Backward sends back exactly the rows forward returned: those forward
    // dropped are dropped again, without a second error.
    auto epSize = static_cast<int64_t>(combine.getEpSize());
    int64_t experts1 = combine.getOffsets().getType().getDimSize(0);
    int64_t localExperts = ShapedType::isDynamic(experts1)
                               ? ShapedType::kDynamic
                               : (experts1 - 1) / epSize;
    auto grad = EPDispatchOp::create(
        builder, loc, combine.getRows().getType(),
        RankedTensorType::get({epSize, localExperts}, builder.getI32Type()),
        RankedTensorType::get({epSize}, builder.getI32Type()),
        gradientOf(combine.getResult()), fwd(combine.getOffsets()),
        /*token_ids=*/Value(), EPOverflow::drop, combine.getEpSize(),
        combine.getCapacity());
    accumulate(combine.getRows(), grad.getReceived());
    return success();
  }

  if (auto dispatch = dyn_cast<EPDispatchOp>(op)) {
    Value dReceived = gradientOf(dispatch.getReceived());
    // The gradient of a gather by token_ids sums each token's rows, which
    // the rows of moe.dispatch name.
    Value rowsOf;
    if (dispatch.getTokenIds()) {
      auto source = dispatch.getOffsets().getDefiningOp<DispatchOp>();
      if (!source || source.getTokenIds() != dispatch.getTokenIds())
        return dispatch.emitOpError(
            "gathers by token_ids that do not come with their offsets from "
            "one moe.dispatch, whose rows its gradient needs");
      rowsOf = fwd(source.getRows());
    }
    auto grad =
        EPCombineOp::create(builder, loc, dispatch.getSource().getType(),
                            dReceived, fwd(dispatch.getOffsets()), rowsOf,
                            dispatch.getEpSize(), dispatch.getCapacity());
    accumulate(dispatch.getSource(), grad.getResult());
    return success();
  }

  if (auto scatter = dyn_cast<ScatterRowsOp>(op)) {
    auto grad = GatherRowsOp::create(
        builder, loc, scatter.getSource().getType(),
        gradientOf(scatter.getResult()), fwd(scatter.getIndices()));
    accumulate(scatter.getSource(), grad.getResult());
    return success();
  }

  if (auto gather = dyn_cast<GatherRowsOp>(op)) {
    auto grad = ScatterRowsOp::create(
        builder, loc, gather.getSource().getType(),
        gradientOf(gather.getResult()), fwd(gather.getIndices()));
    accumulate(gather.getSource(), grad.getResult());
    return success();
  }

  if (auto add = dyn_cast<arith::AddFOp>(op)) {
    Value gradient = gradientOf(add.getResult());
    accumulate(add.getLhs(), gradient);
    accumulate(add.getRhs(), gradient);
    return success();
  }

  if (auto sub = dyn_cast<arith::SubFOp>(op)) {
    Value gradient = gradientOf(sub.getResult());
    accumulate(sub.getLhs(), gradient);
    accumulate(sub.getRhs(), arith::NegFOp::create(builder, loc, gradient));
    return success();
  }

  if (isa<LayerOp>(op))
    return op->emitOpError("must be decomposed first: run --moe-decompose "
                           "before --moe-generate-backward");
  return op->emitOpError(
      "is on the gradient path but moe-generate-backward has no gradient "
      "rule for it");
}

void BackwardBuilder::sortSavedArguments() {
  DenseMap<Operation *, unsigned> position;
  for (auto [index, op] : llvm::enumerate(forward.front()))
    position[&op] = index;
  auto key = [&](Value value) -> std::pair<unsigned, unsigned> {
    if (auto argument = dyn_cast<BlockArgument>(value))
      return {0, argument.getArgNumber()};
    auto result = cast<OpResult>(value);
    return {1 + position.lookup(result.getOwner()), result.getResultNumber()};
  };
  SmallVector<Value> order(saved.keys());
  llvm::stable_sort(order, [&](Value a, Value b) { return key(a) < key(b); });

  // Move every argument to a new entry block in the new order.
  Block &entry = backward.front();
  auto *sorted = new Block();
  llvm::MapVector<Value, BlockArgument> resorted;
  for (Value value : order) {
    BlockArgument argument =
        sorted->addArgument(value.getType(), value.getLoc());
    saved[value].replaceAllUsesWith(argument);
    resorted[value] = argument;
  }
  DenseMap<Value, Value> movedSeeds;
  for (BlockArgument seed : entry.getArguments().drop_front(saved.size())) {
    BlockArgument moved = sorted->addArgument(seed.getType(), seed.getLoc());
    seed.replaceAllUsesWith(moved);
    movedSeeds[seed] = moved;
  }
  // A result gradient that no op consumed (a float argument returned as it
  // is) is still the old seed in the gradient map.
  for (auto &[value, gradient] : gradients)
    if (Value moved = movedSeeds.lookup(gradient))
      gradient = moved;
  sorted->getOperations().splice(sorted->end(), entry.getOperations());
  backward.getBody().push_back(sorted);
  entry.erase();
  saved = std::move(resorted);
  builder.setInsertionPointToEnd(sorted);
}

LogicalResult BackwardBuilder::build() {
  Block &forwardBody = forward.front();
  auto returnOp = cast<func::ReturnOp>(forwardBody.getTerminator());
  Block &seedBlock = backward.front();

  // One gradient argument per float result, seeding the gradient map.
  for (Value result : returnOp.getOperands()) {
    if (!isFloatTensor(result.getType()))
      continue;
    BlockArgument seed =
        seedBlock.addArgument(result.getType(), result.getLoc());
    accumulate(result, seed);
  }

  for (Operation &op : llvm::reverse(forwardBody.without_terminator())) {
    if (handled.contains(&op)) {
      // An expert FFN fused into moe.expert_combine_grad: a gradient that
      // reached its h after the fusion would be dropped.
      auto experts = cast<ExpertFFNOp>(op);
      if (gradients.count(experts.getH()))
        return experts.emitOpError(
            "has a gradient into its pre-activations h, which "
            "moe-generate-backward does not differentiate");
      continue;
    }
    if (op.getNumRegions() != 0)
      return op.emitOpError("has regions; moe-generate-backward "
                            "differentiates straight-line functions only");
    bool needsGradient = llvm::any_of(op.getResults(), [&](Value result) {
      return gradients.count(result) && isFloatTensor(result.getType());
    });
    if (needsGradient || isa<LayerOp>(op))
      if (failed(differentiate(&op)))
        return failure();
  }

  sortSavedArguments();

  // Gradients of the arguments, in argument order.
  SmallVector<Value> results;
  SmallVector<int64_t> gradientArgs;
  for (BlockArgument argument : forwardBody.getArguments()) {
    Value gradient = gradients.lookup(argument);
    if (!gradient || !isFloatTensor(argument.getType()))
      continue;
    results.push_back(gradient);
    gradientArgs.push_back(argument.getArgNumber());
  }
  func::ReturnOp::create(builder, forward.getLoc(), results);
  recomputeAnchor->erase();
  backward.setFunctionType(FunctionType::get(
      backward.getContext(), backward.front().getArgumentTypes(),
      ValueRange(results).getTypes()));
  backward->setAttr("moe.gradient_args",
                    builder.getDenseI64ArrayAttr(gradientArgs));
  for (auto [value, argument] : saved)
    backward.setArgAttr(argument.getArgNumber(), kSavedAttr,
                        builder.getStringAttr(savedName(value)));

  // The training forward also returns the saved tensors.
  SmallVector<Value> forwardResults(returnOp.getOperands());
  for (auto [value, argument] : saved)
    forwardResults.push_back(value);
  OpBuilder forwardBuilder(returnOp);
  func::ReturnOp::create(forwardBuilder, returnOp.getLoc(), forwardResults);
  returnOp.erase();
  forward.setFunctionType(
      FunctionType::get(forward.getContext(), forward.getArgumentTypes(),
                        ValueRange(forwardResults).getTypes()));
  forward->setAttr(kNumSavedAttr,
                   forwardBuilder.getI64IntegerAttr(saved.size()));
  for (Operation &op : forwardBody)
    op.removeAttr(kRecomputeAttr);
  return success();
}

bool containsMoEOps(func::FuncOp func) {
  bool found = false;
  func.walk([&](Operation *op) {
    if (isa<MoEDialect>(op->getDialect())) {
      found = true;
      return WalkResult::interrupt();
    }
    return WalkResult::advance();
  });
  return found;
}

struct MoEGenerateBackwardPass
    : public mlir::moe::impl::MoEGenerateBackwardBase<MoEGenerateBackwardPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (failed(checkNoMoEInNestedModules(module, "moe-generate-backward")))
      return signalPassFailure();
    SymbolTable symbols(module);
    SmallVector<func::FuncOp> functions;
    for (auto func : module.getOps<func::FuncOp>())
      if (!func.isExternal() && !func->hasAttr(kNumSavedAttr) &&
          !func->hasAttr("moe.gradient_args") && containsMoEOps(func))
        functions.push_back(func);

    for (func::FuncOp func : functions) {
      if (!func.getBody().hasOneBlock()) {
        func.emitOpError("has more than one block; moe-generate-backward "
                         "differentiates straight-line functions only");
        return signalPassFailure();
      }
      std::string forwardName = (func.getSymName() + "_forward").str();
      std::string backwardName = (func.getSymName() + "_backward").str();
      for (StringRef name : {StringRef(forwardName), StringRef(backwardName)})
        if (symbols.lookup(name)) {
          func.emitOpError("cannot generate @")
              << name << ": a symbol of that name exists";
          return signalPassFailure();
        }

      OpBuilder moduleBuilder(func->getContext());
      moduleBuilder.setInsertionPointAfter(func);
      auto forward = cast<func::FuncOp>(moduleBuilder.clone(*func));
      forward.setSymName(forwardName);
      moduleBuilder.setInsertionPointAfter(forward);
      auto backward =
          func::FuncOp::create(moduleBuilder, func.getLoc(), backwardName,
                               moduleBuilder.getFunctionType({}, {}));
      backward.setVisibility(func.getVisibility());
      // The clone keeps the bound on a dynamic token count; backward gets it.
      for (StringRef name : {kMaxTokensAttr, kEPStepTokensAttr})
        if (Attribute bound = func->getAttr(name))
          backward->setAttr(name, bound);
      symbols.insert(forward);
      symbols.insert(backward);

      inlineCheckpoints(forward);
      BackwardBuilder backwardBuilder(forward, backward);
      if (failed(backwardBuilder.build())) {
        forward.erase();
        backward.erase();
        return signalPassFailure();
      }
    }
  }
};

} // namespace
