//===- SerializeKernelsCached.cpp - Cached kernel binaries ------*- C++ -*-===//
//
// NVPTX code generation and ptxas take most of a layer's compile time (85%
// of it on a 2-core machine), and every layer carries the same library
// kernels. The binary
// of a lowered gpu.module is stored under a hash of everything that decides
// it, so the next compile of any layer on the machine finds it.
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/Passes.h"

#include "mlir/AsmParser/AsmParser.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Config/llvm-config.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/SHA256.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOESERIALIZEKERNELSCACHED
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;

namespace {

/// Bumped when the stored form changes.
constexpr llvm::StringLiteral kCacheFormat = "moe-kernel-cache-v1";

/// "size:mtime" of `path`, or "none": a new ptxas is a new key.
std::string fileStamp(StringRef path) {
  llvm::sys::fs::file_status status;
  if (path.empty() || llvm::sys::fs::status(path, status))
    return "none";
  return std::to_string(status.getSize()) + ":" +
         std::to_string(
             status.getLastModificationTime().time_since_epoch().count());
}

struct MoESerializeKernelsCachedPass
    : public moe::impl::MoESerializeKernelsCachedBase<
          MoESerializeKernelsCachedPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    llvm::StringMap<std::string> misses; // gpu.module name -> cache file
    if (!cacheDir.empty() || !libraryDirs.empty())
      lookUp(module, misses);

    if (!module.getOps<gpu::GPUModuleOp>().empty()) {
      GpuModuleToBinaryPassOptions options;
      options.toolkitPath = toolkitPath;
      options.cmdOptions = cmdOptions;
      options.compilationTarget = compilationTarget;
      OpPassManager pm(ModuleOp::getOperationName());
      pm.addPass(createGpuModuleToBinaryPass(options));
      if (failed(runPipeline(pm, module)))
        return signalPassFailure();
    }

    for (gpu::BinaryOp binary : module.getOps<gpu::BinaryOp>()) {
      auto it = misses.find(binary.getSymName());
      if (it == misses.end())
        continue;
      store(binary, it->second);
    }
  }

  /// The cache file name of `kernels`: a hash of its printed form and of
  /// what else the binary depends on.
  std::string cacheFileName(gpu::GPUModuleOp kernels) {
    llvm::SHA256 hash;
    std::string text;
    llvm::raw_string_ostream os(text);
    kernels->print(os, OpPrintingFlags().enableDebugInfo(false));
    hash.update(text);
    std::string ptxas;
    if (compilationTarget != "isa" && !toolkitPath.empty()) {
      SmallString<128> path(toolkitPath);
      llvm::sys::path::append(path, "bin", "ptxas");
      ptxas = std::string(path);
    }
    static const uint8_t separator = 0;
    for (StringRef part :
         {StringRef(kCacheFormat), StringRef(LLVM_VERSION_STRING),
          StringRef(compilationTarget), StringRef(toolkitPath),
          StringRef(cmdOptions), StringRef(ptxas)}) {
      hash.update(ArrayRef<uint8_t>(&separator, 1));
      hash.update(part);
    }
    hash.update(fileStamp(ptxas));
    return llvm::toHex(hash.final(), /*LowerCase=*/true) + ".mlir";
  }

  /// The objects stored at `path`, or null when there is no file there or
  /// it cannot be read (which is warned about).
  ArrayAttr readEntry(gpu::GPUModuleOp kernels, StringRef path) {
    llvm::ErrorOr<std::unique_ptr<llvm::MemoryBuffer>> file =
        llvm::MemoryBuffer::getFile(path);
    if (!file)
      return nullptr;
    ArrayAttr objects;
    {
      // A damaged entry is recompiled: its parse errors are not the user's.
      ScopedDiagnosticHandler quiet(&getContext(),
                                    [](Diagnostic &) { return success(); });
      objects = llvm::dyn_cast_or_null<ArrayAttr>(
          parseAttribute((*file)->getBuffer(), &getContext()));
    }
    if (objects && !objects.empty())
      return objects;
    emitWarning(kernels.getLoc(), "moe-serialize-kernels-cached: "
                                  "ignoring the unreadable cache entry ")
        << path;
    return nullptr;
  }

  /// Replaces each gpu.module whose binary is stored (in cache-dir, then in
  /// a library directory) by that binary; the others go into `misses`, to
  /// be stored in cache-dir when there is one.
  void lookUp(ModuleOp module, llvm::StringMap<std::string> &misses) {
    for (gpu::GPUModuleOp kernels :
         llvm::make_early_inc_range(module.getOps<gpu::GPUModuleOp>())) {
      std::string name = cacheFileName(kernels);
      std::string path;
      ArrayAttr objects;
      if (!cacheDir.empty()) {
        SmallString<128> cached(cacheDir);
        llvm::sys::path::append(cached, name);
        path = std::string(cached);
        objects = readEntry(kernels, path);
      }
      for (const std::string &dir : libraryDirs) {
        if (objects)
          break;
        SmallString<128> prebuilt(dir);
        llvm::sys::path::append(prebuilt, name);
        if ((objects = readEntry(kernels, prebuilt)))
          ++numLibraryHits;
      }
      if (!objects) {
        if (!path.empty())
          misses[kernels.getName()] = path;
        continue;
      }
      OpBuilder builder(kernels);
      gpu::BinaryOp::create(builder, kernels.getLoc(), kernels.getName(),
                            /*offloadingHandler=*/nullptr, objects);
      kernels.erase();
      ++numHits;
    }
  }

  /// Writes `binary`'s objects to `path` through a temporary file.
  void store(gpu::BinaryOp binary, StringRef path) {
    ++numMisses;
    if (std::error_code ec = llvm::sys::fs::create_directories(cacheDir)) {
      emitWarning(binary.getLoc(), "moe-serialize-kernels-cached: cannot "
                                   "create ")
          << cacheDir << ": " << ec.message();
      return;
    }
    std::string temporary =
        (path + ".tmp" + Twine(llvm::sys::Process::getProcessId())).str();
    {
      std::error_code ec;
      llvm::raw_fd_ostream os(temporary, ec);
      if (ec) {
        emitWarning(binary.getLoc(), "moe-serialize-kernels-cached: cannot "
                                     "write ")
            << temporary << ": " << ec.message();
        return;
      }
      binary.getObjectsAttr().print(os);
    }
    if (std::error_code ec = llvm::sys::fs::rename(temporary, path)) {
      emitWarning(binary.getLoc(), "moe-serialize-kernels-cached: cannot "
                                   "store ")
          << path << ": " << ec.message();
      llvm::sys::fs::remove(temporary);
    }
  }
};

} // namespace
