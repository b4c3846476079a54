//===- Pipelines.cpp - moe-mlir pass pipelines --------------*- C++ -*-===//

#include "moe/Pipelines/Pipelines.h"
#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Dialect/MoEGPU/Transforms/Passes.h"

#include "mlir/Conversion/AffineToStandard/AffineToStandard.h"
#include "mlir/Conversion/ConvertToLLVM/ToLLVMPass.h"
#include "mlir/Conversion/GPUCommon/GPUCommonPass.h"
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

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/Program.h"

using namespace mlir;
using namespace mlir::moe;

std::string mlir::moe::findPtxas() {
  if (llvm::ErrorOr<std::string> path = llvm::sys::findProgramByName("ptxas"))
    return *path;
  SmallVector<std::string> roots;
  if (std::optional<std::string> root = llvm::sys::Process::GetEnv("CUDA_ROOT"))
    roots.push_back(*root);
  roots.push_back("/usr/local/cuda");
  for (const std::string &root : roots) {
    SmallString<128> path(root);
    llvm::sys::path::append(path, "bin", "ptxas");
    if (llvm::sys::fs::can_execute(path))
      return std::string(path);
  }
  return "";
}

namespace {

/// The kernel half of the NVVM lowering (docs/gpu-kernels.md section 6.1):
/// attach the target, nvgpu and gpu to NVVM, then 1024-aligned dynamic shared
/// memory (docs/gpu-kernels.md, pitfall P6). Bare pointers need kernels on
/// statically shaped memrefs.
void addKernelLowering(OpPassManager &pm, StringRef chip, StringRef features,
                       unsigned optLevel, bool barePointers) {
  GpuNVVMAttachTargetOptions target;
  target.chip = chip.str();
  target.features = features.str();
  target.optLevel = optLevel;
  pm.addPass(createGpuNVVMAttachTarget(target));
  pm.addPass(createConvertNVGPUToNVVMPass());
  OpPassManager &kernels = pm.nest<gpu::GPUModuleOp>();
  kernels.addPass(createSCFToControlFlowPass());
  kernels.addPass(createConvertNVVMToLLVMPass());
  kernels.addPass(memref::createExpandStridedMetadataPass());
  kernels.addPass(createLowerAffinePass());
  ConvertGpuOpsToNVVMOpsOptions toNVVM;
  toNVVM.useBarePtrCallConv = barePointers;
  kernels.addPass(createConvertGpuOpsToNVVMOps(toNVVM));
  kernels.addPass(createMoEAlignDynamicSharedMemory());
  kernels.addPass(createCanonicalizerPass());
  kernels.addPass(createCSEPass());
  kernels.addPass(createReconcileUnrealizedCastsPass());
}

/// The PTX ISA version sm_90a needs (docs/gpu-kernels.md, pitfall P2: lower
/// versions abort).
constexpr llvm::StringLiteral kSM90aFeatures = "+ptx80";

} // namespace

LogicalResult
mlir::moe::buildMoETrainingPipeline(OpPassManager &pm,
                                    const MoETrainingPipelineOptions &options,
                                    std::string *error) {
  auto fail = [&](const Twine &message) {
    if (error)
      *error = message.str();
    return failure();
  };
  // Every option is checked, whether or not chip makes it matter. Checked
  // here because gpu-module-to-binary reports a bad format late, and
  // format=offload not at all (docs/gpu-kernels.md, pitfall P3).
  StringRef format = options.format;
  if (format != "bin" && format != "isa" && format != "fatbin")
    return fail("moe-training-pipeline: unknown format '" + format +
                "' (expected bin, isa or fatbin)");
  if (options.optLevel > 3)
    return fail("moe-training-pipeline: opt-level must be 0 to 3, got " +
                Twine(static_cast<unsigned>(options.optLevel)));
  GpuModuleToBinaryPassOptions binary;
  binary.compilationTarget = format.str();
  // <toolkit>/bin/ptxas: gpu-module-to-binary also finds libdevice there.
  // Without one, building the pipeline still works (--dump-pass-pipeline on
  // a machine without CUDA); gpu-module-to-binary then reports the missing
  // ptxas, and moe-compile checks for it first.
  if (format != "isa") {
    if (std::string ptxas = findPtxas(); !ptxas.empty())
      binary.toolkitPath =
          llvm::sys::path::parent_path(llvm::sys::path::parent_path(ptxas))
              .str();
    // ptxas optimises the kernels on every core: half of a 2-core compile,
    // with the same SASS (cuobjdump -sass, CUDA 13.0).
    binary.cmdOptions = "--split-compile=0";
  }

  StringRef policy = options.policy;
  if (policy != "keep" && policy != "recompute" && policy != "offload" &&
      policy != "auto")
    return fail("moe-training-pipeline: unknown policy '" + policy +
                "' (expected keep, recompute, offload or auto)");
  if (options.offload == OffloadMode::Always) {
    if (policy != "auto" && policy != "offload")
      return fail("moe-training-pipeline: offload=always contradicts policy=" +
                  policy);
    policy = "offload";
  }
  if (!(options.gpuTflops > 0.0) || !(options.hostGbps > 0.0))
    return fail("moe-training-pipeline: gpu-tflops and host-gbps must be "
                "positive");

  pm.addPass(createMoEDecompose());
  pm.addPass(createCanonicalizerPass());
  if (options.chip.empty()) {
    pm.addPass(createCSEPass());
    return success();
  }
  // Silent unless the user asked for a plan: a remark then shows its bytes.
  MoEPlanActivationsOptions plan;
  plan.memoryBudget = options.memoryBudget;
  plan.policy = policy.str();
  plan.autoOffload = options.offload != OffloadMode::Never;
  plan.gpuTflops = options.gpuTflops;
  plan.hostGbps = options.hostGbps;
  plan.report = !options.memoryBudget.empty() || policy != "auto";
  pm.addNestedPass<func::FuncOp>(createMoEPlanActivations(plan));
  pm.addPass(createMoEGenerateBackward());
  pm.addPass(createMoEOffload());
  moe_gpu::MoEGPUSelectKernelsOptions selection;
  selection.chip = options.chip;
  selection.numSMs = options.numSMs;
  selection.configs.assign(options.kernelConfigs.begin(),
                           options.kernelConfigs.end());
  pm.addPass(moe_gpu::createMoEGPUSelectKernels(selection));
  pm.addPass(createMoEFoldAdds());
  // An expert-parallel layer becomes stages between its collectives, each
  // compiled and planned as a function of its own (nothing else changes).
  pm.addPass(createMoEEPStages());
  // The one placement of the step's memory: the conversion allocates at its
  // offsets, and the report (memory-report) shows what runs.
  MoEPlanMemoryOptions memory;
  memory.memoryReport = options.memoryReport;
  pm.addPass(createMoEPlanMemory(memory));
  ConvertMoEToGPUOptions conversion;
  conversion.libraryPath = options.gpuLibrary;
  pm.addPass(createConvertMoEToGPU(conversion));
  addMoEGPULowering(pm, options.chip, options.optLevel, binary,
                    options.kernelCache, options.kernelLibrary);
  return success();
}

void mlir::moe::addMoEGPULowering(OpPassManager &pm, StringRef chip,
                                  unsigned optLevel,
                                  const GpuModuleToBinaryPassOptions &binary,
                                  StringRef kernelCache,
                                  StringRef kernelLibrary) {
  pm.addPass(createInlinerPass());
  pm.addPass(createSymbolDCEPass());
  pm.addPass(createCanonicalizerPass());
  pm.addPass(createCSEPass());
  // A gpu.module a launched kernel: the layer carries only its kernels, and
  // the kernel cache finds each by its text whatever else the layer runs.
  pm.addPass(createMoEGPUSplitKernelModules());

  // The library's kernels take dynamically sized memrefs, which bare
  // pointers cannot carry: kernels get the default memref-descriptor
  // convention, on both sides of the launch.
  addKernelLowering(pm, chip, kSM90aFeatures, optLevel,
                    /*barePointers=*/false);

  // The host: what the inlined library functions hold (memref views, affine
  // maps, scf loops) to the LLVM dialect, launches and allocations to mgpu*
  // calls.
  pm.addPass(memref::createExpandStridedMetadataPass());
  pm.addPass(createLowerAffinePass());
  pm.addPass(createSCFToControlFlowPass());
  pm.addPass(createGpuToLLVMConversionPass());
  pm.addPass(createConvertToLLVMPass());
  pm.addPass(createReconcileUnrealizedCastsPass());
  if (kernelCache.empty() && kernelLibrary.empty()) {
    pm.addPass(createGpuModuleToBinaryPass(binary));
  } else {
    MoESerializeKernelsCachedOptions cached;
    cached.cacheDir = kernelCache.str();
    if (!kernelLibrary.empty())
      cached.libraryDirs.push_back(kernelLibrary.str());
    cached.toolkitPath = binary.toolkitPath;
    cached.cmdOptions = binary.cmdOptions;
    cached.compilationTarget = binary.compilationTarget;
    pm.addPass(createMoESerializeKernelsCached(cached));
  }
  pm.addPass(createCanonicalizerPass());
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
  addKernelLowering(pm, options.chip, options.features, options.optLevel,
                    options.barePointers);
  GpuModuleToBinaryPassOptions binary;
  binary.compilationTarget = options.format;
  pm.addPass(createGpuModuleToBinaryPass(binary));
}

void mlir::moe::registerMoEPipelines() {
  // Registered by hand so that an option that cannot work here (a missing
  // ptxas) is an error when the pipeline is parsed.
  registerPassPipeline(
      "moe-training-pipeline",
      "Compile a forward moe layer for training: with chip=sm_90a, forward "
      "and backward host code in the LLVM dialect with embedded kernels; "
      "without chip, decomposition only",
      [](OpPassManager &pm, StringRef text,
         function_ref<LogicalResult(const Twine &)> errorHandler) {
        MoETrainingPipelineOptions options;
        if (failed(options.parseFromString(text)))
          return failure();
        std::string error;
        if (failed(buildMoETrainingPipeline(pm, options, &error)))
          return errorHandler(error);
        return success();
      },
      [](function_ref<void(const detail::PassOptions &)> handler) {
        handler(MoETrainingPipelineOptions());
      });
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
