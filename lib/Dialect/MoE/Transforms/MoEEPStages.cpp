//===- MoEEPStages.cpp - Split functions at their collectives -*- C++ -*-===//
//
// A function with expert-parallel collectives (moe.ep_dispatch,
// moe.ep_combine) becomes one function per stage between them: each runs on
// one rank alone, and the caller moves the rows between ranks in between.
// A dispatch's sending half is moe.ep_pack at the end of its stage and its
// receiving half the next stage's arguments; a combine sends its rows as
// they are and moe.ep_unpack places what comes back. Values one stage makes
// and a later one reads are carried (returned, then taken). Each stage
// describes its arguments and results in attributes. docs/distributed.md.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/Transforms/NestedModules.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Dialect/MoE/Transforms/TrainingAttributes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/MapVector.h"

#include <vector>

namespace mlir::moe {
#define GEN_PASS_DEF_MOEEPSTAGES
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

bool isCollective(Operation *op) { return isa<EPDispatchOp, EPCombineOp>(op); }

/// One stage being built: its function, the values it maps, and what its
/// arguments and results are.
struct Stage {
  func::FuncOp func;
  IRMapping mapping;
  SmallVector<Attribute> inputs;      // moe.ep_inputs
  SmallVector<Value> outputs;         // values the stage returns
  SmallVector<Attribute> outputNames; // moe.ep_outputs
};

/// Splits one function; `emitError` has been called on failure.
class StageSplitter {
public:
  explicit StageSplitter(func::FuncOp func) : func(func), b(func) {}

  LogicalResult split(SymbolTable &symbols);

private:
  /// The stage that makes `value`: -1 for an argument of the function.
  int stageOf(Value value) const;
  /// `value` in stage `stage`: mapped there, or taken as an argument (an
  /// argument of the function or a carry from the stage that makes it).
  Value lookup(unsigned stage, Value value);
  BlockArgument addInput(unsigned stage, Type type, Location loc,
                         StringRef name);
  void addOutput(unsigned stage, Value value, StringRef name);

  func::FuncOp func;
  OpBuilder b;
  SmallVector<Operation *> collectives;
  DenseMap<Operation *, unsigned> stageOfOp;
  std::vector<Stage> stages;
  /// Carried values and their numbers (carryJ).
  llvm::MapVector<Value, unsigned> carries;
};

int StageSplitter::stageOf(Value value) const {
  if (isa<BlockArgument>(value))
    return -1;
  auto result = cast<OpResult>(value);
  Operation *op = result.getOwner();
  unsigned stage = stageOfOp.lookup(op);
  if (!isCollective(op))
    return stage;
  // A dispatch's `dropped` comes from its sending half; everything else a
  // collective gives arrives with the next stage.
  if (auto dispatch = dyn_cast<EPDispatchOp>(op);
      dispatch && value == dispatch.getDropped())
    return stage;
  return stage + 1;
}

BlockArgument StageSplitter::addInput(unsigned stage, Type type, Location loc,
                                      StringRef name) {
  Stage &s = stages[stage];
  BlockArgument argument = s.func.front().addArgument(type, loc);
  s.inputs.push_back(b.getStringAttr(name));
  return argument;
}

void StageSplitter::addOutput(unsigned stage, Value value, StringRef name) {
  stages[stage].outputs.push_back(value);
  stages[stage].outputNames.push_back(b.getStringAttr(name));
}

Value StageSplitter::lookup(unsigned stage, Value value) {
  Stage &s = stages[stage];
  if (Value mapped = s.mapping.lookupOrNull(value))
    return mapped;
  int from = stageOf(value);
  std::string name;
  if (auto argument = dyn_cast<BlockArgument>(value)) {
    name = ("arg" + Twine(argument.getArgNumber())).str();
  } else {
    assert(from < static_cast<int>(stage) && "a value used before it is made");
    auto [it, inserted] = carries.try_emplace(value, carries.size());
    name = ("carry" + Twine(it->second)).str();
    if (inserted)
      addOutput(from, lookup(from, value), name);
  }
  BlockArgument argument =
      addInput(stage, value.getType(), value.getLoc(), name);
  s.mapping.map(value, argument);
  return argument;
}

LogicalResult StageSplitter::split(SymbolTable &symbols) {
  Block &body = func.front();
  unsigned stage = 0;
  for (Operation &op : body.without_terminator()) {
    stageOfOp[&op] = stage;
    if (isCollective(&op)) {
      collectives.push_back(&op);
      ++stage;
    }
  }
  unsigned numStages = collectives.size() + 1;

  // One ep_size and capacity for the function: the caller's exchange.
  auto attrsOf = [](Operation *op) {
    if (auto dispatch = dyn_cast<EPDispatchOp>(op))
      return std::make_pair(dispatch.getEpSize(), dispatch.getCapacity());
    auto combine = cast<EPCombineOp>(op);
    return std::make_pair(combine.getEpSize(), combine.getCapacity());
  };
  auto [epSize, capacity] = attrsOf(collectives.front());
  for (Operation *op : collectives)
    if (attrsOf(op) != std::make_pair(epSize, capacity))
      return op->emitOpError("has ep_size ")
             << attrsOf(op).first << " and capacity " << attrsOf(op).second
             << " but the first collective of @" << func.getSymName() << " has "
             << epSize << " and " << capacity
             << "; moe-ep-stages needs one of each a function";

  b.setInsertionPoint(func);
  for (unsigned i = 0; i < numStages; ++i) {
    std::string name = (func.getSymName() + "_stage" + Twine(i)).str();
    if (symbols.lookup(name))
      return func.emitOpError("cannot make @")
             << name << ": a symbol of that name exists";
    auto stageFunc =
        func::FuncOp::create(b, func.getLoc(), name, b.getFunctionType({}, {}));
    stageFunc.setVisibility(func.getVisibility());
    stageFunc.addEntryBlock();
    stages.emplace_back();
    stages.back().func = stageFunc;
  }

  auto name = [](StringRef base, unsigned index) {
    return (base + Twine(index)).str();
  };
  for (unsigned i = 0; i < numStages; ++i) {
    Stage &s = stages[i];
    OpBuilder builder = OpBuilder::atBlockEnd(&s.func.front());
    // The receiving half of the collective before this stage.
    if (i > 0) {
      Operation *collective = collectives[i - 1];
      if (auto dispatch = dyn_cast<EPDispatchOp>(collective)) {
        s.mapping.map(dispatch.getReceived(),
                      addInput(i, dispatch.getReceived().getType(),
                               dispatch.getLoc(), name("received", i - 1)));
        s.mapping.map(dispatch.getReceivedCounts(),
                      addInput(i, dispatch.getReceivedCounts().getType(),
                               dispatch.getLoc(),
                               name("received_counts", i - 1)));
      } else {
        auto combine = cast<EPCombineOp>(collective);
        Value returned = addInput(i, combine.getRows().getType(),
                                  combine.getLoc(), name("returned", i - 1));
        Value rowsOf =
            combine.getRowsOf() ? lookup(i, combine.getRowsOf()) : Value();
        auto unpack = EPUnpackOp::create(
            builder, combine.getLoc(), combine.getResult().getType(), returned,
            lookup(i, combine.getOffsets()), rowsOf, combine.getEpSizeAttr(),
            combine.getCapacityAttr());
        s.mapping.map(combine.getResult(), unpack.getResult());
      }
    }
    // The stage's own ops.
    for (Operation &op : body.without_terminator()) {
      if (stageOfOp.lookup(&op) != i || isCollective(&op))
        continue;
      for (Value operand : op.getOperands())
        lookup(i, operand);
      // What the op's regions read from the function's body, too.
      op.walk([&](Operation *nested) {
        for (Value operand : nested->getOperands())
          if (operand.getParentBlock() == &body)
            lookup(i, operand);
      });
      builder.clone(op, s.mapping);
    }
    // The sending half of the collective that ends it.
    if (i + 1 < numStages) {
      Operation *collective = collectives[i];
      if (auto dispatch = dyn_cast<EPDispatchOp>(collective)) {
        Value tokenIds = dispatch.getTokenIds()
                             ? lookup(i, dispatch.getTokenIds())
                             : Value();
        auto pack = EPPackOp::create(
            builder, dispatch.getLoc(), dispatch.getReceived().getType(),
            dispatch.getReceivedCounts().getType(),
            dispatch.getDropped().getType(), lookup(i, dispatch.getSource()),
            lookup(i, dispatch.getOffsets()), tokenIds,
            dispatch.getOverflowAttr(), dispatch.getEpSizeAttr(),
            dispatch.getCapacityAttr());
        s.mapping.map(dispatch.getDropped(), pack.getDropped());
        addOutput(i, pack.getSend(), name("send", i));
        addOutput(i, pack.getSendCounts(), name("send_counts", i));
        addOutput(i, pack.getDropped(), name("dropped", i));
      } else {
        auto combine = cast<EPCombineOp>(collective);
        addOutput(i, lookup(i, combine.getRows()), name("send", i));
      }
    }
  }

  // The results: an argument returned as it is comes from the caller;
  // every other from the stage that makes it.
  auto returnOp = cast<func::ReturnOp>(body.getTerminator());
  SmallVector<Attribute> results;
  for (auto [index, value] : llvm::enumerate(returnOp.getOperands())) {
    if (auto argument = dyn_cast<BlockArgument>(value)) {
      results.push_back(b.getStringAttr(name("arg", argument.getArgNumber())));
      continue;
    }
    unsigned from = static_cast<unsigned>(stageOf(value));
    results.push_back(b.getStringAttr(name("stage", from)));
    addOutput(from, lookup(from, value), name("result", index));
  }

  SmallVector<Attribute> kinds, overflows;
  for (Operation *op : collectives) {
    auto dispatch = dyn_cast<EPDispatchOp>(op);
    kinds.push_back(b.getStringAttr(dispatch ? "dispatch" : "combine"));
    overflows.push_back(b.getStringAttr(
        dispatch ? stringifyEPOverflow(dispatch.getOverflow()) : "none"));
  }
  for (auto [i, s] : llvm::enumerate(stages)) {
    OpBuilder builder = OpBuilder::atBlockEnd(&s.func.front());
    func::ReturnOp::create(builder, func.getLoc(), s.outputs);
    s.func.setFunctionType(b.getFunctionType(s.func.front().getArgumentTypes(),
                                             ValueRange(s.outputs).getTypes()));
    s.func->setAttr("moe.ep_stage_of", func.getSymNameAttr());
    s.func->setAttr("moe.ep_stage", b.getI64IntegerAttr(i));
    s.func->setAttr("moe.ep_stages", b.getI64IntegerAttr(numStages));
    s.func->setAttr("moe.ep_inputs", b.getArrayAttr(s.inputs));
    s.func->setAttr("moe.ep_outputs", b.getArrayAttr(s.outputNames));
    s.func->setAttr("moe.ep_collectives", b.getArrayAttr(kinds));
    s.func->setAttr("moe.ep_overflows", b.getArrayAttr(overflows));
    s.func->setAttr("moe.ep_size", b.getI64IntegerAttr(epSize));
    s.func->setAttr("moe.ep_capacity", b.getI64IntegerAttr(capacity));
    s.func->setAttr("moe.ep_results", b.getArrayAttr(results));
    for (StringRef name : {kMaxTokensAttr, kEPStepTokensAttr})
      if (Attribute bound = func->getAttr(name))
        s.func->setAttr(name, bound);
    if (Attribute numSaved = func->getAttr(kNumSavedAttr))
      s.func->setAttr("moe.ep_num_saved", numSaved);
    if (Attribute gradientArgs = func->getAttr("moe.gradient_args"))
      s.func->setAttr("moe.ep_gradient_args", gradientArgs);
    symbols.insert(s.func);
  }
  return success();
}

struct MoEEPStagesPass
    : public mlir::moe::impl::MoEEPStagesBase<MoEEPStagesPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (failed(checkNoMoEInNestedModules(module, "moe-ep-stages")))
      return signalPassFailure();
    SymbolTable symbols(module);
    SmallVector<func::FuncOp> functions;
    for (auto func : module.getOps<func::FuncOp>())
      if (!func.isExternal() && func.walk([](Operation *op) {
                                      return isCollective(op)
                                                 ? WalkResult::interrupt()
                                                 : WalkResult::advance();
                                    })
                                    .wasInterrupted())
        functions.push_back(func);
    for (func::FuncOp func : functions) {
      if (!func.getBody().hasOneBlock()) {
        func.emitOpError("has more than one block; moe-ep-stages splits "
                         "straight-line functions only");
        return signalPassFailure();
      }
      for (Operation &op : func.front()) {
        bool nested = op.getNumRegions() != 0 &&
                      op.walk([](Operation *inner) {
                          return isCollective(inner) ? WalkResult::interrupt()
                                                     : WalkResult::advance();
                        }).wasInterrupted();
        if (nested) {
          op.emitOpError("holds an expert-parallel collective in a region; "
                         "moe-ep-stages splits at collectives of the "
                         "function's body only");
          return signalPassFailure();
        }
      }
      StageSplitter splitter(func);
      if (failed(splitter.split(symbols)))
        return signalPassFailure();
      symbols.erase(func);
    }
  }
};

} // namespace
