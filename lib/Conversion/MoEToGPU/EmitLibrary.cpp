//===- EmitLibrary.cpp - moe-gpu-emit-library -----------------------------===//
//
// The GPU library the kernel builder makes, written into a module, for tools
// that compile it without a layer (the op-level GPU checks).
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/MoEToGPU/KernelBuilder.h"
#include "moe/Conversion/Passes.h"

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
    module.getBody()->getOperations().splice(
        module.getBody()->end(), library->getBody()->getOperations());
    module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                    UnitAttr::get(&getContext()));
  }
};

} // namespace
