//===- BuildEntryPoints.cpp - moe-gpu-build-entry-points ------------------===//
//
// The C entry points of a compiled layer: `int <layer>_forward(void *stream,
// void *tensor...)` and `_backward`, which check their pointers, call the
// host function on memref descriptors of the static shapes on the caller's
// stream and return the runtime's moeStatus; and `<layer>_<kind>_workspace_
// bytes()`. With a dynamic token count they take `int64_t T` after the
// stream, refuse one outside [1, bound] before anything runs, and size the
// leading dimensions that follow it from T; `_workspace_bytes(int64_t T)`.
// The host functions become internal.
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/MoEToGPU/EntryPoints.h"
#include "moe/Conversion/MoEToGPU/MoEToGPU.h"
#include "moe/Conversion/Passes.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/StringExtras.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUBUILDENTRYPOINTS
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

std::string getString(DictionaryAttr dict, StringRef key) {
  if (auto value = dict.getAs<StringAttr>(key))
    return value.str();
  return "";
}

/// The attributes an entry point carries and its host function loses.
constexpr StringLiteral kEntryAttrs[] = {
    kGPUEntryAttr, kGPULayerNameAttr, kGPUParamsAttr, kGPUWorkspaceBytesAttr,
    kGPULayerAttr, kGPUMaxTokensAttr, kGPUEPStageAttr};

/// Where an entry point of kind `kind` goes among a layer's: forward, then
/// backward; an expert-parallel layer's forward stages in order, then its
/// backward's. std::nullopt for a kind that is no entry point ("plain").
std::optional<std::pair<int, int64_t>> entryOrder(StringRef kind) {
  constexpr StringLiteral kHalves[] = {"forward", "backward"};
  for (auto [rank, name] : llvm::enumerate(kHalves)) {
    if (kind == name)
      return std::make_pair(static_cast<int>(rank), int64_t{-1});
    int64_t index;
    StringRef rest = kind;
    if (rest.consume_front(name) && rest.consume_front("_stage") &&
        !rest.getAsInteger(10, index) && index >= 0)
      return std::make_pair(static_cast<int>(rank), index);
  }
  return std::nullopt;
}

/// The entry-point host functions of `module` (public ones, or every one
/// with `internal`), in entryOrder.
SmallVector<LLVM::LLVMFuncOp> entryFunctions(ModuleOp module, bool internal) {
  SmallVector<std::pair<std::pair<int, int64_t>, LLVM::LLVMFuncOp>> found;
  for (auto func : module.getOps<LLVM::LLVMFuncOp>()) {
    auto kind = func->getAttrOfType<StringAttr>(kGPUEntryAttr);
    if (!kind || (!internal && (func.isPrivate() ||
                                func.getLinkage() == LLVM::Linkage::Internal)))
      continue;
    if (std::optional<std::pair<int, int64_t>> order =
            entryOrder(kind.getValue()))
      found.push_back({*order, func});
  }
  llvm::stable_sort(
      found, [](const auto &a, const auto &b) { return a.first < b.first; });
  return llvm::to_vector(
      llvm::map_range(found, [](const auto &entry) { return entry.second; }));
}

class EntryPointBuilder {
public:
  explicit EntryPointBuilder(ModuleOp module)
      : module(module), b(module.getContext()), loc(module.getLoc()) {
    b.setInsertionPointToEnd(module.getBody());
    ptrType = LLVM::LLVMPointerType::get(module.getContext());
    i32 = b.getI32Type();
    i64 = b.getI64Type();
    voidType = LLVM::LLVMVoidType::get(module.getContext());
  }

  /// `int <cName>_<kind>(void *stream, void *params...)` calling the host
  /// function `entry.func` on memref descriptors of the static shapes;
  /// returns it through `made`.
  LogicalResult build(const EntryPointInfo &entry, StringRef symbol,
                      LLVM::LLVMFuncOp &made) {
    LLVM::LLVMFuncOp impl = entry.func;
    int64_t expected = 0;
    for (const EntryParam &param : entry.params)
      expected += 3 + 2 * static_cast<int64_t>(param.shape.size());
    if (impl.getNumArguments() != expected)
      return impl.emitError("expected a host function with ")
             << expected << " arguments (expanded memref descriptors)";

    // The stream, T with a dynamic token count, a pointer a tensor.
    bool dynamic = entry.maxTokens > 0;
    unsigned firstParam = dynamic ? 2 : 1;
    SmallVector<Type> argTypes(entry.params.size() + firstParam, ptrType);
    if (dynamic)
      argTypes[1] = i64;
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToEnd(module.getBody());
    auto func = LLVM::LLVMFuncOp::create(
        b, loc, symbol, LLVM::LLVMFunctionType::get(i32, argTypes));
    made = func;
    Block *entryBlock = func.addEntryBlock(b);
    Region &body = func.getBody();
    Block *run = new Block();
    body.push_back(run);
    Block *refuse = new Block();
    body.push_back(refuse);
    refuse->addArgument(i32, loc);
    refuse->addArgument(ptrType, loc);

    // Null and alignment checks, each a branch to `refuse` with its message.
    b.setInsertionPointToStart(entryBlock);
    call("moeClearLastError", voidType, {});
    Block *current = entryBlock;
    Value tokens;
    if (dynamic) {
      tokens = entryBlock->getArgument(1);
      Value below = LLVM::ICmpOp::create(b, loc, LLVM::ICmpPredicate::slt,
                                         tokens, constant(i64, 1));
      Value above =
          LLVM::ICmpOp::create(b, loc, LLVM::ICmpPredicate::sgt, tokens,
                               constant(i64, entry.maxTokens));
      Value outside = LLVM::OrOp::create(b, loc, below, above);
      current = check(current, outside, kEntryInvalidArgument,
                      (symbol + ": the token count T is outside [1, " +
                       Twine(entry.maxTokens) + "], the bound it was " +
                       "compiled for")
                          .str(),
                      run);
    }
    for (auto [i, param] : llvm::enumerate(entry.params)) {
      Value pointer = entryBlock->getArgument(i + firstParam);
      std::string what = (symbol + ": parameter " + Twine(i + 1) + " '" +
                          param.name + "' (" + describeEntryParam(param) + ")")
                             .str();
      b.setInsertionPointToEnd(current);
      Value null = LLVM::ZeroOp::create(b, loc, ptrType);
      Value isNull =
          LLVM::ICmpOp::create(b, loc, LLVM::ICmpPredicate::eq, pointer, null);
      current = check(current, isNull, kEntryInvalidArgument,
                      what + " is a null pointer", run);
      Value address = LLVM::PtrToIntOp::create(b, loc, i64, pointer);
      Value mask = constant(i64, kEntryPointerAlignment - 1);
      Value low = LLVM::AndOp::create(b, loc, address, mask);
      Value misaligned = LLVM::ICmpOp::create(b, loc, LLVM::ICmpPredicate::ne,
                                              low, constant(i64, 0));
      current =
          check(current, misaligned, kEntryMisaligned,
                what + " is not " + std::to_string(kEntryPointerAlignment) +
                    "-byte aligned",
                run);
    }
    b.setInsertionPointToEnd(current);
    LLVM::BrOp::create(b, loc, ValueRange{}, run);

    // Borrow the caller's stream, call the host function on descriptors of
    // the static shapes (allocated = aligned pointer, offset 0, row-major
    // strides), give the stream back and report the runtime's status.
    b.setInsertionPointToStart(run);
    Value stream = entryBlock->getArgument(0);
    call("moeSetLaunchStream", i32, {stream});
    SmallVector<Value> args;
    for (auto [i, param] : llvm::enumerate(entry.params)) {
      Value pointer = entryBlock->getArgument(i + firstParam);
      args.append({pointer, pointer, constant(i64, 0)});
      // A leading size that follows T is its rows a token times T; only it
      // is dynamic, so the strides are not.
      for (int64_t size : param.shape)
        args.push_back(
            size >= 0 ? constant(i64, size)
                      : LLVM::MulOp::create(b, loc, tokens,
                                            constant(i64, param.rowsPerToken))
                            .getResult());
      int64_t stride = 1;
      SmallVector<Value> strides;
      for (int64_t size : llvm::reverse(param.shape)) {
        strides.push_back(constant(i64, stride));
        stride *= std::max<int64_t>(size, 1);
      }
      llvm::append_range(args, llvm::reverse(strides));
    }
    LLVM::CallOp::create(b, loc, impl, args);
    call("moeSetLaunchStream", i32, {LLVM::ZeroOp::create(b, loc, ptrType)});
    Value status = call("moeGetLastStatus", i32, {});
    LLVM::ReturnOp::create(b, loc, status);

    b.setInsertionPointToStart(refuse);
    Value code = call("moeSetErrorMessage", i32,
                      {refuse->getArgument(0), refuse->getArgument(1)});
    LLVM::ReturnOp::create(b, loc, code);
    return success();
  }

  /// `size_t <symbol>(void)` returning `bytes`; with a dynamic token count
  /// (`maxTokens` > 0) `int64_t <symbol>(int64_t T)`, which returns `bytes`
  /// (the workspace planned at the bound, enough for every T up to it) for
  /// T in [1, maxTokens] and -1 otherwise.
  void buildWorkspaceBytes(StringRef symbol, int64_t bytes, int64_t maxTokens) {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToEnd(module.getBody());
    SmallVector<Type> params;
    if (maxTokens > 0)
      params.push_back(i64);
    auto func = LLVM::LLVMFuncOp::create(
        b, loc, symbol, LLVM::LLVMFunctionType::get(i64, params));
    b.setInsertionPointToStart(func.addEntryBlock(b));
    Value result = constant(i64, bytes);
    if (maxTokens > 0) {
      Value tokens = func.getArgument(0);
      Value below = LLVM::ICmpOp::create(b, loc, LLVM::ICmpPredicate::slt,
                                         tokens, constant(i64, 1));
      Value above = LLVM::ICmpOp::create(b, loc, LLVM::ICmpPredicate::sgt,
                                         tokens, constant(i64, maxTokens));
      Value outside = LLVM::OrOp::create(b, loc, below, above);
      result =
          LLVM::SelectOp::create(b, loc, outside, constant(i64, -1), result);
    }
    LLVM::ReturnOp::create(b, loc, result);
  }

private:
  Value constant(Type type, int64_t value) {
    return LLVM::ConstantOp::create(b, loc, type,
                                    b.getIntegerAttr(type, value));
  }

  /// Calls the runtime function `name`, declaring it on first use.
  Value call(StringRef name, Type result, ValueRange args) {
    auto callee = module.lookupSymbol<LLVM::LLVMFuncOp>(name);
    if (!callee) {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(module.getBody());
      callee = LLVM::LLVMFuncOp::create(
          b, loc, name,
          LLVM::LLVMFunctionType::get(result,
                                      llvm::to_vector(args.getTypes())));
    }
    auto op = LLVM::CallOp::create(b, loc, callee, args);
    return op.getNumResults() ? op.getResult() : Value();
  }

  /// A private constant C string; returns its address.
  Value string(StringRef text) {
    std::string name = "__moe_message_" + std::to_string(messages++);
    {
      OpBuilder::InsertionGuard guard(b);
      b.setInsertionPointToStart(module.getBody());
      std::string data = text.str();
      data.push_back('\0');
      auto type = LLVM::LLVMArrayType::get(b.getI8Type(), data.size());
      LLVM::GlobalOp::create(b, loc, type, /*isConstant=*/true,
                             LLVM::Linkage::Private, name,
                             b.getStringAttr(data));
    }
    return LLVM::AddressOfOp::create(b, loc, ptrType, name);
  }

  /// Ends `current` with a branch to `refuse(code, message)` if `condition`
  /// holds; returns the block that continues otherwise.
  Block *check(Block *current, Value condition, int32_t code,
               const std::string &message, Block *before) {
    b.setInsertionPointToEnd(current);
    Value codeValue = constant(i32, code);
    Value messageValue = string(message);
    Block *next = b.createBlock(before);
    Block *refuse = &current->getParent()->back();
    b.setInsertionPointToEnd(current);
    LLVM::CondBrOp::create(b, loc, condition, refuse,
                           ValueRange{codeValue, messageValue}, next,
                           ValueRange{});
    b.setInsertionPointToStart(next);
    return next;
  }

  ModuleOp module;
  OpBuilder b;
  Location loc;
  Type ptrType, i32, i64, voidType;
  unsigned messages = 0;
};

struct MoEGPUBuildEntryPointsPass
    : public moe::impl::MoEGPUBuildEntryPointsBase<MoEGPUBuildEntryPointsPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    // The forward and backward host functions (or their stages), forward
    // first.
    SmallVector<EntryPointInfo, 2> entries;
    for (LLVM::LLVMFuncOp func : entryFunctions(module, /*internal=*/true)) {
      FailureOr<EntryPointInfo> entry = readEntryPoint(func);
      if (failed(entry))
        return signalPassFailure();
      entries.push_back(std::move(*entry));
    }
    if (entries.empty() || (entries.front().kind != "forward" &&
                            entries.front().kind != "forward_stage0")) {
      module.emitError("moe-gpu-build-entry-points: no moe layer function to "
                       "compile (a func.func of moe ops on tensors)");
      return signalPassFailure();
    }
    const EntryPointInfo &forward = entries.front();
    for (const EntryPointInfo &entry : entries)
      if (entry.layerName != forward.layerName) {
        module.emitError("moe-gpu-build-entry-points: more than one layer (@")
            << forward.layerName << ", @" << entry.layerName
            << "); a module compiles one";
        return signalPassFailure();
      }
    std::string cName = cIdentifier(forward.layerName);

    EntryPointBuilder builder(module);
    MLIRContext *context = &getContext();
    for (EntryPointInfo &entry : entries) {
      std::string symbol = cName + "_" + entry.kind;
      std::string implName = "__moe_host_" + symbol;
      if (Operation *taken = module.lookupSymbol(implName)) {
        taken->emitError("moe-gpu-build-entry-points: @")
            << implName << " exists already";
        return signalPassFailure();
      }
      if (failed(SymbolTable::replaceAllSymbolUses(
              entry.func, StringAttr::get(context, implName), module)))
        return signalPassFailure();
      entry.func.setSymName(implName);
      entry.func.setLinkage(LLVM::Linkage::Internal);
      if (Operation *taken = module.lookupSymbol(symbol)) {
        taken->emitError("moe-gpu-build-entry-points: @")
            << symbol << " exists already, the name of an entry point";
        return signalPassFailure();
      }
      LLVM::LLVMFuncOp made;
      if (failed(builder.build(entry, symbol, made)))
        return signalPassFailure();
      for (StringRef name : kEntryAttrs)
        if (Attribute attr = entry.func->getAttr(name)) {
          made->setAttr(name, attr);
          entry.func->removeAttr(name);
        }
      builder.buildWorkspaceBytes(symbol + "_workspace_bytes",
                                  entry.workspaceBytes, entry.maxTokens);
    }
  }
};

} // namespace

FailureOr<EntryPointInfo> mlir::moe::readEntryPoint(LLVM::LLVMFuncOp func) {
  EntryPointInfo entry;
  entry.func = func;
  auto kind = func->getAttrOfType<StringAttr>(kGPUEntryAttr);
  auto layerName = func->getAttrOfType<StringAttr>(kGPULayerNameAttr);
  auto params = func->getAttrOfType<ArrayAttr>(kGPUParamsAttr);
  auto workspace = func->getAttrOfType<IntegerAttr>(kGPUWorkspaceBytesAttr);
  if (!kind || !layerName || !params || !workspace)
    return func.emitError("the host function lacks the moe.gpu.* attributes "
                          "of convert-moe-to-gpu");
  entry.kind = kind.str();
  entry.layerName = layerName.str();
  entry.workspaceBytes = workspace.getInt();
  entry.layer = func->getAttrOfType<DictionaryAttr>(kGPULayerAttr);
  entry.stage = func->getAttrOfType<DictionaryAttr>(kGPUEPStageAttr);
  if (auto bound = func->getAttrOfType<IntegerAttr>(kGPUMaxTokensAttr))
    entry.maxTokens = bound.getInt();
  for (Attribute attr : params) {
    auto dict = dyn_cast<DictionaryAttr>(attr);
    auto shape = dict ? dict.getAs<DenseI64ArrayAttr>("shape") : nullptr;
    if (!shape)
      return func.emitError("malformed moe.gpu.params entry ") << attr;
    EntryParam &param = entry.params.emplace_back(EntryParam{
        getString(dict, "name"), getString(dict, "role"),
        getString(dict, "dtype"), llvm::to_vector(shape.asArrayRef()),
        getString(dict, "forward_param"), getString(dict, "of"),
        getString(dict, "memory")});
    if (auto rows = dict.getAs<IntegerAttr>("rows_per_token"))
      param.rowsPerToken = rows.getInt();
    bool dynamic = llvm::any_of(param.shape, [](int64_t d) { return d < 0; });
    if (dynamic && (entry.maxTokens <= 0 || param.shape.front() >= 0 ||
                    llvm::any_of(ArrayRef(param.shape).drop_front(),
                                 [](int64_t d) { return d < 0; }) ||
                    param.rowsPerToken <= 0))
      return func.emitError("parameter '")
             << param.name
             << "' has a dynamic size but for a leading dimension that "
                "follows a bounded token count";
  }
  return entry;
}

std::string mlir::moe::cIdentifier(StringRef name) {
  std::string result;
  for (char c : name)
    result += llvm::isAlnum(c) || c == '_' ? c : '_';
  if (result.empty() || llvm::isDigit(result.front()))
    result.insert(result.begin(), '_');
  return result;
}

std::string mlir::moe::describeEntryParam(const EntryParam &param) {
  std::string text = param.role;
  if (!param.forwardParam.empty() && param.forwardParam != param.name)
    text += " (forward " + param.forwardParam + ")";
  if (!param.of.empty())
    text += " of " + param.of;
  text += ", " + param.dtype + " [";
  text += llvm::join(llvm::map_range(param.shape,
                                     [&](int64_t d) {
                                       if (d >= 0)
                                         return std::to_string(d);
                                       if (param.rowsPerToken == 1)
                                         return std::string("T");
                                       return "T * " + std::to_string(
                                                           param.rowsPerToken);
                                     }),
                     ", ");
  text += "]";
  if (param.memory == "host")
    text += " in pinned host memory";
  return text;
}

SmallVector<EntryPointInfo, 2> mlir::moe::getEntryPoints(ModuleOp module) {
  SmallVector<EntryPointInfo, 2> entries;
  for (LLVM::LLVMFuncOp func : entryFunctions(module, /*internal=*/false))
    if (FailureOr<EntryPointInfo> entry = readEntryPoint(func);
        succeeded(entry))
      entries.push_back(std::move(*entry));
  return entries;
}
