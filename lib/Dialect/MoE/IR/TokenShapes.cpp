//===- TokenShapes.cpp - how tensor sizes follow the token count ----------===//

#include "moe/Dialect/MoE/IR/TokenShapes.h"

#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/IR/MoETypes.h"
#include "moe/Support/ByteSize.h"

#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::moe;

namespace {

/// How a value's leading dimension follows T: not at all, T, or the
/// expert-ordered rows T * k.
enum class Follows { Nothing, Tokens, Rows };

RankedTensorType tensorTypeOf(Value value) {
  Type type = value.getType();
  if (auto host = dyn_cast<HostTensorType>(type))
    return host.getDeviceType();
  return dyn_cast<RankedTensorType>(type);
}

/// The static size of dimension 1 of `value`: k of a [T, k] routing pair.
std::optional<int64_t> pairWidth(Value value) {
  RankedTensorType type = tensorTypeOf(value);
  if (!type || type.getRank() != 2 || type.isDynamicDim(1))
    return std::nullopt;
  return type.getDimSize(1);
}

/// k of the function around `op`: the one width of its routing pairs, or
/// nullopt where there is none or more than one.
std::optional<int64_t> functionTopK(Operation *op) {
  Operation *func = isa<FunctionOpInterface>(op)
                        ? op
                        : op->getParentOfType<FunctionOpInterface>();
  if (!func)
    return std::nullopt;
  std::optional<int64_t> topK;
  bool ambiguous = false;
  auto see = [&](std::optional<int64_t> k) {
    if (!k)
      return;
    if (topK && *topK != *k)
      ambiguous = true;
    topK = k;
  };
  func->walk([&](Operation *inner) {
    TypeSwitch<Operation *>(inner)
        .Case([&](RouterOp router) { see(pairWidth(router.getExperts())); })
        .Case([&](DispatchOp dispatch) { see(pairWidth(dispatch.getRows())); })
        .Case([&](CombineOp combine) { see(pairWidth(combine.getRows())); })
        .Case([&](RouterGradOp grad) { see(pairWidth(grad.getExperts())); })
        .Case([&](ExpertCombineGradOp grad) { see(pairWidth(grad.getRows())); })
        .Case([&](CombineGradOp grad) { see(pairWidth(grad.getRows())); })
        .Case<EPCombineOp, EPUnpackOp>([&](auto combine) {
          if (Value rowsOf = combine.getRowsOf())
            see(pairWidth(rowsOf));
        });
  });
  if (ambiguous)
    return std::nullopt;
  return topK;
}

struct Relation {
  Follows follows = Follows::Nothing;
  std::optional<int64_t> topK; // of Rows, where known
};

Relation relationOf(Value value, unsigned depth);
std::optional<Relation> usesRelation(Value value, unsigned depth);

/// What the values of row indices point at, from the op that made them: the
/// tokens for the token ids of moe.dispatch, the received rows ([S * C],
/// fixed) for those of moe.ep_queues; nullopt where it cannot be told.
std::optional<Follows> indexSpace(Value indices, unsigned depth) {
  if (depth > 16)
    return std::nullopt;
  if (auto argument = dyn_cast<BlockArgument>(indices)) {
    auto checkpoint =
        dyn_cast_or_null<CheckpointOp>(argument.getOwner()->getParentOp());
    if (!checkpoint)
      return std::nullopt;
    return indexSpace(checkpoint.getInputs()[argument.getArgNumber()],
                      depth + 1);
  }
  Operation *op = indices.getDefiningOp();
  if (auto dispatch = dyn_cast<DispatchOp>(op))
    return indices == dispatch.getTokenIds()
               ? std::optional<Follows>(Follows::Tokens)
               : std::nullopt;
  if (auto queues = dyn_cast<EPQueuesOp>(op))
    return indices == queues.getTokenIds()
               ? std::optional<Follows>(Follows::Nothing)
               : std::nullopt;
  if (auto prefetch = dyn_cast<PrefetchOp>(op))
    return indexSpace(prefetch.getHost(), depth + 1);
  if (auto offload = dyn_cast<OffloadOp>(op))
    return indexSpace(offload.getSource(), depth + 1);
  if (auto checkpoint = dyn_cast<CheckpointOp>(op)) {
    auto yield = cast<YieldOp>(checkpoint.getBody().front().getTerminator());
    return indexSpace(
        yield.getValues()[cast<OpResult>(indices).getResultNumber()],
        depth + 1);
  }
  return std::nullopt;
}

/// k of the rows that `offsets` divide among the experts: the [T, k] pairs
/// of the moe.dispatch that made them.
std::optional<int64_t> offsetsTopK(Value offsets) {
  if (auto dispatch = offsets.getDefiningOp<DispatchOp>())
    return pairWidth(dispatch.getExperts());
  return std::nullopt;
}

/// What operand `use` of a moe op is: Rows for the expert-ordered ones (and
/// k where the op shows it), Tokens for [T, ...] ones, Nothing for weights,
/// offsets and the [S * C] rows of expert parallelism; nullopt for an op
/// whose operands this does not know.
std::optional<std::pair<Follows, std::optional<int64_t>>>
operandFollows(OpOperand &use, unsigned depth) {
  Operation *op = use.getOwner();
  Value operand = use.get();
  using Result = std::optional<std::pair<Follows, std::optional<int64_t>>>;
  auto rows = [](std::optional<int64_t> k) -> Result {
    return std::make_pair(Follows::Rows, k);
  };
  auto tokens = []() -> Result {
    return std::make_pair(Follows::Tokens, std::nullopt);
  };
  auto nothing = []() -> Result {
    return std::make_pair(Follows::Nothing, std::nullopt);
  };
  auto known = [](std::optional<Relation> relation) -> Result {
    if (!relation)
      return std::nullopt;
    return std::make_pair(relation->follows, relation->topK);
  };
  return TypeSwitch<Operation *, Result>(op)
      .Case<LayerOp, RouterOp>([&](auto layer) -> Result {
        return operand == layer.getX() ? tokens() : nothing();
      })
      .Case([&](DispatchOp) -> Result { return tokens(); })
      .Case<ExpertFFNOp, ExpertFFNGradOp>([&](auto ffn) -> Result {
        // The experts of a rank on the rows it received: all [S * C].
        if (indexSpace(ffn.getTokenIds(), depth) == Follows::Nothing)
          return nothing();
        if (operand == ffn.getTokenIds())
          return rows(std::nullopt);
        if (operand == ffn.getX())
          return tokens();
        if constexpr (std::is_same_v<decltype(ffn), ExpertFFNGradOp>)
          if (operand == ffn.getH() || operand == ffn.getDy())
            return rows(std::nullopt);
        return nothing();
      })
      .Case([&](ExpertCombineGradOp grad) -> Result {
        if (operand == grad.getTokenIds() || operand == grad.getH())
          return rows(pairWidth(grad.getRows()));
        if (operand == grad.getOffsets() || operand == grad.getWGateUp() ||
            operand == grad.getWDown())
          return nothing();
        return tokens();
      })
      .Case<SharedExpertOp, SharedExpertGradOp>([&](auto shared) -> Result {
        return operand == shared.getWGateUp() || operand == shared.getWDown()
                   ? nothing()
                   : tokens();
      })
      .Case([&](CombineOp combine) -> Result {
        return operand == combine.getY() ? rows(pairWidth(combine.getRows()))
                                         : tokens();
      })
      .Case([&](CombineGradOp grad) -> Result {
        return operand == grad.getY() ? rows(pairWidth(grad.getRows()))
                                      : tokens();
      })
      .Case([&](RouterGradOp grad) -> Result {
        return operand == grad.getRouterWeight() ? nothing() : tokens();
      })
      .Case<AuxLossOp, AuxLossGradOp>([&](Operation *) -> Result {
        return operand.getType() == op->getOperand(0).getType() ||
                       operand.getType() == op->getOperand(1).getType()
                   ? tokens()
                   : nothing();
      })
      // Rows in expert order, or x [T, d] gathered by their token ids; the
      // [S * C] rows and the offsets are fixed.
      .Case<EPDispatchOp, EPPackOp>([&](auto send) -> Result {
        if (operand == send.getSource())
          return send.getTokenIds() ? tokens()
                                    : rows(offsetsTopK(send.getOffsets()));
        if (operand == send.getTokenIds())
          return rows(offsetsTopK(send.getOffsets()));
        return nothing();
      })
      .Case<EPCombineOp, EPUnpackOp>([&](auto combine) -> Result {
        return operand == combine.getRowsOf() ? tokens() : nothing();
      })
      .Case([&](EPQueuesOp) -> Result { return nothing(); })
      // source [N, d] is what the indices point at; indices [M] has the rows
      // of the result.
      .Case([&](GatherRowsOp gather) -> Result {
        if (operand == gather.getIndices())
          return known(usesRelation(gather.getResult(), depth + 1));
        if (std::optional<Follows> space =
                indexSpace(gather.getIndices(), depth + 1))
          return std::make_pair(*space, std::nullopt);
        return std::nullopt;
      })
      // source [M, d] and indices [M]: what the other one is, where an op
      // made it.
      .Case([&](ScatterRowsOp scatter) -> Result {
        Value other = operand == scatter.getSource() ? scatter.getIndices()
                                                     : scatter.getSource();
        if (isa<BlockArgument>(other))
          return std::nullopt;
        Relation relation = relationOf(other, depth + 1);
        return std::make_pair(relation.follows, relation.topK);
      })
      .Default([](Operation *) -> Result { return std::nullopt; });
}

/// What the uses of `value` say: the first moe op that reads it, through
/// checkpoints, offloads and prefetches; nullopt where none does.
std::optional<Relation> usesRelation(Value value, unsigned depth) {
  if (depth > 16)
    return std::nullopt;
  for (OpOperand &use : value.getUses()) {
    Operation *user = use.getOwner();
    std::optional<Relation> relation;
    if (auto checkpoint = dyn_cast<CheckpointOp>(user))
      relation = usesRelation(
          checkpoint.getBody().getArgument(use.getOperandNumber()), depth + 1);
    else if (isa<OffloadOp, PrefetchOp>(user))
      relation = usesRelation(user->getResult(0), depth + 1);
    else if (auto known = operandFollows(use, depth))
      relation = Relation{known->first, known->second};
    if (relation)
      return relation;
  }
  return std::nullopt;
}

/// A block argument: the checkpoint operand it stands for, or what its uses
/// say.
Relation argumentRelation(BlockArgument argument, unsigned depth) {
  Operation *parent = argument.getOwner()->getParentOp();
  if (auto checkpoint = dyn_cast_or_null<CheckpointOp>(parent))
    return relationOf(checkpoint.getInputs()[argument.getArgNumber()], depth);
  if (std::optional<Relation> relation = usesRelation(argument, depth))
    return *relation;
  // Read by no moe op: a result gradient [T, ...] (of y or the logits) or a
  // weight, told apart by whether its leading dimension is dynamic.
  RankedTensorType type = tensorTypeOf(argument);
  if (type && type.getRank() >= 1 && type.isDynamicDim(0))
    return {Follows::Tokens, std::nullopt};
  return {};
}

Relation relationOf(Value value, unsigned depth) {
  if (depth > 16 || !tensorTypeOf(value))
    return {};
  if (auto argument = dyn_cast<BlockArgument>(value))
    return argumentRelation(argument, depth + 1);
  auto result = cast<OpResult>(value);
  Operation *op = result.getOwner();
  auto tokens = [] { return Relation{Follows::Tokens, std::nullopt}; };
  auto nothing = [] { return Relation{}; };
  return TypeSwitch<Operation *, Relation>(op)
      .Case<LayerOp, RouterOp>([&](Operation *) { return tokens(); })
      .Case([&](DispatchOp dispatch) {
        if (value == dispatch.getTokenIds())
          return Relation{Follows::Rows, pairWidth(dispatch.getExperts())};
        return value == dispatch.getRows() ? tokens() : nothing();
      })
      .Case([&](ExpertFFNOp ffn) {
        return relationOf(ffn.getTokenIds(), depth + 1);
      })
      .Case<SharedExpertOp, CombineOp, AuxLossGradOp>(
          [&](Operation *) { return tokens(); })
      .Case<RouterGradOp, SharedExpertGradOp>([&](Operation *) {
        return result.getResultNumber() == 0 ? tokens() : nothing();
      })
      // dx has the rows of x: the tokens, or the [S * C] rows received.
      .Case([&](ExpertFFNGradOp grad) {
        return value == grad.getDx() &&
                       indexSpace(grad.getTokenIds(), depth + 1) !=
                           Follows::Nothing
                   ? tokens()
                   : nothing();
      })
      .Case([&](ExpertCombineGradOp grad) {
        return value == grad.getDx() || value == grad.getDWeights() ? tokens()
                                                                    : nothing();
      })
      .Case([&](CombineGradOp grad) {
        if (value == grad.getDy())
          return Relation{Follows::Rows, pairWidth(grad.getRows())};
        return tokens();
      })
      .Case([&](AuxLossOp) { return nothing(); })
      // Expert parallelism: the [S * C] rows of the ranks, the counts, the
      // dropped rows and the queues have fixed sizes; what comes home is in
      // expert order (T * k rows of the dispatch that made the offsets) or
      // summed per token.
      .Case<EPDispatchOp, EPPackOp, EPQueuesOp>(
          [&](Operation *) { return nothing(); })
      .Case<EPCombineOp, EPUnpackOp>([&](auto combine) {
        if (combine.getRowsOf())
          return tokens();
        return Relation{Follows::Rows, offsetsTopK(combine.getOffsets())};
      })
      .Case([&](GatherRowsOp gather) {
        return relationOf(gather.getIndices(), depth + 1);
      })
      // [N, d]: what the indices point at where the op that made them says;
      // else a static size is fixed and a dynamic one what its uses say.
      .Case([&](ScatterRowsOp scatter) {
        if (std::optional<Follows> space =
                indexSpace(scatter.getIndices(), depth + 1))
          return Relation{*space, std::nullopt};
        if (!tensorTypeOf(value).isDynamicDim(0))
          return nothing();
        return usesRelation(value, depth + 1).value_or(nothing());
      })
      .Case([&](OffloadOp offload) {
        return relationOf(offload.getSource(), depth + 1);
      })
      .Case([&](PrefetchOp prefetch) {
        return relationOf(prefetch.getHost(), depth + 1);
      })
      .Case([&](CheckpointOp checkpoint) {
        auto yield =
            cast<YieldOp>(checkpoint.getBody().front().getTerminator());
        return relationOf(yield.getValues()[result.getResultNumber()],
                          depth + 1);
      })
      // Sizes from a tensor.dim: the tensor it measures.
      .Case<tensor::SplatOp, tensor::EmptyOp>([&](Operation *) {
        for (Value size : op->getOperands())
          if (auto dim = size.getDefiningOp<tensor::DimOp>())
            return relationOf(dim.getSource(), depth + 1);
        return nothing();
      })
      // Anything else (an add of two partial gradients): its operand of the
      // same type.
      .Default([&](Operation *) {
        for (Value operand : op->getOperands())
          if (operand.getType() == value.getType())
            return relationOf(operand, depth + 1);
        return nothing();
      });
}

} // namespace

std::optional<int64_t> mlir::moe::getRowsPerToken(Value value) {
  Relation relation = relationOf(value, 0);
  switch (relation.follows) {
  case Follows::Nothing:
    return 0;
  case Follows::Tokens:
    return 1;
  case Follows::Rows:
    break;
  }
  if (relation.topK)
    return relation.topK;
  Operation *at = value.getDefiningOp();
  if (!at)
    at = cast<BlockArgument>(value).getOwner()->getParentOp();
  return at ? functionTopK(at) : std::nullopt;
}

std::optional<uint64_t> TokenBytes::at(uint64_t tokens) const {
  if (tokens != 0 && perToken > kMaxByteSize / tokens)
    return std::nullopt;
  return addByteSizes(perToken * tokens, fixed);
}

std::optional<RankedTensorType> mlir::moe::getTypeAtTokens(Value value,
                                                           int64_t tokens) {
  RankedTensorType type = tensorTypeOf(value);
  if (!type)
    return std::nullopt;
  if (type.hasStaticShape())
    return type;
  std::optional<int64_t> rows = getRowsPerToken(value);
  if (!rows)
    return std::nullopt;
  SmallVector<int64_t> shape(type.getShape());
  if (*rows > 0 && !shape.empty() && ShapedType::isDynamic(shape[0])) {
    if (tokens > INT64_MAX / *rows)
      return std::nullopt;
    shape[0] = *rows * tokens;
  }
  if (ShapedType::isDynamicShape(shape))
    return std::nullopt;
  return RankedTensorType::get(shape, type.getElementType(),
                               type.getEncoding());
}

std::optional<TokenBytes> mlir::moe::getTokenBytes(Value value) {
  RankedTensorType type = tensorTypeOf(value);
  if (!type)
    return std::nullopt;
  // A static type is its own size, whatever follows T.
  std::optional<int64_t> rows =
      type.hasStaticShape() ? 0 : getRowsPerToken(value);
  if (!rows)
    return std::nullopt;
  bool follows = *rows > 0 && type.getRank() >= 1 && type.isDynamicDim(0);
  // The bytes of one token's rows: the type with `rows` leading rows.
  SmallVector<int64_t> shape(type.getShape());
  if (follows)
    shape[0] = *rows;
  ByteSizeStatus status;
  uint64_t bytes =
      getByteSize(RankedTensorType::get(shape, type.getElementType()), status);
  if (status != ByteSizeStatus::Known)
    return std::nullopt;
  return follows ? TokenBytes{bytes, 0} : TokenBytes{0, bytes};
}
