//===- MoEPlanActivations.cpp - Keep or recompute saved activations -*- C++
//-*-===//
//
// Decides, for the pre-activations `h` of every expert FFN and shared expert
// of a forward function, whether backward keeps them (saved) or recomputes
// them (the op wrapped in a moe.checkpoint region), under a memory budget.
// The cost model counts the activation bytes backward saves and the FLOPs a
// recomputation adds (docs/memory.md).
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Support/MemorySize.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "llvm/ADT/SetVector.h"
#include "llvm/Support/Format.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEPLANACTIVATIONS
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

/// Bytes of a statically shaped tensor, or nullopt.
std::optional<uint64_t> tensorBytes(Type type) {
  auto tensor = dyn_cast<RankedTensorType>(type);
  if (!tensor || !tensor.hasStaticShape())
    return std::nullopt;
  uint64_t elementBytes =
      (tensor.getElementType().getIntOrFloatBitWidth() + 7) / 8;
  return static_cast<uint64_t>(tensor.getNumElements()) * elementBytes;
}

/// "12744 B (1.19e-05 GiB)".
std::string bytesText(uint64_t bytes) {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << bytes << " B ("
     << llvm::format("%.3g", static_cast<double>(bytes) / (1ull << 30))
     << " GiB)";
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

/// An expert FFN or shared expert whose `h` backward would save.
struct Candidate {
  Operation *op;
  unsigned index; // program order, the last tie-break
  uint64_t hBytes = 0;
  double flops = 0; // of recomputing it: 2 * rows * d * width(h)
  bool recompute = false;
};

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
  checkpoint->setAttr("moe.plan", builder.getStringAttr("recompute"));
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
  if (func.isExternal() || func->hasAttr("moe.num_saved") ||
      func->hasAttr("moe.gradient_args"))
    return;

  StringRef policyName = policy;
  if (policyName == "offload") {
    func.emitError("moe-plan-activations: policy=offload is not implemented "
                   "yet (use keep, recompute or auto)");
    return signalPassFailure();
  }
  if (policyName != "keep" && policyName != "recompute" &&
      policyName != "auto") {
    func.emitError("moe-plan-activations: unknown policy '")
        << policyName << "' (expected keep, recompute or auto)";
    return signalPassFailure();
  }
  if (!(gpuTflops > 0.0)) {
    func.emitError("moe-plan-activations: gpu-tflops must be positive, got ")
        << gpuTflops;
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

  // Bytes of each plan; unknown with a dynamic shape.
  Value dynamic;
  uint64_t commonBytes = 0;
  for (Value value : common) {
    std::optional<uint64_t> bytes = tensorBytes(value.getType());
    if (!bytes) {
      dynamic = value;
      break;
    }
    commonBytes += *bytes;
  }
  for (Candidate &candidate : candidates) {
    Value x = candidate.op->getOperand(0);
    Value h = candidate.op->getResult(1);
    std::optional<uint64_t> bytes = tensorBytes(h.getType());
    if (!bytes) {
      dynamic = dynamic ? dynamic : h;
      continue;
    }
    candidate.hBytes = *bytes;
    auto hType = cast<RankedTensorType>(h.getType());
    auto xType = cast<RankedTensorType>(x.getType());
    candidate.flops = 2.0 * static_cast<double>(hType.getDimSize(0)) *
                      static_cast<double>(xType.getDimSize(1)) *
                      static_cast<double>(hType.getDimSize(1));
  }
  if (dynamic && budget) {
    func.emitError("cannot plan activations under memory-budget ")
        << bytesText(*budget) << ": " << valueText(dynamic) << " has type "
        << dynamic.getType() << "; the saved bytes need static shapes";
    return signalPassFailure();
  }

  uint64_t keepBytes = commonBytes, recomputeBytes = commonBytes;
  double recomputeFlops = 0;
  for (const Candidate &candidate : candidates) {
    keepBytes += candidate.hBytes;
    recomputeFlops += candidate.flops;
  }
  auto seconds = [&](double flops) { return flops / (gpuTflops * 1e12); };

  // Choose.
  if (policyName == "recompute") {
    for (Candidate &candidate : candidates)
      candidate.recompute = true;
  } else if (policyName == "auto" && budget && keepBytes > *budget) {
    // Fewest extra seconds per byte first, then the largest h.
    SmallVector<Candidate *> order;
    for (Candidate &candidate : candidates)
      order.push_back(&candidate);
    llvm::sort(order, [](const Candidate *a, const Candidate *b) {
      double rateA =
          a->flops / static_cast<double>(std::max<uint64_t>(a->hBytes, 1));
      double rateB =
          b->flops / static_cast<double>(std::max<uint64_t>(b->hBytes, 1));
      if (rateA != rateB)
        return rateA < rateB;
      if (a->hBytes != b->hBytes)
        return a->hBytes > b->hBytes;
      return a->index < b->index;
    });
    uint64_t bytes = keepBytes;
    for (Candidate *candidate : order) {
      if (bytes <= *budget)
        break;
      candidate->recompute = true;
      bytes -= candidate->hBytes;
    }
  }
  uint64_t plannedBytes = commonBytes;
  double plannedFlops = 0;
  unsigned numRecomputed = 0;
  for (const Candidate &candidate : candidates) {
    if (candidate.recompute) {
      plannedFlops += candidate.flops;
      ++numRecomputed;
    } else {
      plannedBytes += candidate.hBytes;
    }
  }

  auto describe = [&](llvm::raw_ostream &os) {
    os << "keep saves " << bytesText(keepBytes) << ", recompute saves "
       << bytesText(recomputeBytes) << " and adds "
       << llvm::format("%.4g", recomputeFlops) << " FLOPs ("
       << llvm::format("%.3g", seconds(recomputeFlops) * 1e6) << " us at "
       << llvm::format("%g", static_cast<double>(gpuTflops)) << " TFLOP/s)";
  };
  if (budget && plannedBytes > *budget) {
    // keep or recompute asked for explicitly, or auto with every h
    // recomputed: nothing this policy can do fits.
    uint64_t smallest = policyName == "keep" ? keepBytes : recomputeBytes;
    InFlightDiagnostic diag = emitError(func.getLoc());
    diag << "memory-budget " << bytesText(*budget)
         << " cannot be met with policy=" << policyName
         << ": the smallest budget it can meet is " << bytesText(smallest);
    if (policyName == "keep")
      diag << " (policy=recompute or auto needs " << bytesText(recomputeBytes)
           << ")";
    std::string plans;
    llvm::raw_string_ostream os(plans);
    describe(os);
    diag.attachNote() << plans;
    return signalPassFailure();
  }

  for (Candidate &candidate : candidates)
    if (candidate.recompute)
      wrapInCheckpoint(candidate.op);

  Builder builder(func.getContext());
  StringRef planName = numRecomputed == 0                   ? "keep"
                       : numRecomputed == candidates.size() ? "recompute"
                                                            : "partial";
  func->setAttr("moe.activation_plan", builder.getStringAttr(planName));
  if (!dynamic)
    func->setAttr("moe.saved_bytes", builder.getI64IntegerAttr(
                                         static_cast<int64_t>(plannedBytes)));
  if (!report)
    return;
  // On the location only: the note with the whole function is noise here.
  InFlightDiagnostic remark = emitRemark(func.getLoc());
  remark << "activation plan '" << planName << "' (policy " << policyName;
  if (budget)
    remark << ", memory-budget " << bytesText(*budget);
  remark << "): ";
  if (dynamic) {
    remark << numRecomputed << " of " << candidates.size()
           << " expert FFNs recomputed; saved bytes unknown ("
           << valueText(dynamic) << " has type " << dynamic.getType() << ")";
    return;
  }
  std::string plans;
  llvm::raw_string_ostream os(plans);
  describe(os);
  os << "; planned " << bytesText(plannedBytes) << ", " << numRecomputed
     << " of " << candidates.size() << " expert FFNs recomputed, "
     << llvm::format("%.4g", plannedFlops) << " extra FLOPs";
  remark << plans;
}

} // namespace
