//===- AlignDynamicSharedMemory.cpp - 1024-aligned dynamic smem -*- C++ -*-===//
//
// convert-gpu-to-nvvm lowers gpu.dynamic_shared_memory to an internal
// zero-size global aligned to 16 (docs/gpu-kernels.md, pitfall P6); swizzled
// TMA/wgmma tiles need 1024. An external global becomes
// `.extern .shared .align 1024 .b8 __dynamic_shmem__0[];`, which ptxas places
// at the start of dynamic smem.
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/Passes.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEALIGNDYNAMICSHAREDMEMORY
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

/// The name convert-gpu-to-nvvm gives the dynamic shared memory globals.
constexpr llvm::StringLiteral kDynamicSharedMemoryPrefix = "__dynamic_shmem__";
constexpr unsigned kSharedAddressSpace = 3;

struct MoEAlignDynamicSharedMemoryPass
    : public moe::impl::MoEAlignDynamicSharedMemoryBase<
          MoEAlignDynamicSharedMemoryPass> {
  using Base::Base;

  void runOnOperation() override {
    if (alignment == 0 || !llvm::isPowerOf2_64(alignment)) {
      getOperation().emitError("moe-align-dynamic-shared-memory: alignment ")
          << static_cast<uint64_t>(alignment) << " is not a power of two";
      return signalPassFailure();
    }
    getOperation().walk([&](LLVM::GlobalOp global) {
      if (global.getAddrSpace() != kSharedAddressSpace ||
          !global.getSymName().starts_with(kDynamicSharedMemoryPrefix))
        return;
      global.setLinkage(LLVM::Linkage::External);
      global.setAlignment(static_cast<uint64_t>(alignment));
    });
  }
};

} // namespace
