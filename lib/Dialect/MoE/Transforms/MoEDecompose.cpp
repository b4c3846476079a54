//===- MoEDecompose.cpp - Expand moe.layer into its steps ---*- C++ -*-===//

#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/Transforms/Decompose.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/Support/MathExtras.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEDECOMPOSE
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

int64_t mulOrDynamic(int64_t a, int64_t b) {
  int64_t result;
  if (ShapedType::isDynamic(a) || ShapedType::isDynamic(b) ||
      llvm::MulOverflow(a, b, result))
    return ShapedType::kDynamic;
  return result;
}

} // namespace

/// Builds the router/dispatch/expert/combine chain of one layer. Fails (with
/// a diagnostic on the layer) when the number of experts is not static.
LogicalResult mlir::moe::decomposeLayer(RewriterBase &rewriter, LayerOp layer) {
  auto xType = layer.getX().getType();
  auto routerType = layer.getRouterWeight().getType();
  auto gateUpType = layer.getWGateUp().getType();
  int64_t numExperts = routerType.getDimSize(1);
  if (ShapedType::isDynamic(numExperts))
    numExperts = gateUpType.getDimSize(0);
  if (ShapedType::isDynamic(numExperts))
    return layer.emitOpError(
        "cannot be decomposed: the number of experts must be static");

  // A dynamic token count's bound goes to the function, which every plan
  // after this reads; two layers of one function share it. A chunked layer's
  // function serves one chunk: its bound is the chunk's, and the step's is
  // recorded beside it for the runtime that splits the step.
  if (std::optional<int64_t> step = layer.getMaxTokens();
      step && xType.isDynamicDim(0)) {
    Operation *func = layer->getParentOfType<FunctionOpInterface>();
    if (!func)
      return layer.emitOpError("with a dynamic token count must be in a "
                               "function, which records its max_tokens");
    std::optional<int64_t> chunk = layer.getEpChunkTokens();
    int64_t bound = chunk.value_or(*step);
    std::optional<int64_t> recorded = getMaxTokens(func);
    auto recordedStep = func->getAttrOfType<IntegerAttr>(kEPStepTokensAttr);
    if (recorded && (*recorded != bound ||
                     static_cast<bool>(recordedStep) != chunk.has_value() ||
                     (recordedStep && recordedStep.getInt() != *step))) {
      InFlightDiagnostic diag = layer.emitOpError()
                                << "has max_tokens = " << *step;
      if (chunk)
        diag << " and ep_chunk_tokens = " << *chunk;
      diag << " but its function's " << kMaxTokensAttr << " is " << *recorded;
      if (recordedStep)
        diag << " and " << kEPStepTokensAttr << " is " << recordedStep.getInt();
      diag << " (the layers of one function share one bound"
           << (chunk || recordedStep ? " and chunk)" : ")");
      return diag;
    }
    func->setAttr(kMaxTokensAttr, rewriter.getI64IntegerAttr(bound));
    if (chunk)
      func->setAttr(kEPStepTokensAttr, rewriter.getI64IntegerAttr(*step));
  }

  Location loc = layer.getLoc();
  RoutingAttr routing = layer.getRouting();
  int64_t tokens = xType.getDimSize(0), hidden = xType.getDimSize(1);
  int64_t topK = routing.getTopK();
  int64_t pairs = mulOrDynamic(tokens, topK);
  Type elementType = xType.getElementType();
  Builder &b = rewriter;
  auto f32Pairs = RankedTensorType::get({tokens, topK}, b.getF32Type());
  auto i32Pairs = RankedTensorType::get({tokens, topK}, b.getI32Type());
  auto logitsType = layer.getRouterLogits().getType();

  rewriter.setInsertionPoint(layer);
  auto router = RouterOp::create(rewriter, loc, f32Pairs, i32Pairs, logitsType,
                                 layer.getX(), layer.getRouterWeight(),
                                 layer.getRouterBias(), routing);
  auto dispatch = DispatchOp::create(
      rewriter, loc, RankedTensorType::get({pairs}, b.getI32Type()),
      RankedTensorType::get({numExperts + 1}, b.getI32Type()), i32Pairs,
      router.getExperts(), b.getI64IntegerAttr(numExperts),
      layer.getCapacityFactorAttr());
  auto expertY = RankedTensorType::get({pairs, hidden}, elementType);
  Value y;
  if (std::optional<int64_t> epSize = layer.getEpSize()) {
    // Expert-parallel: the rows go to the ranks of their experts, the local
    // experts run on the rows received, and the results come back to the
    // positions they were sent from.
    int64_t capacity = *layer.getEpCapacity();
    int64_t slots = *epSize * capacity;
    int64_t localExperts = numExperts / *epSize;
    auto rowsType = RankedTensorType::get({slots, hidden}, elementType);
    EPOverflow overflow = layer.getEpOverflow().value_or(EPOverflow::error);
    auto epDispatch = EPDispatchOp::create(
        rewriter, loc, rowsType,
        RankedTensorType::get({*epSize, localExperts}, b.getI32Type()),
        RankedTensorType::get({*epSize}, b.getI32Type()), layer.getX(),
        dispatch.getOffsets(), dispatch.getTokenIds(), overflow,
        static_cast<uint64_t>(*epSize), static_cast<uint64_t>(capacity));
    auto queues = EPQueuesOp::create(
        rewriter, loc, RankedTensorType::get({slots}, b.getI32Type()),
        RankedTensorType::get({localExperts + 1}, b.getI32Type()),
        epDispatch.getReceivedCounts(), static_cast<uint64_t>(capacity));
    auto experts = ExpertFFNOp::create(
        rewriter, loc, rowsType,
        RankedTensorType::get({slots, gateUpType.getDimSize(2)}, elementType),
        epDispatch.getReceived(), queues.getTokenIds(), queues.getOffsets(),
        layer.getWGateUp(), layer.getWDown(), layer.getBGateUp(),
        layer.getBDown(), layer.getActivationAttr());
    Value returned = ScatterRowsOp::create(
        rewriter, loc, rowsType, experts.getY(), queues.getTokenIds());
    y = EPCombineOp::create(rewriter, loc, expertY, returned,
                            dispatch.getOffsets(), /*rows_of=*/Value(),
                            static_cast<uint64_t>(*epSize),
                            static_cast<uint64_t>(capacity));
  } else {
    auto expertH =
        RankedTensorType::get({pairs, gateUpType.getDimSize(2)}, elementType);
    y = ExpertFFNOp::create(rewriter, loc, expertY, expertH, layer.getX(),
                            dispatch.getTokenIds(), dispatch.getOffsets(),
                            layer.getWGateUp(), layer.getWDown(),
                            layer.getBGateUp(), layer.getBDown(),
                            layer.getActivationAttr())
            .getY();
  }
  Value out = CombineOp::create(rewriter, loc, layer.getOut().getType(), y,
                                router.getWeights(), dispatch.getRows(),
                                /*accumulate=*/Value());
  if (TypedValue<RankedTensorType> sharedGateUp = layer.getSharedGateUp()) {
    auto sharedH = RankedTensorType::get(
        {tokens, sharedGateUp.getType().getDimSize(1)}, elementType);
    auto shared = SharedExpertOp::create(
        rewriter, loc, layer.getOut().getType(), sharedH, layer.getX(),
        sharedGateUp, layer.getSharedDown(), layer.getActivationAttr());
    out = arith::AddFOp::create(rewriter, loc, out, shared.getY());
  }
  rewriter.replaceOp(layer, {out, router.getLogits()});
  return success();
}

namespace {

struct MoEDecomposePass
    : public mlir::moe::impl::MoEDecomposeBase<MoEDecomposePass> {
  void runOnOperation() override {
    SmallVector<LayerOp> layers;
    getOperation()->walk([&](LayerOp layer) { layers.push_back(layer); });
    IRRewriter rewriter(&getContext());
    bool failedAny = false;
    for (LayerOp layer : layers)
      failedAny |= failed(decomposeLayer(rewriter, layer));
    if (failedAny)
      signalPassFailure();
  }
};

} // namespace
