//===- MoEToGPU.cpp - moe to GPU host functions (sm_90a path) -*- C++ -*-===//
//
// Functions on tensors become host functions on device memrefs whose moe ops
// are calls of the host functions of the GPU library, which the kernel builder
// makes (KernelBuilder.h; docs/gpu-path.md section 1). Each function is
// planned first (planHostFunction): results go straight into out-parameters,
// the other values share one arena at the offsets moe-plan-memory gave them.
// Then dialect conversion patterns, one per op (populateMoEToGPUPatterns),
// replace the ops in order with their calls, which one async token orders.
// Offloaded saved tensors go to pinned host memory through the runtime's copy
// stream.
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/MoEToGPU/MoEToGPU.h"
#include "moe/Conversion/MoEToGPU/GPUContract.h"
#include "moe/Conversion/MoEToGPU/KernelBuilder.h"
#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/IR/MoETypes.h"
#include "moe/Dialect/MoE/IR/TokenShapes.h"
#include "moe/Dialect/MoE/Transforms/Checkpoint.h"
#include "moe/Dialect/MoE/Transforms/NestedModules.h"
#include "moe/Dialect/MoE/Transforms/TrainingAttributes.h"
#include "moe/Dialect/MoEGPU/Transforms/KernelRoles.h"
#include "moe/Support/ArenaPlacement.h"
#include "moe/Support/ByteSize.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/Extensions/InlinerExtension.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/Transforms/InlinerInterfaceImpl.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Transforms/DialectConversion.h"

#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/MemoryBuffer.h"

#include <cmath>
#include <map>

namespace mlir::moe {
#define GEN_PASS_DEF_CONVERTMOETOGPU
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

/// The suffix of the host functions that add their result to what its buffer
/// holds; a library file may lack one (an op that accumulates then fails).
constexpr llvm::StringLiteral kAccumulateSuffix = "_acc";

constexpr llvm::StringLiteral kHostPrefix = "__moe_gpu_";
/// The alignment of the temporaries in a host function's arena (as
/// moe-plan-memory's default): more than the kernels' 16 bytes.
constexpr uint64_t kArenaAlignment = 256;

//===----------------------------------------------------------------------===//
// What this version runs
//===----------------------------------------------------------------------===//

bool isTensor(Type type) { return isa<TensorType, HostTensorType>(type); }

bool hasTensors(Operation *op) {
  return llvm::any_of(op->getOperandTypes(), isTensor) ||
         llvm::any_of(op->getResultTypes(), isTensor);
}

/// The operands and results of `op` that hold bf16 data (activations and
/// weights, as opposed to f32 routing values and i32 indices).
SmallVector<Value> getDataValues(Operation *op) {
  SmallVector<Value> values;
  auto add = [&](auto range) { llvm::append_range(values, range); };
  if (auto router = dyn_cast<RouterOp>(op))
    add(ValueRange{router.getX(), router.getRouterWeight()});
  else if (auto experts = dyn_cast<ExpertFFNOp>(op)) {
    add(ValueRange{experts.getX(), experts.getWGateUp(), experts.getWDown(),
                   experts.getY(), experts.getH()});
    if (experts.getBGateUp())
      add(ValueRange{experts.getBGateUp(), experts.getBDown()});
  } else if (auto shared = dyn_cast<SharedExpertOp>(op))
    add(ValueRange{shared.getX(), shared.getWGateUp(), shared.getWDown(),
                   shared.getY(), shared.getH()});
  else if (auto combine = dyn_cast<CombineOp>(op))
    add(ValueRange{combine.getY(), combine.getOut()});
  else if (auto grad = dyn_cast<ExpertCombineGradOp>(op)) {
    add(ValueRange{grad.getX(), grad.getWGateUp(), grad.getWDown(), grad.getH(),
                   grad.getDout(), grad.getDx(), grad.getDWGateUp(),
                   grad.getDWDown()});
    if (grad.getBGateUp())
      add(ValueRange{grad.getBGateUp(), grad.getBDown(), grad.getDBGateUp(),
                     grad.getDBDown()});
  } else if (auto grad = dyn_cast<SharedExpertGradOp>(op))
    add(ValueRange{grad.getX(), grad.getWGateUp(), grad.getWDown(), grad.getH(),
                   grad.getDy(), grad.getDx(), grad.getDWGateUp(),
                   grad.getDWDown()});
  else if (auto grad = dyn_cast<ExpertFFNGradOp>(op)) {
    add(ValueRange{grad.getX(), grad.getWGateUp(), grad.getWDown(), grad.getH(),
                   grad.getDy(), grad.getDx(), grad.getDWGateUp(),
                   grad.getDWDown()});
    if (grad.getBGateUp())
      add(ValueRange{grad.getBGateUp(), grad.getBDown(), grad.getDBGateUp(),
                     grad.getDBDown()});
  } else if (auto grad = dyn_cast<CombineGradOp>(op))
    add(ValueRange{grad.getDout(), grad.getY(), grad.getDy()});
  else if (auto grad = dyn_cast<RouterGradOp>(op))
    add(ValueRange{grad.getX(), grad.getRouterWeight(), grad.getDx(),
                   grad.getDRouterWeight()});
  else if (isa<arith::AddFOp>(op)) {
    add(op->getOperands());
    add(op->getResults());
  } else if (auto ep = dyn_cast<EPDispatchOp>(op))
    add(ValueRange{ep.getSource(), ep.getReceived()});
  else if (auto ep = dyn_cast<EPPackOp>(op))
    add(ValueRange{ep.getSource(), ep.getSend()});
  else if (auto ep = dyn_cast<EPCombineOp>(op))
    add(ValueRange{ep.getRows(), ep.getResult()});
  else if (auto ep = dyn_cast<EPUnpackOp>(op))
    add(ValueRange{ep.getReturned(), ep.getResult()});
  else if (isa<GatherRowsOp, ScatterRowsOp>(op))
    add(ValueRange{op->getOperand(0), op->getResult(0)});
  return values;
}

/// The sizes the kernels tile by 64, with their names: d, n, m.
SmallVector<std::pair<StringRef, int64_t>> getTiledSizes(Operation *op) {
  auto dim = [](Value value, unsigned i) {
    return cast<ShapedType>(value.getType()).getDimSize(i);
  };
  SmallVector<std::pair<StringRef, int64_t>> sizes;
  if (auto router = dyn_cast<RouterOp>(op))
    sizes.push_back({"d", dim(router.getX(), 1)});
  else if (auto grad = dyn_cast<RouterGradOp>(op))
    sizes.push_back({"d", dim(grad.getX(), 1)});
  else if (auto combine = dyn_cast<CombineOp>(op))
    sizes.push_back({"d", dim(combine.getOut(), 1)});
  else if (auto experts = dyn_cast<ExpertFFNOp>(op))
    sizes.append(
        {{"d", dim(experts.getX(), 1)}, {"n", dim(experts.getWDown(), 1)}});
  else if (auto grad = dyn_cast<ExpertCombineGradOp>(op))
    sizes.append({{"d", dim(grad.getX(), 1)}, {"n", dim(grad.getWDown(), 1)}});
  else if (auto grad = dyn_cast<ExpertFFNGradOp>(op))
    sizes.append({{"d", dim(grad.getX(), 1)}, {"n", dim(grad.getWDown(), 1)}});
  else if (auto grad = dyn_cast<CombineGradOp>(op))
    sizes.push_back({"d", dim(grad.getDout(), 1)});
  else if (auto shared = dyn_cast<SharedExpertOp>(op))
    sizes.append(
        {{"d", dim(shared.getX(), 1)}, {"m", dim(shared.getWDown(), 0)}});
  else if (auto grad = dyn_cast<SharedExpertGradOp>(op))
    sizes.append({{"d", dim(grad.getX(), 1)}, {"m", dim(grad.getWDown(), 0)}});
  else if (isa<EPDispatchOp, EPPackOp, EPCombineOp, EPUnpackOp, GatherRowsOp,
               ScatterRowsOp>(op))
    sizes.push_back({"d", dim(op->getOperand(0), 1)});
  return sizes;
}

std::optional<Activation> getActivation(Operation *op) {
  if (auto attr = op->getAttrOfType<ActivationAttr>("activation"))
    return attr.getValue();
  return std::nullopt;
}

/// Whether a routed expert op has the optional biases.
bool hasExpertBias(Operation *op) {
  return TypeSwitch<Operation *, bool>(op)
      .Case<ExpertFFNOp, ExpertFFNGradOp, ExpertCombineGradOp>(
          [](auto ffn) { return static_cast<bool>(ffn.getBGateUp()); })
      .Default([](Operation *) { return false; });
}

/// Whether `type` is the contract's data type (gpu_contract::kDataDtype).
bool isDataType(Type type) {
  std::string name;
  llvm::raw_string_ostream os(name);
  type.print(os);
  return name == gpu_contract::kDataDtype;
}

/// Whether `value`'s shape is static but for a leading dimension that follows
/// the token count (T or T * k rows).
bool isTokenShaped(Value value) {
  ShapedType type;
  if (auto host = dyn_cast<HostTensorType>(value.getType()))
    type = host.getDeviceType();
  else
    type = dyn_cast<RankedTensorType>(value.getType());
  if (!type || type.getRank() == 0)
    return false;
  if (llvm::any_of(type.getShape().drop_front(), ShapedType::isDynamic))
    return false;
  return !type.isDynamicDim(0) || getRowsPerToken(value).value_or(0) > 0;
}

/// The ranks of an expert-parallel collective (moe.ep_dispatch,
/// moe.ep_combine), 0 for any other op.
int64_t getCollectiveRanks(Operation *op) {
  if (auto ep = dyn_cast<EPDispatchOp>(op))
    return static_cast<int64_t>(ep.getEpSize());
  if (auto ep = dyn_cast<EPCombineOp>(op))
    return static_cast<int64_t>(ep.getEpSize());
  return 0;
}

/// The experts E of an expert-parallel op: offsets' E + 1, or the received
/// counts' S * (E / S); 0 for any other op.
int64_t getEPExperts(Operation *op) {
  auto size = [](Value value) -> int64_t {
    auto type = cast<ShapedType>(value.getType());
    return type.hasStaticShape() ? type.getNumElements() : 0;
  };
  if (isa<EPDispatchOp, EPPackOp, EPCombineOp, EPUnpackOp>(op))
    return size(op->getOperand(1)) - 1;
  if (auto queues = dyn_cast<EPQueuesOp>(op))
    return size(queues.getReceivedCounts());
  return 0;
}

/// Emits an error at `op` if this version cannot run it on the GPU. The
/// limits, and the reason for each, are the contract's (GPUContract.h,
/// python/moe_mlir/gpu_contract.json).
LogicalResult checkSupported(Operation *op) {
  if (isa<func::ReturnOp>(op) || !hasTensors(op))
    return success();
  if (isa<LayerOp>(op))
    return op->emitError("moe.layer must be decomposed (moe-decompose) "
                         "before convert-moe-to-gpu");
  if (auto offload = dyn_cast<OffloadOp>(op)) {
    // The copy goes into the forward's out-parameter for the saved tensor.
    auto func = op->getParentOfType<func::FuncOp>();
    bool saved =
        func && func->hasAttr(kNumSavedAttr) && op->getParentOp() == func &&
        llvm::any_of(offload.getHost().getUsers(),
                     [](Operation *user) { return isa<func::ReturnOp>(user); });
    if (!saved || !offload.getHost().hasOneUse())
      return op->emitError("the GPU path offloads a tensor only into a saved "
                           "result of a training forward (moe-offload), "
                           "returned and used nowhere else");
    return success();
  }
  if (auto prefetch = dyn_cast<PrefetchOp>(op)) {
    auto arg = dyn_cast<BlockArgument>(prefetch.getHost());
    auto func = op->getParentOfType<func::FuncOp>();
    if (!arg || !func || arg.getOwner() != &func.front() ||
        !func.getArgAttr(arg.getArgNumber(), kSavedAttr))
      return op->emitError("the GPU path prefetches only a saved argument "
                           "of a training backward (moe-offload)");
    return success();
  }
  // With one rank a collective is its local half; with more the function
  // must be split at it first.
  if (int64_t ranks = getCollectiveRanks(op); ranks > 1)
    return op->emitOpError()
           << "is a collective over " << ranks
           << " ranks: split the function with moe-ep-stages before "
              "lowering it to the GPU";
  bool isAdd = isa<arith::AddFOp>(op);
  if (!isAdd && !isa<UpdateSelectionBiasOp>(op) &&
      !isa<RouterOp, DispatchOp, ExpertFFNOp, SharedExpertOp, CombineOp,
           ExpertCombineGradOp, SharedExpertGradOp, RouterGradOp, CombineGradOp,
           ExpertFFNGradOp, EPDispatchOp, EPCombineOp, EPPackOp, EPUnpackOp,
           EPQueuesOp, GatherRowsOp, ScatterRowsOp, AuxLossOp, AuxLossGradOp>(
          op))
    return op->emitError() << "'" << op->getName()
                           << "' on tensors is not supported on the GPU path";
  // Static shapes, but for a leading dimension that follows a token count
  // with its bound.
  auto func = op->getParentOfType<func::FuncOp>();
  bool bounded = func && getMaxTokens(func);
  for (Value value : llvm::concat<Value>(op->getOperands(), op->getResults())) {
    Type type = value.getType();
    auto tensor = dyn_cast<RankedTensorType>(type);
    if (!tensor)
      return op->emitError("the GPU path needs static shapes, got ") << type;
    if (!tensor.hasStaticShape() && (!bounded || !isTokenShaped(value)))
      return op->emitError(bounded ? "the GPU path needs static shapes but "
                                     "for the token count, got "
                                   : "the GPU path needs static shapes (or a "
                                     "dynamic token count with its bound, "
                                     "moe.layer's max_tokens), got ")
             << type;
    if (llvm::is_contained(tensor.getShape(), 0))
      return op->emitError("the GPU path needs non-empty tensors, got ")
             << type;
  }
  for (Value value : getDataValues(op))
    if (!isDataType(cast<ShapedType>(value.getType()).getElementType()))
      return op->emitError() << "the GPU path runs " << gpu_contract::kDataDtype
                             << " data only, got " << value.getType();
  if (isAdd && cast<ShapedType>(op->getResult(0).getType()).getRank() == 0)
    return op->emitError("the GPU path adds tensors of rank 1 or more");
  if (std::optional<Activation> activation = getActivation(op);
      activation && !llvm::is_contained(gpu_contract::kActivations,
                                        stringifyActivation(*activation)))
    return op->emitError() << "the GPU path runs the "
                           << llvm::join(ArrayRef(gpu_contract::kActivations),
                                         ", ")
                           << " activation only, got "
                           << stringifyActivation(*activation);
  if (auto dispatch = dyn_cast<DispatchOp>(op);
      dispatch && dispatch.getCapacityFactor() &&
      !gpu_contract::kCapacityFactorSupported)
    return op->emitError("this GPU library is dropless: a capacity factor is "
                         "not supported");
  // The forward's GEMMs add the biases (bias variants, gemmRolesOf); their
  // gradients have no kernels yet.
  if (isa<ExpertFFNGradOp, ExpertCombineGradOp>(op) && hasExpertBias(op) &&
      !gpu_contract::kExpertBiasSupported)
    return op->emitError("the GPU path does not run expert biases (b_gate_up, "
                         "b_down) backward: no kernel computes their "
                         "gradients; run this layer on the CPU path");
  int64_t experts = 0;
  if (auto router = dyn_cast<RouterOp>(op))
    experts = cast<ShapedType>(router->getResult(2).getType()).getDimSize(1);
  if (auto dispatch = dyn_cast<DispatchOp>(op))
    experts =
        cast<ShapedType>(dispatch->getResult(1).getType()).getDimSize(0) - 1;
  experts = std::max(experts, getEPExperts(op));
  // The auxiliary losses count the selections in a shared-memory table.
  if (isa<AuxLossOp, AuxLossGradOp>(op))
    experts = cast<ShapedType>(op->getOperand(0).getType()).getDimSize(1);
  if (experts > gpu_contract::kMaxExperts)
    return op->emitError("the GPU path runs at most ")
           << gpu_contract::kMaxExperts << " experts, got " << experts;
  if (auto router = dyn_cast<RouterOp>(op)) {
    int64_t groups = router.getRouting().getNumGroups();
    if (groups > gpu_contract::kMaxExpertGroups)
      return op->emitError("the GPU path routes among at most ")
             << gpu_contract::kMaxExpertGroups << " expert groups, got "
             << groups;
  }
  for (auto [name, size] : getTiledSizes(op)) {
    if (size % gpu_contract::kTileMultiple != 0)
      return op->emitError()
             << "the GPU kernels need " << name << " to be a multiple of "
             << gpu_contract::kTileMultiple << ", got " << size;
    if (size > gpu_contract::kMaxWidth)
      return op->emitError() << "the GPU kernels take " << name << " up to "
                             << gpu_contract::kMaxWidth << ", got " << size;
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Parameters and their names
//===----------------------------------------------------------------------===//

StringRef dtypeName(Type type) {
  if (type.isBF16())
    return "bf16";
  if (type.isF32())
    return "f32";
  if (type.isInteger(32))
    return "i32";
  return "other";
}

MemRefType getBufferType(Type type) {
  if (auto host = dyn_cast<HostTensorType>(type))
    return MemRefType::get(host.getShape(), host.getElementType());
  auto tensor = cast<RankedTensorType>(type);
  return MemRefType::get(tensor.getShape(), tensor.getElementType());
}

/// One parameter of a converted function.
struct Param {
  std::string name;
  StringRef role;
  /// "forward_param" or "of", and its value; empty when neither applies.
  StringRef relation;
  std::string related;
  MemRefType type;
  /// Pinned host memory (an offloaded saved tensor) instead of the device's.
  bool host = false;
  /// With a dynamic leading dimension: its rows a token (T or T * k).
  int64_t rowsPerToken = 0;

  DictionaryAttr getAttr(MLIRContext *context) const {
    Builder b(context);
    SmallVector<NamedAttribute> entries = {
        b.getNamedAttr("name", b.getStringAttr(name)),
        b.getNamedAttr("role", b.getStringAttr(role)),
        b.getNamedAttr("dtype",
                       b.getStringAttr(dtypeName(type.getElementType()))),
        b.getNamedAttr("shape", b.getDenseI64ArrayAttr(type.getShape()))};
    if (!relation.empty())
      entries.push_back(b.getNamedAttr(relation, b.getStringAttr(related)));
    if (host)
      entries.push_back(b.getNamedAttr("memory", b.getStringAttr("host")));
    if (rowsPerToken > 0)
      entries.push_back(
          b.getNamedAttr("rows_per_token", b.getI64IntegerAttr(rowsPerToken)));
    return b.getDictionaryAttr(entries);
  }
};

enum class EntryKind { Forward, Backward, Plain };

StringRef entryName(EntryKind kind) {
  switch (kind) {
  case EntryKind::Forward:
    return "forward";
  case EntryKind::Backward:
    return "backward";
  case EntryKind::Plain:
    return "plain";
  }
  llvm_unreachable("unknown entry kind");
}

bool isFloatTensor(Type type) {
  auto tensor = dyn_cast<TensorType>(type);
  return tensor && isa<FloatType>(tensor.getElementType());
}

/// A function to convert and what its parameters are.
struct FunctionPlan {
  func::FuncOp func;
  EntryKind kind = EntryKind::Plain;
  std::string layerName;
  /// A stage of an expert-parallel forward or backward: its entry name
  /// ("forward_stage0") and moe.ep_* attributes.
  std::string stageEntry;
  DictionaryAttr stage;
  SmallVector<Param> inputs;
  /// One per result of `func`; std::nullopt for a dropped result (a saved
  /// forward argument).
  SmallVector<std::optional<Param>> outputs;
};

/// The `moe.saved` names of `backward`'s saved arguments, in order: the
/// names of the forward's saved results.
SmallVector<std::string> getSavedNames(func::FuncOp backward) {
  SmallVector<std::string> names;
  if (!backward)
    return names;
  for (unsigned i = 0, e = backward.getNumArguments(); i < e; ++i)
    if (auto name = backward.getArgAttrOfType<StringAttr>(i, kSavedAttr))
      names.push_back(name.str());
  return names;
}

std::string indexed(StringRef prefix, unsigned index) {
  return (prefix + Twine(index)).str();
}

FailureOr<FunctionPlan> planFunction(func::FuncOp func, SymbolTable &symbols) {
  FunctionPlan plan;
  plan.func = func;
  StringRef name = func.getSymName();
  FunctionType type = func.getFunctionType();
  std::optional<int64_t> bound = getMaxTokens(func);
  auto returnValues =
      cast<func::ReturnOp>(func.front().getTerminator()).getOperands();
  SmallVector<Value> values(func.getArguments());
  llvm::append_range(values, returnValues);
  for (Value value : values) {
    Type input = value.getType();
    bool isStatic = false;
    if (auto tensor = dyn_cast<RankedTensorType>(input))
      isStatic = tensor.hasStaticShape();
    else if (auto host = dyn_cast<HostTensorType>(input))
      isStatic = !ShapedType::isDynamicShape(host.getShape());
    if (!isStatic && !(bound && isTokenShaped(value)))
      return func.emitError("the GPU path needs functions on statically "
                            "shaped tensors (or a dynamic token count with "
                            "its bound, moe.max_tokens), got ")
             << input;
    std::optional<TokenBytes> bytes = getTokenBytes(value);
    if (!bytes || !bytes->at(bound.value_or(0)))
      return func.emitError("the GPU path takes tensors of at most 2^63 - 1 "
                            "bytes, got ")
             << input;
  }

  auto numSaved = func->getAttrOfType<IntegerAttr>(kNumSavedAttr);
  auto gradientArgs =
      func->getAttrOfType<DenseI64ArrayAttr>("moe.gradient_args");
  if (numSaved && name.ends_with("_forward")) {
    plan.kind = EntryKind::Forward;
    plan.layerName = name.drop_back(strlen("_forward")).str();
  } else if (gradientArgs && name.ends_with("_backward")) {
    plan.kind = EntryKind::Backward;
    plan.layerName = name.drop_back(strlen("_backward")).str();
  } else {
    plan.layerName = name.str();
  }
  // A stage of an expert-parallel forward or backward (moe-ep-stages): a
  // plain function whose entry point is named after its place.
  if (auto of = func->getAttrOfType<StringAttr>("moe.ep_stage_of")) {
    auto index = func->getAttrOfType<IntegerAttr>("moe.ep_stage");
    for (StringRef half : {"forward", "backward"})
      if (index && of.getValue().ends_with(("_" + half).str())) {
        plan.layerName = of.getValue().drop_back(half.size() + 1).str();
        plan.stageEntry = (half + "_stage" + Twine(index.getInt())).str();
      }
    SmallVector<NamedAttribute> entries;
    for (NamedAttribute attr : func->getAttrs())
      if (attr.getName().getValue().starts_with("moe.ep_"))
        entries.push_back(
            NamedAttribute(StringAttr::get(func.getContext(),
                                           attr.getName().getValue().drop_front(
                                               strlen("moe.ep_"))),
                           attr.getValue()));
    plan.stage = DictionaryAttr::get(func.getContext(), entries);
  }

  auto refuseHost = [&](Type t) {
    return func.emitError("only the saved tensors of a training forward and "
                          "backward pair can be host tensors, got ")
           << t;
  };
  auto returnOp = cast<func::ReturnOp>(func.front().getTerminator());
  switch (plan.kind) {
  case EntryKind::Forward: {
    int64_t saved = numSaved.getInt();
    int64_t original = static_cast<int64_t>(type.getNumResults()) - saved;
    if (saved < 0 || original < 0)
      return func.emitError("moe.num_saved exceeds the number of results");
    SmallVector<std::string> savedNames = getSavedNames(
        symbols.lookup<func::FuncOp>(plan.layerName + "_backward"));
    for (auto [i, input] : llvm::enumerate(type.getInputs())) {
      if (isa<HostTensorType>(input))
        return refuseHost(input);
      plan.inputs.push_back(
          {indexed("arg", i), "input", "", "", getBufferType(input)});
    }
    for (auto [i, result] : llvm::enumerate(type.getResults())) {
      int64_t index = static_cast<int64_t>(i);
      MemRefType bufferType = getBufferType(result);
      if (index < original && isa<HostTensorType>(result))
        return refuseHost(result);
      if (index < original) {
        plan.outputs.push_back(
            Param{indexed("result", i), "output", "", "", bufferType});
        continue;
      }
      // Backward takes a saved input again as the input itself.
      if (isa<BlockArgument>(returnOp.getOperand(i))) {
        plan.outputs.push_back(std::nullopt);
        continue;
      }
      int64_t s = index - original;
      std::string savedName = s < static_cast<int64_t>(savedNames.size())
                                  ? savedNames[s]
                                  : indexed("saved", static_cast<unsigned>(s));
      plan.outputs.push_back(Param{savedName, "saved", "", "", bufferType,
                                   isa<HostTensorType>(result)});
    }
    break;
  }
  case EntryKind::Backward: {
    // Cotangent j is the gradient of the j-th float result of @f.
    SmallVector<unsigned> floatResults;
    if (auto forward =
            symbols.lookup<func::FuncOp>(plan.layerName + "_forward")) {
      FunctionType forwardType = forward.getFunctionType();
      int64_t saved = 0;
      if (auto attr = forward->getAttrOfType<IntegerAttr>(kNumSavedAttr))
        saved = attr.getInt();
      int64_t original =
          static_cast<int64_t>(forwardType.getNumResults()) - saved;
      for (int64_t i = 0; i < original; ++i)
        if (isFloatTensor(forwardType.getResult(i)))
          floatResults.push_back(static_cast<unsigned>(i));
    }
    unsigned cotangent = 0;
    for (auto [i, input] : llvm::enumerate(type.getInputs())) {
      MemRefType bufferType = getBufferType(input);
      if (auto saved = func.getArgAttrOfType<StringAttr>(i, kSavedAttr)) {
        plan.inputs.push_back({saved.str(), "saved", "forward_param",
                               saved.str(), bufferType,
                               isa<HostTensorType>(input)});
        continue;
      }
      if (isa<HostTensorType>(input))
        return refuseHost(input);
      unsigned of =
          cotangent < floatResults.size() ? floatResults[cotangent] : cotangent;
      ++cotangent;
      plan.inputs.push_back({indexed("d_result", of), "cotangent", "of",
                             indexed("result", of), bufferType});
    }
    ArrayRef<int64_t> args = gradientArgs.asArrayRef();
    if (args.size() != type.getNumResults())
      return func.emitError("moe.gradient_args must name one argument per "
                            "result");
    for (auto [i, result] : llvm::enumerate(type.getResults())) {
      if (isa<HostTensorType>(result))
        return refuseHost(result);
      unsigned arg = static_cast<unsigned>(args[i]);
      plan.outputs.push_back(Param{indexed("d_arg", arg), "gradient", "of",
                                   indexed("arg", arg), getBufferType(result)});
    }
    break;
  }
  case EntryKind::Plain:
    for (Type t : llvm::concat<const Type>(type.getInputs(), type.getResults()))
      if (isa<HostTensorType>(t))
        return refuseHost(t);
    for (auto [i, input] : llvm::enumerate(type.getInputs()))
      plan.inputs.push_back(
          {indexed("arg", i), "input", "", "", getBufferType(input)});
    for (auto [i, result] : llvm::enumerate(type.getResults()))
      plan.outputs.push_back(
          Param{indexed("result", i), "output", "", "", getBufferType(result)});
    break;
  }
  // A dynamic leading dimension: its rows a token, for the entry points.
  for (auto [param, argument] : llvm::zip(plan.inputs, func.getArguments()))
    if (!param.type.hasStaticShape())
      param.rowsPerToken = getRowsPerToken(argument).value_or(0);
  for (auto [param, value] : llvm::zip(plan.outputs, returnOp.getOperands()))
    if (param && !param->type.hasStaticShape())
      param->rowsPerToken = getRowsPerToken(value).value_or(0);
  return plan;
}

/// The layer configuration of a forward function, from its router, expert
/// FFN and shared expert, for the manifest.
DictionaryAttr getLayerAttr(func::FuncOp func) {
  Builder b(func.getContext());
  SmallVector<NamedAttribute> entries;
  SmallVector<NamedAttribute> inputs;
  auto addInput = [&](StringRef key, Value value) {
    if (auto arg = dyn_cast_or_null<BlockArgument>(value))
      inputs.push_back(b.getNamedAttr(
          key, b.getStringAttr(indexed("arg", arg.getArgNumber()))));
  };
  auto dim = [](Value value, unsigned i) {
    return cast<ShapedType>(value.getType()).getDimSize(i);
  };
  auto addInt = [&](StringRef key, int64_t value) {
    entries.push_back(b.getNamedAttr(key, b.getI64IntegerAttr(value)));
  };
  RouterOp router;
  ExpertFFNOp experts;
  SharedExpertOp shared;
  func.walk([&](Operation *op) {
    if (auto r = dyn_cast<RouterOp>(op); r && !router)
      router = r;
    if (auto e = dyn_cast<ExpertFFNOp>(op); e && !experts)
      experts = e;
    if (auto s = dyn_cast<SharedExpertOp>(op); s && !shared)
      shared = s;
  });
  if (router) {
    RoutingAttr routing = router.getRouting();
    // A dynamic token count: T is its bound (`max_tokens` says so).
    int64_t tokens = dim(router.getX(), 0);
    if (std::optional<int64_t> bound = getMaxTokens(func);
        bound && ShapedType::isDynamic(tokens)) {
      tokens = *bound;
      addInt("max_tokens", *bound);
    }
    addInt("T", tokens);
    addInt("d", dim(router.getX(), 1));
    addInt("E", dim(router.getRouterWeight(), 1));
    addInt("k", static_cast<int64_t>(routing.getTopK()));
    entries.push_back(b.getNamedAttr(
        "scoring",
        b.getStringAttr(stringifyScoringFunc(routing.getScoring()))));
    entries.push_back(
        b.getNamedAttr("renormalize", b.getBoolAttr(routing.getRenormalize())));
    addInt("num_groups", routing.getNumGroups());
    addInt("topk_groups", routing.getTopkGroups());
    entries.push_back(b.getNamedAttr(
        "scaling_factor", b.getF64FloatAttr(routing.getScalingFactorValue())));
    entries.push_back(b.getNamedAttr("round_logits",
                                     b.getBoolAttr(routing.getRoundLogits())));
    entries.push_back(
        b.getNamedAttr("has_bias", b.getBoolAttr(router.getBias() != nullptr)));
    addInput("x", router.getX());
    addInput("w_router", router.getRouterWeight());
    addInput("bias", router.getBias());
  }
  if (experts) {
    addInt("n", dim(experts.getWDown(), 1));
    entries.push_back(b.getNamedAttr(
        "activation",
        b.getStringAttr(stringifyActivation(experts.getActivation()))));
    addInput("w_gate_up", experts.getWGateUp());
    addInput("w_down", experts.getWDown());
    entries.push_back(b.getNamedAttr(
        "expert_bias", b.getBoolAttr(experts.getBGateUp() != nullptr)));
    addInput("b_gate_up", experts.getBGateUp());
    addInput("b_down", experts.getBDown());
  }
  addInt("shared_n", shared ? dim(shared.getWDown(), 0) : 0);
  if (shared) {
    addInput("shared_w_gate_up", shared.getWGateUp());
    addInput("shared_w_down", shared.getWDown());
  }
  entries.push_back(b.getNamedAttr("inputs", b.getDictionaryAttr(inputs)));
  return b.getDictionaryAttr(entries);
}

//===----------------------------------------------------------------------===//
// Building the host function
//===----------------------------------------------------------------------===//

class HostFunctionBuilder {
public:
  explicit HostFunctionBuilder(Location loc) : loc(loc) {}

  Value token;
  int64_t liveBytes = 0;
  int64_t peakBytes = 0;

  /// `buffer` with every size dynamic, as the library takes it.
  Value dynamic(Value buffer) {
    auto type = cast<MemRefType>(buffer.getType());
    SmallVector<int64_t> shape(type.getRank(), ShapedType::kDynamic);
    return memref::CastOp::create(
        *b, loc, MemRefType::get(shape, type.getElementType()), buffer);
  }

  /// A 1-D dynamic view of all of `buffer`.
  Value flat(Value buffer) {
    auto type = cast<MemRefType>(buffer.getType());
    if (type.getRank() > 1) {
      ReassociationIndices all =
          llvm::to_vector(llvm::seq<int64_t>(0, type.getRank()));
      buffer = memref::CollapseShapeOp::create(
          *b, loc, buffer, ArrayRef<ReassociationIndices>{all});
    }
    return dynamic(buffer);
  }

  /// A size-0 dynamic view of rank `rank` of the f32 `buffer`: the library's
  /// "absent" for an optional operand.
  Value empty(Value buffer, int64_t rank) {
    SmallVector<int64_t> sizes(rank, 0);
    SmallVector<int64_t> strides(rank, 0);
    strides.back() = 1;
    auto type = MemRefType::get(
        sizes, cast<MemRefType>(buffer.getType()).getElementType());
    Value view =
        memref::ReinterpretCastOp::create(*b, loc, type, buffer,
                                          /*offset=*/0, sizes, strides);
    return dynamic(view);
  }

  /// With a dynamic token count: its bound, and the call's T (an index).
  int64_t maxTokens = 0;
  Value tokens;

  /// The bytes of `type` at `tokens` tokens, its leading dimension (where
  /// dynamic) `rows` rows a token.
  static int64_t getBytes(MemRefType type, int64_t rows = 0,
                          int64_t tokens = 0) {
    int64_t elements = 1;
    for (auto [i, size] : llvm::enumerate(type.getShape()))
      elements *= ShapedType::isDynamic(size) ? rows * tokens : size;
    return elements * static_cast<int64_t>(
                          llvm::divideCeil(type.getElementTypeBitWidth(), 8));
  }
  /// At the bound: what the workspace is planned for.
  int64_t bytesAtBound(MemRefType type, int64_t rows) const {
    return getBytes(type, rows, maxTokens);
  }
  /// The dynamic sizes of `type` at the call's T: its leading dimension
  /// `rows` a token.
  SmallVector<Value> dynamicSizes(MemRefType type, int64_t rows) {
    SmallVector<Value> sizes;
    if (type.getRank() > 0 && type.isDynamicDim(0))
      sizes.push_back(
          arith::MulIOp::create(*b, loc, tokens, index(rows)).getResult());
    return sizes;
  }
  /// The bytes of `type` at the call's T, as an i64.
  Value bytesValue(MemRefType type, int64_t rows) {
    if (type.hasStaticShape())
      return i64(getBytes(type));
    Value perToken = i64(getBytes(type, rows, /*tokens=*/1));
    Value t = arith::IndexCastOp::create(*b, loc, b->getI64Type(), tokens);
    return arith::MulIOp::create(*b, loc, perToken, t);
  }

  /// A buffer of `type` from the runtime's pool, its leading dimension (where
  /// dynamic) `rows` a token of the call's T.
  Value alloc(MemRefType type, int64_t rows = 0) {
    auto op = gpu::AllocOp::create(*b, loc, type, token.getType(),
                                   ValueRange{token}, dynamicSizes(type, rows),
                                   ValueRange{}, /*hostShared=*/false);
    token = op.getAsyncToken();
    liveBytes += bytesAtBound(type, rows);
    peakBytes = std::max(peakBytes, liveBytes);
    return op.getMemref();
  }

  void dealloc(Value buffer, int64_t rows = 0) {
    token = gpu::DeallocOp::create(*b, loc, token.getType(), ValueRange{token},
                                   buffer)
                .getAsyncToken();
    liveBytes -= bytesAtBound(cast<MemRefType>(buffer.getType()), rows);
  }

  void copy(Value dst, Value src) {
    token = gpu::MemcpyOp::create(*b, loc, token.getType(), ValueRange{token},
                                  dst, src)
                .getAsyncToken();
  }

  void call(StringRef callee, ValueRange operands) {
    SmallVector<Value> args = {token};
    llvm::append_range(args, operands);
    auto op =
        func::CallOp::create(*b, loc, callee, TypeRange{token.getType()}, args);
    token = op.getResult(0);
  }

  /// The address of `buffer`'s first element (its aligned pointer: the
  /// buffers here have offset 0; a view's shift is in that pointer), as an
  /// i64 for the runtime.
  Value address(Value buffer) {
    Value index =
        memref::ExtractAlignedPointerAsIndexOp::create(*b, loc, buffer);
    return arith::IndexCastOp::create(*b, loc, b->getI64Type(), index);
  }

  /// A call of the runtime function `callee` (declared in `module` on first
  /// use) between the launches: it acts on the call's stream in host order.
  /// Returns its result, if `result` names a type.
  Value callRuntime(ModuleOp module, StringRef callee, ValueRange operands,
                    Type result = {}) {
    SmallVector<Type> results;
    if (result)
      results.push_back(result);
    if (!module.lookupSymbol(callee)) {
      OpBuilder::InsertionGuard guard(*b);
      b->setInsertionPointToStart(module.getBody());
      auto decl = func::FuncOp::create(
          *b, loc, callee,
          b->getFunctionType(TypeRange(ValueRange(operands)), results));
      decl.setPrivate();
    }
    auto call = func::CallOp::create(*b, loc, callee, results, operands);
    return result ? call.getResult(0) : Value();
  }

  /// A memref of `type` (identity layout) on the device buffer at `address`
  /// (an i64 from the runtime): its descriptor in the LLVM dialect, which the
  /// lowering to LLVM takes as the memref's.
  Value memrefAt(Value address, MemRefType type, int64_t rows = 0) {
    MLIRContext *context = b->getContext();
    auto ptrType = LLVM::LLVMPointerType::get(context);
    Type i64 = b->getI64Type();
    auto array = LLVM::LLVMArrayType::get(i64, type.getRank());
    auto descriptorType = LLVM::LLVMStructType::getLiteral(
        context, {ptrType, ptrType, i64, array, array});
    Value pointer = LLVM::IntToPtrOp::create(*b, loc, ptrType, address);
    Value descriptor = LLVM::PoisonOp::create(*b, loc, descriptorType);
    auto insert = [&](Value value, ArrayRef<int64_t> position) {
      descriptor =
          LLVM::InsertValueOp::create(*b, loc, descriptor, value, position);
    };
    auto constant = [&](int64_t value) {
      return LLVM::ConstantOp::create(*b, loc, i64,
                                      b->getI64IntegerAttr(value));
    };
    insert(pointer, {0});
    insert(pointer, {1});
    insert(constant(0), {2});
    // Only the leading size may be dynamic: the strides are static.
    int64_t stride = 1;
    for (int64_t i = type.getRank() - 1; i >= 0; --i) {
      Value size = type.isDynamicDim(i)
                       ? arith::IndexCastOp::create(
                             *b, loc, i64, dynamicSizes(type, rows).front())
                             .getResult()
                       : constant(type.getDimSize(i));
      insert(size, {3, i});
      insert(constant(stride), {4, i});
      stride *= type.isDynamicDim(i) ? 1 : type.getDimSize(i);
    }
    return UnrealizedConversionCastOp::create(*b, loc, type, descriptor)
        .getResult(0);
  }

  Value i1(bool value) {
    return arith::ConstantIntOp::create(*b, loc, b->getI1Type(), value);
  }
  Value i64(int64_t value) {
    return arith::ConstantIntOp::create(*b, loc, b->getI64Type(), value);
  }
  Value i32(int64_t value) {
    return arith::ConstantIntOp::create(*b, loc, b->getI32Type(), value);
  }
  Value index(int64_t value) {
    return arith::ConstantIndexOp::create(*b, loc, value);
  }
  Value f32(double value) {
    return arith::ConstantFloatOp::create(*b, loc, b->getF32Type(),
                                          APFloat(static_cast<float>(value)));
  }

  /// Where the ops go: the rewriter of the pattern at work, at its op.
  OpBuilder *b = nullptr;
  Location loc;
};

/// Whether the library has no kernel of `config`'s GEMM: a non-gated
/// activation's or an expert bias's, built with the host function variants
/// that run them.
bool isVariantOnly(const moe_gpu::GemmConfig &config) {
  return !moe_gpu::isGatedActivation(config) || config.bias;
}

/// The configs `op`'s `moe_gpu.kernels` choose for the GEMM roles of the host
/// function `base`, where that function has variants.
SmallVector<HostGemmConfig> getChosenConfigs(Operation *op, StringRef base) {
  SmallVector<HostGemmConfig> configs;
  auto kernels = op->getAttrOfType<DictionaryAttr>(moe_gpu::kKernelsAttrName);
  // Without a choice, a non-gated op still runs its activation's up and dact
  // GEMMs, which the library does not have (gemmRolesOf).
  SmallVector<moe_gpu::GemmRole> roles = moe_gpu::gemmRolesOf(op);
  for (const HostGemmConfig &role : libraryHostGemmConfigs(base)) {
    if (kernels)
      if (auto config = kernels.getAs<moe_gpu::GemmConfigAttr>(role.role)) {
        configs.push_back({role.role, config.getConfig()});
        continue;
      }
    for (const moe_gpu::GemmRole &own : roles)
      if (own.name == role.role && isVariantOnly(own.libraryConfig))
        configs.push_back({role.role, own.libraryConfig});
  }
  return configs;
}

/// The host function of `op` where the library's is `base`: `base`, or its
/// variant for the configs `op` chooses (libraryHostFunctionVariantName).
std::string getHostCallee(Operation *op, StringRef base) {
  return libraryHostFunctionVariantName(base, getChosenConfigs(op, base));
}

/// The library host functions with variants that `op` may call: those of
/// its host functions that the builder varies (libraryHostGemmConfigs).
SmallVector<StringRef> getVariantBases(Operation *op) {
  SmallVector<StringRef> callees =
      TypeSwitch<Operation *, SmallVector<StringRef>>(op)
          .Case([](RouterOp) -> SmallVector<StringRef> {
            return {"__moe_gpu_router", "__moe_gpu_router_aux"};
          })
          .Case([](RouterGradOp) -> SmallVector<StringRef> {
            return {"__moe_gpu_router_grad", "__moe_gpu_router_grad_acc",
                    "__moe_gpu_router_grad_aux",
                    "__moe_gpu_router_grad_aux_acc"};
          })
          .Case([](ExpertFFNOp) -> SmallVector<StringRef> {
            return {"__moe_gpu_expert_ffn", "__moe_gpu_expert_ffn_h"};
          })
          .Case([](SharedExpertOp) -> SmallVector<StringRef> {
            return {"__moe_gpu_shared_expert", "__moe_gpu_shared_expert_h"};
          })
          .Case([](ExpertCombineGradOp op) -> SmallVector<StringRef> {
            if (op.getBGateUp())
              return {"__moe_gpu_expert_combine_grad_bias",
                      "__moe_gpu_expert_combine_grad_bias_acc"};
            return {"__moe_gpu_expert_combine_grad",
                    "__moe_gpu_expert_combine_grad_acc"};
          })
          .Case([](SharedExpertGradOp) -> SmallVector<StringRef> {
            return {"__moe_gpu_shared_expert_grad"};
          })
          .Case([](ExpertFFNGradOp op) -> SmallVector<StringRef> {
            if (op.getBGateUp())
              return {"__moe_gpu_expert_ffn_grad_bias"};
            return {"__moe_gpu_expert_ffn_grad"};
          })
          .Default([](Operation *) { return SmallVector<StringRef>(); });
  llvm::erase_if(callees, [](StringRef callee) {
    return libraryHostGemmConfigs(callee).empty();
  });
  return callees;
}

/// The results of `op` that become temporaries of the host function (in its
/// arena, or an allocation of their own): neither parameters nor a y nobody
/// reads.
SmallVector<Value> getTemporaries(Operation &op,
                                  const DenseMap<Value, Value> &buffers) {
  SmallVector<Value> temporaries;
  if (isa<PrefetchOp, OffloadOp>(op) || !hasTensors(&op))
    return temporaries;
  bool onlyH = isa<ExpertFFNOp, SharedExpertOp>(op) &&
               op.getResult(0).use_empty() && !buffers.count(op.getResult(0));
  for (Value result : op.getResults())
    if (!buffers.count(result) && !(onlyH && result == op.getResult(0)))
      temporaries.push_back(result);
  return temporaries;
}

/// The offsets in the function's arena of the `temporaries` (getTemporaries,
/// by op) that live there, as moe-plan-memory placed them (`moe.arena_offsets`
/// on the ops, `moe.arena_size` on the function), and the arena's size in
/// `arenaBytes`. The plan is checked against the temporaries made here:
/// every one of them in the arena but an offloaded tensor (the runtime frees
/// it after its copy), nothing else there, each aligned and inside the
/// arena, no two that are live together overlapping.
FailureOr<DenseMap<Value, int64_t>>
readArenaPlan(func::FuncOp func,
              const DenseMap<Operation *, SmallVector<Value>> &temporaries,
              const DenseMap<Operation *, SmallVector<Value>> &freeAfter,
              int64_t &arenaBytes) {
  Block &body = func.front();
  DenseMap<Operation *, unsigned> position;
  for (Operation &op : body.without_terminator())
    position[&op] = position.size();
  DenseMap<Value, unsigned> lastUse;
  for (auto &[op, values] : freeAfter)
    for (Value value : values)
      lastUse[value] = position.lookup(op);

  int64_t bound = getMaxTokens(func).value_or(0);
  auto sizeAttr = func->getAttrOfType<IntegerAttr>(kArenaSizeAttr);
  arenaBytes = sizeAttr ? sizeAttr.getInt() : 0;
  auto rerun = [](InFlightDiagnostic diag) -> InFlightDiagnostic {
    return std::move(diag) << "; run moe-plan-memory right before "
                              "convert-moe-to-gpu (moe-training-pipeline does)";
  };
  SmallVector<Value> values;
  SmallVector<ArenaBuffer> requests;
  SmallVector<uint64_t> offsets;
  for (Operation &op : body.without_terminator()) {
    SmallVector<Value> opTemporaries = temporaries.lookup(&op);
    auto planned = op.getAttrOfType<DenseI64ArrayAttr>(kArenaOffsetsAttr);
    if (planned && planned.size() != static_cast<int64_t>(op.getNumResults()))
      return op.emitOpError("has ")
             << planned.size() << " moe.arena_offsets for "
             << op.getNumResults() << " results";
    for (OpResult result : op.getResults()) {
      int64_t offset = planned ? planned[result.getResultNumber()] : -1;
      bool temporary = llvm::is_contained(opTemporaries, result) &&
                       llvm::none_of(result.getUsers(), [](Operation *user) {
                         return isa<OffloadOp>(user);
                       });
      if (temporary && offset < 0)
        return rerun(op.emitOpError("result #")
                     << result.getResultNumber()
                     << " has no place in the arena of @" << func.getSymName());
      if (!temporary && offset >= 0)
        return rerun(op.emitOpError("result #")
                     << result.getResultNumber()
                     << " is planned in the arena, where the GPU path keeps "
                        "only the function's temporaries");
      if (!temporary)
        continue;
      // With a dynamic token count, at the bound (the plan's size).
      int64_t bytes = HostFunctionBuilder::getBytes(
          getBufferType(result.getType()), getRowsPerToken(result).value_or(0),
          bound);
      if (offset % kArenaAlignment != 0 || bytes > arenaBytes ||
          offset > arenaBytes - bytes)
        return rerun(op.emitOpError("result #")
                     << result.getResultNumber() << " (" << bytes
                     << " B) is planned at offset " << offset
                     << " of an arena of " << arenaBytes
                     << " B; the GPU path needs it inside, at a multiple of "
                     << kArenaAlignment << " B");
      values.push_back(result);
      requests.push_back({static_cast<uint64_t>(bytes), position.lookup(&op),
                          lastUse.lookup(result)});
      offsets.push_back(static_cast<uint64_t>(offset));
    }
  }
  if (auto overlap = findArenaOverlap(requests, offsets))
    return rerun(func.emitOpError("has temporaries planned to overlap while "
                                  "both are live: ")
                 << values[overlap->first] << " and "
                 << values[overlap->second]);
  DenseMap<Value, int64_t> result;
  for (auto [value, offset] : llvm::zip(values, offsets))
    result[value] = static_cast<int64_t>(offset);
  return result;
}

/// The `accumulate` operand of `op` (moe-fold-adds folds an add into it),
/// and the host function whose `_acc` form adds the op's result to what its
/// buffer holds; null for any other op, or one without `accumulate`.
std::pair<Value, StringRef> getAccumulate(Operation *op) {
  OpOperand *accumulate = getAccumulateOperand(op);
  if (!accumulate)
    return {};
  StringRef callee =
      TypeSwitch<Operation *, StringRef>(op)
          .Case([](RouterGradOp) { return "__moe_gpu_router_grad"; })
          .Case([](ExpertCombineGradOp op) {
            return op.getBGateUp() ? "__moe_gpu_expert_combine_grad_bias"
                                   : "__moe_gpu_expert_combine_grad";
          })
          .Default([](Operation *) { return "__moe_gpu_combine"; });
  return {accumulate->get(), callee};
}

/// Checks the ops of `body` that accumulate (moe-fold-adds): the library
/// has their `_acc` host function, and the dx config chosen can accumulate;
/// their result has a buffer of its own (the function returns it, or it is
/// the `accumulate` of another such op); their `accumulate` is made by an op
/// of `body` (not a moe.prefetch, whose buffer is the runtime's) and read by
/// them alone, so that it can be written straight into the result's buffer.
LogicalResult checkAccumulating(Block &body,
                                function_ref<bool(StringRef)> libraryHas,
                                StringRef libraryName) {
  for (Operation &op : body.without_terminator()) {
    auto [accumulate, base] = getAccumulate(&op);
    if (!accumulate)
      continue;
    std::string callee = (base + kAccumulateSuffix).str();
    if (!libraryHas(callee))
      return op.emitError() << "the GPU library " << libraryName << " has no @"
                            << callee << " for an op that accumulates";
    if (!canBuildLibraryHostFunction(callee, getChosenConfigs(&op, callee)))
      return op.emitError()
             << "'" << moe_gpu::kKernelsAttrName << "' chooses a config of @"
             << callee << " that cannot accumulate";
    Value result = getAccumulatedResult(&op);
    bool ownBuffer = llvm::any_of(result.getUses(), [](OpOperand &use) {
      Operation *user = use.getOwner();
      return isa<func::ReturnOp>(user) ||
             getAccumulate(user).first == use.get();
    });
    if (!ownBuffer)
      return op.emitError("the GPU path needs the result of an op that "
                          "accumulates returned or accumulated into");
    Operation *producer = accumulate.getDefiningOp();
    if (!producer || producer->getBlock() != &body ||
        isa<PrefetchOp>(producer) || !accumulate.hasOneUse())
      return op.emitError("the GPU path needs the accumulate operand made "
                          "by an op of the function's body (not a "
                          "moe.prefetch) and read by this op alone");
  }
  return success();
}

//===----------------------------------------------------------------------===//
// The plan of a host function
//===----------------------------------------------------------------------===//

/// What the patterns of one function share: the host function, the builder
/// of its calls, and the plan made before they run (planHostFunction: where
/// each tensor lives, the temporaries, their offsets in the
/// arena and the op after which each is freed), which they complete as they
/// go (the temporaries' buffers, the prefetches still to await). The patterns
/// convert the ops in order, each emitting its work right before its op, so
/// the host function runs that work in the ops' order, threaded by one token
/// (`h.token`).
struct HostCallContext {
  explicit HostCallContext(Location loc) : h(loc) {}

  /// The function on tensors, its module and its terminator.
  func::FuncOp func;
  ModuleOp module;
  func::ReturnOp returnOp;
  /// The host function (its parameters the plan's inputs, then its outputs)
  /// and its entry block, empty until the function's pattern fills it.
  func::FuncOp host;
  Block *entry = nullptr;
  SmallVector<Param> params;
  HostFunctionBuilder h;

  /// Where each tensor lives: arguments in their parameters, returned values
  /// in (the first of) their out-parameters, the `accumulate` operand of an
  /// op in its result's buffer; a temporary from when its op is converted, a
  /// prefetched tensor from the function's start.
  DenseMap<Value, Value> buffers;
  /// (out-parameter, value) pairs copied at the end: a returned argument, or
  /// a value returned twice.
  SmallVector<std::pair<Value, Value>> copies;
  /// The results of each op that become temporaries (getTemporaries).
  DenseMap<Operation *, SmallVector<Value>> temporaries;
  /// The temporaries freed after each op, their last reader.
  DenseMap<Operation *, SmallVector<Value>> freeAfter;
  /// The temporaries in the arena, at their offsets; its size; the arena.
  DenseMap<Value, int64_t> arenaOffsets;
  int64_t arenaBytes = 0;
  Value arena;
  /// The prefetched tensors the call's stream has not waited for yet, and
  /// the runtime's address of each.
  SmallVector<Value> prefetching;
  DenseMap<Value, Value> prefetchAddress;
  /// Whether a tensor was offloaded (the function then finishes the
  /// offloads).
  bool offloaded = false;
  /// The layer configuration, on a forward or plain function.
  DictionaryAttr layerAttr;

  Value bufferOf(Value value) const { return buffers.lookup(value); }

  /// Whether `op` adds its result to what its buffer holds (its
  /// `accumulate`, a folded add).
  static bool accumulates(Operation *op) {
    return getAccumulate(op).first != nullptr;
  }

  /// Points `h` at `op`: its work goes right before it.
  void startOp(ConversionPatternRewriter &rewriter, Operation *op) {
    h.b = &rewriter;
    rewriter.setInsertionPoint(op);
    h.loc = op->getLoc();
  }

  /// The call's stream waits for those of `values` still being prefetched.
  void awaitPrefetches(ValueRange values) {
    for (Value value : values) {
      auto *it = llvm::find(prefetching, value);
      if (it == prefetching.end())
        continue;
      h.callRuntime(module, "mgpuMoeAwaitPrefetch",
                    {prefetchAddress.lookup(value)});
      prefetching.erase(it);
    }
  }

  /// The arena, one allocation a call. With a dynamic token count it holds
  /// what the call's T needs: the buffers stay at the offsets planned at the
  /// bound, and it ends at the furthest end of a buffer at T (rounded to the
  /// arena's alignment), so that a call at a small T does not hold the
  /// bound's workspace.
  Value allocateArena() {
    auto i8 = IntegerType::get(host.getContext(), 8);
    int64_t fixedEnd = 0;
    SmallVector<std::pair<int64_t, int64_t>> tokenEnds; // offset, B a token
    for (auto &[value, offset] : arenaOffsets) {
      MemRefType type = getBufferType(value.getType());
      int64_t rows = rowsPerToken(value);
      if (h.tokens && !type.hasStaticShape())
        tokenEnds.push_back(
            {offset, HostFunctionBuilder::getBytes(type, rows, /*tokens=*/1)});
      else
        fixedEnd =
            std::max(fixedEnd, offset + HostFunctionBuilder::getBytes(type));
    }
    if (tokenEnds.empty())
      return h.alloc(MemRefType::get({arenaBytes}, i8));
    // Deterministic IR: the ends in the order of their offsets.
    llvm::sort(tokenEnds);
    OpBuilder &b = *h.b;
    Value end = h.index(fixedEnd);
    for (auto [offset, perToken] : tokenEnds) {
      Value bytes =
          arith::MulIOp::create(b, h.loc, h.tokens, h.index(perToken));
      Value bufferEnd = arith::AddIOp::create(b, h.loc, bytes, h.index(offset));
      end = arith::MaxUIOp::create(b, h.loc, end, bufferEnd);
    }
    Value mask = h.index(static_cast<int64_t>(kArenaAlignment) - 1);
    Value aligned = arith::AndIOp::create(
        b, h.loc, arith::AddIOp::create(b, h.loc, end, mask),
        arith::XOrIOp::create(b, h.loc, mask, h.index(-1)));
    auto op = gpu::AllocOp::create(
        b, h.loc, MemRefType::get({ShapedType::kDynamic}, i8),
        h.token.getType(), ValueRange{h.token}, ValueRange{aligned},
        ValueRange{}, /*hostShared=*/false);
    h.token = op.getAsyncToken();
    // The workspace reported is the bound's, enough for every T.
    h.liveBytes += arenaBytes;
    h.peakBytes = std::max(h.peakBytes, h.liveBytes);
    return op.getMemref();
  }

  /// Gives the temporaries of `op` their buffers: a view of the arena at
  /// their offset, or an allocation of their own.
  void allocateTemporaries(Operation *op) {
    for (Value result : temporaries.lookup(op)) {
      MemRefType type = getBufferType(result.getType());
      int64_t rows = rowsPerToken(result);
      auto planned = arenaOffsets.find(result);
      buffers[result] = planned == arenaOffsets.end()
                            ? h.alloc(type, rows)
                            : memref::ViewOp::create(*h.b, h.loc, type, arena,
                                                     h.index(planned->second),
                                                     h.dynamicSizes(type, rows))
                                  .getResult();
    }
  }

  /// Frees those of `values` that have an allocation of their own.
  void deallocTemporaries(ArrayRef<Value> values) {
    for (Value value : values)
      if (Value buffer = buffers.lookup(value);
          buffer && !arenaOffsets.count(value))
        h.dealloc(buffer, rowsPerToken(value));
  }

  /// Rows a token of `value`'s leading dimension (0 where it does not
  /// follow T; the conversion checked the others).
  static int64_t rowsPerToken(Value value) {
    return getRowsPerToken(value).value_or(0);
  }

  /// Replaces `op` with the buffers of its results; a y nobody reads has
  /// none.
  void replaceWithBuffers(ConversionPatternRewriter &rewriter, Operation *op) {
    SmallVector<SmallVector<Value>> replacements;
    for (Value result : op->getResults()) {
      SmallVector<Value> &replacement = replacements.emplace_back();
      if (Value buffer = buffers.lookup(result))
        replacement.push_back(buffer);
    }
    rewriter.replaceOpWithMultiple(op, std::move(replacements));
  }
};

/// Creates the host function of `plan` (its parameters; before `plan.func`)
/// and plans its buffers into `ctx`. The work that waits for a prefetch
/// comes after the rest already (moe-offload schedules it so).
LogicalResult planHostFunction(FunctionPlan &plan, HostCallContext &ctx) {
  func::FuncOp func = plan.func;
  MLIRContext *context = func.getContext();
  Block &body = func.front();
  ctx.func = func;
  ctx.module = func->getParentOfType<ModuleOp>();
  ctx.returnOp = cast<func::ReturnOp>(body.getTerminator());

  ctx.params.assign(plan.inputs.begin(), plan.inputs.end());
  SmallVector<int> outParamOf; // result -> parameter index, or -1
  for (const std::optional<Param> &output : plan.outputs) {
    outParamOf.push_back(output ? static_cast<int>(ctx.params.size()) : -1);
    if (output)
      ctx.params.push_back(*output);
  }
  SmallVector<Type> paramTypes = llvm::map_to_vector(
      ctx.params, [](const Param &param) -> Type { return param.type; });

  OpBuilder b(func);
  ctx.host = func::FuncOp::create(b, func.getLoc(), func.getSymName(),
                                  FunctionType::get(context, paramTypes, {}));
  ctx.host.setVisibility(func.getVisibility());
  ctx.entry = ctx.host.addEntryBlock();

  // Where each tensor lives: arguments in their parameters, returned values
  // in (the first of) their out-parameters.
  DenseMap<Value, Value> &buffers = ctx.buffers;
  for (BlockArgument arg : body.getArguments())
    buffers[arg] = ctx.entry->getArgument(arg.getArgNumber());
  for (auto [i, value] : llvm::enumerate(ctx.returnOp.getOperands())) {
    if (outParamOf[i] < 0)
      continue;
    Value param = ctx.entry->getArgument(outParamOf[i]);
    if (isa<BlockArgument>(value) || buffers.count(value))
      ctx.copies.push_back({param, value});
    else
      buffers[value] = param;
  }

  // An op that accumulates (moe-fold-adds) adds its result to what its
  // `accumulate` operand wrote into the result's buffer (checkAccumulating):
  // neither is a temporary. The last first: the result may be the
  // `accumulate` of a later op.
  for (Operation &op : llvm::reverse(body.without_terminator()))
    if (Value accumulate = getAccumulate(&op).first)
      buffers[accumulate] = buffers.lookup(getAccumulatedResult(&op));

  // Temporaries are freed after the last op that reads them.
  for (Operation &op : body.without_terminator())
    for (Value result : op.getResults()) {
      if (buffers.count(result) || !isTensor(result.getType()))
        continue;
      Operation *last = &op;
      for (Operation *user : result.getUsers())
        if (last->isBeforeInBlock(user))
          last = user;
      ctx.freeAfter[last].push_back(result);
    }

  // An expert FFN whose y nobody reads (H recomputed in backward) gets no
  // buffer for y, and runs only its up projection.
  for (Operation &op : body.without_terminator())
    if (SmallVector<Value> temporaries = getTemporaries(op, buffers);
        !temporaries.empty())
      ctx.temporaries[&op] = std::move(temporaries);
  // The temporaries in one arena at moe-plan-memory's offsets: one
  // allocation a call.
  FailureOr<DenseMap<Value, int64_t>> arenaOffsets =
      readArenaPlan(func, ctx.temporaries, ctx.freeAfter, ctx.arenaBytes);
  if (failed(arenaOffsets))
    return failure();
  ctx.arenaOffsets = std::move(*arenaOffsets);

  if (plan.kind != EntryKind::Backward)
    ctx.layerAttr = getLayerAttr(func);
  ctx.h.maxTokens = getMaxTokens(func).value_or(0);
  return success();
}

//===----------------------------------------------------------------------===//
// One pattern per op
//===----------------------------------------------------------------------===//

/// The function on tensors: the host function's entry gets the call's first
/// token, the arena and the start of every prefetch (their copies overlap the
/// work before their first reader), then the body, whose arguments become
/// the host function's parameters.
class LowerFunction : public OpConversionPattern<func::FuncOp> {
public:
  LowerFunction(const TypeConverter &typeConverter, HostCallContext &ctx)
      : OpConversionPattern(typeConverter, ctx.host.getContext()), ctx(ctx) {}

  LogicalResult
  matchAndRewrite(func::FuncOp func, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    HostFunctionBuilder &h = ctx.h;
    h.b = &rewriter;
    rewriter.setInsertionPointToEnd(ctx.entry);
    auto tokenType = gpu::AsyncTokenType::get(rewriter.getContext());
    h.token =
        gpu::WaitOp::create(rewriter, func.getLoc(), tokenType, ValueRange{})
            .getAsyncToken();
    // A dynamic token count: T of the call from the leading size of the
    // first parameter that follows it.
    for (auto [param, argument] :
         llvm::zip(ctx.params, ctx.entry->getArguments()))
      if (param.rowsPerToken > 0 && !h.tokens) {
        Value size =
            memref::DimOp::create(rewriter, func.getLoc(), argument, 0);
        h.tokens = arith::DivUIOp::create(rewriter, func.getLoc(), size,
                                          h.index(param.rowsPerToken));
      }
    if (ctx.arenaBytes > 0)
      ctx.arena = ctx.allocateArena();

    // Prefetches start before everything else, into buffers of their own;
    // the call's stream waits for one right before its first reader.
    Block &body = func.front();
    for (auto prefetch : body.getOps<PrefetchOp>()) {
      h.loc = prefetch.getLoc();
      MemRefType type = getBufferType(prefetch.getType());
      int64_t rows = HostCallContext::rowsPerToken(prefetch.getDevice());
      // The runtime allocates the buffer on its copy stream: the copy then
      // need not wait for the work enqueued before this call.
      Value address =
          h.callRuntime(ctx.module, "mgpuMoePrefetch",
                        {h.address(ctx.bufferOf(prefetch.getHost())),
                         h.bytesValue(type, rows)},
                        rewriter.getI64Type());
      ctx.buffers[prefetch.getDevice()] = h.memrefAt(address, type, rows);
      h.liveBytes += h.bytesAtBound(type, rows);
      h.peakBytes = std::max(h.peakBytes, h.liveBytes);
      ctx.prefetchAddress[prefetch.getDevice()] = address;
      ctx.prefetching.push_back(prefetch.getDevice());
    }

    rewriter.inlineBlockBefore(
        &body, ctx.entry, ctx.entry->end(),
        ctx.entry->getArguments().take_front(body.getNumArguments()));
    rewriter.eraseOp(func);
    return success();
  }

private:
  HostCallContext &ctx;
};

/// The function's return: the call's stream waits for the prefetches nobody
/// read, the values returned as they are copy into their out-parameters,
/// the arena is freed, the offloads finish, and the host waits for the
/// stream.
class LowerReturn : public OpConversionPattern<func::ReturnOp> {
public:
  LowerReturn(const TypeConverter &typeConverter, HostCallContext &ctx)
      : OpConversionPattern(typeConverter, ctx.host.getContext()), ctx(ctx) {}

  LogicalResult
  matchAndRewrite(func::ReturnOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    HostFunctionBuilder &h = ctx.h;
    ctx.startOp(rewriter, op);
    ctx.awaitPrefetches(SmallVector<Value>(ctx.prefetching));
    for (auto [param, value] : ctx.copies)
      h.copy(param, ctx.bufferOf(value));
    if (ctx.arena) {
      bool sizedAtT = cast<MemRefType>(ctx.arena.getType()).isDynamicDim(0);
      h.dealloc(ctx.arena);
      if (sizedAtT)
        h.liveBytes -= ctx.arenaBytes;
    }
    if (ctx.offloaded)
      h.callRuntime(ctx.module, "mgpuMoeOffloadsFinish", {});
    gpu::WaitOp::create(rewriter, h.loc, Type(), ValueRange{h.token});
    rewriter.replaceOpWithNewOp<func::ReturnOp>(op);
    return success();
  }

private:
  HostCallContext &ctx;
};

/// moe.prefetch: started with the function (LowerFunction); freed here when
/// nothing reads it.
class LowerPrefetch : public OpConversionPattern<PrefetchOp> {
public:
  LowerPrefetch(const TypeConverter &typeConverter, HostCallContext &ctx)
      : OpConversionPattern(typeConverter, ctx.host.getContext()), ctx(ctx) {}

  LogicalResult
  matchAndRewrite(PrefetchOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    ctx.startOp(rewriter, op);
    for (Value value : ctx.freeAfter.lookup(op)) {
      ctx.awaitPrefetches(value);
      ctx.h.dealloc(ctx.bufferOf(value), HostCallContext::rowsPerToken(value));
    }
    ctx.replaceWithBuffers(rewriter, op);
    return success();
  }

private:
  HostCallContext &ctx;
};

/// moe.offload: the runtime copies the tensor into the out-parameter in
/// pinned host memory on its copy stream, and frees the device buffer once
/// it is copied when nothing reads it after.
class LowerOffload : public OpConversionPattern<OffloadOp> {
public:
  LowerOffload(const TypeConverter &typeConverter, HostCallContext &ctx)
      : OpConversionPattern(typeConverter, ctx.host.getContext()), ctx(ctx) {}

  LogicalResult
  matchAndRewrite(OffloadOp op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const override {
    HostFunctionBuilder &h = ctx.h;
    ctx.startOp(rewriter, op);
    Value source = op.getSource();
    Value device = adaptor.getSource();
    SmallVector<Value> &freed = ctx.freeAfter[op];
    auto *last = llvm::find(freed, source);
    bool handOver = last != freed.end();
    auto deviceType = cast<MemRefType>(device.getType());
    int64_t rows = HostCallContext::rowsPerToken(source);
    if (handOver) {
      freed.erase(last);
      h.liveBytes -= h.bytesAtBound(deviceType, rows);
    }
    ctx.awaitPrefetches(source);
    h.callRuntime(ctx.module, "mgpuMoeOffload",
                  {h.address(ctx.bufferOf(op.getHost())), h.address(device),
                   h.bytesValue(deviceType, rows), h.i32(handOver)});
    ctx.offloaded = true;
    ctx.deallocTemporaries(freed);
    ctx.replaceWithBuffers(rewriter, op);
    return success();
  }

private:
  HostCallContext &ctx;
};

/// The arguments of an op's host function call, in the order of the contract
/// (docs/gpu-path.md): its tensor operands, its scalar config, then its
/// results, each buffer with every size dynamic.
class HostCall {
public:
  HostCall(HostCallContext &ctx, Operation *op, ValueRange operands)
      : ctx(ctx), op(op), operands(operands) {}

  /// The buffers of the op's operands (its adaptor's).
  void addOperands() {
    for (Value operand : operands)
      args.push_back(ctx.h.dynamic(operand));
  }
  void addResults() {
    for (Value result : op->getResults())
      args.push_back(ctx.h.dynamic(ctx.bufferOf(result)));
  }
  void addActivation() {
    args.push_back(ctx.h.i32(static_cast<int32_t>(*getActivation(op))));
  }

  /// Calls the host function `base`, or its variant for the op's configs
  /// (getHostCallee); with `accumulate`, its `_acc` form, which adds the
  /// op's result to what its buffer holds (the op's `accumulate` operand).
  void call(StringRef base, bool accumulate = false) {
    std::string callee =
        accumulate ? (base + kAccumulateSuffix).str() : base.str();
    ctx.h.call(getHostCallee(op, callee), args);
  }
  /// Calls `callee`, a host function without variants.
  void callExactly(StringRef callee) { ctx.h.call(callee, args); }

  SmallVector<Value> args;

private:
  HostCallContext &ctx;
  Operation *op;
  ValueRange operands;
};

/// The lowering of an op that calls a host function of the library: the
/// call's stream waits for the prefetched tensors the op reads, its
/// temporaries get their buffers, emitCall calls the host function (an op's
/// `accumulate` operand is none of its arguments), the temporaries it read
/// last are freed, and its results become their buffers.
template <typename OpTy>
class HostCallPattern : public OpConversionPattern<OpTy> {
public:
  using OpAdaptor = typename OpConversionPattern<OpTy>::OpAdaptor;

  HostCallPattern(const TypeConverter &typeConverter, HostCallContext &ctx)
      : OpConversionPattern<OpTy>(typeConverter, ctx.host.getContext()),
        ctx(ctx) {}

  LogicalResult
  matchAndRewrite(OpTy op, OpAdaptor adaptor,
                  ConversionPatternRewriter &rewriter) const final {
    Operation *operation = op.getOperation();
    ctx.startOp(rewriter, operation);
    ctx.awaitPrefetches(operation->getOperands());
    ctx.allocateTemporaries(operation);
    // The `accumulate` operand is no argument: its producer wrote it into
    // the result's buffer. (The expert biases may come after it.)
    SmallVector<Value> operands(adaptor.getOperands());
    if (OpOperand *accumulate = getAccumulateOperand(operation);
        accumulate && HostCallContext::accumulates(operation))
      operands.erase(operands.begin() + accumulate->getOperandNumber());
    HostCall call(ctx, operation, operands);
    emitCall(op, adaptor, call);
    ctx.deallocTemporaries(ctx.freeAfter.lookup(operation));
    ctx.replaceWithBuffers(rewriter, operation);
    return success();
  }

protected:
  /// Adds the arguments of `op`'s call to `call` and makes the call.
  virtual void emitCall(OpTy op, OpAdaptor adaptor, HostCall &call) const = 0;

  Value scoring(RoutingAttr routing) const {
    return ctx.h.i32(static_cast<int32_t>(routing.getScoring()));
  }

  HostCallContext &ctx;
};

/// The moe.aux_loss that `router`'s kernels compute (`__moe_gpu_router_aux`):
/// the first one after it on its logits and experts, with its scoring, whose
/// losses the host function returns (out-parameters, there before the
/// router runs); null if none.
AuxLossOp getFusedAuxLoss(RouterOp router, const HostCallContext &ctx) {
  AuxLossOp fused;
  for (Operation *user : router.getLogits().getUsers()) {
    auto aux = dyn_cast<AuxLossOp>(user);
    if (!aux || aux.getExperts() != router.getExperts() ||
        aux.getScoring() != router.getRouting().getScoring() ||
        aux->getBlock() != router->getBlock())
      continue;
    bool returned = llvm::all_of(aux->getResults(), [&](Value result) {
      return ctx.bufferOf(result) &&
             !llvm::is_contained(ctx.temporaries.lookup(aux), result);
    });
    if (returned && (!fused || aux->isBeforeInBlock(fused)))
      fused = aux;
  }
  return fused;
}

/// moe.router: `__moe_gpu_router`, with an empty bias where it has none;
/// `__moe_gpu_router_aux` with the losses of the moe.aux_loss it computes
/// too (getFusedAuxLoss).
class LowerRouter : public HostCallPattern<RouterOp> {
public:
  using HostCallPattern::HostCallPattern;

  void emitCall(RouterOp op, OpAdaptor adaptor, HostCall &call) const override {
    HostFunctionBuilder &h = ctx.h;
    RoutingAttr routing = op.getRouting();
    call.addOperands();
    if (!op.getBias())
      call.args.push_back(h.empty(ctx.bufferOf(op.getWeights()), 1));
    call.args.append({scoring(routing), h.i1(routing.getRenormalize()),
                      h.index(routing.getNumGroups()),
                      h.index(routing.getTopkGroups()),
                      h.f32(routing.getScalingFactorValue()),
                      h.i1(routing.getRoundLogits())});
    call.addResults();
    if (AuxLossOp aux = getFusedAuxLoss(op, ctx)) {
      for (Value loss : aux->getResults())
        call.args.push_back(h.dynamic(ctx.bufferOf(loss)));
      call.call("__moe_gpu_router_aux");
      return;
    }
    call.call("__moe_gpu_router");
  }
};

/// The moe.aux_loss_grad whose d_logits `grad` adds in its own pass
/// (`__moe_gpu_router_grad_aux`): its logits gradient, read by `grad` alone,
/// on its logits and experts with its scoring, the losses' gradients the
/// function's arguments (alive at `grad`); null if none.
AuxLossGradOp getFusedAuxLossGrad(RouterGradOp grad) {
  Value dLogits = grad.getDLogits();
  auto aux = dLogits ? dLogits.getDefiningOp<AuxLossGradOp>() : AuxLossGradOp();
  if (!aux || !dLogits.hasOneUse() || aux.getLogits() != grad.getLogits() ||
      aux.getExperts() != grad.getExperts() ||
      aux.getScoring() != grad.getRouting().getScoring() ||
      aux->getBlock() != grad->getBlock() ||
      !isa<BlockArgument>(aux.getDLoadBalance()) ||
      !isa<BlockArgument>(aux.getDZLoss()))
    return {};
  return aux;
}

/// moe.router_grad: `__moe_gpu_router_grad`, with empty logits gradients
/// where it has none; `_acc` into a folded add.
class LowerRouterGrad : public HostCallPattern<RouterGradOp> {
public:
  using HostCallPattern::HostCallPattern;

  void emitCall(RouterGradOp op, OpAdaptor adaptor,
                HostCall &call) const override {
    HostFunctionBuilder &h = ctx.h;
    RoutingAttr routing = op.getRouting();
    AuxLossGradOp aux = getFusedAuxLossGrad(op);
    if (aux) {
      // The losses' gradients where d_logits was.
      for (Value operand : adaptor.getOperands().take_front(5))
        call.args.push_back(h.dynamic(operand));
      for (Value d : {aux.getDLoadBalance(), aux.getDZLoss()})
        call.args.push_back(h.dynamic(ctx.bufferOf(d)));
    } else {
      call.addOperands();
    }
    if (!op.getDLogits())
      call.args.push_back(h.empty(adaptor.getLogits(), 2));
    call.args.append({scoring(routing), h.i1(routing.getRenormalize()),
                      h.f32(routing.getScalingFactorValue())});
    call.addResults();
    call.call(aux ? "__moe_gpu_router_grad_aux" : "__moe_gpu_router_grad",
              ctx.accumulates(op));
  }
};

/// The pairs an expert keeps under `op`'s capacity factor: ceil(capacity_factor
/// * T * k / E) in f64, left to right, at most T * k, as the CPU path and
/// moe_mlir.config.capacity_for compute it. A static T folds it here; a
/// dynamic one computes it in the host code from the call's T (the experts
/// buffer's leading size).
Value buildDispatchCapacity(HostFunctionBuilder &h, DispatchOp op,
                            Value experts) {
  auto type = cast<MemRefType>(experts.getType());
  double factor = op.getCapacityFactor()->convertToDouble();
  double numExperts = static_cast<double>(op.getNumExperts());
  int64_t topK = type.getDimSize(1);
  if (!type.isDynamicDim(0)) {
    int64_t pairs = type.getDimSize(0) * topK;
    double capacity =
        std::ceil(factor * static_cast<double>(type.getDimSize(0)) *
                  static_cast<double>(topK) / numExperts);
    return h.index(
        static_cast<int64_t>(std::min(capacity, static_cast<double>(pairs))));
  }
  OpBuilder &b = *h.b;
  Location loc = h.loc;
  FloatType f64 = b.getF64Type();
  Type i64 = b.getI64Type();
  auto toF64 = [&](Value index) -> Value {
    Value wide = arith::IndexCastOp::create(b, loc, i64, index);
    return arith::SIToFPOp::create(b, loc, f64, wide);
  };
  auto constant = [&](double value) -> Value {
    return arith::ConstantFloatOp::create(b, loc, f64, APFloat(value));
  };
  Value tokens = memref::DimOp::create(b, loc, experts, 0);
  Value pairs = arith::MulIOp::create(b, loc, tokens, h.index(topK));
  Value product =
      arith::MulFOp::create(b, loc, constant(factor), toF64(tokens));
  product = arith::MulFOp::create(b, loc, product,
                                  constant(static_cast<double>(topK)));
  Value quotient = arith::DivFOp::create(b, loc, product, constant(numExperts));
  // Bounded first, then rounded up: ceil(min(q, T * k)) = min(ceil(q), T * k)
  // for an integer T * k, and the conversion to an integer cannot overflow.
  Value bounded = arith::MinimumFOp::create(b, loc, quotient, toF64(pairs));
  Value truncated = arith::FPToSIOp::create(b, loc, i64, bounded);
  Value below = arith::CmpFOp::create(
      b, loc, arith::CmpFPredicate::OLT,
      arith::SIToFPOp::create(b, loc, f64, truncated), bounded);
  Value up = arith::ExtUIOp::create(b, loc, i64, below);
  Value capacity = arith::AddIOp::create(b, loc, truncated, up);
  return arith::IndexCastOp::create(b, loc, b.getIndexType(), capacity);
}

/// moe.dispatch: `__moe_gpu_dispatch`; with a capacity factor
/// `__moe_gpu_dispatch_capacity` with the capacity of the call's T.
class LowerDispatch : public HostCallPattern<DispatchOp> {
public:
  using HostCallPattern::HostCallPattern;

  void emitCall(DispatchOp op, OpAdaptor adaptor,
                HostCall &call) const override {
    call.addOperands();
    if (op.getCapacityFactor()) {
      call.args.push_back(
          buildDispatchCapacity(ctx.h, op, adaptor.getExperts()));
      call.addResults();
      call.callExactly("__moe_gpu_dispatch_capacity");
      return;
    }
    call.addResults();
    call.callExactly("__moe_gpu_dispatch");
  }
};

/// moe.combine: `__moe_gpu_combine`; `_acc` into a folded add.
class LowerCombine : public HostCallPattern<CombineOp> {
public:
  using HostCallPattern::HostCallPattern;

  void emitCall(CombineOp op, OpAdaptor adaptor,
                HostCall &call) const override {
    call.addOperands();
    call.addResults();
    call.call("__moe_gpu_combine", ctx.accumulates(op));
  }
};

/// moe.combine_grad: `__moe_gpu_combine_grad`.
class LowerCombineGrad : public HostCallPattern<CombineGradOp> {
public:
  using HostCallPattern::HostCallPattern;

  void emitCall(CombineGradOp op, OpAdaptor adaptor,
                HostCall &call) const override {
    call.addOperands();
    call.addResults();
    call.callExactly("__moe_gpu_combine_grad");
  }
};

/// moe.ep_pack, and moe.ep_dispatch of one rank (its all-to-all is the
/// identity): `__moe_gpu_ep_pack`, `_gather` with token ids. The overflow
/// rule is the caller's, from `dropped`.
template <typename OpTy>
class LowerEPSend : public HostCallPattern<OpTy> {
public:
  using HostCallPattern<OpTy>::HostCallPattern;

  void emitCall(OpTy op, typename HostCallPattern<OpTy>::OpAdaptor adaptor,
                HostCall &call) const override {
    HostFunctionBuilder &h = this->ctx.h;
    call.addOperands();
    call.args.append({h.index(static_cast<int64_t>(op.getEpSize())),
                      h.index(static_cast<int64_t>(op.getCapacity()))});
    call.addResults();
    call.callExactly(op.getTokenIds() ? "__moe_gpu_ep_pack_gather"
                                      : "__moe_gpu_ep_pack");
  }
};

/// moe.ep_unpack, and moe.ep_combine of one rank: `__moe_gpu_ep_unpack`,
/// `_reduce` with rows_of. A result of dynamic row count has the rows its
/// buffer was given (T * k, offsets[E] after a dropless dispatch).
template <typename OpTy>
class LowerEPReturn : public HostCallPattern<OpTy> {
public:
  using HostCallPattern<OpTy>::HostCallPattern;

  void emitCall(OpTy op, typename HostCallPattern<OpTy>::OpAdaptor adaptor,
                HostCall &call) const override {
    HostFunctionBuilder &h = this->ctx.h;
    call.addOperands();
    call.args.append({h.index(static_cast<int64_t>(op.getEpSize())),
                      h.index(static_cast<int64_t>(op.getCapacity()))});
    call.addResults();
    call.callExactly(op.getRowsOf() ? "__moe_gpu_ep_unpack_reduce"
                                    : "__moe_gpu_ep_unpack");
  }
};

/// moe.ep_queues: `__moe_gpu_ep_queues`.
class LowerEPQueues : public HostCallPattern<EPQueuesOp> {
public:
  using HostCallPattern::HostCallPattern;

  void emitCall(EPQueuesOp op, OpAdaptor adaptor,
                HostCall &call) const override {
    call.addOperands();
    call.args.push_back(ctx.h.index(static_cast<int64_t>(op.getCapacity())));
    call.addResults();
    call.callExactly("__moe_gpu_ep_queues");
  }
};

/// moe.aux_loss and moe.aux_loss_grad: the host function `callee` on the
/// op's tensors (the scalars 0-d memrefs), with its scoring after them.
template <typename OpTy>
class LowerAuxLoss : public HostCallPattern<OpTy> {
public:
  LowerAuxLoss(const TypeConverter &typeConverter, HostCallContext &ctx,
               StringRef callee)
      : HostCallPattern<OpTy>(typeConverter, ctx), callee(callee) {}

  void emitCall(OpTy op, typename HostCallPattern<OpTy>::OpAdaptor adaptor,
                HostCall &call) const override {
    // The router's call computed the losses (getFusedAuxLoss).
    if constexpr (std::is_same_v<OpTy, AuxLossOp>)
      if (auto router = op.getLogits().template getDefiningOp<RouterOp>();
          router && getFusedAuxLoss(router, this->ctx) == op)
        return;
    // The router's gradient adds d_logits itself (getFusedAuxLossGrad).
    if constexpr (std::is_same_v<OpTy, AuxLossGradOp>)
      if (op->hasOneUse())
        if (auto grad = dyn_cast<RouterGradOp>(*op->getUsers().begin());
            grad && getFusedAuxLossGrad(grad) == op)
          return;
    call.addOperands();
    call.args.push_back(this->ctx.h.i32(static_cast<int32_t>(op.getScoring())));
    call.addResults();
    call.callExactly(callee);
  }

private:
  /// A string literal's.
  StringRef callee;
};

/// moe.gather_rows and moe.scatter_rows: the host function `callee` on the
/// op's operands and result.
template <typename OpTy>
class LowerRows : public HostCallPattern<OpTy> {
public:
  LowerRows(const TypeConverter &typeConverter, HostCallContext &ctx,
            StringRef callee)
      : HostCallPattern<OpTy>(typeConverter, ctx), callee(callee) {}

  void emitCall(OpTy op, typename HostCallPattern<OpTy>::OpAdaptor adaptor,
                HostCall &call) const override {
    call.addOperands();
    call.addResults();
    call.callExactly(callee);
  }

private:
  /// A string literal's.
  StringRef callee;
};

/// moe.update_selection_bias: `__moe_gpu_update_selection_bias`, the rate
/// rounded to f32 and the rule's code (sign 0, proportional 1).
class LowerUpdateSelectionBias : public HostCallPattern<UpdateSelectionBiasOp> {
public:
  using HostCallPattern::HostCallPattern;

  void emitCall(UpdateSelectionBiasOp op, OpAdaptor adaptor,
                HostCall &call) const override {
    HostFunctionBuilder &h = ctx.h;
    call.addOperands();
    call.args.append({h.f32(op.getRate().convertToDouble()),
                      h.i32(static_cast<int32_t>(op.getRule()))});
    call.addResults();
    call.callExactly("__moe_gpu_update_selection_bias");
  }
};

/// arith.addf on tensors: `__moe_gpu_add` on their flattened buffers (an add
/// that moe-fold-adds folded is gone).
class LowerAdd : public HostCallPattern<arith::AddFOp> {
public:
  using HostCallPattern::HostCallPattern;

  void emitCall(arith::AddFOp op, OpAdaptor adaptor,
                HostCall &call) const override {
    for (Value buffer :
         {adaptor.getLhs(), adaptor.getRhs(), ctx.bufferOf(op.getResult())})
      call.args.push_back(ctx.h.flat(buffer));
    call.callExactly("__moe_gpu_add");
  }
};

/// moe.expert_ffn and moe.shared_expert: the host function `base`, or
/// `<base>_h` (the up projection alone) where nobody reads y (a recomputation
/// of H in backward).
template <typename OpTy>
class LowerFFN : public HostCallPattern<OpTy> {
public:
  LowerFFN(const TypeConverter &typeConverter, HostCallContext &ctx,
           StringRef base)
      : HostCallPattern<OpTy>(typeConverter, ctx), base(base) {}

  void emitCall(OpTy op, typename HostCallPattern<OpTy>::OpAdaptor adaptor,
                HostCall &call) const override {
    call.addOperands();
    call.addActivation();
    if (!this->ctx.bufferOf(op.getY())) {
      call.args.push_back(this->ctx.h.dynamic(this->ctx.bufferOf(op.getH())));
      call.call((base + "_h").str());
      return;
    }
    call.addResults();
    call.call(base);
  }

private:
  /// A string literal's.
  StringRef base;
};

/// moe.expert_combine_grad, moe.expert_ffn_grad and moe.shared_expert_grad:
/// the host function `base`, `<base>_bias` for experts with biases (their
/// operands and their gradients after the others); `_acc` after it where the
/// op accumulates (a folded add).
template <typename OpTy>
class LowerFFNGrad : public HostCallPattern<OpTy> {
public:
  LowerFFNGrad(const TypeConverter &typeConverter, HostCallContext &ctx,
               StringRef base)
      : HostCallPattern<OpTy>(typeConverter, ctx), base(base) {}

  void emitCall(OpTy op, typename HostCallPattern<OpTy>::OpAdaptor adaptor,
                HostCall &call) const override {
    call.addOperands();
    call.addActivation();
    call.addResults();
    std::string callee = base.str();
    if (hasExpertBias(op))
      callee += "_bias";
    call.call(callee, HostCallContext::accumulates(op));
  }

private:
  /// A string literal's.
  StringRef base;
};

/// Tensors become the memrefs that hold them (getBufferType): device memory,
/// or pinned host memory for a host tensor.
void populateMoEToGPUTypeConversions(TypeConverter &typeConverter) {
  typeConverter.addConversion([](Type type) { return type; });
  typeConverter.addConversion(
      [](RankedTensorType type) -> Type { return getBufferType(type); });
  typeConverter.addConversion(
      [](HostTensorType type) -> Type { return getBufferType(type); });
}

/// The patterns of convert-moe-to-gpu for the function `ctx` plans: one per
/// op, and the function's own (its entry and its return).
void populateMoEToGPUPatterns(const TypeConverter &typeConverter,
                              HostCallContext &ctx,
                              RewritePatternSet &patterns) {
  patterns
      .add<LowerFunction, LowerReturn, LowerRouter, LowerRouterGrad,
           LowerDispatch, LowerCombine, LowerAdd, LowerOffload, LowerPrefetch>(
          typeConverter, ctx);
  patterns.add<LowerFFN<ExpertFFNOp>>(typeConverter, ctx,
                                      "__moe_gpu_expert_ffn");
  patterns.add<LowerFFN<SharedExpertOp>>(typeConverter, ctx,
                                         "__moe_gpu_shared_expert");
  patterns.add<LowerFFNGrad<ExpertCombineGradOp>>(
      typeConverter, ctx, "__moe_gpu_expert_combine_grad");
  patterns.add<LowerFFNGrad<SharedExpertGradOp>>(
      typeConverter, ctx, "__moe_gpu_shared_expert_grad");
  patterns.add<LowerFFNGrad<ExpertFFNGradOp>>(typeConverter, ctx,
                                              "__moe_gpu_expert_ffn_grad");
  patterns.add<LowerCombineGrad>(typeConverter, ctx);
  patterns.add<LowerEPSend<EPPackOp>, LowerEPSend<EPDispatchOp>,
               LowerEPReturn<EPUnpackOp>, LowerEPReturn<EPCombineOp>,
               LowerEPQueues>(typeConverter, ctx);
  patterns.add<LowerRows<GatherRowsOp>>(typeConverter, ctx,
                                        "__moe_gpu_gather_rows");
  patterns.add<LowerRows<ScatterRowsOp>>(typeConverter, ctx,
                                         "__moe_gpu_scatter_rows");
  patterns.add<LowerUpdateSelectionBias>(typeConverter, ctx);
  patterns.add<LowerAuxLoss<AuxLossOp>>(typeConverter, ctx,
                                        "__moe_gpu_aux_loss");
  patterns.add<LowerAuxLoss<AuxLossGradOp>>(typeConverter, ctx,
                                            "__moe_gpu_aux_loss_grad");
}

/// Replaces `plan.func` with a host function on device memrefs: plans it
/// (planHostFunction), converts its body with the patterns, in order, and
/// gives the host function its attributes. `libraryHas` says which host
/// functions the GPU library `libraryName` has.
LogicalResult convertFunction(FunctionPlan &plan,
                              function_ref<bool(StringRef)> libraryHas,
                              StringRef libraryName) {
  if (failed(checkAccumulating(plan.func.front(), libraryHas, libraryName)))
    return failure();
  for (auto dispatch : plan.func.front().getOps<DispatchOp>())
    if (dispatch.getCapacityFactor() &&
        !libraryHas("__moe_gpu_dispatch_capacity"))
      return dispatch.emitError()
             << "the GPU library " << libraryName
             << " has no @__moe_gpu_dispatch_capacity for a dispatch with a "
                "capacity factor";
  HostCallContext ctx(plan.func.getLoc());
  if (failed(planHostFunction(plan, ctx)))
    return failure();

  MLIRContext *context = ctx.host.getContext();
  TypeConverter typeConverter;
  populateMoEToGPUTypeConversions(typeConverter);
  RewritePatternSet patterns(context);
  populateMoEToGPUPatterns(typeConverter, ctx, patterns);
  // The ops on tensors, the function and its return. An op without tensors
  // stays as it is, in the host function once the body moves there.
  ConversionTarget target(*context);
  target.markUnknownOpDynamicallyLegal(
      [](Operation *op) { return !hasTensors(op); });
  target.addDynamicallyLegalOp<func::FuncOp>(
      [&](func::FuncOp op) { return op != ctx.func; });
  target.addDynamicallyLegalOp<func::ReturnOp>(
      [&](func::ReturnOp op) { return op != ctx.returnOp; });
  // The patterns never fail and emit legal ops only, so nothing they do (nor
  // the plan they update) is rolled back. An op is never folded: its
  // pattern gives its results their buffers.
  ConversionConfig config;
  config.foldingMode = DialectConversionFoldingMode::Never;
  if (failed(applyPartialConversion(ctx.func.getOperation(), target,
                                    std::move(patterns), config)))
    return failure();

  func::FuncOp host = ctx.host;
  Builder attrs(context);
  host->setAttr(kGPUEntryAttr,
                attrs.getStringAttr(plan.stageEntry.empty()
                                        ? entryName(plan.kind).str()
                                        : plan.stageEntry));
  if (plan.stage)
    host->setAttr(kGPUEPStageAttr, plan.stage);
  host->setAttr(kGPULayerNameAttr, attrs.getStringAttr(plan.layerName));
  host->setAttr(kGPUParamsAttr,
                attrs.getArrayAttr(llvm::map_to_vector(
                    ctx.params, [&](const Param &param) -> Attribute {
                      return param.getAttr(context);
                    })));
  host->setAttr(kGPUWorkspaceBytesAttr,
                attrs.getI64IntegerAttr(ctx.h.peakBytes));
  if (ctx.h.maxTokens > 0)
    host->setAttr(kGPUMaxTokensAttr, attrs.getI64IntegerAttr(ctx.h.maxTokens));
  if (plan.kind != EntryKind::Backward)
    host->setAttr(kGPULayerAttr, ctx.layerAttr);
  return success();
}

//===----------------------------------------------------------------------===//
// The library
//===----------------------------------------------------------------------===//

/// Copies the host functions `module` calls, every symbol of the library they
/// reference (transitively) and the library's gpu.modules into `module`.
/// Symbols the module already has are kept, but a host function must have the
/// type its calls expect.
/// The GPU library: the one the kernel builder makes, or a file's (the
/// `library` option), made or parsed once when first needed.
class LibraryModule {
public:
  LibraryModule(MLIRContext *context, StringRef path)
      : context(context), path(path.str()) {}

  std::string getName() const {
    return path.empty() ? "(built in)" : "'" + path + "'";
  }

  /// The library; failure (reported at `module`) when the file cannot be
  /// read, is empty or does not parse.
  FailureOr<ModuleOp> get(ModuleOp module) {
    if (library)
      return *library;
    if (path.empty()) {
      int64_t numSMs = 0;
      if (auto sms =
              module->getAttrOfType<IntegerAttr>(moe_gpu::kNumSMsAttrName))
        numSMs = sms.getInt();
      library = buildGPULibrary(context, numSMs);
      if (!library)
        return module.emitError("the kernel builder could not build the GPU "
                                "library");
      return *library;
    }
    llvm::ErrorOr<std::unique_ptr<llvm::MemoryBuffer>> file =
        llvm::MemoryBuffer::getFile(path);
    if (!file)
      return module.emitError("cannot read the GPU library '")
             << path << "': " << file.getError().message();
    if ((*file)->getBuffer().trim().empty())
      return module.emitError("the GPU library '") << path << "' is empty";
    ParserConfig config(context);
    library = parseSourceString<ModuleOp>((*file)->getBuffer(), config, path);
    if (!library)
      return module.emitError("cannot parse the GPU library '") << path << "'";
    return *library;
  }

private:
  MLIRContext *context;
  std::string path;
  OwningOpRef<ModuleOp> library;
};

/// The host function variants the converted ops may call, by name: the
/// library function they vary and the configs they run.
using HostVariants =
    std::map<std::string, std::pair<std::string, SmallVector<HostGemmConfig>>>;

/// Whether `a` and `b` compute the same GEMM (they may differ in how).
bool computesSame(const moe_gpu::GemmConfig &a, const moe_gpu::GemmConfig &b) {
  return a.a == b.a && a.b == b.b && a.gathered == b.gathered &&
         a.epilogue == b.epilogue && a.activation == b.activation &&
         a.bias == b.bias && a.storeA == b.storeA &&
         a.withRouterWeight == b.withRouterWeight && a.withDs == b.withDs &&
         a.problem == b.problem;
}

/// Each op's `moe_gpu.kernels` (moe-gpu-select-kernels) against the library:
/// a library config must name a kernel of the library (a symbol lookup by
/// its kernel name). Another config must compute the role's GEMM: the
/// variants of the op's host functions it may call go to `variants`, built
/// with their kernels when called.
LogicalResult checkKernelConfigs(ArrayRef<FunctionPlan> plans,
                                 LibraryModule &library, ModuleOp module,
                                 HostVariants &variants) {
  SmallVector<std::pair<Operation *, DictionaryAttr>> chosen;
  for (const FunctionPlan &plan : plans)
    func::FuncOp(plan.func).walk([&](Operation *op) {
      if (auto kernels =
              op->getAttrOfType<DictionaryAttr>(moe_gpu::kKernelsAttrName))
        chosen.emplace_back(op, kernels);
    });
  // A non-gated or biased op runs variants even without a choice
  // (getChosenConfigs).
  auto nonGated = [](Operation *op) {
    return llvm::any_of(moe_gpu::gemmRolesOf(op), [](const auto &role) {
      return isVariantOnly(role.libraryConfig);
    });
  };
  for (const FunctionPlan &plan : plans)
    func::FuncOp(plan.func).walk([&](Operation *op) {
      if (!op->hasAttr(moe_gpu::kKernelsAttrName) && nonGated(op))
        chosen.emplace_back(op, DictionaryAttr::get(op->getContext()));
    });
  if (chosen.empty())
    return success();
  FailureOr<ModuleOp> parsed = library.get(module);
  if (failed(parsed))
    return failure();
  SmallVector<SymbolTable> kernelModules;
  for (auto kernels : parsed->getOps<gpu::GPUModuleOp>())
    kernelModules.emplace_back(kernels);
  for (auto [op, kernels] : chosen) {
    bool anyOther = nonGated(op);
    for (const moe_gpu::GemmRole &role : moe_gpu::gemmRolesOf(op)) {
      auto config = kernels.getAs<moe_gpu::GemmConfigAttr>(role.name);
      if (!config)
        continue;
      std::string name = config.kernelName();
      // The op's `accumulate` decides whether a GEMM accumulates (a folded
      // add).
      moe_gpu::GemmConfig requested = config.getConfig().resolved();
      requested.accumulate = false;
      moe_gpu::GemmConfig libraryConfig = role.libraryConfig.resolved();
      std::string built = moe_gpu::gemmKernelName(role.libraryConfig);
      if (requested != libraryConfig) {
        if (!computesSame(requested, libraryConfig))
          return op->emitError()
                 << "'" << moe_gpu::kKernelsAttrName << "' chooses @" << name
                 << " for '" << role.name << "', which computes another GEMM"
                 << " than the one " << op->getName() << " runs there (@"
                 << built << ")";
        anyOther = true;
        continue;
      }
      // A non-gated activation's or a bias's kernels are built with the
      // variants.
      if (isVariantOnly(libraryConfig))
        continue;
      if (llvm::none_of(kernelModules, [&](SymbolTable &symbols) {
            return symbols.lookup(name) != nullptr;
          }))
        return op->emitError()
               << "the GPU library " << library.getName() << " has no kernel @"
               << name << " for '" << role.name << "'";
    }
    if (!anyOther)
      continue;
    for (StringRef base : getVariantBases(op)) {
      SmallVector<HostGemmConfig> configs = getChosenConfigs(op, base);
      std::string variant = libraryHostFunctionVariantName(base, configs);
      if (variant != base)
        variants.try_emplace(variant, base.str(), std::move(configs));
    }
  }
  return success();
}

/// Copies the library's functions that the module calls, with what they use,
/// and every kernel; builds the called `variants` (and their kernels) into
/// the module.
LogicalResult addLibrary(ModuleOp module, LibraryModule &library,
                         const HostVariants &variants) {
  SymbolTable symbols(module);
  SmallVector<StringAttr> worklist;
  SmallVector<HostVariants::const_iterator> called;
  WalkResult walk = module.walk([&](func::CallOp call) {
    StringAttr callee = call.getCalleeAttr().getAttr();
    if (!callee.getValue().starts_with(kHostPrefix))
      return WalkResult::advance();
    Operation *existing = symbols.lookup(callee);
    if (!existing) {
      auto variant = variants.find(callee.getValue().str());
      if (variant == variants.end())
        worklist.push_back(callee);
      else if (!llvm::is_contained(called, variant))
        called.push_back(variant);
      return WalkResult::advance();
    }
    auto function = dyn_cast<func::FuncOp>(existing);
    if (function && function.getFunctionType() == call.getCalleeType())
      return WalkResult::advance();
    existing->emitError() << "@" << callee.getValue()
                          << " exists, but the GPU path calls it as a "
                             "function of type "
                          << call.getCalleeType();
    return WalkResult::interrupt();
  });
  if (walk.wasInterrupted())
    return failure();
  if (worklist.empty() && called.empty())
    return success();

  FailureOr<ModuleOp> parsed = library.get(module);
  if (failed(parsed))
    return failure();
  SymbolTable librarySymbols(*parsed);

  // The kernels, whether or not a copied function launches them yet.
  for (auto kernels : parsed->getOps<gpu::GPUModuleOp>())
    worklist.push_back(kernels.getSymNameAttr());
  while (!worklist.empty()) {
    StringAttr name = worklist.pop_back_val();
    if (symbols.lookup(name))
      continue;
    Operation *symbol = librarySymbols.lookup(name);
    if (!symbol)
      return module.emitError("the GPU library has no symbol '")
             << name.getValue() << "'";
    Operation *copy = symbol->clone();
    if (auto function = dyn_cast<func::FuncOp>(copy))
      function.setPrivate();
    symbols.insert(copy);
    if (std::optional<SymbolTable::UseRange> uses =
            SymbolTable::getSymbolUses(copy))
      for (const SymbolTable::SymbolUse &use : *uses)
        worklist.push_back(use.getSymbolRef().getRootReference());
  }
  // The variants, after the library's kernels: theirs join @moe_kernels.
  for (HostVariants::const_iterator variant : called) {
    const auto &[base, configs] = variant->second;
    FailureOr<func::FuncOp> function =
        buildLibraryHostFunction(module, base, configs);
    if (failed(function))
      return failure();
    if (function->getSymName() != variant->first)
      return module.emitError("the host function builder built @")
             << function->getSymName() << " for @" << variant->first;
  }
  return success();
}

struct ConvertMoEToGPUPass
    : public mlir::moe::impl::ConvertMoEToGPUBase<ConvertMoEToGPUPass> {
  using ConvertMoEToGPUBase::ConvertMoEToGPUBase;

  /// The pipeline inlines the host functions (their tensor-map set-up holds
  /// llvm ops).
  void getDependentDialects(DialectRegistry &registry) const override {
    ConvertMoEToGPUBase::getDependentDialects(registry);
    func::registerInlinerExtension(registry);
    LLVM::registerInlinerInterface(registry);
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    if (failed(checkNoMoEInNestedModules(module, "convert-moe-to-gpu")))
      return signalPassFailure();
    // What a recompute plan (moe-plan-activations) left in the forward runs
    // in place; backward already holds its recomputation.
    inlineCheckpoints(module);
    SymbolTable symbols(module);

    SmallVector<func::FuncOp> functions;
    for (auto func : module.getOps<func::FuncOp>()) {
      if (func.isExternal())
        continue;
      FunctionType type = func.getFunctionType();
      bool onTensors = llvm::any_of(type.getInputs(), isTensor) ||
                       llvm::any_of(type.getResults(), isTensor);
      bool anyOp = false;
      func.walk([&](Operation *op) {
        anyOp |= hasTensors(op) && !isa<func::ReturnOp>(op);
      });
      if (onTensors || anyOp)
        functions.push_back(func);
    }

    bool failedAny = false;
    for (func::FuncOp func : functions) {
      if (!func.getBody().hasOneBlock()) {
        func.emitError("the GPU path converts single-block functions only");
        failedAny = true;
        continue;
      }
      // The regions of a rejected op need no more errors.
      func.walk<WalkOrder::PreOrder>([&](Operation *op) {
        if (succeeded(checkSupported(op)))
          return WalkResult::advance();
        failedAny = true;
        return WalkResult::skip();
      });
    }
    if (failedAny)
      return signalPassFailure();

    // @f computes what @f_forward computes, less the saved set; so do the
    // stages of @f (moe-ep-stages) beside those of @f_forward.
    std::vector<FunctionPlan> plans;
    for (func::FuncOp func : functions) {
      auto forward =
          symbols.lookup<func::FuncOp>((func.getSymName() + "_forward").str());
      bool trained = forward && forward->hasAttr(kNumSavedAttr);
      if (auto of = func->getAttrOfType<StringAttr>("moe.ep_stage_of")) {
        auto firstStage = symbols.lookup<func::FuncOp>(
            (of.getValue() + "_forward_stage0").str());
        trained = firstStage && firstStage->hasAttr("moe.ep_num_saved");
      }
      if (trained && SymbolTable::symbolKnownUseEmpty(func, module)) {
        symbols.erase(func);
        continue;
      }
      FailureOr<FunctionPlan> plan = planFunction(func, symbols);
      if (failed(plan))
        return signalPassFailure();
      plans.push_back(std::move(*plan));
    }
    // The built library, or the one `library` names.
    LibraryModule library(module.getContext(), libraryPath);
    HostVariants variants;
    if (failed(checkKernelConfigs(plans, library, module, variants)))
      return signalPassFailure();

    if (!plans.empty()) {
      FailureOr<ModuleOp> parsed = library.get(module);
      if (failed(parsed))
        return signalPassFailure();
      SymbolTable librarySymbols(*parsed);
      auto hasFunction = [&](StringRef name) {
        return isa_and_nonnull<func::FuncOp>(librarySymbols.lookup(name));
      };
      for (FunctionPlan &plan : plans)
        if (failed(convertFunction(plan, hasFunction, library.getName())))
          return signalPassFailure();
    }

    if (failed(addLibrary(module, library, variants)))
      return signalPassFailure();
    module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                    UnitAttr::get(module.getContext()));
  }
};

} // namespace
