//===- SplitKernelModules.cpp - a gpu.module a launched kernel ------------===//
//
// Each kernel a layer launches goes into a gpu.module of its own, with the
// device functions it calls: the layer carries only its kernels, and the
// compiled-kernel cache, keyed by a module's text, finds a kernel by its
// config whichever layer asks.
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/Passes.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEGPUSPLITKERNELMODULES
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

/// `kernel` and the symbols of `source` it uses, directly or through one
/// another.
llvm::SetVector<Operation *> getClosure(gpu::GPUModuleOp source,
                                        Operation *kernel) {
  SymbolTable symbols(source);
  llvm::SetVector<Operation *> closure;
  SmallVector<Operation *> worklist = {kernel};
  while (!worklist.empty()) {
    Operation *op = worklist.pop_back_val();
    if (!closure.insert(op))
      continue;
    op->walk([&](Operation *nested) {
      std::optional<SymbolTable::UseRange> uses =
          SymbolTable::getSymbolUses(nested);
      if (!uses)
        return;
      for (const SymbolTable::SymbolUse &use : *uses)
        if (Operation *callee =
                symbols.lookup(use.getSymbolRef().getRootReference()))
          worklist.push_back(callee);
    });
  }
  return closure;
}

struct MoEGPUSplitKernelModulesPass
    : public moe::impl::MoEGPUSplitKernelModulesBase<
          MoEGPUSplitKernelModulesPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SymbolTable symbols(module);
    // The launches of each kernel, in the order of the first.
    llvm::MapVector<SymbolRefAttr, SmallVector<gpu::LaunchFuncOp>> launches;
    module.walk([&](gpu::LaunchFuncOp launch) {
      if (!launch->getParentOfType<gpu::GPUModuleOp>())
        launches[launch.getKernel()].push_back(launch);
    });
    llvm::SetVector<gpu::GPUModuleOp> sources;
    for (auto &[kernelRef, uses] : launches) {
      auto source =
          symbols.lookup<gpu::GPUModuleOp>(kernelRef.getRootReference());
      StringAttr kernelName = kernelRef.getLeafReference();
      auto kernel =
          source ? source.lookupSymbol<gpu::GPUFuncOp>(kernelName) : nullptr;
      if (!kernel) {
        uses.front().emitError("moe-gpu-split-kernel-modules: no kernel ")
            << kernelRef;
        return signalPassFailure();
      }
      // A kernel already alone in its module keeps it.
      if (source.getName() == kernelName.getValue() &&
          getClosure(source, kernel).size() ==
              static_cast<size_t>(
                  llvm::range_size(source.getBody()->without_terminator())))
        continue;
      if (Operation *taken = symbols.lookup(kernelName)) {
        taken->emitError("moe-gpu-split-kernel-modules: @")
            << kernelName.getValue()
            << " is taken, so the kernel of that name cannot get a "
               "gpu.module of it";
        return signalPassFailure();
      }
      sources.insert(source);
      llvm::SetVector<Operation *> closure = getClosure(source, kernel);
      OpBuilder builder(source);
      auto split = gpu::GPUModuleOp::create(builder, source.getLoc(),
                                            kernelName.getValue());
      // The targets and other attributes, but its own name.
      for (NamedAttribute attr : source->getAttrs())
        if (attr.getName() != SymbolTable::getSymbolAttrName())
          split->setAttr(attr.getName(), attr.getValue());
      builder.setInsertionPoint(split.getBody(), split.getBody()->end());
      for (Operation &op : source.getBody()->without_terminator())
        if (closure.contains(&op))
          builder.clone(op);
      symbols.insert(split);
      auto ref = SymbolRefAttr::get(split.getNameAttr(),
                                    {FlatSymbolRefAttr::get(kernelName)});
      for (gpu::LaunchFuncOp launch : uses)
        launch.setKernelAttr(ref);
    }
    for (gpu::GPUModuleOp source : sources)
      symbols.erase(source);
  }
};

} // namespace
