//===- EmitLibrary.cpp - moe-gpu-emit-library -----------------------------===//
//
// The GPU library the kernel builder makes, written into a module, for tools
// that compile it without a layer (the op-level GPU checks).
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/MoEToGPU/KernelBuilder.h"
#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoEGPU/Transforms/KernelRoles.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/SymbolTable.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUEMITLIBRARY
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

struct MoEGPUEmitLibraryPass
    : public moe::impl::MoEGPUEmitLibraryBase<MoEGPUEmitLibraryPass> {
  using Base::Base;

  /// Replaces each host function whose GEMMs `configs` configure by the
  /// variant that runs them, under the function's name.
  LogicalResult applyConfigs(ModuleOp library) {
    SmallVector<moe_gpu::GemmOverride> overrides;
    for (const std::string &text : configs) {
      FailureOr<moe_gpu::GemmOverride> override = moe_gpu::parseGemmOverride(
          text, [&]() { return getOperation().emitError(); });
      if (failed(override))
        return failure();
      overrides.push_back(std::move(*override));
    }
    if (overrides.empty())
      return success();
    MLIRContext *context = &getContext();
    for (StringRef name : moe::libraryHostFunctionNames()) {
      // The op a host function runs: its name without the prefix and the
      // accumulating or H-only suffix.
      StringRef op = name;
      op.consume_front("__moe_gpu_");
      if (!op.consume_back("_acc"))
        op.consume_back("_h");
      SmallVector<moe::HostGemmConfig> chosen;
      for (moe::HostGemmConfig role : moe::libraryHostGemmConfigs(name)) {
        auto config = moe_gpu::GemmConfigAttr::get(context, role.config);
        for (const moe_gpu::GemmOverride &override : overrides) {
          if (!override.matches(op, role.role))
            continue;
          FailureOr<moe_gpu::GemmConfigAttr> overridden =
              moe_gpu::applyGemmOverride(config, override, [&]() {
                return getOperation().emitError() << "in @" << name << ": ";
              });
          if (failed(overridden))
            return failure();
          config = *overridden;
        }
        chosen.push_back({role.role, config.getConfig()});
      }
      // expert_ffn takes b_gate_up and b_down together, for its up and its
      // down GEMM: one of them configured with the biases alone would drop
      // the other's.
      if (op == "expert_ffn" && name == ("__moe_gpu_" + op).str()) {
        auto biased = [&](StringRef role) {
          return llvm::any_of(chosen, [&](const moe::HostGemmConfig &c) {
            return c.role == role && c.config.bias;
          });
        };
        if (biased("up") != biased("down"))
          return getOperation().emitError()
                 << "in @" << name
                 << ": expert_ffn's up and down GEMMs add the expert biases "
                    "together (bias = true on both or on neither)";
      }
      std::string variant = moe::libraryHostFunctionVariantName(name, chosen);
      if (variant == name)
        continue;
      auto base = library.lookupSymbol<func::FuncOp>(name);
      // An accumulating function whose config cannot add to C is left out,
      // as the conversion then leaves the add unfolded.
      if (!moe::canBuildLibraryHostFunction(name, chosen)) {
        base.erase();
        continue;
      }
      FailureOr<func::FuncOp> built =
          moe::buildLibraryHostFunction(library, name, chosen);
      if (failed(built))
        return failure();
      // In the base's place, under its name.
      built->getOperation()->moveBefore(base);
      base.erase();
      built->setName(name);
      built->setPrivate();
    }
    return success();
  }

  void runOnOperation() override {
    ModuleOp module = getOperation();
    OwningOpRef<ModuleOp> library = moe::buildGPULibrary(&getContext());
    if (!library)
      return signalPassFailure();
    SymbolTable symbols(module);
    for (Operation &op : library->getBody()->getOperations()) {
      StringAttr name = SymbolTable::getSymbolName(&op);
      if (name && symbols.lookup(name)) {
        module.emitError("moe-gpu-emit-library: the module already has @")
            << name.getValue() << ", a symbol of the GPU library";
        return signalPassFailure();
      }
    }
    if (failed(applyConfigs(*library)))
      return signalPassFailure();
    module.getBody()->getOperations().splice(
        module.getBody()->end(), library->getBody()->getOperations());
    module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                    UnitAttr::get(&getContext()));
  }
};

} // namespace
