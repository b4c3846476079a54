//===- Pipelines.h - moe-mlir pass pipelines ----------------*- C++ -*-===//

#ifndef MOE_PIPELINES_PIPELINES_H
#define MOE_PIPELINES_PIPELINES_H

#include "moe/Support/OptionParsers.h"

#include "mlir/Dialect/GPU/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassOptions.h"

namespace mlir::moe {

/// Where saved activations may go besides device memory.
enum class OffloadMode { Never, Auto, Always };

/// A target chip option that may be left empty (no GPU code generation);
/// otherwise it must be a chip ChipOptionParser accepts.
class OptionalChipOptionParser : public ChipOptionParser {
public:
  using ChipOptionParser::ChipOptionParser;

  bool parse(llvm::cl::Option &option, llvm::StringRef argName,
             llvm::StringRef arg, std::string &value) {
    if (arg.empty()) {
      value.clear();
      return false;
    }
    return ChipOptionParser::parse(option, argName, arg, value);
  }
};

struct MoETrainingPipelineOptions
    : public PassPipelineOptions<MoETrainingPipelineOptions> {
  PassOptions::Option<std::string, OptionalChipOptionParser> chip{
      *this, "chip",
      llvm::cl::desc("GPU architecture to generate for (sm_90a); empty: "
                     "decompose only"),
      llvm::cl::init("")};
  PassOptions::Option<std::string, MemorySizeOptionParser> memoryBudget{
      *this, "memory-budget",
      llvm::cl::desc("Activation memory the layer may keep for backward, e.g. "
                     "4GiB (empty: no limit)"),
      llvm::cl::init("")};
  PassOptions::Option<std::string> policy{
      *this, "policy",
      llvm::cl::desc("With chip set, what moe-plan-activations does with the "
                     "expert pre-activations: keep, recompute, offload or "
                     "auto (the fastest plan under memory-budget)"),
      llvm::cl::init("auto")};
  PassOptions::Option<OffloadMode> offload{
      *this, "offload",
      llvm::cl::desc("Whether saved activations may move to host memory "
                     "(pinned, by the runtime's copy stream on the GPU path)"),
      llvm::cl::init(OffloadMode::Never),
      llvm::cl::values(
          clEnumValN(OffloadMode::Never, "never",
                     "policy=auto keeps or recomputes only"),
          clEnumValN(OffloadMode::Auto, "auto",
                     "policy=auto offloads when that is the fastest plan "
                     "under the budget"),
          clEnumValN(OffloadMode::Always, "always",
                     "offload every expert pre-activation (policy=offload)"))};
  PassOptions::Option<double> gpuTflops{
      *this, "gpu-tflops",
      llvm::cl::desc("GPU rate of the activation cost model (TFLOP/s)"),
      llvm::cl::init(780.0)};
  PassOptions::Option<double> hostGbps{
      *this, "host-gbps",
      llvm::cl::desc("Host-link bandwidth of the activation cost model, each "
                     "direction (GB/s; measured on the H200: 55)"),
      llvm::cl::init(55.0)};
  PassOptions::Option<std::string> memoryReport{
      *this, "memory-report",
      llvm::cl::desc("With chip set, print moe-plan-memory's report of the "
                     "placement the GPU path runs here (- for stdout, or a "
                     "file)"),
      llvm::cl::init("")};
  PassOptions::Option<std::string> format{
      *this, "format",
      llvm::cl::desc("Kernel binary with chip set: bin (cubin, needs ptxas), "
                     "isa (PTX, JIT-compiled at load) or fatbin (needs ptxas "
                     "and fatbinary)"),
      llvm::cl::init("bin")};
  PassOptions::Option<unsigned> optLevel{
      *this, "opt-level",
      llvm::cl::desc("LLVM optimisation level of the kernels (0-3)"),
      llvm::cl::init(3)};
  PassOptions::Option<std::string> kernelCache{
      *this, "kernel-cache",
      llvm::cl::desc("With chip set, a directory where compiled kernel "
                     "binaries are kept and found again "
                     "(moe-serialize-kernels-cached); empty: none"),
      llvm::cl::init("")};
  PassOptions::Option<std::string> gpuLibrary{
      *this, "gpu-library",
      llvm::cl::desc("With chip set, a GPU library file (kernels and host "
                     "functions) to use instead of the kernel builder's, e.g. "
                     "another build's moe-gpu-emit-library output, to time "
                     "two libraries side by side; empty: the builder's"),
      llvm::cl::init("")};
  PassOptions::Option<int64_t> numSMs{
      *this, "num-sms",
      llvm::cl::desc("With chip set, the SMs of the GPU the kernels run on "
                     "(0: the chip's, 132 for sm_90a)"),
      llvm::cl::init(0)};
  PassOptions::ListOption<std::string> kernelConfigs{
      *this, "kernel-configs",
      llvm::cl::desc("With chip set, parameters of the GEMM kernels "
                     "moe-gpu-select-kernels chooses: [OP.]ROLE:KEY=VALUE"
                     "[:KEY=VALUE...], e.g. expert_ffn.down:stages=2")};
  PassOptions::Option<std::string> kernelLibrary{
      *this, "kernel-library",
      llvm::cl::desc("With chip set, a read-only directory of prebuilt "
                     "kernel binaries searched after kernel-cache (the "
                     "project's kernel library); empty: none"),
      llvm::cl::init("")};
};

/// The whole compiler: a forward `moe` layer in, training code out. Without
/// `chip` it decomposes layers only. With `chip=sm_90a` it generates the
/// training forward and backward (moe-generate-backward), lowers them to host
/// functions calling the GPU library (convert-moe-to-gpu), inlines them,
/// compiles the kernels (as buildMoELowerToNVVMPipeline, plus 1024-aligned
/// dynamic shared memory) and lowers the host code to the LLVM dialect with
/// gpu-to-llvm (bare pointers for kernels), so that mlir-translate gives LLVM
/// IR calling the mgpu* runtime. Fails with a message in `error` for an
/// unknown format, opt-level or policy, or a policy that contradicts offload.
/// With chip, moe-plan-activations (memory-budget, policy, offload,
/// gpu-tflops, host-gbps) runs before moe-generate-backward and moe-offload
/// after it; after moe-gpu-select-kernels and moe-fold-adds, moe-plan-memory
/// places each function's temporaries in its arena (with memory-report it
/// prints the plan). convert-moe-to-gpu runs the plan: recomputed regions
/// are inlined into backward, and offloaded tensors go to pinned host memory
/// and come back through the runtime's copy stream.
LogicalResult
buildMoETrainingPipeline(OpPassManager &pm,
                         const MoETrainingPipelineOptions &options,
                         std::string *error = nullptr);

/// The part of moe-training-pipeline{chip=...} after convert-moe-to-gpu:
/// inlining of the library's host functions, the kernels to `binary`'s format
/// for `chip`, the host code to the LLVM dialect (mgpu* calls). With a
/// `kernelCache` or `kernelLibrary` directory the kernels are serialized by
/// moe-serialize-kernels-cached, else by gpu-module-to-binary.
void addMoEGPULowering(OpPassManager &pm, llvm::StringRef chip,
                       unsigned optLevel,
                       const GpuModuleToBinaryPassOptions &binary,
                       llvm::StringRef kernelCache = "",
                       llvm::StringRef kernelLibrary = "");

/// The ptxas moe-training-pipeline gives gpu-module-to-binary (as its
/// toolkit): from PATH, then $CUDA_ROOT/bin, then /usr/local/cuda/bin; empty
/// when none is found.
std::string findPtxas();

/// The CPU reference path (docs/cpu-path.md): convert-moe-to-linalg, then
/// bufferization with identity layouts at function boundaries, results as
/// out-parameters, loops, and the LLVM dialect with C wrappers, so that every
/// public function `@f(ins...) -> (outs...)` on tensors becomes
/// `void _mlir_ciface_f(ins..., outs...)` on memref descriptors.
void buildMoELowerToCPUPipeline(OpPassManager &pm);

struct MoELowerToNVVMPipelineOptions
    : public PassPipelineOptions<MoELowerToNVVMPipelineOptions> {
  PassOptions::Option<std::string, ChipOptionParser> chip{
      *this, "chip", llvm::cl::desc("GPU architecture to generate for"),
      llvm::cl::init("sm_90a")};
  PassOptions::Option<std::string> features{
      *this, "features", llvm::cl::desc("PTX features (sm_90a needs +ptx80)"),
      llvm::cl::init("+ptx80")};
  PassOptions::Option<unsigned> optLevel{
      *this, "opt-level", llvm::cl::desc("LLVM optimisation level (0-3)"),
      llvm::cl::init(3)};
  PassOptions::Option<std::string> format{
      *this, "format",
      llvm::cl::desc("gpu-module-to-binary format: isa (PTX text), bin "
                     "(cubin, needs ptxas) or fatbin"),
      llvm::cl::init("isa")};
  PassOptions::Option<bool> barePointers{
      *this, "bare-pointers",
      llvm::cl::desc("Kernels take memrefs as bare pointers (static shapes "
                     "only); false: as memref descriptors, as the GPU "
                     "library's kernels do"),
      llvm::cl::init(true)};
};

/// gpu.modules of nvgpu/nvvm/gpu ops to PTX or cubin (docs/gpu-kernels.md
/// §6.1): attach the sm_90a target, nvgpu and gpu to NVVM (memrefs as bare
/// pointers, or descriptors with bare-pointers=false), NVVM to LLVM, then
/// gpu-module-to-binary. With bare pointers kernels must have static shapes.
void buildMoELowerToNVVMPipeline(OpPassManager &pm,
                                 const MoELowerToNVVMPipelineOptions &options);

/// Registers every moe-mlir pipeline with the pass registry.
void registerMoEPipelines();

} // namespace mlir::moe

#endif // MOE_PIPELINES_PIPELINES_H
