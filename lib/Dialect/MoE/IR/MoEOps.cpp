//===- MoEOps.cpp - MoE dialect operations ------------------*- C++ -*-===//
//
// Verifiers. Every shape rule of the op docs is checked here; a dynamic size
// matches anything, and the first static size seen for a quantity (T, d, n,
// E, k, ...) is what later operands are checked against.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/TypeUtilities.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/MathExtras.h"

#include <cmath>
#include <limits>

using namespace mlir;
using namespace mlir::moe;

namespace {

constexpr int64_t kDynamic = ShapedType::kDynamic;

/// Collects the sizes an op's operands imply and reports the first mismatch.
class ShapeVerifier {
public:
  explicit ShapeVerifier(Operation *op) : op(op) {}

  /// Unifies dimension `dim` of `value` with the quantity `size`, named
  /// `sizeName` in diagnostics.
  LogicalResult match(int64_t &size, StringRef sizeName, Value value,
                      StringRef valueName, unsigned dim) {
    int64_t actual = cast<ShapedType>(value.getType()).getDimSize(dim);
    return matchSize(size, sizeName, actual,
                     (valueName + " dimension " + Twine(dim)).str());
  }

  /// Unifies an already known `actual` size, described by `what`.
  LogicalResult matchSize(int64_t &size, StringRef sizeName, int64_t actual,
                          StringRef what) {
    if (ShapedType::isDynamic(actual))
      return success();
    if (ShapedType::isDynamic(size)) {
      size = actual;
      return success();
    }
    if (size == actual)
      return success();
    return op->emitOpError() << what << " is " << actual << ", expected "
                             << sizeName << " = " << size;
  }

  /// All `values` must share one element type.
  LogicalResult sameElementType(ArrayRef<std::pair<StringRef, Value>> values) {
    if (values.empty())
      return success();
    auto [firstName, first] = values.front();
    Type expected = getElementTypeOrSelf(first.getType());
    for (auto [name, value] : values.drop_front()) {
      Type actual = getElementTypeOrSelf(value.getType());
      if (actual != expected)
        return op->emitOpError()
               << "expected one element type for activations and weights, "
                  "but "
               << firstName << " has " << expected << " and " << name << " has "
               << actual;
    }
    return success();
  }

private:
  Operation *op;
};

/// a * b, or dynamic (unchecked) when either is dynamic or it overflows.
int64_t product(int64_t a, int64_t b) {
  int64_t result;
  if (ShapedType::isDynamic(a) || ShapedType::isDynamic(b) ||
      llvm::MulOverflow(a, b, result))
    return kDynamic;
  return result;
}

/// a + 1, or dynamic when a is dynamic or a + 1 overflows.
int64_t successor(int64_t a) {
  int64_t result;
  if (ShapedType::isDynamic(a) || llvm::AddOverflow(a, int64_t{1}, result))
    return kDynamic;
  return result;
}

/// Row, token and expert indices are i32.
constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();

/// The largest ep_size (the ops' attribute constraint).
constexpr int64_t kMaxEPSize = 65536;

/// Rules of a routing attribute that depend on the number of experts.
LogicalResult verifyRoutingForExperts(Operation *op, RoutingAttr routing,
                                      int64_t numExperts) {
  if (ShapedType::isDynamic(numExperts))
    return success();
  if (numExperts >= kMaxIndex)
    return op->emitOpError() << "the number of experts (" << numExperts
                             << ") exceeds the i32 expert index range";
  int64_t topK = routing.getTopK();
  if (topK > numExperts)
    return op->emitOpError()
           << "top_k (" << topK << ") exceeds the number of experts ("
           << numExperts << ")";
  int64_t numGroups = routing.getNumGroups();
  if (numExperts % numGroups != 0)
    return op->emitOpError()
           << "num_groups (" << numGroups
           << ") must divide the number of experts (" << numExperts << ")";
  int64_t candidates = routing.getTopkGroups() * (numExperts / numGroups);
  if (topK > candidates)
    return op->emitOpError() << "top_k (" << topK << ") exceeds the "
                             << candidates << " experts of the topk_groups ("
                             << routing.getTopkGroups() << ") best groups";
  return success();
}

/// The width of the first FFN weight: `2 * ffn` for gated activations.
/// `width` is the weight's last dimension; `ffn` is unified with its half.
LogicalResult matchGateUpWidth(Operation *op, ShapeVerifier &shapes,
                               Activation activation, int64_t width,
                               StringRef name, int64_t &ffn,
                               StringRef ffnName) {
  if (!isGated(activation))
    return shapes.matchSize(ffn, ffnName, width, (name + " width").str());
  if (ShapedType::isDynamic(width))
    return success();
  if (width % 2 != 0)
    return op->emitOpError()
           << name << " width is " << width << ", expected an even width (gate "
           << "and up halves of 2 * " << ffnName << ") for "
           << stringifyActivation(activation);
  return shapes.matchSize(ffn, ffnName, width / 2, (name + " width / 2").str());
}

int64_t dimOf(Value value, unsigned dim) {
  return cast<ShapedType>(value.getType()).getDimSize(dim);
}

/// k read from a shape (experts, rows, weights) must be at least 1.
LogicalResult verifyTopKDim(Operation *op, int64_t topK, StringRef from) {
  if (ShapedType::isDynamic(topK) || topK >= 1)
    return success();
  return op->emitOpError() << "k (dimension 1 of " << from
                           << ") must be at least 1, got " << topK;
}

/// Rows of expert-ordered tensors are (token, slot) pairs: a multiple of T.
LogicalResult verifyRowCount(Operation *op, int64_t rows, int64_t tokens) {
  if (ShapedType::isDynamic(rows) || ShapedType::isDynamic(tokens))
    return success();
  if ((tokens == 0 && rows != 0) || (tokens != 0 && rows % tokens != 0))
    return op->emitOpError()
           << "expert-ordered row count (" << rows
           << ") must be a multiple of the token count (" << tokens << ")";
  return success();
}

/// Operands of a routed expert FFN and its gradient:
/// x [T, d], token_ids [R], offsets [E + 1], w_gate_up [E, d, G],
/// w_down [E, n, d]; `rows` receives R.
struct ExpertSizes {
  int64_t tokens = kDynamic, hidden = kDynamic, ffn = kDynamic,
          experts = kDynamic, rows = kDynamic, gateUpWidth = kDynamic;
};

LogicalResult verifyExpertOperands(ShapeVerifier &shapes, Value x,
                                   Value tokenIds, Value offsets, Value wGateUp,
                                   Value wDown, ExpertSizes &sizes) {
  if (failed(shapes.match(sizes.tokens, "T", x, "x", 0)) ||
      failed(shapes.match(sizes.hidden, "d", x, "x", 1)) ||
      failed(shapes.match(sizes.rows, "R", tokenIds, "token_ids", 0)) ||
      failed(shapes.match(sizes.experts, "E", wGateUp, "w_gate_up", 0)) ||
      failed(shapes.match(sizes.hidden, "d", wGateUp, "w_gate_up", 1)) ||
      failed(shapes.match(sizes.experts, "E", wDown, "w_down", 0)) ||
      failed(shapes.match(sizes.ffn, "n", wDown, "w_down", 1)) ||
      failed(shapes.match(sizes.hidden, "d", wDown, "w_down", 2)))
    return failure();
  sizes.gateUpWidth = dimOf(wGateUp, 2);
  int64_t experts1 = successor(sizes.experts);
  return shapes.matchSize(experts1, "E + 1", dimOf(offsets, 0),
                          "offsets dimension 0");
}

/// The optional expert biases `b_gate_up [E, G]` and `b_down [E, d]`: both or
/// neither, of the weights' element type.
LogicalResult verifyExpertBiases(Operation *op, ShapeVerifier &shapes,
                                 int64_t &experts, StringRef expertsName,
                                 int64_t &gateUpWidth, int64_t &hidden,
                                 Value wGateUp, Value bGateUp, Value bDown) {
  if (static_cast<bool>(bGateUp) != static_cast<bool>(bDown))
    return op->emitOpError("expected both b_gate_up and b_down, or neither");
  if (!bGateUp)
    return success();
  if (failed(shapes.match(experts, expertsName, bGateUp, "b_gate_up", 0)) ||
      failed(shapes.match(gateUpWidth, "the w_gate_up width", bGateUp,
                          "b_gate_up", 1)) ||
      failed(shapes.match(experts, expertsName, bDown, "b_down", 0)) ||
      failed(shapes.match(hidden, "d", bDown, "b_down", 1)))
    return failure();
  return shapes.sameElementType(
      {{"w_gate_up", wGateUp}, {"b_gate_up", bGateUp}, {"b_down", bDown}});
}

/// Checks that need every operand's and result's sizes: the gate/up width
/// against n, and the row count against T.
LogicalResult verifyExpertSizes(Operation *op, ShapeVerifier &shapes,
                                Activation activation, ExpertSizes &sizes) {
  if (failed(matchGateUpWidth(op, shapes, activation, sizes.gateUpWidth,
                              "w_gate_up", sizes.ffn, "n")))
    return failure();
  return verifyRowCount(op, sizes.rows, sizes.tokens);
}

/// Operands of a shared expert: x [T, d], w_gate_up [d, G], w_down [m, d],
/// named `gateUpName` and `downName` in diagnostics. `width` receives G and
/// `ffn` receives m; check G against m once every value is matched.
LogicalResult verifySharedOperands(ShapeVerifier &shapes, Value x,
                                   Value wGateUp, StringRef gateUpName,
                                   Value wDown, StringRef downName,
                                   int64_t &tokens, int64_t &hidden,
                                   int64_t &width, int64_t &ffn) {
  if (failed(shapes.match(tokens, "T", x, "x", 0)) ||
      failed(shapes.match(hidden, "d", x, "x", 1)) ||
      failed(shapes.match(hidden, "d", wGateUp, gateUpName, 0)) ||
      failed(
          shapes.match(width, "the gate/up width", wGateUp, gateUpName, 1)) ||
      failed(shapes.match(ffn, "m", wDown, downName, 0)) ||
      failed(shapes.match(hidden, "d", wDown, downName, 1)))
    return failure();
  return success();
}

LogicalResult verifySameType(Operation *op, StringRef name, Value value,
                             StringRef expectedName, Value expected) {
  if (value.getType() == expected.getType())
    return success();
  return op->emitOpError() << "expected " << name << " to have the type of "
                           << expectedName << " (" << expected.getType()
                           << "), got " << value.getType();
}

} // namespace

//===----------------------------------------------------------------------===//
// LayerOp
//===----------------------------------------------------------------------===//

LogicalResult LayerOp::verify() {
  ShapeVerifier shapes(*this);
  int64_t tokens = kDynamic, hidden = kDynamic, experts = kDynamic,
          ffn = kDynamic;
  Activation activation = getActivation();
  if (failed(shapes.match(tokens, "T", getX(), "x", 0)) ||
      failed(shapes.match(hidden, "d", getX(), "x", 1)) ||
      failed(
          shapes.match(hidden, "d", getRouterWeight(), "router_weight", 0)) ||
      failed(shapes.match(experts, "E", getRouterWeight(), "router_weight", 1)))
    return failure();
  // Expert-parallel: the weights hold this rank's E / ep_size experts.
  std::optional<int64_t> epSize = getEpSize();
  if (epSize.has_value() != getEpCapacity().has_value())
    return emitOpError("expected both ep_size and ep_capacity, or neither");
  if (getEpOverflow() && !epSize)
    return emitOpError("has ep_overflow but no ep_size");
  if (epSize && getCapacityFactor())
    return emitOpError("is expert-parallel and has a capacity_factor; its "
                       "capacity is ep_capacity, the rows a rank sends to one "
                       "rank");
  // Without ep_size the weights' expert count is E itself, which the bias
  // and the logits are then checked against.
  int64_t epLocalExperts = kDynamic;
  int64_t &localExperts = epSize ? epLocalExperts : experts;
  // E / ep_size, once E is known: here, and again at the end for an E that
  // only the bias or the logits give.
  auto matchLocalExperts = [&]() -> LogicalResult {
    if (!epSize || ShapedType::isDynamic(experts))
      return success();
    if (experts % *epSize != 0)
      return emitOpError() << "ep_size (" << *epSize
                           << ") must divide the number of experts (" << experts
                           << ")";
    int64_t expected = experts / *epSize;
    if (failed(shapes.matchSize(expected, "E / ep_size", epLocalExperts,
                                ShapedType::isDynamic(dimOf(getWGateUp(), 0))
                                    ? "w_down dimension 0"
                                    : "w_gate_up dimension 0")))
      return failure();
    epLocalExperts = expected;
    return success();
  };
  if (failed(matchLocalExperts()))
    return failure();
  StringRef localName = epSize ? "E / ep_size" : "E";
  if (failed(shapes.match(localExperts, localName, getWGateUp(), "w_gate_up",
                          0)) ||
      failed(shapes.match(hidden, "d", getWGateUp(), "w_gate_up", 1)) ||
      failed(shapes.match(localExperts, localName, getWDown(), "w_down", 0)) ||
      failed(shapes.match(ffn, "n", getWDown(), "w_down", 1)) ||
      failed(shapes.match(hidden, "d", getWDown(), "w_down", 2)) ||
      failed(matchGateUpWidth(*this, shapes, activation, dimOf(getWGateUp(), 2),
                              "w_gate_up", ffn, "n")))
    return failure();
  if (Value bias = getRouterBias())
    if (failed(shapes.match(experts, "E", bias, "router_bias", 0)))
      return failure();
  int64_t gateUpWidth = dimOf(getWGateUp(), 2);
  if (failed(verifyExpertBiases(*this, shapes, localExperts, localName,
                                gateUpWidth, hidden, getWGateUp(), getBGateUp(),
                                getBDown())))
    return failure();

  SmallVector<std::pair<StringRef, Value>> typed = {
      {"x", getX()},
      {"router_weight", getRouterWeight()},
      {"w_gate_up", getWGateUp()},
      {"w_down", getWDown()},
      {"out", getOut()}};
  if (static_cast<bool>(getSharedGateUp()) !=
      static_cast<bool>(getSharedDown()))
    return emitOpError("expected both shared_gate_up and shared_down, or "
                       "neither");
  if (Value sharedGateUp = getSharedGateUp()) {
    int64_t sharedWidth = kDynamic, sharedFfn = kDynamic;
    if (failed(verifySharedOperands(
            shapes, getX(), sharedGateUp, "shared_gate_up", getSharedDown(),
            "shared_down", tokens, hidden, sharedWidth, sharedFfn)) ||
        failed(matchGateUpWidth(*this, shapes, activation, sharedWidth,
                                "shared_gate_up", sharedFfn, "m")))
      return failure();
    typed.push_back({"shared_gate_up", sharedGateUp});
    typed.push_back({"shared_down", getSharedDown()});
  }
  if (failed(shapes.sameElementType(typed)) ||
      failed(shapes.match(tokens, "T", getOut(), "out", 0)) ||
      failed(shapes.match(hidden, "d", getOut(), "out", 1)) ||
      failed(
          shapes.match(tokens, "T", getRouterLogits(), "router_logits", 0)) ||
      failed(shapes.match(experts, "E", getRouterLogits(), "router_logits", 1)))
    return failure();
  // A dynamic T is served up to its bound; a static one is its own bound.
  std::optional<int64_t> maxTokens = getMaxTokens();
  if (ShapedType::isDynamic(tokens) && !maxTokens)
    return emitOpError("has a dynamic token count and needs max_tokens, the "
                       "bound it is planned and compiled for");
  if (!ShapedType::isDynamic(tokens) && maxTokens && *maxTokens != tokens)
    return emitOpError() << "has max_tokens = " << *maxTokens
                         << " but a static token count T = " << tokens
                         << " (a static T is its own bound)";
  if (failed(matchLocalExperts()))
    return failure();
  // A chunk holds up to ep_chunk_tokens of a step's tokens, so its count
  // varies and the layer's T must be dynamic.
  if (std::optional<int64_t> chunk = getEpChunkTokens()) {
    if (!epSize)
      return emitOpError("has ep_chunk_tokens but no ep_size");
    if (!ShapedType::isDynamic(tokens))
      return emitOpError()
             << "has ep_chunk_tokens and a static token count T = " << tokens
             << "; chunks need a dynamic T (tensor<?x...>) with "
                "max_tokens, the step's bound";
    if (maxTokens && *chunk > *maxTokens)
      return emitOpError() << "has ep_chunk_tokens = " << *chunk
                           << ", more than max_tokens = " << *maxTokens
                           << " (a chunk is part of a step)";
  }
  if (epSize && product(*epSize, *getEpCapacity()) > kMaxIndex)
    return emitOpError() << "ep_size * ep_capacity (" << *epSize << " * "
                         << *getEpCapacity()
                         << ") exceeds the i32 row index range";
  int64_t bound = maxTokens ? *maxTokens : tokens;
  // The moe.dispatch that moe-decompose builds numbers the T * k rows in i32.
  int64_t topK = getRouting().getTopK();
  int64_t pairs = product(bound, topK);
  if (!ShapedType::isDynamic(bound) &&
      (ShapedType::isDynamic(pairs) || pairs > kMaxIndex))
    return emitOpError() << (maxTokens ? "max_tokens * k (" : "T * k (")
                         << bound << " * " << topK
                         << ") exceeds the i32 row index range";
  return verifyRoutingForExperts(*this, getRouting(), experts);
}

//===----------------------------------------------------------------------===//
// RouterOp and RouterGradOp
//===----------------------------------------------------------------------===//

/// x [T, d], router_weight [d, E], logits [T, E], experts and the weights
/// or their gradient [T, k] with k = top_k.
static LogicalResult verifyRouterShapes(Operation *op, RoutingAttr routing,
                                        Value x, Value routerWeight, Value bias,
                                        Value logits, Value experts,
                                        Value weights, StringRef weightsName) {
  ShapeVerifier shapes(op);
  int64_t tokens = kDynamic, hidden = kDynamic, numExperts = kDynamic;
  int64_t topK = routing.getTopK();
  if (failed(shapes.sameElementType(
          {{"x", x}, {"router_weight", routerWeight}})) ||
      failed(shapes.match(tokens, "T", x, "x", 0)) ||
      failed(shapes.match(hidden, "d", x, "x", 1)) ||
      failed(shapes.match(hidden, "d", routerWeight, "router_weight", 0)) ||
      failed(shapes.match(numExperts, "E", routerWeight, "router_weight", 1)) ||
      failed(shapes.match(tokens, "T", logits, "logits", 0)) ||
      failed(shapes.match(numExperts, "E", logits, "logits", 1)) ||
      failed(shapes.match(tokens, "T", experts, "experts", 0)) ||
      failed(shapes.match(topK, "top_k", experts, "experts", 1)) ||
      failed(shapes.match(tokens, "T", weights, weightsName, 0)) ||
      failed(shapes.match(topK, "top_k", weights, weightsName, 1)))
    return failure();
  // The bias may be the only operand that gives E statically.
  if (bias && failed(shapes.match(numExperts, "E", bias, "bias", 0)))
    return failure();
  return verifyRoutingForExperts(op, routing, numExperts);
}

LogicalResult RouterOp::verify() {
  return verifyRouterShapes(*this, getRouting(), getX(), getRouterWeight(),
                            getBias(), getLogits(), getExperts(), getWeights(),
                            "weights");
}

LogicalResult RouterGradOp::verify() {
  if (failed(verifyRouterShapes(*this, getRouting(), getX(), getRouterWeight(),
                                /*bias=*/nullptr, getLogits(), getExperts(),
                                getDWeights(), "d_weights")) ||
      failed(verifySameType(*this, "dx", getDx(), "x", getX())) ||
      failed(verifySameType(*this, "d_router_weight", getDRouterWeight(),
                            "router_weight", getRouterWeight())))
    return failure();
  if (Value dLogits = getDLogits();
      dLogits && failed(verifySameType(*this, "logits_grad", dLogits, "logits",
                                       getLogits())))
    return failure();
  if (Value accumulate = getAccumulate())
    return verifySameType(*this, "accumulate", accumulate, "dx", getDx());
  return success();
}

//===----------------------------------------------------------------------===//
// DispatchOp
//===----------------------------------------------------------------------===//

LogicalResult DispatchOp::verify() {
  ShapeVerifier shapes(*this);
  int64_t tokens = dimOf(getExperts(), 0), topK = dimOf(getExperts(), 1);
  int64_t pairs = product(tokens, topK);
  int64_t offsets = successor(static_cast<int64_t>(getNumExperts()));
  if (!ShapedType::isDynamic(tokens) && !ShapedType::isDynamic(topK) &&
      (ShapedType::isDynamic(pairs) || pairs > kMaxIndex))
    return emitOpError() << "T * k (" << tokens << " * " << topK
                         << ") exceeds the i32 row index range";
  if (failed(shapes.match(pairs, "T * k", getTokenIds(), "token_ids", 0)) ||
      failed(shapes.match(offsets, "num_experts + 1", getOffsets(), "offsets",
                          0)) ||
      failed(
          verifySameType(*this, "rows", getRows(), "experts", getExperts())) ||
      failed(verifyTopKDim(*this, topK, "experts")))
    return failure();
  if (!ShapedType::isDynamic(topK) &&
      topK > static_cast<int64_t>(getNumExperts()))
    return emitOpError() << "top_k (" << topK
                         << ") exceeds the number of experts ("
                         << getNumExperts() << ")";
  return success();
}

//===----------------------------------------------------------------------===//
// ExpertFFNOp and ExpertFFNGradOp
//===----------------------------------------------------------------------===//

/// A routed expert FFN and its gradient share operands, `h [R, G]` and one
/// more expert-ordered `[R, d]` value: `y` forward, `dy` backward.
static LogicalResult verifyRoutedExpert(Operation *op, Activation activation,
                                        Value x, Value tokenIds, Value offsets,
                                        Value wGateUp, Value wDown, Value h,
                                        Value rowValue, StringRef rowName,
                                        Value bGateUp, Value bDown) {
  ShapeVerifier shapes(op);
  ExpertSizes sizes;
  if (failed(verifyExpertOperands(shapes, x, tokenIds, offsets, wGateUp, wDown,
                                  sizes)) ||
      failed(shapes.sameElementType({{"x", x},
                                     {"w_gate_up", wGateUp},
                                     {"w_down", wDown},
                                     {"h", h},
                                     {rowName, rowValue}})) ||
      failed(shapes.match(sizes.rows, "R", h, "h", 0)) ||
      failed(
          shapes.match(sizes.gateUpWidth, "the w_gate_up width", h, "h", 1)) ||
      failed(shapes.match(sizes.rows, "R", rowValue, rowName, 0)) ||
      failed(shapes.match(sizes.hidden, "d", rowValue, rowName, 1)) ||
      failed(verifyExpertBiases(op, shapes, sizes.experts, "E",
                                sizes.gateUpWidth, sizes.hidden, wGateUp,
                                bGateUp, bDown)))
    return failure();
  return verifyExpertSizes(op, shapes, activation, sizes);
}

/// Gradients have the types of what they differentiate.
static LogicalResult verifyWeightGrads(Operation *op, Value dx, Value x,
                                       Value dWGateUp, Value wGateUp,
                                       Value dWDown, Value wDown) {
  if (failed(verifySameType(op, "dx", dx, "x", x)) ||
      failed(
          verifySameType(op, "d_w_gate_up", dWGateUp, "w_gate_up", wGateUp)) ||
      failed(verifySameType(op, "d_w_down", dWDown, "w_down", wDown)))
    return failure();
  return success();
}

/// The bias gradients of a gradient op: present exactly with the biases,
/// each of its bias's type.
static LogicalResult verifyBiasGrads(Operation *op, Value bGateUp, Value bDown,
                                     Value dBGateUp, Value dBDown) {
  if (static_cast<bool>(bGateUp) != static_cast<bool>(dBGateUp) ||
      static_cast<bool>(bDown) != static_cast<bool>(dBDown))
    return op->emitOpError("expected d_b_gate_up and d_b_down results exactly "
                           "when it has b_gate_up and b_down operands");
  if (!bGateUp)
    return success();
  if (failed(
          verifySameType(op, "d_b_gate_up", dBGateUp, "b_gate_up", bGateUp)) ||
      failed(verifySameType(op, "d_b_down", dBDown, "b_down", bDown)))
    return failure();
  return success();
}

LogicalResult ExpertFFNOp::verify() {
  return verifyRoutedExpert(*this, getActivation(), getX(), getTokenIds(),
                            getOffsets(), getWGateUp(), getWDown(), getH(),
                            getY(), "y", getBGateUp(), getBDown());
}

LogicalResult ExpertFFNGradOp::verify() {
  if (failed(verifyRoutedExpert(*this, getActivation(), getX(), getTokenIds(),
                                getOffsets(), getWGateUp(), getWDown(), getH(),
                                getDy(), "dy", getBGateUp(), getBDown())) ||
      failed(verifyBiasGrads(*this, getBGateUp(), getBDown(), getDBGateUp(),
                             getDBDown())))
    return failure();
  return verifyWeightGrads(*this, getDx(), getX(), getDWGateUp(), getWGateUp(),
                           getDWDown(), getWDown());
}

LogicalResult ExpertCombineGradOp::verify() {
  ShapeVerifier shapes(*this);
  ExpertSizes sizes;
  int64_t topK = kDynamic;
  if (failed(verifyExpertOperands(shapes, getX(), getTokenIds(), getOffsets(),
                                  getWGateUp(), getWDown(), sizes)) ||
      failed(shapes.sameElementType({{"x", getX()},
                                     {"w_gate_up", getWGateUp()},
                                     {"w_down", getWDown()},
                                     {"h", getH()},
                                     {"dout", getDout()}})) ||
      failed(shapes.match(sizes.rows, "R", getH(), "h", 0)) ||
      failed(shapes.match(sizes.gateUpWidth, "the w_gate_up width", getH(), "h",
                          1)) ||
      failed(shapes.match(sizes.tokens, "T", getRows(), "rows", 0)) ||
      failed(shapes.match(topK, "k", getRows(), "rows", 1)) ||
      failed(shapes.match(sizes.tokens, "T", getWeights(), "weights", 0)) ||
      failed(shapes.match(topK, "k", getWeights(), "weights", 1)) ||
      failed(verifyTopKDim(*this, topK, "rows")) ||
      failed(verifySameType(*this, "dout", getDout(), "x", getX())) ||
      failed(verifySameType(*this, "d_weights", getDWeights(), "weights",
                            getWeights())) ||
      failed(verifyWeightGrads(*this, getDx(), getX(), getDWGateUp(),
                               getWGateUp(), getDWDown(), getWDown())) ||
      failed(verifyExpertBiases(*this, shapes, sizes.experts, "E",
                                sizes.gateUpWidth, sizes.hidden, getWGateUp(),
                                getBGateUp(), getBDown())) ||
      failed(verifyBiasGrads(*this, getBGateUp(), getBDown(), getDBGateUp(),
                             getDBDown())))
    return failure();
  int64_t pairs = product(sizes.tokens, topK);
  if (failed(shapes.matchSize(pairs, "T * k", sizes.rows, "the row count R")))
    return failure();
  if (Value accumulate = getAccumulate();
      accumulate &&
      failed(verifySameType(*this, "accumulate", accumulate, "dx", getDx())))
    return failure();
  return verifyExpertSizes(*this, shapes, getActivation(), sizes);
}

//===----------------------------------------------------------------------===//
// Expert parallelism
//===----------------------------------------------------------------------===//

/// The blocks of an expert-parallel exchange: `offsets [E + 1]` with E a
/// multiple of `epSize`, rows `[S * C, d]` (`blocks`, named `blocksName`),
/// and optionally the counts `[S, E / S]` and the dropped rows `[S]`.
/// `hidden` receives d; `localExperts` receives E / S.
static LogicalResult verifyEPBlocks(Operation *op, ShapeVerifier &shapes,
                                    int64_t epSize, int64_t capacity,
                                    Value offsets, Value blocks,
                                    StringRef blocksName, Value counts,
                                    StringRef countsName, Value dropped,
                                    int64_t &hidden, int64_t &localExperts) {
  int64_t slots = product(epSize, capacity);
  if (ShapedType::isDynamic(slots) || slots > kMaxIndex)
    return op->emitOpError() << "ep_size * capacity (" << epSize << " * "
                             << capacity << ") exceeds the i32 row index range";
  int64_t experts1 = dimOf(offsets, 0);
  if (!ShapedType::isDynamic(experts1)) {
    int64_t experts = experts1 - 1;
    if (experts < 1)
      return op->emitOpError("offsets must have E + 1 >= 2 entries, got ")
             << experts1;
    if (experts % epSize != 0)
      return op->emitOpError()
             << "ep_size (" << epSize << ") must divide the number of experts ("
             << experts << ", offsets has E + 1 entries)";
    localExperts = experts / epSize;
  }
  if (failed(
          shapes.match(slots, "ep_size * capacity", blocks, blocksName, 0)) ||
      failed(shapes.match(hidden, "d", blocks, blocksName, 1)))
    return failure();
  if (counts) {
    int64_t ranks = epSize;
    if (failed(shapes.match(ranks, "ep_size", counts, countsName, 0)) ||
        failed(
            shapes.match(localExperts, "E / ep_size", counts, countsName, 1)))
      return failure();
    // Only the counts give E / ep_size where offsets is dynamic.
    if (localExperts == 0)
      return op->emitOpError()
             << countsName << " must have E / ep_size >= 1 columns, got 0";
  }
  if (dropped) {
    int64_t ranks = epSize;
    if (failed(shapes.match(ranks, "ep_size", dropped, "dropped", 0)))
      return failure();
  }
  return success();
}

/// moe.ep_dispatch and moe.ep_pack: `source` rows (`[R, d]`, or x `[T, d]`
/// gathered by `token_ids [R]`) into `blocks [S * C, d]`.
static LogicalResult verifyEPSend(Operation *op, int64_t epSize,
                                  int64_t capacity, Value source, Value offsets,
                                  Value tokenIds, Value blocks,
                                  StringRef blocksName, Value counts,
                                  StringRef countsName, Value dropped) {
  ShapeVerifier shapes(op);
  int64_t hidden = kDynamic, localExperts = kDynamic;
  if (failed(
          shapes.sameElementType({{"source", source}, {blocksName, blocks}})) ||
      failed(shapes.match(hidden, "d", source, "source", 1)))
    return failure();
  return verifyEPBlocks(op, shapes, epSize, capacity, offsets, blocks,
                        blocksName, counts, countsName, dropped, hidden,
                        localExperts);
}

/// moe.ep_combine and moe.ep_unpack: `blocks [S * C, d]` back to `result`,
/// `[R, d]`, or `[T, d]` summed by `rowsOf [T, k]`.
static LogicalResult verifyEPReturn(Operation *op, int64_t epSize,
                                    int64_t capacity, Value blocks,
                                    StringRef blocksName, Value offsets,
                                    Value rowsOf, Value result) {
  ShapeVerifier shapes(op);
  int64_t hidden = kDynamic, localExperts = kDynamic;
  if (failed(
          shapes.sameElementType({{blocksName, blocks}, {"result", result}})) ||
      failed(verifyEPBlocks(op, shapes, epSize, capacity, offsets, blocks,
                            blocksName, Value(), "", Value(), hidden,
                            localExperts)) ||
      failed(shapes.match(hidden, "d", result, "result", 1)))
    return failure();
  if (rowsOf) {
    int64_t tokens = kDynamic, topK = kDynamic;
    if (failed(shapes.match(tokens, "T", rowsOf, "rows_of", 0)) ||
        failed(shapes.match(topK, "k", rowsOf, "rows_of", 1)) ||
        failed(verifyTopKDim(op, topK, "rows_of")) ||
        failed(shapes.match(tokens, "T", result, "result", 0)))
      return failure();
  }
  return success();
}

LogicalResult EPDispatchOp::verify() {
  return verifyEPSend(*this, getEpSize(), getCapacity(), getSource(),
                      getOffsets(), getTokenIds(), getReceived(), "received",
                      getReceivedCounts(), "received_counts", getDropped());
}

LogicalResult EPPackOp::verify() {
  return verifyEPSend(*this, getEpSize(), getCapacity(), getSource(),
                      getOffsets(), getTokenIds(), getSend(), "send",
                      getSendCounts(), "send_counts", getDropped());
}

LogicalResult EPCombineOp::verify() {
  return verifyEPReturn(*this, getEpSize(), getCapacity(), getRows(), "rows",
                        getOffsets(), getRowsOf(), getResult());
}

LogicalResult EPUnpackOp::verify() {
  return verifyEPReturn(*this, getEpSize(), getCapacity(), getReturned(),
                        "returned", getOffsets(), getRowsOf(), getResult());
}

LogicalResult EPQueuesOp::verify() {
  ShapeVerifier shapes(*this);
  int64_t ranks = dimOf(getReceivedCounts(), 0);
  int64_t localExperts = dimOf(getReceivedCounts(), 1);
  // [S, E / S] of an ep_size in [1, 65536] and E >= 1.
  if (!ShapedType::isDynamic(ranks) && (ranks < 1 || ranks > kMaxEPSize))
    return emitOpError() << "received_counts must have ep_size in [1, "
                         << kMaxEPSize << "] rows, got " << ranks;
  if (localExperts == 0)
    return emitOpError(
        "received_counts must have E / ep_size >= 1 columns, got 0");
  int64_t slots = product(ranks, getCapacity());
  if (!ShapedType::isDynamic(ranks) && slots > kMaxIndex)
    return emitOpError() << "the received rows (" << ranks << " * "
                         << getCapacity() << ") exceed the i32 row index range";
  int64_t localExperts1 = successor(localExperts);
  if (failed(shapes.match(slots, "ep_size * capacity", getTokenIds(),
                          "token_ids", 0)) ||
      failed(shapes.match(localExperts1, "E / ep_size + 1", getOffsets(),
                          "offsets", 0)))
    return failure();
  return success();
}

LogicalResult GatherRowsOp::verify() {
  ShapeVerifier shapes(*this);
  int64_t rows = kDynamic, hidden = kDynamic;
  if (failed(shapes.sameElementType(
          {{"source", getSource()}, {"result", getResult()}})) ||
      failed(shapes.match(hidden, "d", getSource(), "source", 1)) ||
      failed(shapes.match(rows, "M", getIndices(), "indices", 0)) ||
      failed(shapes.match(rows, "M", getResult(), "result", 0)) ||
      failed(shapes.match(hidden, "d", getResult(), "result", 1)))
    return failure();
  return success();
}

LogicalResult ScatterRowsOp::verify() {
  ShapeVerifier shapes(*this);
  int64_t rows = kDynamic, hidden = kDynamic;
  if (failed(shapes.sameElementType(
          {{"source", getSource()}, {"result", getResult()}})) ||
      failed(shapes.match(rows, "M", getSource(), "source", 0)) ||
      failed(shapes.match(hidden, "d", getSource(), "source", 1)) ||
      failed(shapes.match(rows, "M", getIndices(), "indices", 0)) ||
      failed(shapes.match(hidden, "d", getResult(), "result", 1)))
    return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// SharedExpertOp and SharedExpertGradOp
//===----------------------------------------------------------------------===//

/// A shared expert and its gradient share operands, `h [T, G]` and one more
/// token-ordered value of x's type: `y` forward, `dy` backward.
static LogicalResult verifySharedExpert(Operation *op, Activation activation,
                                        Value x, Value wGateUp, Value wDown,
                                        Value h, Value tokenValue,
                                        StringRef tokenName) {
  ShapeVerifier shapes(op);
  int64_t tokens = kDynamic, hidden = kDynamic, width = kDynamic,
          ffn = kDynamic;
  if (failed(verifySharedOperands(shapes, x, wGateUp, "w_gate_up", wDown,
                                  "w_down", tokens, hidden, width, ffn)) ||
      failed(shapes.sameElementType({{"x", x},
                                     {"w_gate_up", wGateUp},
                                     {"w_down", wDown},
                                     {"h", h},
                                     {tokenName, tokenValue}})) ||
      failed(verifySameType(op, tokenName, tokenValue, "x", x)) ||
      failed(shapes.match(tokens, "T", h, "h", 0)) ||
      failed(shapes.match(width, "the w_gate_up width", h, "h", 1)))
    return failure();
  return matchGateUpWidth(op, shapes, activation, width, "w_gate_up", ffn, "m");
}

LogicalResult SharedExpertOp::verify() {
  return verifySharedExpert(*this, getActivation(), getX(), getWGateUp(),
                            getWDown(), getH(), getY(), "y");
}

LogicalResult SharedExpertGradOp::verify() {
  if (failed(verifySharedExpert(*this, getActivation(), getX(), getWGateUp(),
                                getWDown(), getH(), getDy(), "dy")))
    return failure();
  return verifyWeightGrads(*this, getDx(), getX(), getDWGateUp(), getWGateUp(),
                           getDWDown(), getWDown());
}

//===----------------------------------------------------------------------===//
// CombineOp and CombineGradOp
//===----------------------------------------------------------------------===//

/// y [R, d] with R = T * k, weights and rows [T, k]; `tokenValue` ([T, d])
/// is the output (combine) or the incoming gradient (combine_grad).
static LogicalResult verifyCombineShapes(Operation *op, Value y, Value weights,
                                         Value rows, Value tokenValue,
                                         StringRef tokenName) {
  ShapeVerifier shapes(op);
  int64_t tokens = kDynamic, topK = kDynamic, hidden = kDynamic;
  if (failed(shapes.sameElementType({{"y", y}, {tokenName, tokenValue}})) ||
      failed(shapes.match(tokens, "T", weights, "weights", 0)) ||
      failed(shapes.match(topK, "k", weights, "weights", 1)) ||
      failed(shapes.match(tokens, "T", rows, "rows", 0)) ||
      failed(shapes.match(topK, "k", rows, "rows", 1)) ||
      failed(shapes.match(tokens, "T", tokenValue, tokenName, 0)) ||
      failed(shapes.match(hidden, "d", tokenValue, tokenName, 1)) ||
      failed(shapes.match(hidden, "d", y, "y", 1)) ||
      failed(verifyTopKDim(op, topK, "weights")))
    return failure();
  int64_t pairs = product(tokens, topK);
  return shapes.match(pairs, "T * k", y, "y", 0);
}

LogicalResult CombineOp::verify() {
  if (failed(verifyCombineShapes(*this, getY(), getWeights(), getRows(),
                                 getOut(), "out")))
    return failure();
  if (Value accumulate = getAccumulate())
    return verifySameType(*this, "accumulate", accumulate, "out", getOut());
  return success();
}

LogicalResult CombineGradOp::verify() {
  if (failed(verifyCombineShapes(*this, getY(), getWeights(), getRows(),
                                 getDout(), "dout")) ||
      failed(verifySameType(*this, "dy", getDy(), "y", getY())) ||
      failed(verifySameType(*this, "d_weights", getDWeights(), "weights",
                            getWeights())))
    return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// AuxLossOp and AuxLossGradOp
//===----------------------------------------------------------------------===//

static LogicalResult verifyAuxLossShapes(Operation *op, Value logits,
                                         Value experts) {
  ShapeVerifier shapes(op);
  int64_t tokens = kDynamic;
  if (failed(shapes.match(tokens, "T", logits, "logits", 0)) ||
      failed(shapes.match(tokens, "T", experts, "experts", 0)))
    return failure();
  int64_t numExperts = dimOf(logits, 1), topK = dimOf(experts, 1);
  if (failed(verifyTopKDim(op, topK, "experts")))
    return failure();
  if (!ShapedType::isDynamic(numExperts) && !ShapedType::isDynamic(topK) &&
      topK > numExperts)
    return op->emitOpError()
           << "top_k (" << topK << ") exceeds the number of experts ("
           << numExperts << ")";
  return success();
}

LogicalResult AuxLossOp::verify() {
  return verifyAuxLossShapes(*this, getLogits(), getExperts());
}

LogicalResult AuxLossGradOp::verify() {
  if (failed(verifyAuxLossShapes(*this, getLogits(), getExperts())))
    return failure();
  return verifySameType(*this, "d_logits", getDLogits(), "logits", getLogits());
}

//===----------------------------------------------------------------------===//
// UpdateSelectionBiasOp
//===----------------------------------------------------------------------===//

LogicalResult UpdateSelectionBiasOp::verify() {
  ShapeVerifier shapes(*this);
  int64_t numExperts = kDynamic;
  if (failed(shapes.match(numExperts, "E", getBias(), "bias", 0)) ||
      failed(shapes.match(numExperts, "E", getResult(), "result", 0)))
    return failure();
  int64_t topK = dimOf(getExperts(), 1);
  if (failed(verifyTopKDim(*this, topK, "experts")))
    return failure();
  if (!ShapedType::isDynamic(numExperts) && !ShapedType::isDynamic(topK) &&
      topK > numExperts)
    return emitOpError() << "top_k (" << topK
                         << ") exceeds the number of experts (" << numExperts
                         << ")";
  return success();
}

//===----------------------------------------------------------------------===//
// CheckpointOp
//===----------------------------------------------------------------------===//

LogicalResult CheckpointOp::verifyRegions() {
  Block &body = getBody().front();
  if (body.getNumArguments() != getInputs().size())
    return emitOpError() << "expected " << getInputs().size()
                         << " region arguments (one per input), got "
                         << body.getNumArguments();
  for (auto [index, pair] :
       llvm::enumerate(llvm::zip(getInputs(), body.getArguments()))) {
    auto [input, argument] = pair;
    if (input.getType() != argument.getType())
      return emitOpError() << "region argument #" << index << " has type "
                           << argument.getType() << ", but input #" << index
                           << " has type " << input.getType();
  }
  auto yield = cast<YieldOp>(body.getTerminator());
  if (yield.getValues().size() != getOutputs().size())
    return emitOpError() << "expected the region to yield one value per "
                            "result ("
                         << getOutputs().size() << "), got "
                         << yield.getValues().size();
  for (auto [index, pair] :
       llvm::enumerate(llvm::zip(yield.getValues(), getOutputs()))) {
    auto [yielded, result] = pair;
    if (yielded.getType() != result.getType())
      return emitOpError() << "yielded value #" << index << " has type "
                           << yielded.getType() << ", but result #" << index
                           << " has type " << result.getType();
  }
  return success();
}

//===----------------------------------------------------------------------===//
// OffloadOp and PrefetchOp
//===----------------------------------------------------------------------===//

static LogicalResult verifyHostCopy(Operation *op, RankedTensorType device,
                                    HostTensorType host) {
  if (device == host.getDeviceType())
    return success();
  return op->emitOpError() << "device tensor " << device << " and host tensor "
                           << host
                           << " must have the same shape and element type, and "
                              "the device tensor no encoding";
}

LogicalResult OffloadOp::verify() {
  return verifyHostCopy(*this, getSource().getType(), getHost().getType());
}

LogicalResult PrefetchOp::verify() {
  return verifyHostCopy(*this, getDevice().getType(), getHost().getType());
}

#define GET_OP_CLASSES
#include "moe/Dialect/MoE/IR/MoEOps.cpp.inc"

OpOperand *mlir::moe::getAccumulateOperand(Operation *op) {
  return TypeSwitch<Operation *, OpOperand *>(op)
      .Case<CombineOp, RouterGradOp, ExpertCombineGradOp>([](auto op) {
        MutableOperandRange range = op.getAccumulateMutable();
        return range.empty() ? nullptr : &range[0];
      })
      .Default([](Operation *) { return nullptr; });
}

Value mlir::moe::getAccumulatedResult(Operation *op) {
  return TypeSwitch<Operation *, Value>(op)
      .Case<RouterGradOp, ExpertCombineGradOp>(
          [](auto grad) -> Value { return grad.getDx(); })
      .Case([](CombineOp combine) -> Value { return combine.getOut(); })
      .Default([](Operation *) { return Value(); });
}

std::optional<int64_t> mlir::moe::getMaxTokens(Operation *func) {
  if (auto bound = func->getAttrOfType<IntegerAttr>(kMaxTokensAttr))
    return bound.getInt();
  return std::nullopt;
}
