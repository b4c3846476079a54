//===- moe-parser-fuzzer.cpp - libFuzzer harness for moe-mlir -*- C++ -*-===//
//
// Parses each input as MLIR with the moe, func, arith and tensor dialects and
// swallows the diagnostics. When the input parses and verifies, it is also
// printed, and moe-decompose, moe-generate-backward, convert-moe-to-gpu and
// the rest of moe-training-pipeline{chip=sm_90a format=isa} up to PTX, then
// convert-moe-to-linalg and moe-lower-to-cpu-pipeline run on it. A pass that
// fails with a diagnostic is fine; a crash, a leak, a hang, or one of our
// passes succeeding with IR that does not verify is a bug (the last one
// aborts). Modelled on upstream
// mlir/tools/mlir-parser-fuzzer/text/mlir-text-parser-fuzzer.cpp.
//
// The library kernels' bodies do not depend on the input, and compiling them
// takes 1.6 s; before the GPU lowering they are replaced by a bare return
// (their signatures, which the launches must match, stay), so every input
// still goes through the inlined host code, gpu-to-llvm and PTX generation.
// test/Target/NVPTX covers the real kernels.
//
// Built with -DMOE_ENABLE_FUZZER=ON; scripts/fuzz.sh runs it.
//
//===----------------------------------------------------------------------===//

#include "moe/InitAll.h"

#include "moe/Pipelines/Pipelines.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OwningOpRef.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/raw_ostream.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

using namespace mlir;

namespace {

/// The dialects an input may use.
const DialectRegistry &parserRegistry() {
  static const DialectRegistry *registry = [] {
    auto *r = new DialectRegistry();
    r->insert<moe::MoEDialect, func::FuncDialect, arith::ArithDialect,
              tensor::TensorDialect>();
    return r;
  }();
  return *registry;
}

/// What the passes need on top: the dialects they produce and the
/// bufferization and convert-to-llvm models of moe-lower-to-cpu-pipeline.
const DialectRegistry &passRegistry() {
  static const DialectRegistry *registry = [] {
    auto *r = new DialectRegistry();
    moe::registerMoECPUPathDialects(*r);
    moe::registerMoEGPUPathDialects(*r);
    return r;
  }();
  return *registry;
}

/// Runs one of our passes on a copy of `module`; returns the copy when the
/// pass succeeds, null when it fails. A pass that succeeds must leave IR that
/// verifies: otherwise this aborts, so that libFuzzer keeps the input.
OwningOpRef<ModuleOp> runOurPass(ModuleOp module, std::unique_ptr<Pass> pass) {
  OwningOpRef<ModuleOp> copy = module.clone();
  PassManager pm(module.getContext());
  pm.enableVerifier(false);
  pm.addPass(std::move(pass));
  if (failed(pm.run(*copy)))
    return nullptr;
  if (failed(verify(*copy))) {
    llvm::errs() << "moe-parser-fuzzer: a pass succeeded but its output does "
                    "not verify\n";
    abort();
  }
  return copy;
}

/// Empties every kernel of the GPU library: the body becomes `gpu.return`.
void stripKernelBodies(ModuleOp module) {
  module.walk([](gpu::GPUFuncOp kernel) {
    Region &body = kernel.getBody();
    body.dropAllReferences();
    while (body.getBlocks().size() > 1)
      body.back().erase();
    body.front().clear();
    OpBuilder builder = OpBuilder::atBlockEnd(&body.front());
    gpu::ReturnOp::create(builder, kernel.getLoc());
  });
}

} // namespace

/// Only our libraries are instrumented, not the MLIR and LLVM archives they
/// link. llvm::BumpPtrAllocator poisons and unpoisons its slabs with
/// __asan_(un)poison_memory_region in inline code, so an instrumented copy can
/// poison memory that an uninstrumented one then hands out; ignore that manual
/// poisoning (heap, stack and global checks stay on).
extern "C" const char *__asan_default_options() {
  return "allow_user_poisoning=0";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // The lexer reads up to the terminating nul, so parse a nul-terminated copy.
  std::string source(reinterpret_cast<const char *>(data), size);

  // A fresh context per input: nothing carries over from one input to the
  // next, and no thread pool is started.
  MLIRContext context(parserRegistry(), MLIRContext::Threading::DISABLED);
  ScopedDiagnosticHandler swallow(&context,
                                  [](Diagnostic &) { return success(); });

  ParserConfig config(&context);
  OwningOpRef<ModuleOp> module =
      parseSourceString<ModuleOp>(source, config, "fuzz-input");
  if (!module)
    return 0;

  // The input verified: the printers and the passes must cope with it.
  module->print(llvm::nulls());
  module->print(llvm::nulls(), OpPrintingFlags().printGenericOpForm());

  context.appendDialectRegistry(passRegistry());
  ModuleOp input = *module;
  OwningOpRef<ModuleOp> decomposed =
      runOurPass(input, moe::createMoEDecompose());
  if (decomposed)
    input = *decomposed;
  OwningOpRef<ModuleOp> differentiated =
      runOurPass(input, moe::createMoEGenerateBackward());
  if (differentiated) {
    input = *differentiated;
    // The GPU path: diagnostics for what it cannot run, or host functions
    // that verify and lower, with the (emptied) kernels, to PTX.
    if (OwningOpRef<ModuleOp> gpu =
            runOurPass(input, moe::createConvertMoEToGPU())) {
      stripKernelBodies(*gpu);
      PassManager lowering(&context);
      GpuModuleToBinaryPassOptions ptx;
      ptx.compilationTarget = "isa";
      moe::addMoEGPULowering(lowering, "sm_90a", /*optLevel=*/0, ptx);
      if (succeeded(lowering.run(*gpu)))
        (*gpu)->print(llvm::nulls());
    }
  }
  // convert-moe-to-linalg decomposes what is left of moe.layer itself.
  OwningOpRef<ModuleOp> converted =
      runOurPass(input, moe::createConvertMoEToLinalg());
  if (!converted)
    return 0;
  // The whole CPU pipeline, with the verifier after each pass; on converted
  // IR its convert-moe-to-linalg finds nothing left to do.
  PassManager pm(&context);
  moe::buildMoELowerToCPUPipeline(pm);
  if (succeeded(pm.run(*converted)))
    (*converted)->print(llvm::nulls());
  return 0;
}
