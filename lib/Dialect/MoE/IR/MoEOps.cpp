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

int64_t product(int64_t a, int64_t b) {
  if (ShapedType::isDynamic(a) || ShapedType::isDynamic(b))
    return kDynamic;
  return a * b;
}

/// Rules of a routing attribute that depend on the number of experts.
LogicalResult verifyRoutingForExperts(Operation *op, RoutingAttr routing,
                                      int64_t numExperts) {
  if (ShapedType::isDynamic(numExperts))
    return success();
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

LogicalResult verifyExpertOperands(Operation *op, ShapeVerifier &shapes,
                                   Activation activation, Value x,
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
  if (failed(matchGateUpWidth(op, shapes, activation, sizes.gateUpWidth,
                              "w_gate_up", sizes.ffn, "n")))
    return failure();
  int64_t experts1 =
      ShapedType::isDynamic(sizes.experts) ? kDynamic : sizes.experts + 1;
  if (failed(shapes.matchSize(experts1, "E + 1", dimOf(offsets, 0),
                              "offsets dimension 0")))
    return failure();
  return verifyRowCount(op, sizes.rows, sizes.tokens);
}

/// Operands of a shared expert and its gradient: x [T, d], w_gate_up [d, G],
/// w_down [m, d].
LogicalResult verifySharedOperands(Operation *op, ShapeVerifier &shapes,
                                   Activation activation, Value x,
                                   Value wGateUp, Value wDown, int64_t &tokens,
                                   int64_t &hidden, int64_t &width) {
  int64_t ffn = kDynamic;
  if (failed(shapes.match(tokens, "T", x, "x", 0)) ||
      failed(shapes.match(hidden, "d", x, "x", 1)) ||
      failed(shapes.match(hidden, "d", wGateUp, "w_gate_up", 0)) ||
      failed(shapes.match(ffn, "m", wDown, "w_down", 0)) ||
      failed(shapes.match(hidden, "d", wDown, "w_down", 1)))
    return failure();
  width = dimOf(wGateUp, 1);
  return matchGateUpWidth(op, shapes, activation, width, "w_gate_up", ffn, "m");
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
      failed(
          shapes.match(experts, "E", getRouterWeight(), "router_weight", 1)) ||
      failed(shapes.match(experts, "E", getWGateUp(), "w_gate_up", 0)) ||
      failed(shapes.match(hidden, "d", getWGateUp(), "w_gate_up", 1)) ||
      failed(shapes.match(experts, "E", getWDown(), "w_down", 0)) ||
      failed(shapes.match(ffn, "n", getWDown(), "w_down", 1)) ||
      failed(shapes.match(hidden, "d", getWDown(), "w_down", 2)) ||
      failed(matchGateUpWidth(*this, shapes, activation, dimOf(getWGateUp(), 2),
                              "w_gate_up", ffn, "n")))
    return failure();
  if (Value bias = getRouterBias())
    if (failed(shapes.match(experts, "E", bias, "router_bias", 0)))
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
    int64_t sharedTokens = tokens, sharedWidth;
    if (failed(verifySharedOperands(*this, shapes, activation, getX(),
                                    sharedGateUp, getSharedDown(), sharedTokens,
                                    hidden, sharedWidth)))
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
  return verifyRoutingForExperts(*this, getRouting(), experts);
}

//===----------------------------------------------------------------------===//
// RouterOp and RouterGradOp
//===----------------------------------------------------------------------===//

/// x [T, d], router_weight [d, E], logits [T, E], experts and the weights
/// or their gradient [T, k] with k = top_k.
static LogicalResult verifyRouterShapes(Operation *op, RoutingAttr routing,
                                        Value x, Value routerWeight,
                                        Value logits, Value experts,
                                        Value weights, StringRef weightsName,
                                        int64_t &tokens, int64_t &hidden,
                                        int64_t &numExperts) {
  ShapeVerifier shapes(op);
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
  return verifyRoutingForExperts(op, routing, numExperts);
}

LogicalResult RouterOp::verify() {
  int64_t tokens = kDynamic, hidden = kDynamic, experts = kDynamic;
  if (failed(verifyRouterShapes(*this, getRouting(), getX(), getRouterWeight(),
                                getLogits(), getExperts(), getWeights(),
                                "weights", tokens, hidden, experts)))
    return failure();
  if (Value bias = getBias()) {
    ShapeVerifier shapes(*this);
    return shapes.match(experts, "E", bias, "bias", 0);
  }
  return success();
}

LogicalResult RouterGradOp::verify() {
  int64_t tokens = kDynamic, hidden = kDynamic, experts = kDynamic;
  if (failed(verifyRouterShapes(*this, getRouting(), getX(), getRouterWeight(),
                                getLogits(), getExperts(), getDWeights(),
                                "d_weights", tokens, hidden, experts)) ||
      failed(verifySameType(*this, "dx", getDx(), "x", getX())) ||
      failed(verifySameType(*this, "d_router_weight", getDRouterWeight(),
                            "router_weight", getRouterWeight())))
    return failure();
  if (Value dLogits = getDLogits())
    return verifySameType(*this, "logits_grad", dLogits, "logits", getLogits());
  return success();
}

//===----------------------------------------------------------------------===//
// DispatchOp
//===----------------------------------------------------------------------===//

LogicalResult DispatchOp::verify() {
  ShapeVerifier shapes(*this);
  int64_t tokens = dimOf(getExperts(), 0), topK = dimOf(getExperts(), 1);
  int64_t pairs = product(tokens, topK);
  int64_t offsets = static_cast<int64_t>(getNumExperts()) + 1;
  if (failed(shapes.match(pairs, "T * k", getTokenIds(), "token_ids", 0)) ||
      failed(shapes.match(offsets, "num_experts + 1", getOffsets(), "offsets",
                          0)) ||
      failed(verifySameType(*this, "rows", getRows(), "experts", getExperts())))
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

LogicalResult ExpertFFNOp::verify() {
  ShapeVerifier shapes(*this);
  ExpertSizes sizes;
  if (failed(verifyExpertOperands(*this, shapes, getActivation(), getX(),
                                  getTokenIds(), getOffsets(), getWGateUp(),
                                  getWDown(), sizes)) ||
      failed(shapes.sameElementType({{"x", getX()},
                                     {"w_gate_up", getWGateUp()},
                                     {"w_down", getWDown()},
                                     {"y", getY()},
                                     {"h", getH()}})) ||
      failed(shapes.match(sizes.rows, "R", getY(), "y", 0)) ||
      failed(shapes.match(sizes.hidden, "d", getY(), "y", 1)) ||
      failed(shapes.match(sizes.rows, "R", getH(), "h", 0)) ||
      failed(shapes.match(sizes.gateUpWidth, "the w_gate_up width", getH(), "h",
                          1)))
    return failure();
  return success();
}

LogicalResult ExpertFFNGradOp::verify() {
  ShapeVerifier shapes(*this);
  ExpertSizes sizes;
  if (failed(verifyExpertOperands(*this, shapes, getActivation(), getX(),
                                  getTokenIds(), getOffsets(), getWGateUp(),
                                  getWDown(), sizes)) ||
      failed(shapes.sameElementType({{"x", getX()},
                                     {"w_gate_up", getWGateUp()},
                                     {"w_down", getWDown()},
                                     {"h", getH()},
                                     {"dy", getDy()}})) ||
      failed(shapes.match(sizes.rows, "R", getH(), "h", 0)) ||
      failed(shapes.match(sizes.gateUpWidth, "the w_gate_up width", getH(), "h",
                          1)) ||
      failed(shapes.match(sizes.rows, "R", getDy(), "dy", 0)) ||
      failed(shapes.match(sizes.hidden, "d", getDy(), "dy", 1)) ||
      failed(verifySameType(*this, "dx", getDx(), "x", getX())) ||
      failed(verifySameType(*this, "d_w_gate_up", getDWGateUp(), "w_gate_up",
                            getWGateUp())) ||
      failed(
          verifySameType(*this, "d_w_down", getDWDown(), "w_down", getWDown())))
    return failure();
  return success();
}

//===----------------------------------------------------------------------===//
// SharedExpertOp and SharedExpertGradOp
//===----------------------------------------------------------------------===//

LogicalResult SharedExpertOp::verify() {
  ShapeVerifier shapes(*this);
  int64_t tokens = kDynamic, hidden = kDynamic, width = kDynamic;
  if (failed(verifySharedOperands(*this, shapes, getActivation(), getX(),
                                  getWGateUp(), getWDown(), tokens, hidden,
                                  width)) ||
      failed(shapes.sameElementType({{"x", getX()},
                                     {"w_gate_up", getWGateUp()},
                                     {"w_down", getWDown()},
                                     {"y", getY()},
                                     {"h", getH()}})) ||
      failed(verifySameType(*this, "y", getY(), "x", getX())) ||
      failed(shapes.match(tokens, "T", getH(), "h", 0)) ||
      failed(shapes.match(width, "the w_gate_up width", getH(), "h", 1)))
    return failure();
  return success();
}

LogicalResult SharedExpertGradOp::verify() {
  ShapeVerifier shapes(*this);
  int64_t tokens = kDynamic, hidden = kDynamic, width = kDynamic;
  if (failed(verifySharedOperands(*this, shapes, getActivation(), getX(),
                                  getWGateUp(), getWDown(), tokens, hidden,
                                  width)) ||
      failed(shapes.sameElementType({{"x", getX()},
                                     {"w_gate_up", getWGateUp()},
                                     {"w_down", getWDown()},
                                     {"h", getH()},
                                     {"dy", getDy()}})) ||
      failed(shapes.match(tokens, "T", getH(), "h", 0)) ||
      failed(shapes.match(width, "the w_gate_up width", getH(), "h", 1)) ||
      failed(verifySameType(*this, "dy", getDy(), "x", getX())) ||
      failed(verifySameType(*this, "dx", getDx(), "x", getX())) ||
      failed(verifySameType(*this, "d_w_gate_up", getDWGateUp(), "w_gate_up",
                            getWGateUp())) ||
      failed(
          verifySameType(*this, "d_w_down", getDWDown(), "w_down", getWDown())))
    return failure();
  return success();
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
      failed(shapes.match(hidden, "d", y, "y", 1)))
    return failure();
  int64_t pairs = product(tokens, topK);
  return shapes.match(pairs, "T * k", y, "y", 0);
}

LogicalResult CombineOp::verify() {
  return verifyCombineShapes(*this, getY(), getWeights(), getRows(), getOut(),
                             "out");
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
    return emitOpError() << "expected the region to yield "
                         << getOutputs().size()
                         << " values (one per result), got "
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
  if (device.getShape() == host.getShape() &&
      device.getElementType() == host.getElementType())
    return success();
  return op->emitOpError() << "device tensor " << device << " and host tensor "
                           << host
                           << " must have the same shape and element type";
}

LogicalResult OffloadOp::verify() {
  return verifyHostCopy(*this, getSource().getType(), getHost().getType());
}

LogicalResult PrefetchOp::verify() {
  return verifyHostCopy(*this, getDevice().getType(), getHost().getType());
}

#define GET_OP_CLASSES
#include "moe/Dialect/MoE/IR/MoEOps.cpp.inc"
