//===- moe-opt.cpp - moe-mlir optimizer driver --------------*- C++ -*-===//

#include "moe/InitAll.h"

#include "mlir/Conversion/Passes.h"
#include "mlir/Dialect/Bufferization/Pipelines/Passes.h"
#include "mlir/Dialect/Bufferization/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/Transforms/Passes.h"
#include "mlir/Dialect/Linalg/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"
#include "mlir/Transforms/Passes.h"
#include "llvm/Support/PrettyStackTrace.h"

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

int main(int argc, char **argv) {
  mlir::DialectRegistry registry;
  mlir::moe::registerAllMoEToolDialects(registry);
  mlir::registerTransformsPasses();
  registerCPUPathPasses();
  mlir::moe::registerAllMoEPasses();
  llvm::setBugReportMsg(
      "Please report this moe-mlir bug and attach the file written by "
      "--mlir-pass-pipeline-crash-reproducer=<file>.\n");
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "moe-mlir optimizer driver\n", registry));
}
