//===- KernelPortTest.cpp - the kernel builder against the generator -----===//
//
// Every kernel the C++ builder makes must be op for op the one in the GPU
// library gen_gpu_library.py writes: printed alone, the two are the same text
// (value names come from the printer), so the PTX and the SASS are the same.
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/MoEToGPU/KernelBuilder.h"

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
#include "mlir/Parser/Parser.h"
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

class KernelPortTest : public ::testing::Test {
protected:
  void SetUp() override {
    // The dialects of the library's text.
    context.loadDialect<arith::ArithDialect, func::FuncDialect, gpu::GPUDialect,
                        LLVM::LLVMDialect, NVVM::NVVMDialect,
                        memref::MemRefDialect, scf::SCFDialect,
                        vector::VectorDialect>();
    library = parseSourceString<ModuleOp>(moe::getEmbeddedGPULibrary(),
                                          ParserConfig(&context));
    ASSERT_TRUE(library) << "the embedded GPU library does not parse";
    for (auto module : library->getOps<gpu::GPUModuleOp>())
      kernels = module;
    ASSERT_TRUE(kernels) << "the embedded GPU library has no gpu.module";
  }

  MLIRContext context;
  OwningOpRef<ModuleOp> library;
  gpu::GPUModuleOp kernels;
};

TEST_F(KernelPortTest, EachBuiltKernelIsTheGenerators) {
  OpBuilder b(&context);
  OwningOpRef<ModuleOp> built = ModuleOp::create(b.getUnknownLoc());
  b.setInsertionPointToEnd(built->getBody());
  auto module = gpu::GPUModuleOp::create(b, b.getUnknownLoc(), "built");
  ASSERT_FALSE(moe::builtLibraryKernelNames().empty());
  for (StringRef name : moe::builtLibraryKernelNames()) {
    SCOPED_TRACE(name.str());
    auto expected = kernels.lookupSymbol<gpu::GPUFuncOp>(name);
    ASSERT_TRUE(expected) << "the generator's library has no @" << name.str();
    FailureOr<gpu::GPUFuncOp> kernel = moe::buildLibraryKernel(module, name);
    ASSERT_TRUE(succeeded(kernel));
    EXPECT_EQ(printed(*kernel), printed(expected));
  }
}

TEST_F(KernelPortTest, TheWholeLibraryIsTheGenerators) {
  OwningOpRef<ModuleOp> built = moe::buildGPULibrary(&context);
  ASSERT_TRUE(built);
  EXPECT_TRUE(succeeded(verify(*built)));
  EXPECT_EQ(printed(*built), printed(*library));
}

TEST_F(KernelPortTest, UnknownKernelIsAnError) {
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

// The builder makes all of the library's device functions (the func.func ops
// of its gpu.module), in its order, each printed as the generator's.
TEST_F(KernelPortTest, EachDeviceFunctionIsTheGenerators) {
  SmallVector<StringRef> expectedNames;
  for (auto function : kernels.getOps<func::FuncOp>())
    expectedNames.push_back(function.getSymName());
  EXPECT_EQ(moe::libraryDeviceFunctionNames(), expectedNames);

  OpBuilder b(&context);
  OwningOpRef<ModuleOp> built = ModuleOp::create(b.getUnknownLoc());
  b.setInsertionPointToEnd(built->getBody());
  auto module = gpu::GPUModuleOp::create(b, b.getUnknownLoc(), "built");
  ASSERT_TRUE(succeeded(moe::buildLibraryDeviceFunctions(module)));
  SmallVector<StringRef> builtNames;
  for (auto function : module.getOps<func::FuncOp>())
    builtNames.push_back(function.getSymName());
  EXPECT_EQ(builtNames, moe::libraryDeviceFunctionNames());
  for (StringRef name : moe::libraryDeviceFunctionNames()) {
    SCOPED_TRACE(name.str());
    auto expected = kernels.lookupSymbol<func::FuncOp>(name);
    ASSERT_TRUE(expected) << "the generator's library has no @" << name.str();
    auto function = module.lookupSymbol<func::FuncOp>(name);
    ASSERT_TRUE(function);
    EXPECT_EQ(printed(function), printed(expected));
  }
}

TEST_F(KernelPortTest, DeviceFunctionsTwiceIsAnError) {
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

// The builder makes all of the library's host functions (the func.func
// @__moe_gpu_* ops outside its gpu.module), in its order, each printed as the
// generator's, and before the first that needs it the declaration of the
// runtime's tensor map function, as the library declares it.
TEST_F(KernelPortTest, EachHostFunctionIsTheGenerators) {
  SmallVector<StringRef> expectedNames;
  for (auto function : library->getOps<func::FuncOp>())
    if (function.getSymName().starts_with("__moe_gpu_"))
      expectedNames.push_back(function.getSymName());
  EXPECT_EQ(moe::libraryHostFunctionNames(), expectedNames);

  OpBuilder b(&context);
  OwningOpRef<ModuleOp> built = ModuleOp::create(b.getUnknownLoc());
  for (StringRef name : moe::libraryHostFunctionNames()) {
    SCOPED_TRACE(name.str());
    auto expected = library->lookupSymbol<func::FuncOp>(name);
    ASSERT_TRUE(expected) << "the generator's library has no @" << name.str();
    FailureOr<func::FuncOp> function =
        moe::buildLibraryHostFunction(*built, name);
    ASSERT_TRUE(succeeded(function));
    EXPECT_EQ(printed(*function), printed(expected));
  }

  // The module-level functions in the library's order.
  SmallVector<StringRef> libraryFunctions, builtFunctions;
  for (auto function : library->getOps<func::FuncOp>())
    libraryFunctions.push_back(function.getSymName());
  for (auto function : built->getOps<func::FuncOp>())
    builtFunctions.push_back(function.getSymName());
  EXPECT_EQ(builtFunctions, libraryFunctions);
  auto declaration =
      built->lookupSymbol<func::FuncOp>("moeTensorMapDeviceBf16");
  auto expectedDeclaration =
      library->lookupSymbol<func::FuncOp>("moeTensorMapDeviceBf16");
  ASSERT_TRUE(declaration);
  ASSERT_TRUE(expectedDeclaration);
  EXPECT_EQ(printed(declaration), printed(expectedDeclaration));
}

TEST_F(KernelPortTest, HostFunctionErrors) {
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

} // namespace
