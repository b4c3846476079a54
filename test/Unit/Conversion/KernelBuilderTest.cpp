//===- KernelBuilderTest.cpp - the GPU library's kernel builder -----------===//
//
// The builder makes every kernel, device function and host function of the
// GPU library, each once, in the library's order, into a module that
// verifies; the same text every time (the kernel cache keys on it); and a
// clear error for what it does not make.
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/MoEToGPU/KernelBuilder.h"
#include "moe/Dialect/MoEGPU/IR/MoEGPUAttributes.h"
#include "moe/Dialect/MoEGPU/IR/MoEGPUDialect.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/OperationSupport.h"
#include "mlir/IR/Verifier.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/raw_ostream.h"

#include "gtest/gtest.h"

#include <string>

using namespace mlir;

namespace {

std::string printed(Operation *op) {
  std::string text;
  llvm::raw_string_ostream os(text);
  op->print(os, OpPrintingFlags().useLocalScope());
  return text;
}

// The kernels a host function of `library` launches, in order; none for a
// function it lacks.
SmallVector<std::string> launchedKernels(ModuleOp library, StringRef name) {
  SmallVector<std::string> kernels;
  if (auto function = library.lookupSymbol<func::FuncOp>(name))
    function.walk([&](gpu::LaunchFuncOp launch) {
      kernels.push_back(launch.getKernelName().str());
    });
  return kernels;
}

class KernelBuilderTest : public ::testing::Test {
protected:
  void SetUp() override {
    context.loadDialect<arith::ArithDialect, func::FuncDialect, gpu::GPUDialect,
                        LLVM::LLVMDialect, NVVM::NVVMDialect,
                        memref::MemRefDialect, moe_gpu::MoEGPUDialect,
                        scf::SCFDialect, vector::VectorDialect>();
  }

  MLIRContext context;
};

TEST_F(KernelBuilderTest, EachKernelBuildsOnceAndVerifies) {
  OpBuilder b(&context);
  OwningOpRef<ModuleOp> built = ModuleOp::create(b.getUnknownLoc());
  built.get()->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                       b.getUnitAttr());
  b.setInsertionPointToEnd(built->getBody());
  auto module = gpu::GPUModuleOp::create(b, b.getUnknownLoc(), "built");
  SmallVector<StringRef> names = moe::builtLibraryKernelNames();
  ASSERT_EQ(names.size(), 55u);
  llvm::StringSet<> unique;
  ASSERT_TRUE(succeeded(moe::buildLibraryDeviceFunctions(module)));
  for (StringRef name : names) {
    SCOPED_TRACE(name.str());
    EXPECT_TRUE(unique.insert(name).second);
    FailureOr<gpu::GPUFuncOp> kernel = moe::buildLibraryKernel(module, name);
    ASSERT_TRUE(succeeded(kernel));
    EXPECT_EQ(kernel->getName(), name);
    EXPECT_TRUE(kernel->isKernel());
  }
  EXPECT_TRUE(succeeded(verify(*built)));
  // Every GEMM of the library is one of its default configs, named from it.
  for (moe_gpu::GemmConfigAttr config : moe_gpu::defaultGemmConfigs(&context))
    EXPECT_TRUE(unique.contains(config.kernelName())) << config.kernelName();
}

// The library: its kernels, then the device functions, in one gpu.module;
// the host functions after it, each once, in the builder's order, after the
// runtime's tensor map declaration.
TEST_F(KernelBuilderTest, TheWholeLibrary) {
  OwningOpRef<ModuleOp> library = moe::buildGPULibrary(&context);
  ASSERT_TRUE(library);
  EXPECT_TRUE(succeeded(verify(*library)));
  auto modules = llvm::to_vector(library->getOps<gpu::GPUModuleOp>());
  ASSERT_EQ(modules.size(), 1u);
  SmallVector<StringRef> kernels, deviceFunctions;
  for (auto kernel : modules[0].getOps<gpu::GPUFuncOp>())
    kernels.push_back(kernel.getName());
  for (auto function : modules[0].getOps<func::FuncOp>())
    deviceFunctions.push_back(function.getSymName());
  EXPECT_EQ(kernels, moe::builtLibraryKernelNames());
  EXPECT_EQ(deviceFunctions, moe::libraryDeviceFunctionNames());
  SmallVector<StringRef> functions;
  for (auto function : library->getOps<func::FuncOp>())
    functions.push_back(function.getSymName());
  // The router's logits GEMM takes tensor maps: the declaration comes first.
  SmallVector<StringRef> expected = {"moeTensorMapDeviceBf16"};
  SmallVector<StringRef> hostFunctions = moe::libraryHostFunctionNames();
  expected.append(hostFunctions.begin(), hostFunctions.end());
  EXPECT_EQ(functions, expected);
  EXPECT_EQ(hostFunctions.size(), 33u);
}

// The same text every time: the kernel cache and the kernel library key a
// kernel by its text.
TEST_F(KernelBuilderTest, TheSameTextEveryTime) {
  OwningOpRef<ModuleOp> first = moe::buildGPULibrary(&context);
  OwningOpRef<ModuleOp> second = moe::buildGPULibrary(&context);
  ASSERT_TRUE(first && second);
  EXPECT_EQ(printed(*first), printed(*second));
}

// The selection-bias update's kernels: the histogram over the flat experts
// (experts, slots, E, loads) and the one-block update (bias, loads, E, rate,
// rule, result), each a block of the non-GEMM kernels' threads.
TEST_F(KernelBuilderTest, SelectionBiasKernels) {
  OpBuilder b(&context);
  OwningOpRef<ModuleOp> built = ModuleOp::create(b.getUnknownLoc());
  b.setInsertionPointToEnd(built->getBody());
  auto module = gpu::GPUModuleOp::create(b, b.getUnknownLoc(), "built");
  for (auto [name, arguments] :
       {std::pair<StringRef, unsigned>{"moe_selection_bias_count", 4},
        std::pair<StringRef, unsigned>{"moe_selection_bias_update", 6}}) {
    SCOPED_TRACE(name.str());
    FailureOr<gpu::GPUFuncOp> kernel = moe::buildLibraryKernel(module, name);
    ASSERT_TRUE(succeeded(kernel));
    EXPECT_EQ(kernel->getNumArguments(), arguments);
    ASSERT_TRUE(kernel->getKnownBlockSize().has_value());
    EXPECT_EQ((*kernel->getKnownBlockSize())[0], 128);
  }
  EXPECT_TRUE(succeeded(verify(*built)));
}

TEST_F(KernelBuilderTest, UnknownKernelIsAnError) {
  OpBuilder b(&context);
  OwningOpRef<ModuleOp> built = ModuleOp::create(b.getUnknownLoc());
  b.setInsertionPointToEnd(built->getBody());
  auto module = gpu::GPUModuleOp::create(b, b.getUnknownLoc(), "built");
  std::string message;
  ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diagnostic) {
    message = diagnostic.str();
    return success();
  });
  EXPECT_TRUE(failed(moe::buildLibraryKernel(module, "moe_frobnicate")));
  EXPECT_EQ(message, "the kernel builder has no kernel @moe_frobnicate");
}

TEST_F(KernelBuilderTest, DeviceFunctionsTwiceIsAnError) {
  OpBuilder b(&context);
  OwningOpRef<ModuleOp> built = ModuleOp::create(b.getUnknownLoc());
  b.setInsertionPointToEnd(built->getBody());
  auto module = gpu::GPUModuleOp::create(b, b.getUnknownLoc(), "built");
  ASSERT_TRUE(succeeded(moe::buildLibraryDeviceFunctions(module)));
  std::string message;
  ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diagnostic) {
    message = diagnostic.str();
    return success();
  });
  EXPECT_TRUE(failed(moe::buildLibraryDeviceFunctions(module)));
  EXPECT_EQ(message, "the gpu.module already has a symbol @__moe_gpu_exp of "
                     "the library's device functions");
  EXPECT_EQ(llvm::range_size(module.getOps<func::FuncOp>()),
            moe::libraryDeviceFunctionNames().size());
}

TEST_F(KernelBuilderTest, HostFunctionErrors) {
  OpBuilder b(&context);
  OwningOpRef<ModuleOp> built = ModuleOp::create(b.getUnknownLoc());
  std::string message;
  ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diagnostic) {
    message = diagnostic.str();
    return success();
  });
  EXPECT_TRUE(failed(moe::buildLibraryHostFunction(*built, "__moe_gpu_fft")));
  EXPECT_EQ(message,
            "the host function builder has no function @__moe_gpu_fft");

  ASSERT_TRUE(
      succeeded(moe::buildLibraryHostFunction(*built, "__moe_gpu_router")));
  EXPECT_TRUE(
      failed(moe::buildLibraryHostFunction(*built, "__moe_gpu_router")));
  EXPECT_EQ(message, "the module already has a symbol @__moe_gpu_router");

  // A symbol of the tensor map function's name that is not its declaration.
  OwningOpRef<ModuleOp> other = ModuleOp::create(b.getUnknownLoc());
  b.setInsertionPointToEnd(other->getBody());
  func::FuncOp::create(b, b.getUnknownLoc(), "moeTensorMapDeviceBf16",
                       b.getFunctionType({}, {}))
      .setPrivate();
  EXPECT_TRUE(
      failed(moe::buildLibraryHostFunction(*other, "__moe_gpu_expert_ffn")));
  EXPECT_EQ(message, "the module's @moeTensorMapDeviceBf16 is not the host "
                     "functions' declaration of it");
  EXPECT_EQ(llvm::range_size(other->getOps<func::FuncOp>()), 1u);
}

// The auxiliary losses' kernels (their arguments and shared-memory tables),
// and their host functions launching them in order.
TEST_F(KernelBuilderTest, AuxLossKernels) {
  OpBuilder b(&context);
  OwningOpRef<ModuleOp> built = ModuleOp::create(b.getUnknownLoc());
  built.get()->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                       b.getUnitAttr());
  b.setInsertionPointToEnd(built->getBody());
  auto module = gpu::GPUModuleOp::create(b, b.getUnknownLoc(), "built");
  ASSERT_TRUE(succeeded(moe::buildLibraryDeviceFunctions(module)));
  struct Expected {
    StringRef name;
    unsigned arguments, workgroupBuffers;
  };
  for (Expected kernel :
       {Expected{"moe_aux_counts", 4, 1}, Expected{"moe_aux_partials", 7, 2},
        Expected{"moe_aux_columns", 4, 0}, Expected{"moe_aux_finish", 7, 1},
        Expected{"moe_aux_loss_grad", 9, 0}}) {
    SCOPED_TRACE(kernel.name.str());
    FailureOr<gpu::GPUFuncOp> made =
        moe::buildLibraryKernel(module, kernel.name);
    ASSERT_TRUE(succeeded(made));
    EXPECT_EQ(made->getNumArguments(), kernel.arguments);
    EXPECT_EQ(made->getNumWorkgroupAttributions(), kernel.workgroupBuffers);
    ASSERT_TRUE(made->getKnownBlockSize().has_value());
    EXPECT_EQ((*made->getKnownBlockSize())[0], 128);
  }
  EXPECT_TRUE(succeeded(verify(*built)));

  OwningOpRef<ModuleOp> library = moe::buildGPULibrary(&context);
  ASSERT_TRUE(library);
  auto launches = [&](StringRef name) {
    return launchedKernels(*library, name);
  };
  EXPECT_EQ(launches("__moe_gpu_aux_loss"),
            (SmallVector<std::string>{"moe_aux_counts", "moe_aux_partials",
                                      "moe_aux_columns", "moe_aux_finish"}));
  EXPECT_EQ(launches("__moe_gpu_aux_loss_grad"),
            (SmallVector<std::string>{"moe_aux_counts", "moe_aux_loss_grad"}));
}

// The expert biases' gradient kernels, and the host functions of biased
// experts: the plain function's launches, then each expert's column sums (of
// dH, then of dout's rows) after the GEMMs, and the routing weights' bias term
// after their partial sums; the plain functions launch none of them.
TEST_F(KernelBuilderTest, ExpertBiasGradients) {
  OpBuilder b(&context);
  OwningOpRef<ModuleOp> built = ModuleOp::create(b.getUnknownLoc());
  built.get()->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                       b.getUnitAttr());
  b.setInsertionPointToEnd(built->getBody());
  auto module = gpu::GPUModuleOp::create(b, b.getUnknownLoc(), "built");
  ASSERT_TRUE(succeeded(moe::buildLibraryDeviceFunctions(module)));
  for (auto [name, arguments] :
       {std::pair<StringRef, unsigned>{"moe_segment_colsum", 12},
        {"moe_sum_splits_f32", 6},
        {"moe_bias_dweights", 10}}) {
    SCOPED_TRACE(name.str());
    FailureOr<gpu::GPUFuncOp> made = moe::buildLibraryKernel(module, name);
    ASSERT_TRUE(succeeded(made));
    EXPECT_EQ(made->getNumArguments(), arguments);
    EXPECT_EQ(made->getNumWorkgroupAttributions(), 0u);
  }
  EXPECT_TRUE(succeeded(verify(*built)));

  OwningOpRef<ModuleOp> library = moe::buildGPULibrary(&context);
  ASSERT_TRUE(library);
  auto launches = [&](StringRef name) {
    return launchedKernels(*library, name);
  };
  auto withBiasSums = [](SmallVector<std::string> plain, size_t at) {
    plain.insert(plain.begin() + at,
                 {"moe_segment_colsum", "moe_sum_splits_f32",
                  "moe_segment_colsum", "moe_sum_splits_f32"});
    return plain;
  };
  for (StringRef suffix : {"", "_acc"}) {
    SCOPED_TRACE(suffix.str());
    SmallVector<std::string> plain =
        launches(("__moe_gpu_expert_combine_grad" + suffix).str());
    // scatter weights, dact, dx, dW_down, dW_gate_up, then the sums.
    ASSERT_EQ(plain.size(), 7u);
    SmallVector<std::string> expected = withBiasSums(plain, 5);
    expected.insert(expected.begin() + 10, "moe_bias_dweights");
    EXPECT_EQ(launches(("__moe_gpu_expert_combine_grad_bias" + suffix).str()),
              expected);
  }
  SmallVector<std::string> plainFfn = launches("__moe_gpu_expert_ffn_grad");
  ASSERT_GE(plainFfn.size(), 4u);
  EXPECT_EQ(launches("__moe_gpu_expert_ffn_grad_bias"),
            withBiasSums(plainFfn, 4));
  for (StringRef plainName :
       {"__moe_gpu_expert_combine_grad", "__moe_gpu_expert_ffn_grad"})
    for (const std::string &kernel : launches(plainName))
      EXPECT_TRUE(kernel != "moe_segment_colsum" &&
                  kernel != "moe_bias_dweights")
          << plainName.str();
}

} // namespace
