//===- MoEPlanActivations.cpp - Keep, recompute or offload activations ---===//
//
// Decides, for the pre-activations `h` of every expert FFN and shared expert
// of a forward function, whether backward keeps them (saved on the device),
// recomputes them (the op wrapped in a moe.checkpoint region) or finds them
// offloaded to host memory (the op marked moe.plan = "offload" for
// moe-offload), under a memory budget. The cost model counts the activation
// bytes backward saves on the device, the FLOPs a recomputation adds and the
// copy time an offload cannot hide behind compute (docs/memory.md).
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/IR/TokenShapes.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Dialect/MoE/Transforms/TrainingAttributes.h"
#include "moe/Support/ByteSize.h"
#include "moe/Support/MemorySize.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/Support/Format.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEPLANACTIVATIONS
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

/// "12744 B (1.19e-05 GiB)".
std::string bytesText(uint64_t bytes) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << bytes << " B ("
     << llvm::format("%.3g", static_cast<double>(bytes) / (1ull << 30))
     << " GiB)";
  return text;
}

/// "0.5", "-1", "1e+06".
std::string formatDouble(double value) {
  std::string text;
  llvm::raw_string_ostream(text) << llvm::format("%g", value);
  return text;
}

/// "argument #0" or "result #1 of 'moe.expert_ffn'".
std::string valueText(Value value) {
  if (auto argument = dyn_cast<BlockArgument>(value))
    return ("argument #" + Twine(argument.getArgNumber())).str();
  auto result = cast<OpResult>(value);
  return ("result #" + Twine(result.getResultNumber()) + " of '" +
          result.getOwner()->getName().getStringRef() + "'")
      .str();
}

/// What happens to the `h` of one candidate.
enum class Choice { Keep, Recompute, Offload };

/// An expert FFN or shared expert whose `h` backward would save.
struct Candidate {
  Operation *op;
  unsigned index = 0; // program order, the last tie-break
  uint64_t hBytes = 0;
  double flops = 0; // of recomputing it: 2 * rows * d * width(h)
  // Compute on either side of the copies of an offloaded h (FLOPs): the
  // forward ops after h's last forward use, and the backward ops that run
  // before its first backward use (the gradients of those same ops).
  double forwardAfter = 0;
  double backwardBefore = 0;
  Choice choice = Choice::Keep;
};

/// FLOPs of one forward op (GEMMs only) at `tokens` tokens where the token
/// count is dynamic (0: none; then 0 with dynamic shapes).
double forwardFlops(Operation *op, int64_t tokens) {
  auto dims = [&](Value value) -> SmallVector<double> {
    auto type = dyn_cast<RankedTensorType>(value.getType());
    if (type && !type.hasStaticShape() && tokens > 0)
      type = getTypeAtTokens(value, tokens).value_or(nullptr);
    if (!type || !type.hasStaticShape())
      return {};
    return llvm::map_to_vector(type.getShape(), [](int64_t size) {
      return static_cast<double>(size);
    });
  };
  // 2 * rows * d * width(h) for the up projection, 2 * rows * n * d down.
  auto ffn = [&](Value x, Value h, Value wDown) -> double {
    SmallVector<double> xs = dims(x), hs = dims(h), ws = dims(wDown);
    if (xs.size() != 2 || hs.size() != 2 || ws.empty())
      return 0;
    double n = ws[ws.size() - 2];
    return 2 * hs[0] * xs[1] * hs[1] + 2 * hs[0] * n * xs[1];
  };
  if (auto router = dyn_cast<RouterOp>(op)) {
    SmallVector<double> xs = dims(router.getX()), ls = dims(router.getLogits());
    return xs.size() == 2 && ls.size() == 2 ? 2 * xs[0] * xs[1] * ls[1] : 0;
  }
  if (auto experts = dyn_cast<ExpertFFNOp>(op))
    return ffn(experts.getX(), experts.getH(), experts.getWDown());
  if (auto shared = dyn_cast<SharedExpertOp>(op))
    return ffn(shared.getX(), shared.getH(), shared.getWDown());
  if (auto combine = dyn_cast<CombineOp>(op)) {
    SmallVector<double> ws = dims(combine.getWeights()),
                        os = dims(combine.getOut());
    return ws.size() == 2 && os.size() == 2 ? 2 * ws[0] * ws[1] * os[1] : 0;
  }
  double nested = 0;
  for (Region &region : op->getRegions())
    region.walk(
        [&](Operation *inner) { nested += forwardFlops(inner, tokens); });
  return nested;
}

/// The rates that turn FLOPs and bytes into seconds.
struct Rates {
  double flopsPerSecond;
  double bytesPerSecond; // host link, each direction
};

/// Seconds a plan adds to the step: the recomputations, and the copies of
/// the offloaded tensors where compute does not hide them. Copies run one
/// after the other on one copy stream. Forward: an offload starts after h's
/// last forward use; what runs past the end of the forward compute is
/// exposed. Backward: every prefetch starts with backward (after nothing),
/// in the order of first use, and backward waits at a first use whose copy
/// has not finished; the recomputations run before every backward op.
double planSeconds(ArrayRef<Candidate> candidates, ArrayRef<Choice> choices,
                   double forwardTotal, const Rates &rates) {
  double recompute = 0;
  SmallVector<const Candidate *> offloaded;
  for (auto [candidate, choice] : llvm::zip_equal(candidates, choices)) {
    if (choice == Choice::Recompute)
      recompute += candidate.flops / rates.flopsPerSecond;
    else if (choice == Choice::Offload)
      offloaded.push_back(&candidate);
  }
  if (offloaded.empty())
    return recompute;
  // Forward: issue order is program order (least compute left first).
  llvm::sort(offloaded, [](const Candidate *a, const Candidate *b) {
    return std::make_pair(-a->forwardAfter, a->index) <
           std::make_pair(-b->forwardAfter, b->index);
  });
  double forwardEnd = forwardTotal / rates.flopsPerSecond;
  double stream = 0;
  for (const Candidate *candidate : offloaded) {
    double start = forwardEnd - candidate->forwardAfter / rates.flopsPerSecond;
    stream = std::max(stream, start) +
             static_cast<double>(candidate->hBytes) / rates.bytesPerSecond;
  }
  double exposed = std::max(0.0, stream - forwardEnd);
  // Backward: needed first is the one with the least compute before it.
  llvm::sort(offloaded, [](const Candidate *a, const Candidate *b) {
    return std::make_pair(a->backwardBefore, a->index) <
           std::make_pair(b->backwardBefore, b->index);
  });
  double stall = 0;
  stream = 0;
  for (const Candidate *candidate : offloaded) {
    stream += static_cast<double>(candidate->hBytes) / rates.bytesPerSecond;
    double needed =
        recompute + candidate->backwardBefore / rates.flopsPerSecond + stall;
    stall += std::max(0.0, stream - needed);
  }
  return recompute + exposed + stall;
}

/// Exhaustive search up to this many candidates (3^10 plans), greedy above.
constexpr unsigned kMaxExhaustive = 10;

/// The fastest plan whose device bytes fit `budget` (nullopt: no limit)
/// among keep, recompute and, with `offload`, offload for each candidate.
/// Ties go to fewer moved tensors, then recompute over offload (no host
/// memory), then the earlier candidates moved (as before offload existed).
/// `candidates` must fit when every h leaves the device.
SmallVector<Choice> fastestPlan(ArrayRef<Candidate> candidates,
                                uint64_t keepBytes,
                                std::optional<uint64_t> budget, bool offload,
                                double forwardTotal, const Rates &rates) {
  unsigned count = candidates.size();
  SmallVector<Choice> keep(count, Choice::Keep);
  if (!budget || keepBytes <= *budget)
    return keep;
  auto bytesOf = [&](ArrayRef<Choice> choices) {
    uint64_t bytes = keepBytes;
    for (auto [candidate, choice] : llvm::zip_equal(candidates, choices))
      if (choice != Choice::Keep)
        bytes -= candidate.hBytes;
    return bytes;
  };
  // (seconds, moved, offloaded, choices) ordered lexicographically.
  auto key = [&](ArrayRef<Choice> choices) {
    unsigned moved = 0, offloads = 0;
    for (Choice choice : choices) {
      moved += choice != Choice::Keep;
      offloads += choice == Choice::Offload;
    }
    // Program order last: the earlier candidates move first.
    SmallVector<unsigned> order = llvm::map_to_vector(choices, [](Choice c) {
      return c == Choice::Keep ? 3u : static_cast<unsigned>(c);
    });
    return std::make_tuple(
        planSeconds(candidates, choices, forwardTotal, rates), moved, offloads,
        order);
  };
  unsigned options = offload ? 3 : 2;
  if (count <= kMaxExhaustive) {
    std::optional<decltype(key(keep))> best;
    SmallVector<Choice> bestChoices;
    SmallVector<Choice> choices(count, Choice::Keep);
    uint64_t plans = 1;
    for (unsigned i = 0; i < count; ++i)
      plans *= options;
    for (uint64_t code = 0; code < plans; ++code) {
      uint64_t rest = code;
      for (unsigned i = 0; i < count; ++i, rest /= options)
        choices[i] = static_cast<Choice>(rest % options);
      if (bytesOf(choices) > *budget)
        continue;
      auto candidateKey = key(choices);
      if (!best || candidateKey < *best) {
        best = std::move(candidateKey);
        bestChoices = choices;
      }
    }
    return bestChoices;
  }
  // Greedy: move the h whose move adds the fewest seconds per byte until the
  // plan fits.
  SmallVector<Choice> choices = keep;
  while (bytesOf(choices) > *budget) {
    double baseline = planSeconds(candidates, choices, forwardTotal, rates);
    std::optional<std::tuple<double, unsigned, Choice>> best;
    for (unsigned i = 0; i < count; ++i) {
      if (choices[i] != Choice::Keep)
        continue;
      for (Choice choice : {Choice::Recompute, Choice::Offload}) {
        if (choice == Choice::Offload && !offload)
          continue;
        choices[i] = choice;
        double rate =
            (planSeconds(candidates, choices, forwardTotal, rates) - baseline) /
            static_cast<double>(std::max<uint64_t>(candidates[i].hBytes, 1));
        choices[i] = Choice::Keep;
        auto option = std::make_tuple(rate, i, choice);
        if (!best || option < *best)
          best = option;
      }
    }
    choices[std::get<1>(*best)] = std::get<2>(*best);
  }
  return choices;
}

struct MoEPlanActivationsPass
    : public mlir::moe::impl::MoEPlanActivationsBase<MoEPlanActivationsPass> {
  using MoEPlanActivationsBase::MoEPlanActivationsBase;

  void runOnOperation() override;

private:
  /// Wraps `op` in a moe.checkpoint region that yields all its results.
  static void wrapInCheckpoint(Operation *op);
};

void MoEPlanActivationsPass::wrapInCheckpoint(Operation *op) {
  OpBuilder builder(op);
  auto checkpoint = CheckpointOp::create(
      builder, op->getLoc(), op->getResultTypes(), op->getOperands());
  checkpoint->setAttr(kPlanAttr, builder.getStringAttr("recompute"));
  Block *body = builder.createBlock(&checkpoint.getBody());
  IRMapping mapping;
  for (Value operand : op->getOperands())
    mapping.map(operand, body->addArgument(operand.getType(), op->getLoc()));
  Operation *clone = builder.clone(*op, mapping);
  YieldOp::create(builder, op->getLoc(), clone->getResults());
  op->replaceAllUsesWith(checkpoint.getOutputs());
  op->erase();
}

void MoEPlanActivationsPass::runOnOperation() {
  func::FuncOp func = getOperation();
  // Functions moe-generate-backward made are planned through their source.
  if (func.isExternal() || func->hasAttr(kNumSavedAttr) ||
      func->hasAttr("moe.gradient_args"))
    return;

  StringRef policyName = policy;
  if (policyName != "keep" && policyName != "recompute" &&
      policyName != "offload" && policyName != "auto") {
    func.emitError("moe-plan-activations: unknown policy '")
        << policyName << "' (expected keep, recompute, offload or auto)";
    return signalPassFailure();
  }
  if (!(gpuTflops > 0.0)) {
    func.emitError("moe-plan-activations: gpu-tflops must be positive, got ")
        << formatDouble(gpuTflops);
    return signalPassFailure();
  }
  if (!(hostGbps > 0.0)) {
    func.emitError("moe-plan-activations: host-gbps must be positive, got ")
        << formatDouble(hostGbps);
    return signalPassFailure();
  }
  std::optional<uint64_t> budget;
  if (!memoryBudget.empty()) {
    std::string error;
    budget = parseMemorySize(memoryBudget, &error);
    if (!budget) {
      func.emitError("moe-plan-activations: ") << error;
      return signalPassFailure();
    }
  }

  // The candidates and the activations every plan saves: x, the router's
  // and dispatch's results. Ops already inside a checkpoint are recomputed
  // whatever the plan.
  SmallVector<Candidate> candidates;
  llvm::SetVector<Value> common;
  Operation *undecomposed = nullptr;
  func.walk([&](Operation *op) {
    if (op->getParentOfType<CheckpointOp>())
      return;
    if (isa<LayerOp>(op)) {
      undecomposed = op;
    } else if (auto router = dyn_cast<RouterOp>(op)) {
      common.insert(router.getX());
      common.insert(router->result_begin(), router->result_end());
    } else if (isa<DispatchOp>(op)) {
      common.insert(op->result_begin(), op->result_end());
    } else if (auto ffn = dyn_cast<ExpertFFNOp>(op)) {
      common.insert(ffn.getX());
      candidates.push_back({op, static_cast<unsigned>(candidates.size())});
    } else if (auto shared = dyn_cast<SharedExpertOp>(op)) {
      common.insert(shared.getX());
      candidates.push_back({op, static_cast<unsigned>(candidates.size())});
    }
  });
  if (undecomposed) {
    undecomposed->emitOpError("cannot be planned: moe-plan-activations runs "
                              "after moe-decompose");
    return signalPassFailure();
  }
  if (candidates.empty() && common.empty())
    return;

  // Bytes of each plan; with a dynamic token count at its bound (what fits
  // the budget there fits at every smaller T), and as functions of T for the
  // report; unknown with another dynamic shape or no bound. The report's
  // words for the unknown value are taken now: the plan may erase its op.
  std::optional<int64_t> bound = getMaxTokens(func);
  int64_t tokens = bound.value_or(0);
  Value dynamic;
  std::string dynamicName;
  Type dynamicType;
  auto noteDynamic = [&](Value value) {
    if (dynamic)
      return;
    dynamic = value;
    dynamicName = valueText(value);
    dynamicType = value.getType();
  };
  // A byte count over 63 bits is an error at the value, never a wrapped
  // number in the plan.
  auto tooLarge = [&](Value value) {
    emitError(value.getLoc())
        << "moe-plan-activations: the bytes of " << valueText(value) << " ("
        << value.getType() << "), added up, do not fit in 63 bits";
    signalPassFailure();
  };
  // The bytes of `value` (at the bound), added to `sum`; false past 63 bits
  // (reported), unknown ones noted.
  auto addBytes = [&](TokenBytes &sum, Value value,
                      uint64_t *bytesAtBound) -> bool {
    auto shaped = dyn_cast<ShapedType>(value.getType());
    std::optional<TokenBytes> bytes =
        shaped && (shaped.hasStaticShape() || bound) ? getTokenBytes(value)
                                                     : std::nullopt;
    if (!bytes) {
      ByteSizeStatus status = ByteSizeStatus::Dynamic;
      if (shaped)
        (void)getByteSize(shaped, status);
      if (status == ByteSizeStatus::Overflow) {
        tooLarge(value);
        return false;
      }
      noteDynamic(value);
      return true;
    }
    std::optional<uint64_t> atBound = bytes->at(tokens);
    std::optional<uint64_t> perToken =
        addByteSizes(sum.perToken, bytes->perToken);
    std::optional<uint64_t> fixed = addByteSizes(sum.fixed, bytes->fixed);
    TokenBytes total{perToken.value_or(0), fixed.value_or(0)};
    if (!atBound || !perToken || !fixed || !total.at(tokens)) {
      tooLarge(value);
      return false;
    }
    sum = total;
    if (bytesAtBound)
      *bytesAtBound = *atBound;
    return true;
  };
  TokenBytes commonBytes;
  for (Value value : common)
    if (!addBytes(commonBytes, value, nullptr))
      return;
  TokenBytes keepBytes = commonBytes;
  for (Candidate &candidate : candidates) {
    Value x = candidate.op->getOperand(0);
    Value h = candidate.op->getResult(1);
    Value before = dynamic;
    if (!addBytes(keepBytes, h, &candidate.hBytes))
      return;
    if (dynamic != before)
      continue;
    std::optional<RankedTensorType> hType = getTypeAtTokens(h, tokens);
    std::optional<RankedTensorType> xType = getTypeAtTokens(x, tokens);
    if (hType && xType)
      candidate.flops = 2.0 * static_cast<double>(hType->getDimSize(0)) *
                        static_cast<double>(xType->getDimSize(1)) *
                        static_cast<double>(hType->getDimSize(1));
  }
  if (dynamic && budget) {
    func.emitError("cannot plan activations under memory-budget ")
        << bytesText(*budget) << ": " << dynamicName << " has type "
        << dynamicType
        << "; the saved bytes need static shapes, or a dynamic token count "
           "with its bound (moe.max_tokens)";
    return signalPassFailure();
  }

  // The compute an offload's copies can hide behind: the forward ops after
  // h's last forward use, and their gradients, which backward runs before
  // it first reads h (about twice their forward FLOPs: dx and dW).
  double forwardTotal = 0;
  for (Candidate &candidate : candidates) {
    Block *block = candidate.op->getBlock();
    Operation *last = candidate.op;
    for (Operation *user : candidate.op->getResult(1).getUsers())
      if (Operation *inBlock = block->findAncestorOpInBlock(*user))
        if (last->isBeforeInBlock(inBlock) &&
            !inBlock->hasTrait<OpTrait::IsTerminator>())
          last = inBlock;
    for (Operation *op = last->getNextNode(); op; op = op->getNextNode())
      candidate.forwardAfter += forwardFlops(op, tokens);
    candidate.backwardBefore = 2 * candidate.forwardAfter;
  }
  for (Operation &op : func.getBody().front())
    forwardTotal += forwardFlops(&op, tokens);

  uint64_t keepAtBound = *keepBytes.at(tokens);
  uint64_t recomputeBytes = *commonBytes.at(tokens);
  double recomputeFlops = 0;
  for (const Candidate &candidate : candidates)
    recomputeFlops += candidate.flops;
  Rates rates{gpuTflops * 1e12, hostGbps * 1e9};
  auto every = [&](Choice choice) {
    return SmallVector<Choice>(candidates.size(), choice);
  };
  double recomputeSeconds =
      planSeconds(candidates, every(Choice::Recompute), forwardTotal, rates);
  double offloadSeconds =
      planSeconds(candidates, every(Choice::Offload), forwardTotal, rates);

  // Choose.
  SmallVector<Choice> choices;
  if (policyName == "auto")
    choices = fastestPlan(candidates, keepAtBound, budget, autoOffload,
                          forwardTotal, rates);
  else
    choices = every(policyName == "keep"        ? Choice::Keep
                    : policyName == "recompute" ? Choice::Recompute
                                                : Choice::Offload);
  uint64_t plannedBytes = recomputeBytes, hostBytes = 0;
  // The saved bytes as a function of T: every kept h follows T as the
  // common part does (its rows are T * k or T).
  TokenBytes planned = commonBytes;
  double plannedFlops = 0;
  unsigned numRecomputed = 0, numOffloaded = 0;
  for (auto [candidate, choice] : llvm::zip_equal(candidates, choices)) {
    candidate.choice = choice;
    if (choice == Choice::Recompute) {
      plannedFlops += candidate.flops;
      ++numRecomputed;
    } else if (choice == Choice::Offload) {
      hostBytes += candidate.hBytes;
      ++numOffloaded;
    } else {
      plannedBytes += candidate.hBytes;
      if (std::optional<TokenBytes> h =
              getTokenBytes(candidate.op->getResult(1))) {
        planned.perToken += h->perToken;
        planned.fixed += h->fixed;
      }
    }
  }
  double plannedSeconds = planSeconds(candidates, choices, forwardTotal, rates);

  auto us = [](double seconds) { return llvm::format("%.3g", seconds * 1e6); };
  auto describe = [&](llvm::raw_ostream &os) {
    os << "keep saves " << bytesText(keepAtBound) << ", recompute saves "
       << bytesText(recomputeBytes) << " and adds "
       << llvm::format("%.4g", recomputeFlops) << " FLOPs ("
       << us(recomputeSeconds) << " us at "
       << llvm::format("%g", static_cast<double>(gpuTflops))
       << " TFLOP/s), offload saves " << bytesText(recomputeBytes)
       << " and adds " << us(offloadSeconds) << " us of copies compute does "
       << "not hide (at " << llvm::format("%g", static_cast<double>(hostGbps))
       << " GB/s)";
  };
  if (budget && plannedBytes > *budget) {
    // keep, recompute or offload asked for explicitly, or auto with every h
    // off the device: nothing this policy can do fits.
    uint64_t smallest = policyName == "keep" ? keepAtBound : recomputeBytes;
    InFlightDiagnostic diag = emitError(func.getLoc());
    diag << "memory-budget " << bytesText(*budget)
         << " cannot be met with policy=" << policyName
         << ": the smallest budget it can meet is " << bytesText(smallest);
    if (policyName == "keep")
      diag << " (policy=recompute, offload or auto needs "
           << bytesText(recomputeBytes) << ")";
    std::string plans;
    llvm::raw_string_ostream os(plans);
    describe(os);
    diag.attachNote() << plans;
    return signalPassFailure();
  }

  Builder builder(func.getContext());
  for (Candidate &candidate : candidates) {
    if (candidate.choice == Choice::Recompute)
      wrapInCheckpoint(candidate.op);
    else if (candidate.choice == Choice::Offload)
      candidate.op->setAttr(kPlanAttr, builder.getStringAttr("offload"));
  }

  StringRef planName = "partial";
  if (numRecomputed == 0 && numOffloaded == 0)
    planName = "keep";
  else if (numRecomputed == candidates.size())
    planName = "recompute";
  else if (numOffloaded == candidates.size())
    planName = "offload";
  func->setAttr("moe.activation_plan", builder.getStringAttr(planName));
  if (!dynamic) {
    func->setAttr("moe.saved_bytes", builder.getI64IntegerAttr(
                                         static_cast<int64_t>(plannedBytes)));
    if (numOffloaded)
      func->setAttr("moe.offloaded_bytes",
                    builder.getI64IntegerAttr(static_cast<int64_t>(hostBytes)));
    // With a dynamic token count: the saved bytes at T are
    // saved_bytes_per_token * T + saved_bytes_fixed (saved_bytes is at the
    // bound).
    if (bound && planned.perToken > 0) {
      func->setAttr(
          "moe.saved_bytes_per_token",
          builder.getI64IntegerAttr(static_cast<int64_t>(planned.perToken)));
      func->setAttr(
          "moe.saved_bytes_fixed",
          builder.getI64IntegerAttr(static_cast<int64_t>(planned.fixed)));
    }
  }
  if (!report)
    return;
  // On the location only: the note with the whole function is noise here.
  InFlightDiagnostic remark = emitRemark(func.getLoc());
  remark << "activation plan '" << planName << "' (policy " << policyName;
  if (budget)
    remark << ", memory-budget " << bytesText(*budget);
  remark << "): ";
  if (dynamic) {
    remark << numRecomputed << " recomputed, " << numOffloaded
           << " offloaded of " << candidates.size()
           << " expert FFNs; saved bytes unknown (" << dynamicName
           << " has type " << dynamicType << ")";
    return;
  }
  std::string plans;
  llvm::raw_string_ostream os(plans);
  describe(os);
  os << "; planned " << bytesText(plannedBytes) << " on the device";
  if (bound && planned.perToken > 0)
    os << " at the bound T = " << *bound << " (" << planned.perToken
       << " B * T + " << planned.fixed << " B)";
  if (numOffloaded)
    os << " and " << bytesText(hostBytes) << " on the host";
  os << ", " << numRecomputed << " recomputed and " << numOffloaded
     << " offloaded of " << candidates.size() << " expert FFNs, "
     << llvm::format("%.4g", plannedFlops) << " extra FLOPs, "
     << us(plannedSeconds) << " us added";
  remark << plans;
}

} // namespace
