//===- moe-parser-fuzzer.cpp - libFuzzer harness for moe-mlir -*- C++ -*-===//
//
// Parses each input as MLIR with the moe, func, arith and tensor dialects and
// swallows the diagnostics. When the input parses and verifies, it is also
// printed, and moe-decompose, moe-generate-backward, convert-moe-to-gpu and
// the rest of moe-training-pipeline{chip=sm_90a format=isa} up to PTX, then
// convert-moe-to-linalg and moe-lower-to-cpu-pipeline run on it. A pass that
// fails with a diagnostic is fine; a crash, a leak, a hang, or one of our
// passes succeeding with IR that does not verify is a bug (the last one
// aborts). Modelled on upstream
// mlir/tools/mlir-parser-fuzzer/text/mlir-text-parser-fuzzer.cpp.
//
// The library kernels' bodies do not depend on the input, and compiling them
// takes 1.6 s; before the GPU lowering they are replaced by a bare return
// (their signatures, which the launches must match, stay), so every input
// still goes through the inlined host code, gpu-to-llvm and PTX generation.
// test/Target/NVPTX covers the real kernels.
//
// With MOE_FUZZ_LAYERS=1 in the environment the harness is structure-aware:
// the fuzzer's bytes choose a module of moe.layer functions, built with the op
// builders (every routing option, bias, shared experts, capacity factors, the
// element types and activations, dynamic dimensions, sizes at and past every
// limit, extra and passthrough results, several functions, a nested module;
// then, from the bytes left, gelu_tanh in place of the non-gated activations,
// expert biases and moe.update_selection_bias functions, alone or as the
// forward and backward pair that moe-compile takes), and what verifies goes
// through the same passes. test/Fuzz/layer_fuzz.py does the same from random
// seeds through the command-line tools.
//
// Built with -DMOE_ENABLE_FUZZER=ON; scripts/fuzz.sh runs both modes.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoEGPU/IR/MoEGPUDialect.h"
#include "moe/InitAll.h"

#include "moe/Pipelines/Pipelines.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/raw_ostream.h"

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>

using namespace mlir;

namespace {

/// The dialects an input may use.
const DialectRegistry &parserRegistry() {
  static const DialectRegistry *registry = [] {
    auto *r = new DialectRegistry();
    r->insert<moe::MoEDialect, moe_gpu::MoEGPUDialect, func::FuncDialect,
              arith::ArithDialect, tensor::TensorDialect>();
    return r;
  }();
  return *registry;
}

/// What the passes need on top: the dialects they produce and the
/// bufferization and convert-to-llvm models of moe-lower-to-cpu-pipeline.
const DialectRegistry &passRegistry() {
  static const DialectRegistry *registry = [] {
    auto *r = new DialectRegistry();
    moe::registerMoECPUPathDialects(*r);
    moe::registerMoEGPUPathDialects(*r);
    return r;
  }();
  return *registry;
}

/// Runs one of our passes on a copy of `module`; returns the copy when the
/// pass succeeds, null when it fails. A pass that succeeds must leave IR that
/// verifies: otherwise this aborts, so that libFuzzer keeps the input.
OwningOpRef<ModuleOp> runOurPass(ModuleOp module, std::unique_ptr<Pass> pass) {
  OwningOpRef<ModuleOp> copy = module.clone();
  PassManager pm(module.getContext());
  pm.enableVerifier(false);
  pm.addPass(std::move(pass));
  if (failed(pm.run(*copy)))
    return nullptr;
  if (failed(verify(*copy))) {
    llvm::errs() << "moe-parser-fuzzer: a pass succeeded but its output does "
                    "not verify\n";
    abort();
  }
  return copy;
}

/// Empties every kernel of the GPU library: the body becomes `gpu.return`.
void stripKernelBodies(ModuleOp module) {
  module.walk([](gpu::GPUFuncOp kernel) {
    Region &body = kernel.getBody();
    body.dropAllReferences();
    while (body.getBlocks().size() > 1)
      body.back().erase();
    body.front().clear();
    OpBuilder builder = OpBuilder::atBlockEnd(&body.front());
    gpu::ReturnOp::create(builder, kernel.getLoc());
  });
}

} // namespace

/// Only our libraries are instrumented, not the MLIR and LLVM archives they
/// link. llvm::BumpPtrAllocator poisons and unpoisons its slabs with
/// __asan_(un)poison_memory_region in inline code, so an instrumented copy can
/// poison memory that an uninstrumented one then hands out; ignore that manual
/// poisoning (heap, stack and global checks stay on).
extern "C" const char *__asan_default_options() {
  return "allow_user_poisoning=0";
}

static void runPasses(MLIRContext &context, ModuleOp module);

namespace {

/// A dimension: mostly small, sometimes 0, a limit, past one, or dynamic.
int64_t pickSize(FuzzedDataProvider &bytes, ArrayRef<int64_t> usual) {
  static constexpr int64_t kEdges[] = {0,
                                       1,
                                       63,
                                       65,
                                       65536,
                                       65600,
                                       2147483647,
                                       2147483648LL,
                                       4611686018427387904LL};
  switch (bytes.ConsumeIntegralInRange<int>(0, 9)) {
  case 0:
    return ShapedType::kDynamic;
  case 1:
    return kEdges[bytes.ConsumeIntegralInRange<size_t>(0,
                                                       std::size(kEdges) - 1)];
  default:
    return usual[bytes.ConsumeIntegralInRange<size_t>(0, usual.size() - 1)];
  }
}

/// size * factor; a size that would overflow stays as it is (the layer's
/// shapes then disagree, which its verifier reports).
int64_t times(int64_t size, int64_t factor) {
  if (ShapedType::isDynamic(size) ||
      size > std::numeric_limits<int64_t>::max() / factor)
    return size;
  return size * factor;
}

/// Appends one func.func holding a moe.layer chosen by `bytes` at the end of
/// `block`; false when the bytes ask for what cannot be built (an attribute
/// the attribute verifier refuses).
bool buildLayer(OpBuilder &builder, FuzzedDataProvider &bytes, Block &block,
                unsigned index) {
  MLIRContext *context = builder.getContext();
  Location loc = builder.getUnknownLoc();
  Type elements[] = {builder.getF32Type(), builder.getBF16Type(),
                     builder.getF16Type()};
  Type element = elements[bytes.ConsumeIntegralInRange<int>(0, 2)];
  auto activation =
      static_cast<moe::Activation>(bytes.ConsumeIntegralInRange<int>(0, 2));
  bool gated = activation == moe::Activation::swiglu;
  int64_t tokens = pickSize(bytes, {1, 2, 7, 37, 64});
  int64_t d = pickSize(bytes, {4, 8, 48, 64, 128});
  int64_t n = pickSize(bytes, {4, 8, 40, 64, 128});
  int64_t experts =
      bytes.PickValueInArray<int64_t>({1, 2, 4, 5, 8, 64, 1024, 1025});
  auto scoring = bytes.ConsumeBool() ? moe::ScoringFunc::sigmoid
                                     : moe::ScoringFunc::softmax;
  int64_t topK = bytes.ConsumeIntegralInRange<int64_t>(0, experts + 1);
  int64_t groups = bytes.PickValueInArray<int64_t>({1, 1, 2, 3, 4, 8});
  int64_t topkGroups = bytes.ConsumeIntegralInRange<int64_t>(0, groups + 1);
  double scaling = bytes.PickValueInArray<double>({1.0, 2.5, 0.0, -1.0});
  moe::RoutingAttr routing = moe::RoutingAttr::getChecked(
      [&] { return emitError(loc); }, context, scoring, topK,
      bytes.ConsumeBool(), groups, topkGroups, llvm::APFloat(scaling),
      bytes.ConsumeBool());
  if (!routing)
    return false;

  auto tensor = [&](ArrayRef<int64_t> shape, Type type) {
    return RankedTensorType::get(shape, type);
  };
  SmallVector<Type> inputs = {tensor({tokens, d}, element),
                              tensor({d, experts}, element)};
  bool hasBias = bytes.ConsumeBool();
  if (hasBias)
    inputs.push_back(tensor({experts}, builder.getF32Type()));
  inputs.push_back(tensor({experts, d, times(n, gated ? 2 : 1)}, element));
  inputs.push_back(tensor({experts, n, d}, element));
  bool hasShared = bytes.ConsumeIntegralInRange<int>(0, 3) == 0;
  if (hasShared) {
    int64_t m = pickSize(bytes, {8, 64});
    inputs.push_back(tensor({d, times(m, gated ? 2 : 1)}, element));
    inputs.push_back(tensor({m, d}, element));
  }
  FloatAttr capacity;
  if (bytes.ConsumeIntegralInRange<int>(0, 5) == 0)
    capacity = builder.getF64FloatAttr(
        bytes.PickValueInArray<double>({1.0, 1.25, 0.5, 0.0}));

  Type out = inputs[0];
  Type logits = tensor({tokens, experts}, builder.getF32Type());
  SmallVector<Type> results = {out};
  bool returnLogits = bytes.ConsumeBool();
  if (returnLogits)
    results.push_back(logits);
  bool passthrough = bytes.ConsumeIntegralInRange<int>(0, 4) == 0;
  if (passthrough)
    results.push_back(inputs[1]);

  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToEnd(&block);
  auto func =
      func::FuncOp::create(builder, loc, "layer" + std::to_string(index),
                           builder.getFunctionType(inputs, results));
  Block *body = func.addEntryBlock();
  builder.setInsertionPointToEnd(body);
  ValueRange args = body->getArguments();
  unsigned next = 2;
  Value bias = hasBias ? args[next++] : Value();
  Value wGateUp = args[next++];
  Value wDown = args[next++];
  Value sharedGateUp = hasShared ? args[next++] : Value();
  Value sharedDown = hasShared ? args[next++] : Value();
  // The bound of a dynamic token count, mostly given (the verifier refuses a
  // dynamic T without one), sometimes beside a static T or too large.
  IntegerAttr maxTokens;
  if (bytes.ConsumeIntegralInRange<int>(0, 3) != 0 &&
      (ShapedType::isDynamic(tokens) || bytes.ConsumeBool()))
    maxTokens = builder.getI64IntegerAttr(
        bytes.PickValueInArray<int64_t>({1, 64, 4096, 1073741824}));
  // Expert parallelism now and then: sizes that divide E or not, a capacity
  // missing, tiny or huge, the overflow rule given or not.
  IntegerAttr epSize, epCapacity, epChunkTokens;
  moe::EPOverflowAttr epOverflow;
  if (bytes.ConsumeIntegralInRange<int>(0, 3) == 0) {
    epSize = builder.getI64IntegerAttr(
        bytes.PickValueInArray<int64_t>({1, 2, 3, 4}));
    if (bytes.ConsumeIntegralInRange<int>(0, 7) != 0)
      epCapacity = builder.getI64IntegerAttr(
          bytes.PickValueInArray<int64_t>({1, 64, 1073741824}));
    if (bytes.ConsumeBool())
      epOverflow = moe::EPOverflowAttr::get(context, moe::EPOverflow::drop);
  }
  // Chunks now and then, with or without ep_size, beside a bound or not.
  if (bytes.ConsumeIntegralInRange<int>(0, 5) == 0)
    epChunkTokens = builder.getI64IntegerAttr(
        bytes.PickValueInArray<int64_t>({1, 16, 4096, 1073741824}));
  auto layer = moe::LayerOp::create(
      builder, loc, out, logits, args[0], args[1], bias, wGateUp, wDown,
      sharedGateUp, sharedDown, /*b_gate_up=*/Value(),
      /*b_down=*/Value(), routing,
      moe::ActivationAttr::get(context, activation), capacity, maxTokens,
      epSize, epCapacity, epOverflow, epChunkTokens);
  SmallVector<Value> returned = {layer.getOut()};
  if (returnLogits)
    returned.push_back(layer.getRouterLogits());
  if (passthrough)
    returned.push_back(args[1]);
  func::ReturnOp::create(builder, loc, returned);
  return true;
}

/// Gives `layer`, in `func`, expert biases b_gate_up [E, G] and b_down [E, d]
/// (two more arguments, the weights' element type).
void addExpertBiases(OpBuilder &builder, func::FuncOp func,
                     moe::LayerOp layer) {
  Location loc = layer.getLoc();
  auto wGateUp = cast<RankedTensorType>(layer.getWGateUp().getType());
  auto wDown = cast<RankedTensorType>(layer.getWDown().getType());
  Type element = wGateUp.getElementType();
  int64_t experts = wGateUp.getDimSize(0);
  Type bGateUpType =
      RankedTensorType::get({experts, wGateUp.getDimSize(2)}, element);
  Type bDownType =
      RankedTensorType::get({experts, wDown.getDimSize(2)}, element);
  unsigned at = func.getNumArguments();
  if (failed(func.insertArgument(at, bGateUpType, {}, loc)) ||
      failed(func.insertArgument(at + 1, bDownType, {}, loc)))
    return;
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPoint(layer);
  auto biased = moe::LayerOp::create(
      builder, loc, layer.getOut().getType(), layer.getRouterLogits().getType(),
      layer.getX(), layer.getRouterWeight(), layer.getRouterBias(),
      layer.getWGateUp(), layer.getWDown(), layer.getSharedGateUp(),
      layer.getSharedDown(), func.getArgument(at), func.getArgument(at + 1),
      layer.getRoutingAttr(), layer.getActivationAttr(),
      layer.getCapacityFactorAttr(), layer.getMaxTokensAttr(),
      layer.getEpSizeAttr(), layer.getEpCapacityAttr(),
      layer.getEpOverflowAttr(), layer.getEpChunkTokensAttr());
  layer.replaceAllUsesWith(biased);
  layer.erase();
}

/// Appends `moe.update_selection_bias` on a bias [E] and experts [T, k] chosen
/// by `bytes`: a function returning it, or the forward (nothing saved) and
/// empty backward pair that moe-compile compiles it as, at a token bound.
void buildSelectionBiasUpdate(OpBuilder &builder, FuzzedDataProvider &bytes,
                              Block &block, unsigned index, bool pair) {
  MLIRContext *context = builder.getContext();
  Location loc = builder.getUnknownLoc();
  int64_t experts =
      bytes.PickValueInArray<int64_t>({8, 1, 64, 256, 1024, 1025});
  int64_t tokens = pickSize(bytes, {1, 37, 64});
  int64_t topK = bytes.PickValueInArray<int64_t>({2, 1, 8});
  double rate = bytes.PickValueInArray<double>({1e-3, 1e-2, 1.0});
  auto rule = bytes.ConsumeBool() ? moe::BiasUpdate::proportional
                                  : moe::BiasUpdate::sign;
  IntegerAttr maxTokens;
  if (ShapedType::isDynamic(tokens) || bytes.ConsumeBool())
    maxTokens = builder.getI64IntegerAttr(
        bytes.PickValueInArray<int64_t>({64, 1, 65536, 1073741824}));
  auto biasType = RankedTensorType::get({experts}, builder.getF32Type());
  auto expertsType =
      RankedTensorType::get({tokens, topK}, builder.getI32Type());

  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToEnd(&block);
  std::string name = "selection_bias" + std::to_string(index);
  auto func = func::FuncOp::create(
      builder, loc, pair ? name + "_forward" : name,
      builder.getFunctionType({biasType, expertsType}, {biasType}));
  if (maxTokens)
    func->setAttr("moe.max_tokens", maxTokens);
  if (pair)
    func->setAttr("moe.num_saved", builder.getI64IntegerAttr(0));
  Block *body = func.addEntryBlock();
  builder.setInsertionPointToEnd(body);
  auto update = moe::UpdateSelectionBiasOp::create(
      builder, loc, biasType, body->getArgument(0), body->getArgument(1),
      builder.getF64FloatAttr(rate), moe::BiasUpdateAttr::get(context, rule));
  func::ReturnOp::create(builder, loc, update.getResult());
  if (!pair)
    return;
  builder.setInsertionPointToEnd(&block);
  auto backward = func::FuncOp::create(builder, loc, name + "_backward",
                                       builder.getFunctionType({biasType}, {}));
  if (maxTokens)
    backward->setAttr("moe.max_tokens", maxTokens);
  backward->setAttr("moe.gradient_args", builder.getDenseI64ArrayAttr({}));
  builder.setInsertionPointToEnd(backward.addEntryBlock());
  func::ReturnOp::create(builder, loc);
}

/// Choices added to the structure-aware mode after its first ones, read from
/// the bytes those leave, so that an input of an older corpus builds the same
/// layers (spent bytes read as 0, which is "none of these"): per layer,
/// gelu_tanh for a non-gated activation and expert biases; then up to two
/// moe.update_selection_bias functions.
void extendLayers(OpBuilder &builder, FuzzedDataProvider &bytes, Block &block,
                  unsigned functions) {
  MLIRContext *context = builder.getContext();
  SmallVector<moe::LayerOp> layers;
  block.walk([&](moe::LayerOp layer) { layers.push_back(layer); });
  for (moe::LayerOp layer : layers) {
    int choice = bytes.ConsumeIntegralInRange<int>(0, 3);
    if ((choice & 1) &&
        layer.getActivationAttr().getValue() != moe::Activation::swiglu)
      layer.setActivationAttr(
          moe::ActivationAttr::get(context, moe::Activation::gelu_tanh));
    if (choice & 2)
      addExpertBiases(builder, layer->getParentOfType<func::FuncOp>(), layer);
  }
  unsigned updates = bytes.ConsumeIntegralInRange<unsigned>(0, 2);
  for (unsigned i = 0; i < updates; ++i)
    buildSelectionBiasUpdate(builder, bytes, block, functions + i,
                             bytes.ConsumeBool());
}

/// The module of layer functions that `data` chooses, or null.
OwningOpRef<ModuleOp> buildLayers(MLIRContext &context, const uint8_t *data,
                                  size_t size) {
  FuzzedDataProvider bytes(data, size);
  // The parser loads the dialects an input names; the builders need them now.
  context.loadDialect<moe::MoEDialect, func::FuncDialect>();
  OpBuilder builder(&context);
  OwningOpRef<ModuleOp> module = ModuleOp::create(builder.getUnknownLoc());
  Block *block = module->getBody();
  if (bytes.ConsumeIntegralInRange<int>(0, 9) == 0) {
    builder.setInsertionPointToEnd(block);
    block =
        ModuleOp::create(builder, builder.getUnknownLoc(), "inner").getBody();
  }
  unsigned functions = bytes.ConsumeIntegralInRange<unsigned>(1, 3);
  for (unsigned i = 0; i < functions; ++i)
    if (!buildLayer(builder, bytes, *block, i))
      return nullptr;
  extendLayers(builder, bytes, *block, functions);
  if (failed(verify(*module)))
    return nullptr;
  return module;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // A fresh context per input: nothing carries over from one input to the
  // next, and no thread pool is started.
  MLIRContext context(parserRegistry(), MLIRContext::Threading::DISABLED);
  ScopedDiagnosticHandler swallow(&context,
                                  [](Diagnostic &) { return success(); });

  static const bool layers = [] {
    const char *mode = std::getenv("MOE_FUZZ_LAYERS");
    return mode && std::string(mode) == "1";
  }();
  if (layers) {
    if (OwningOpRef<ModuleOp> module = buildLayers(context, data, size))
      runPasses(context, *module);
    return 0;
  }

  // The lexer reads up to the terminating nul, so parse a nul-terminated copy.
  std::string source(reinterpret_cast<const char *>(data), size);

  ParserConfig config(&context);
  OwningOpRef<ModuleOp> module =
      parseSourceString<ModuleOp>(source, config, "fuzz-input");
  if (!module)
    return 0;

  runPasses(context, *module);
  return 0;
}

static void runPasses(MLIRContext &context, ModuleOp module) {
  // The input verified: the printers and the passes must cope with it.
  module->print(llvm::nulls());
  module->print(llvm::nulls(), OpPrintingFlags().printGenericOpForm());

  context.appendDialectRegistry(passRegistry());
  ModuleOp input = module;
  OwningOpRef<ModuleOp> decomposed =
      runOurPass(input, moe::createMoEDecompose());
  if (decomposed)
    input = *decomposed;
  OwningOpRef<ModuleOp> differentiated =
      runOurPass(input, moe::createMoEGenerateBackward());
  if (differentiated) {
    input = *differentiated;
    // The GPU path: diagnostics for what it cannot run, or host functions
    // that verify and lower, with the (emptied) kernels, to PTX. The
    // conversion allocates at moe-plan-memory's offsets.
    OwningOpRef<ModuleOp> planned =
        runOurPass(input, moe::createMoEPlanMemory());
    if (OwningOpRef<ModuleOp> gpu =
            planned ? runOurPass(*planned, moe::createConvertMoEToGPU())
                    : nullptr) {
      stripKernelBodies(*gpu);
      PassManager lowering(&context);
      GpuModuleToBinaryPassOptions ptx;
      ptx.compilationTarget = "isa";
      moe::addMoEGPULowering(lowering, "sm_90a", /*optLevel=*/0, ptx);
      if (succeeded(lowering.run(*gpu)))
        (*gpu)->print(llvm::nulls());
    }
  }
  // convert-moe-to-linalg decomposes what is left of moe.layer itself.
  OwningOpRef<ModuleOp> converted =
      runOurPass(input, moe::createConvertMoEToLinalg());
  if (!converted)
    return;
  // The whole CPU pipeline, with the verifier after each pass; on converted
  // IR its convert-moe-to-linalg finds nothing left to do.
  PassManager pm(&context);
  moe::buildMoELowerToCPUPipeline(pm);
  if (succeeded(pm.run(*converted)))
    (*converted)->print(llvm::nulls());
}
