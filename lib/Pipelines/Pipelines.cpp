//===- Pipelines.cpp - moe-mlir pass pipelines --------------*- C++ -*-===//

#include "moe/Pipelines/Pipelines.h"
#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"

#include "mlir/Conversion/AffineToStandard/AffineToStandard.h"
#include "mlir/Conversion/ConvertToLLVM/ToLLVMPass.h"
#include "mlir/Conversion/GPUToNVVM/GPUToNVVMPass.h"
#include "mlir/Conversion/MathToLibm/MathToLibm.h"
#include "mlir/Conversion/NVGPUToNVVM/NVGPUToNVVM.h"
#include "mlir/Conversion/NVVMToLLVM/NVVMToLLVM.h"
#include "mlir/Conversion/ReconcileUnrealizedCasts/ReconcileUnrealizedCasts.h"
#include "mlir/Conversion/SCFToControlFlow/SCFToControlFlow.h"
#include "mlir/Dialect/Bufferization/Pipelines/Passes.h"
#include "mlir/Dialect/Bufferization/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Dialect/LLVMIR/Transforms/RequestCWrappers.h"
#include "mlir/Dialect/Linalg/Passes.h"
#include "mlir/Dialect/MemRef/Transforms/Passes.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

using namespace mlir;
using namespace mlir::moe;

void mlir::moe::buildMoETrainingPipeline(
    OpPassManager &pm, const MoETrainingPipelineOptions &options) {
  (void)options; // Read by the planning and GPU stages once they exist.
  pm.addPass(createMoEDecompose());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
}

void mlir::moe::buildMoELowerToCPUPipeline(OpPassManager &pm) {
  // moe ops become calls of private kernels; inlining them lets the static
  // shapes of the caller reach the kernels' loops and allocations.
  pm.addPass(createConvertMoEToLinalg());
  pm.addPass(createInlinerPass());
  pm.addPass(createSymbolDCEPass());
  pm.addPass(createConvertElementwiseToLinalgPass());
  pm.addPass(createCanonicalizerPass());

  bufferization::OneShotBufferizePassOptions bufferize;
  bufferize.bufferizeFunctionBoundaries = true;
  bufferize.functionBoundaryTypeConversion =
      bufferization::LayoutMapOption::IdentityLayoutMap;
  pm.addPass(bufferization::createOneShotBufferizePass(bufferize));
  // Results are copied into the caller's buffers. hoist-static-allocs would
  // save the copy but crashes (LLVM 22.1) when a function returns one buffer
  // twice, as a forward function returning the logits and saving them does.
  bufferization::BufferResultsToOutParamsPassOptions outParams;
  outParams.modifyPublicFunctions = true;
  pm.addPass(bufferization::createBufferResultsToOutParamsPass(outParams));
  // C wrappers for the functions of the input only: not for the helper of
  // the deallocation lowering nor for the libm declarations added below.
  pm.addNestedPass<func::FuncOp>(LLVM::createLLVMRequestCWrappersPass());
  bufferization::buildBufferDeallocationPipeline(pm);

  pm.addNestedPass<func::FuncOp>(createConvertLinalgToLoopsPass());
  pm.addPass(memref::createExpandStridedMetadataPass());
  pm.addPass(createLowerAffinePass());
  pm.addPass(createSCFToControlFlowPass());
  pm.addPass(createConvertMathToLibmPass());
  pm.addPass(createConvertToLLVMPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
}

void mlir::moe::buildMoELowerToNVVMPipeline(
    OpPassManager &pm, const MoELowerToNVVMPipelineOptions &options) {
  GpuNVVMAttachTargetOptions target;
  target.chip = options.chip;
  target.features = options.features;
  target.optLevel = options.optLevel;
  pm.addPass(createGpuNVVMAttachTarget(target));
  pm.addPass(createConvertNVGPUToNVVMPass());
  OpPassManager &kernels = pm.nest<gpu::GPUModuleOp>();
  kernels.addPass(createSCFToControlFlowPass());
  kernels.addPass(createConvertNVVMToLLVMPass());
  kernels.addPass(memref::createExpandStridedMetadataPass());
  kernels.addPass(createLowerAffinePass());
  ConvertGpuOpsToNVVMOpsOptions toNVVM;
  toNVVM.useBarePtrCallConv = true;
  kernels.addPass(createConvertGpuOpsToNVVMOps(toNVVM));
  kernels.addPass(createCanonicalizerPass());
  kernels.addPass(createCSEPass());
  kernels.addPass(createReconcileUnrealizedCastsPass());
  GpuModuleToBinaryPassOptions binary;
  binary.compilationTarget = options.format;
  pm.addPass(createGpuModuleToBinaryPass(binary));
}

void mlir::moe::registerMoEPipelines() {
  PassPipelineRegistration<MoETrainingPipelineOptions>(
      "moe-training-pipeline",
      "Compile a forward moe layer for training (decomposition today; "
      "backward, activation planning and sm_90a kernels follow)",
      buildMoETrainingPipeline);
  PassPipelineRegistration<MoELowerToNVVMPipelineOptions>(
      "moe-lower-to-nvvm-pipeline",
      "Lower gpu.modules of nvgpu/nvvm kernels to PTX or cubin for sm_90a",
      buildMoELowerToNVVMPipeline);
  PassPipelineRegistration<>(
      "moe-lower-to-cpu-pipeline",
      "Lower moe ops through the CPU reference kernels to the LLVM dialect "
      "(docs/cpu-path.md)",
      buildMoELowerToCPUPipeline);
}
