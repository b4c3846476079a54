//===- MoEToLinalg.cpp - moe to linalg/tensor/scf (CPU path) -*- C++ -*-===//
//
// Each moe op becomes a func.call of a reference kernel from the embedded
// library MoECPULibrary.mlir (docs/cpu-path.md). The kernels the module calls
// are copied into it as private functions.
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/MoEToLinalg/MoEToLinalg.h"
#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/IR/MoETypes.h"
#include "moe/Dialect/MoE/Transforms/Checkpoint.h"
#include "moe/Dialect/MoE/Transforms/Decompose.h"
#include "moe/Dialect/MoE/Transforms/NestedModules.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/Extensions/InlinerExtension.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Func/Transforms/FuncConversions.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/SCF/Transforms/Patterns.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Transforms/DialectConversion.h"
#include "llvm/ADT/TypeSwitch.h"

#include <algorithm>
#include <cmath>

namespace mlir::moe {
#define GEN_PASS_DEF_CONVERTMOETOLINALG
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

/// The text of MoECPULibrary.mlir, embedded at build time.
constexpr llvm::StringLiteral kCPULibrary =
#include "MoECPULibrary.inc"
    ;

constexpr llvm::StringLiteral kKernelPrefix = "__moe_cpu_";

bool isNarrowFloat(Type type) { return isa<BFloat16Type, Float16Type>(type); }

/// The type a kernel takes or returns for `type`: the same rank with every
/// size dynamic, f32 in place of bf16/f16.
RankedTensorType getKernelType(Type type) {
  auto tensorType = cast<RankedTensorType>(type);
  Type elementType = tensorType.getElementType();
  if (isNarrowFloat(elementType))
    elementType = Float32Type::get(type.getContext());
  SmallVector<int64_t> shape(tensorType.getRank(), ShapedType::kDynamic);
  return RankedTensorType::get(shape, elementType);
}

/// Builds the operands of a kernel call and the call itself.
class KernelCallBuilder {
public:
  KernelCallBuilder(ConversionPatternRewriter &rewriter, Location loc)
      : rewriter(rewriter), loc(loc) {}

  /// `value` in kernel form: extended to f32, sizes cast to dynamic.
  Value operand(Value value) {
    auto type = cast<RankedTensorType>(value.getType());
    if (isNarrowFloat(type.getElementType()))
      value = arith::ExtFOp::create(rewriter, loc,
                                    type.clone(rewriter.getF32Type()), value);
    RankedTensorType kernelType = getKernelType(type);
    if (value.getType() != kernelType)
      value = tensor::CastOp::create(rewriter, loc, kernelType, value);
    return value;
  }

  Value i1(bool value) {
    return arith::ConstantIntOp::create(rewriter, loc, rewriter.getI1Type(),
                                        value);
  }
  Value i32(int64_t value) {
    return arith::ConstantIntOp::create(rewriter, loc, rewriter.getI32Type(),
                                        value);
  }
  Value index(int64_t value) {
    return arith::ConstantIndexOp::create(rewriter, loc, value);
  }
  Value f32(double value) {
    return arith::ConstantFloatOp::create(rewriter, loc, rewriter.getF32Type(),
                                          APFloat(static_cast<float>(value)));
  }
  Value dim(Value tensor, int64_t dim) {
    return tensor::DimOp::create(rewriter, loc, tensor, dim);
  }

  /// A zero f32 tensor with the given (dynamic) sizes.
  Value zeros(ArrayRef<Value> sizes) {
    SmallVector<int64_t> shape(sizes.size(), ShapedType::kDynamic);
    Value empty = tensor::EmptyOp::create(rewriter, loc, shape,
                                          rewriter.getF32Type(), sizes);
    Value zero = f32(0.0);
    return linalg::FillOp::create(rewriter, loc, zero, empty).getResult(0);
  }

  /// Replaces `op` with a call of `kernel` on `operands` (in kernel form) and
  /// converts the kernel's results back to the types of `op`'s results. With
  /// `accumulate` (the op's operand of that name, converted), result 0 is
  /// then added to it by a tensor arith.addf, as the add that moe-fold-adds
  /// folded into the op: the op followed by the add. `unused` are the types
  /// of trailing kernel results the op does not have (dropped).
  void replaceWithCall(Operation *op, StringRef kernel, ValueRange operands,
                       Value accumulate = nullptr, ArrayRef<Type> unused = {}) {
    SmallVector<Type> kernelTypes =
        llvm::map_to_vector(op->getResultTypes(), [](Type type) -> Type {
          return getKernelType(type);
        });
    llvm::append_range(kernelTypes, unused);
    auto call =
        func::CallOp::create(rewriter, loc, kernel, kernelTypes, operands);
    SmallVector<Value> results;
    for (auto [value, type] :
         llvm::zip_equal(call.getResults().take_front(op->getNumResults()),
                         op->getResultTypes())) {
      auto resultType = cast<RankedTensorType>(type);
      bool narrow = isNarrowFloat(resultType.getElementType());
      auto castType =
          narrow ? resultType.clone(rewriter.getF32Type()) : resultType;
      Value result = value;
      if (result.getType() != castType)
        result = tensor::CastOp::create(rewriter, loc, castType, result);
      if (narrow)
        result = arith::TruncFOp::create(rewriter, loc, resultType, result);
      results.push_back(result);
    }
    if (accumulate)
      results[0] = arith::AddFOp::create(rewriter, loc, results[0], accumulate);
    rewriter.replaceOp(op, results);
  }

  ConversionPatternRewriter &rewriter;
  Location loc;
};

int32_t scoringCode(ScoringFunc scoring) {
  return static_cast<int32_t>(scoring);
}
int32_t activationCode(Activation activation) {
  return static_cast<int32_t>(activation);
}

//===----------------------------------------------------------------------===//
// One lowering per op
//===----------------------------------------------------------------------===//

LogicalResult lower(RouterOp op, RouterOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  RoutingAttr routing = op.getRouting();
  Value x = b.operand(adaptor.getX());
  Value wr = b.operand(adaptor.getRouterWeight());
  Value bias = adaptor.getBias() ? b.operand(adaptor.getBias())
                                 : b.zeros({b.dim(wr, 1)});
  b.replaceWithCall(
      op, "__moe_cpu_router",
      {x, wr, bias, b.i32(scoringCode(routing.getScoring())),
       b.index(routing.getTopK()), b.i1(routing.getRenormalize()),
       b.index(routing.getNumGroups()), b.index(routing.getTopkGroups()),
       b.f32(routing.getScalingFactorValue()),
       b.i1(routing.getRoundLogits() &&
            cast<ShapedType>(op.getX().getType()).getElementType().isBF16())});
  return success();
}

LogicalResult lower(RouterGradOp op, RouterGradOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  RoutingAttr routing = op.getRouting();
  Value x = b.operand(adaptor.getX());
  Value wr = b.operand(adaptor.getRouterWeight());
  Value logits = b.operand(adaptor.getLogits());
  Value experts = b.operand(adaptor.getExperts());
  Value dWeights = b.operand(adaptor.getDWeights());
  Value dLogits = adaptor.getDLogits()
                      ? b.operand(adaptor.getDLogits())
                      : b.zeros({b.dim(logits, 0), b.dim(logits, 1)});
  b.replaceWithCall(op, "__moe_cpu_router_grad",
                    {x, wr, logits, experts, dWeights, dLogits,
                     b.i32(scoringCode(routing.getScoring())),
                     b.i1(routing.getRenormalize()),
                     b.f32(routing.getScalingFactorValue())},
                    adaptor.getAccumulate());
  return success();
}

/// The most (token, slot) pairs an expert keeps: ceil(capacity_factor * T * k
/// / E) in f64, as the NumPy reference computes it, or T * k without a
/// capacity factor (more than T * k never matters).
Value buildCapacity(DispatchOp op, Value experts, KernelCallBuilder &b) {
  auto type = cast<RankedTensorType>(op.getExperts().getType());
  int64_t numExperts = static_cast<int64_t>(op.getNumExperts());
  std::optional<APFloat> factor = op.getCapacityFactor();
  if (type.hasStaticShape()) {
    int64_t pairs = type.getDimSize(0) * type.getDimSize(1);
    if (!factor)
      return b.index(pairs);
    double capacity = std::ceil(factor->convertToDouble() *
                                static_cast<double>(type.getDimSize(0)) *
                                static_cast<double>(type.getDimSize(1)) /
                                static_cast<double>(numExperts));
    return b.index(
        static_cast<int64_t>(std::min(capacity, static_cast<double>(pairs))));
  }
  OpBuilder &rewriter = b.rewriter;
  Location loc = b.loc;
  Value tokens = b.dim(experts, 0), topK = b.dim(experts, 1);
  Value pairs = arith::MulIOp::create(rewriter, loc, tokens, topK);
  if (!factor)
    return pairs;
  auto toF64 = [&](Value index) -> Value {
    Value i64 =
        arith::IndexCastOp::create(rewriter, loc, rewriter.getI64Type(), index);
    return arith::SIToFPOp::create(rewriter, loc, rewriter.getF64Type(), i64);
  };
  Value cf = arith::ConstantFloatOp::create(rewriter, loc,
                                            rewriter.getF64Type(), *factor);
  Value e =
      arith::ConstantFloatOp::create(rewriter, loc, rewriter.getF64Type(),
                                     APFloat(static_cast<double>(numExperts)));
  Value product = arith::MulFOp::create(rewriter, loc, cf, toF64(tokens));
  product = arith::MulFOp::create(rewriter, loc, product, toF64(topK));
  Value quotient = arith::DivFOp::create(rewriter, loc, product, e);
  Value ceil = math::CeilOp::create(rewriter, loc, quotient);
  Value bounded = arith::MinimumFOp::create(rewriter, loc, ceil, toF64(pairs));
  Value capacity =
      arith::FPToSIOp::create(rewriter, loc, rewriter.getI64Type(), bounded);
  return arith::IndexCastOp::create(rewriter, loc, rewriter.getIndexType(),
                                    capacity);
}

LogicalResult lower(DispatchOp op, DispatchOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  Value experts = b.operand(adaptor.getExperts());
  Value capacity = buildCapacity(op, experts, b);
  b.replaceWithCall(
      op, "__moe_cpu_dispatch",
      {experts, b.index(static_cast<int64_t>(op.getNumExperts())), capacity});
  return success();
}

/// The expert biases in kernel form: b_gate_up [E, G] and b_down [E, d], or
/// zeros of those sizes for experts without biases.
std::pair<Value, Value> expertBiases(Value bGateUp, Value bDown, Value wGateUp,
                                     Value wDown, KernelCallBuilder &b) {
  if (bGateUp)
    return {b.operand(bGateUp), b.operand(bDown)};
  return {b.zeros({b.dim(wGateUp, 0), b.dim(wGateUp, 2)}),
          b.zeros({b.dim(wDown, 0), b.dim(wDown, 2)})};
}

/// The kernels' bias gradients, dropped for experts without biases.
SmallVector<Type> unusedBiasGrads(Value bGateUp, MLIRContext *context) {
  if (bGateUp)
    return {};
  auto type = RankedTensorType::get(
      {ShapedType::kDynamic, ShapedType::kDynamic}, Float32Type::get(context));
  return {type, type};
}

LogicalResult lower(ExpertFFNOp op, ExpertFFNOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  Value wGateUp = b.operand(adaptor.getWGateUp());
  Value wDown = b.operand(adaptor.getWDown());
  auto [bGateUp, bDown] =
      expertBiases(adaptor.getBGateUp(), adaptor.getBDown(), wGateUp, wDown, b);
  b.replaceWithCall(op, "__moe_cpu_expert_ffn",
                    {b.operand(adaptor.getX()),
                     b.operand(adaptor.getTokenIds()),
                     b.operand(adaptor.getOffsets()), wGateUp, wDown, bGateUp,
                     bDown, b.i32(activationCode(op.getActivation()))});
  return success();
}

LogicalResult lower(ExpertFFNGradOp op, ExpertFFNGradOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  b.replaceWithCall(
      op, "__moe_cpu_expert_ffn_grad",
      {b.operand(adaptor.getX()), b.operand(adaptor.getTokenIds()),
       b.operand(adaptor.getOffsets()), b.operand(adaptor.getWGateUp()),
       b.operand(adaptor.getWDown()), b.operand(adaptor.getH()),
       b.operand(adaptor.getDy()), b.i32(activationCode(op.getActivation()))},
      /*accumulate=*/nullptr,
      unusedBiasGrads(adaptor.getBGateUp(), op.getContext()));
  return success();
}

LogicalResult lower(ExpertCombineGradOp op,
                    ExpertCombineGradOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  Value wGateUp = b.operand(adaptor.getWGateUp());
  Value wDown = b.operand(adaptor.getWDown());
  // Only b_down reaches the kernel (the routing-weight gradient); h holds
  // b_gate_up already.
  Value bDown = adaptor.getBDown()
                    ? b.operand(adaptor.getBDown())
                    : b.zeros({b.dim(wDown, 0), b.dim(wDown, 2)});
  b.replaceWithCall(
      op, "__moe_cpu_expert_combine_grad",
      {b.operand(adaptor.getX()), b.operand(adaptor.getTokenIds()),
       b.operand(adaptor.getOffsets()), b.operand(adaptor.getRows()),
       b.operand(adaptor.getWeights()), wGateUp, wDown,
       b.operand(adaptor.getH()), b.operand(adaptor.getDout()), bDown,
       b.i32(activationCode(op.getActivation()))},
      adaptor.getAccumulate(),
      unusedBiasGrads(adaptor.getBGateUp(), op.getContext()));
  return success();
}

LogicalResult lower(SharedExpertOp op, SharedExpertOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  b.replaceWithCall(op, "__moe_cpu_shared_expert",
                    {b.operand(adaptor.getX()), b.operand(adaptor.getWGateUp()),
                     b.operand(adaptor.getWDown()),
                     b.i32(activationCode(op.getActivation()))});
  return success();
}

LogicalResult lower(SharedExpertGradOp op, SharedExpertGradOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  b.replaceWithCall(op, "__moe_cpu_shared_expert_grad",
                    {b.operand(adaptor.getX()), b.operand(adaptor.getWGateUp()),
                     b.operand(adaptor.getWDown()), b.operand(adaptor.getH()),
                     b.operand(adaptor.getDy()),
                     b.i32(activationCode(op.getActivation()))});
  return success();
}

LogicalResult lower(CombineOp op, CombineOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  b.replaceWithCall(op, "__moe_cpu_combine",
                    {b.operand(adaptor.getY()), b.operand(adaptor.getWeights()),
                     b.operand(adaptor.getRows())},
                    adaptor.getAccumulate());
  return success();
}

LogicalResult lower(CombineGradOp op, CombineGradOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  b.replaceWithCall(op, "__moe_cpu_combine_grad",
                    {b.operand(adaptor.getDout()),
                     b.operand(adaptor.getWeights()),
                     b.operand(adaptor.getRows()), b.operand(adaptor.getY())});
  return success();
}

LogicalResult lower(AuxLossOp op, AuxLossOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  b.replaceWithCall(op, "__moe_cpu_aux_loss",
                    {b.operand(adaptor.getLogits()),
                     b.operand(adaptor.getExperts()),
                     b.i32(scoringCode(op.getScoring()))});
  return success();
}

LogicalResult lower(AuxLossGradOp op, AuxLossGradOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  b.replaceWithCall(
      op, "__moe_cpu_aux_loss_grad",
      {b.operand(adaptor.getLogits()), b.operand(adaptor.getExperts()),
       b.operand(adaptor.getDLoadBalance()), b.operand(adaptor.getDZLoss()),
       b.i32(scoringCode(op.getScoring()))});
  return success();
}

LogicalResult lower(UpdateSelectionBiasOp op,
                    UpdateSelectionBiasOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  b.replaceWithCall(op, "__moe_cpu_update_selection_bias",
                    {b.operand(adaptor.getBias()),
                     b.operand(adaptor.getExperts()),
                     b.f32(op.getRate().convertToDouble()),
                     b.i32(static_cast<int32_t>(op.getRule()))});
  return success();
}

//===----------------------------------------------------------------------===//
// Expert parallelism
//===----------------------------------------------------------------------===//

/// A collective is lowered only where its all-to-all is the identity.
LogicalResult checkLocal(Operation *op, uint64_t epSize) {
  if (epSize == 1)
    return success();
  return op->emitOpError()
         << "is a collective over " << static_cast<int64_t>(epSize)
         << " ranks: split the function with moe-ep-stages before lowering "
            "it to the CPU";
}

/// What the CPU path cannot lower, as an error at the op. The pass checks
/// every op first, so that a refusal is one error.
LogicalResult checkLowerable(Operation *op) {
  return TypeSwitch<Operation *, LogicalResult>(op)
      .Case([](EPDispatchOp ep) { return checkLocal(ep, ep.getEpSize()); })
      .Case([](EPCombineOp ep) { return checkLocal(ep, ep.getEpSize()); })
      .Case([](ScatterRowsOp scatter) -> LogicalResult {
        if (!scatter.getType().isDynamicDim(0))
          return success();
        return scatter.emitOpError(
            "has a result of dynamic row count that the CPU path cannot size "
            "(no operand gives it)");
      })
      .Default([](Operation *) { return success(); });
}

/// moe.ep_pack, and moe.ep_dispatch of one rank (its all-to-all is the
/// identity): the overflow rule is the caller's, from `dropped`.
template <typename OpT>
LogicalResult lowerEPSend(OpT op, typename OpT::Adaptor adaptor,
                          KernelCallBuilder &b) {
  if (failed(checkLowerable(op)))
    return failure();
  Value source = b.operand(adaptor.getSource());
  Value offsets = b.operand(adaptor.getOffsets());
  Value ranks = b.index(static_cast<int64_t>(op.getEpSize()));
  Value capacity = b.index(static_cast<int64_t>(op.getCapacity()));
  if (Value tokenIds = adaptor.getTokenIds())
    b.replaceWithCall(op, "__moe_cpu_ep_pack_gather",
                      {source, offsets, b.operand(tokenIds), ranks, capacity});
  else
    b.replaceWithCall(op, "__moe_cpu_ep_pack",
                      {source, offsets, ranks, capacity});
  return success();
}

/// moe.ep_unpack, and moe.ep_combine of one rank; `blocks` is the converted
/// operand of rows to place.
template <typename OpT>
LogicalResult lowerEPReturn(OpT op, typename OpT::Adaptor adaptor, Value blocks,
                            KernelCallBuilder &b) {
  if (failed(checkLowerable(op)))
    return failure();
  Value source = b.operand(blocks);
  Value offsets = b.operand(adaptor.getOffsets());
  Value ranks = b.index(static_cast<int64_t>(op.getEpSize()));
  Value capacity = b.index(static_cast<int64_t>(op.getCapacity()));
  if (Value rowsOf = adaptor.getRowsOf()) {
    b.replaceWithCall(op, "__moe_cpu_ep_unpack_reduce",
                      {source, offsets, b.operand(rowsOf), ranks, capacity});
    return success();
  }
  // R rows: the result type's, or offsets[E] (T * k after a dropless
  // dispatch), never below zero.
  Value rows;
  if (op.getType().isDynamicDim(0)) {
    OpBuilder &builder = b.rewriter;
    Location loc = op.getLoc();
    Value last =
        arith::SubIOp::create(builder, loc, b.dim(offsets, 0), b.index(1));
    Value end = tensor::ExtractOp::create(builder, loc, offsets, last);
    rows = arith::MaxSIOp::create(
        builder, loc,
        arith::IndexCastOp::create(builder, loc, builder.getIndexType(), end),
        b.index(0));
  } else {
    rows = b.index(op.getType().getDimSize(0));
  }
  b.replaceWithCall(op, "__moe_cpu_ep_unpack",
                    {source, offsets, rows, ranks, capacity});
  return success();
}

LogicalResult lower(EPDispatchOp op, EPDispatchOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  return lowerEPSend(op, adaptor, b);
}

LogicalResult lower(EPPackOp op, EPPackOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  return lowerEPSend(op, adaptor, b);
}

LogicalResult lower(EPCombineOp op, EPCombineOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  return lowerEPReturn(op, adaptor, adaptor.getRows(), b);
}

LogicalResult lower(EPUnpackOp op, EPUnpackOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  return lowerEPReturn(op, adaptor, adaptor.getReturned(), b);
}

LogicalResult lower(EPQueuesOp op, EPQueuesOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  b.replaceWithCall(op, "__moe_cpu_ep_queues",
                    {b.operand(adaptor.getReceivedCounts()),
                     b.index(static_cast<int64_t>(op.getCapacity()))});
  return success();
}

LogicalResult lower(GatherRowsOp op, GatherRowsOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  b.replaceWithCall(
      op, "__moe_cpu_gather_rows",
      {b.operand(adaptor.getSource()), b.operand(adaptor.getIndices())});
  return success();
}

LogicalResult lower(ScatterRowsOp op, ScatterRowsOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  if (failed(checkLowerable(op)))
    return failure();
  b.replaceWithCall(op, "__moe_cpu_scatter_rows",
                    {b.operand(adaptor.getSource()),
                     b.operand(adaptor.getIndices()),
                     b.index(op.getType().getDimSize(0))});
  return success();
}

/// A copy of `source` with type `resultType` (the same shape, possibly with
/// more static sizes).
Value copyTensor(KernelCallBuilder &b, Value source, Type resultType) {
  auto type = cast<RankedTensorType>(source.getType());
  SmallVector<Value> dynamicSizes;
  for (int64_t i = 0, e = type.getRank(); i < e; ++i)
    if (type.isDynamicDim(i))
      dynamicSizes.push_back(b.dim(source, i));
  Value empty = tensor::EmptyOp::create(b.rewriter, b.loc, type.getShape(),
                                        type.getElementType(), dynamicSizes);
  Value copy =
      linalg::CopyOp::create(b.rewriter, b.loc, source, empty).getResult(0);
  if (copy.getType() != resultType)
    copy = tensor::CastOp::create(b.rewriter, b.loc, resultType, copy);
  return copy;
}

LogicalResult lower(OffloadOp op, OffloadOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  b.rewriter.replaceOp(op, copyTensor(b, adaptor.getSource(),
                                      op.getHost().getType().getDeviceType()));
  return success();
}

LogicalResult lower(PrefetchOp op, PrefetchOp::Adaptor adaptor,
                    KernelCallBuilder &b) {
  b.rewriter.replaceOp(op, copyTensor(b, adaptor.getHost(), op.getType()));
  return success();
}

template <typename OpT>
struct LowerToKernel : public OpConversionPattern<OpT> {
  using OpConversionPattern<OpT>::OpConversionPattern;

  LogicalResult
  matchAndRewrite(OpT op, typename OpT::Adaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    KernelCallBuilder builder(rewriter, op.getLoc());
    return lower(op, adaptor, builder);
  }
};

//===----------------------------------------------------------------------===//
// Steps of the pass
//===----------------------------------------------------------------------===//

/// Runs moe-decompose on every moe.layer.
LogicalResult decomposeLayers(ModuleOp module) {
  SmallVector<LayerOp> layers;
  module.walk([&](LayerOp layer) { layers.push_back(layer); });
  IRRewriter rewriter(module.getContext());
  bool failedAny = false;
  for (LayerOp layer : layers)
    failedAny |= failed(decomposeLayer(rewriter, layer));
  return failure(failedAny);
}

/// Copies the kernels that `module` calls, and the helpers they call, from
/// the embedded library into `module` as private functions. Functions the
/// module already defines are left as they are, but must have the type the
/// calls expect.
LogicalResult addKernels(ModuleOp module) {
  SymbolTable symbols(module);
  WalkResult typesMatch = module.walk([&](func::CallOp call) {
    StringAttr callee = call.getCalleeAttr().getAttr();
    Operation *existing = symbols.lookup(callee);
    if (!existing || !callee.getValue().starts_with(kKernelPrefix))
      return WalkResult::advance();
    auto function = dyn_cast<func::FuncOp>(existing);
    if (!function)
      existing->emitError() << "@" << callee.getValue()
                            << " is not a function, but the CPU kernels call "
                               "it as one of type "
                            << call.getCalleeType();
    else if (function.getFunctionType() != call.getCalleeType())
      existing->emitError()
          << "@" << callee.getValue() << " has type "
          << function.getFunctionType()
          << ", but the CPU kernels call it with type " << call.getCalleeType();
    else
      return WalkResult::advance();
    return WalkResult::interrupt();
  });
  if (typesMatch.wasInterrupted())
    return failure();

  SmallVector<StringAttr> worklist;
  auto collectCallees = [&](Operation *root) {
    root->walk([&](func::CallOp call) {
      StringAttr callee = call.getCalleeAttr().getAttr();
      if (callee.getValue().starts_with(kKernelPrefix) &&
          !symbols.lookup(callee))
        worklist.push_back(callee);
    });
  };
  collectCallees(module);
  if (worklist.empty())
    return success();

  ParserConfig config(module.getContext());
  OwningOpRef<ModuleOp> library =
      parseSourceString<ModuleOp>(kCPULibrary, config, "MoECPULibrary.mlir");
  if (!library)
    return module.emitError("cannot parse the embedded CPU kernel library");
  SymbolTable librarySymbols(*library);
  while (!worklist.empty()) {
    StringAttr name = worklist.pop_back_val();
    if (symbols.lookup(name))
      continue;
    auto kernel = librarySymbols.lookup<func::FuncOp>(name);
    if (!kernel)
      return module.emitError("the CPU kernel library has no function '")
             << name.getValue() << "'";
    func::FuncOp copy = kernel.clone();
    copy.setPrivate();
    symbols.insert(copy);
    collectCallees(copy);
  }
  return success();
}

struct ConvertMoEToLinalgPass
    : public mlir::moe::impl::ConvertMoEToLinalgBase<ConvertMoEToLinalgPass> {
  /// The kernels are private functions that moe-lower-to-cpu-pipeline
  /// inlines, which needs the func dialect's inliner interface.
  void getDependentDialects(DialectRegistry &registry) const override {
    ConvertMoEToLinalgBase::getDependentDialects(registry);
    func::registerInlinerExtension(registry);
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (failed(checkNoMoEInNestedModules(module, "convert-moe-to-linalg")))
      return signalPassFailure();
    if (failed(decomposeLayers(module)))
      return signalPassFailure();
    inlineCheckpoints(module);
    bool refused = false;
    module.walk([&](Operation *op) { refused |= failed(checkLowerable(op)); });
    if (refused)
      return signalPassFailure();

    MLIRContext *context = &getContext();
    TypeConverter typeConverter;
    populateMoEToLinalgTypeConversions(typeConverter);
    RewritePatternSet patterns(context);
    ConversionTarget target(*context);
    populateMoEToLinalgConversionPatterns(typeConverter, patterns);
    target.addIllegalDialect<MoEDialect>();
    target.markUnknownOpDynamicallyLegal(
        [&](Operation *op) { return typeConverter.isLegal(op); });
    target.addDynamicallyLegalOp<func::FuncOp>([&](func::FuncOp op) {
      return typeConverter.isSignatureLegal(op.getFunctionType()) &&
             typeConverter.isLegal(&op.getBody());
    });
    scf::populateSCFStructuralTypeConversionsAndLegality(typeConverter,
                                                         patterns, target);
    if (failed(applyPartialConversion(module, target, std::move(patterns))))
      return signalPassFailure();
    if (failed(addKernels(module)))
      return signalPassFailure();
  }
};

} // namespace

void mlir::moe::populateMoEToLinalgTypeConversions(
    TypeConverter &typeConverter) {
  typeConverter.addConversion([](Type type) { return type; });
  typeConverter.addConversion(
      [](HostTensorType type) -> Type { return type.getDeviceType(); });
}

void mlir::moe::populateMoEToLinalgConversionPatterns(
    const TypeConverter &typeConverter, RewritePatternSet &patterns) {
  MLIRContext *context = patterns.getContext();
  patterns
      .add<LowerToKernel<RouterOp>, LowerToKernel<RouterGradOp>,
           LowerToKernel<DispatchOp>, LowerToKernel<ExpertFFNOp>,
           LowerToKernel<ExpertFFNGradOp>, LowerToKernel<ExpertCombineGradOp>,
           LowerToKernel<SharedExpertOp>, LowerToKernel<SharedExpertGradOp>,
           LowerToKernel<CombineOp>, LowerToKernel<CombineGradOp>,
           LowerToKernel<AuxLossOp>, LowerToKernel<AuxLossGradOp>,
           LowerToKernel<OffloadOp>, LowerToKernel<PrefetchOp>,
           LowerToKernel<EPDispatchOp>, LowerToKernel<EPCombineOp>,
           LowerToKernel<EPPackOp>, LowerToKernel<EPUnpackOp>,
           LowerToKernel<EPQueuesOp>, LowerToKernel<GatherRowsOp>,
           LowerToKernel<ScatterRowsOp>, LowerToKernel<UpdateSelectionBiasOp>>(
          typeConverter, context);
  populateFunctionOpInterfaceTypeConversionPattern<func::FuncOp>(patterns,
                                                                 typeConverter);
  populateCallOpTypeConversionPattern(patterns, typeConverter);
  populateReturnOpTypeConversionPattern(patterns, typeConverter);
}
