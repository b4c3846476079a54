//===- moe-opt.cpp - moe-mlir optimizer driver --------------*- C++ -*-===//

#include "moe/InitAll.h"
#include "moe/Support/InputNesting.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/Bufferization/Pipelines/Passes.h"
#include "mlir/Dialect/Bufferization/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/Transforms/Passes.h"
#include "mlir/Dialect/Linalg/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/PrettyStackTrace.h"
#include "llvm/Support/raw_ostream.h"

#include <unistd.h>

/// The upstream passes of moe-lower-to-cpu-pipeline, so that each can be run
/// on its own and crash reproducers of the pipeline replay.
static void registerCPUPathPasses() {
  mlir::registerConvertElementwiseToLinalgPass();
  mlir::registerConvertLinalgToLoopsPass();
  mlir::bufferization::registerOneShotBufferizePass();
  mlir::bufferization::registerBufferResultsToOutParamsPass();
  mlir::bufferization::registerOwnershipBasedBufferDeallocationPass();
  mlir::bufferization::registerBufferDeallocationSimplificationPass();
  mlir::bufferization::registerLowerDeallocationsPass();
  mlir::bufferization::registerBufferizationPipelines();
  mlir::memref::registerExpandStridedMetadataPass();
  mlir::registerLowerAffinePass();
  mlir::registerSCFToControlFlowPass();
  mlir::registerConvertMathToLibmPass();
  mlir::LLVM::registerLLVMRequestCWrappersPass();
  mlir::registerConvertToLLVMPass();
  mlir::registerReconcileUnrealizedCastsPass();
}

/// Whether the input nests no deeper than the parser can take; says why not.
/// Standard input is read here, then given back to MlirOptMain on descriptor
/// 0 (a temporary file), so that diagnostics still name `<stdin>`.
static bool checkInput(llvm::StringRef filename) {
  llvm::ErrorOr<std::unique_ptr<llvm::MemoryBuffer>> buffer =
      llvm::MemoryBuffer::getFileOrSTDIN(filename);
  if (!buffer)
    return true; // MlirOptMain reports what is wrong with the file
  if (std::optional<mlir::moe::NestingError> error =
          mlir::moe::checkInputNesting((*buffer)->getBuffer())) {
    llvm::errs() << (*buffer)->getBufferIdentifier() << ":" << error->line
                 << ":" << error->column << ": error: " << error->message
                 << "\n";
    return false;
  }
  if (filename != "-")
    return true;
  int fd;
  llvm::SmallString<128> path;
  if (llvm::sys::fs::createTemporaryFile("moe-opt-stdin", "mlir", fd, path)) {
    llvm::errs() << "moe-opt: error: cannot keep standard input in a "
                    "temporary file\n";
    return false;
  }
  {
    llvm::raw_fd_ostream copy(fd, /*shouldClose=*/false);
    copy << (*buffer)->getBuffer();
  }
  bool ok = ::lseek(fd, 0, SEEK_SET) == 0 && ::dup2(fd, 0) == 0;
  ::close(fd);
  llvm::sys::fs::remove(path);
  if (!ok)
    llvm::errs() << "moe-opt: error: cannot read standard input again\n";
  return ok;
}

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  mlir::moe::registerAllMoEToolDialects(registry);
  mlir::registerTransformsPasses();
  registerCPUPathPasses();
  mlir::moe::registerAllMoEPasses();
  llvm::setBugReportMsg(
      "Please report this moe-mlir bug and attach the file written by "
      "--mlir-pass-pipeline-crash-reproducer=<file>.\n");
  auto [inputFilename, outputFilename] = mlir::registerAndParseCLIOptions(
      argc, argv, "moe-mlir optimizer driver\n", registry);
  mlir::MlirOptMainConfig config =
      mlir::MlirOptMainConfig::createFromCLOptions();
  if (!config.shouldShowDialects() && !config.shouldListPasses() &&
      !checkInput(inputFilename))
    return 1;
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, inputFilename, outputFilename, registry));
}
