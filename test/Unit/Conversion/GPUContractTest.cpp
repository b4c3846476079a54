//===- GPUContractTest.cpp - the host functions against the contract -----===//
//
// The host functions the kernel builder makes are the ones the GPU path's
// contract (python/moe_mlir/gpu_contract.json, GPUContract.h) lists, with the
// parameter and result types it gives, and the contract's limits are what
// its generated constants say.
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/MoEToGPU/GPUContract.h"
#include "moe/Conversion/MoEToGPU/KernelBuilder.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"

#include "mlir/AsmParser/AsmParser.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/raw_ostream.h"

#include "gtest/gtest.h"

#include <string>
#include <vector>

using namespace mlir;

namespace {

std::string printed(Type type) {
  std::string text;
  llvm::raw_string_ostream os(text);
  type.print(os);
  return text;
}

std::vector<std::string> printed(TypeRange types) {
  std::vector<std::string> texts;
  for (Type type : types)
    texts.push_back(printed(type));
  return texts;
}

std::vector<std::string> contractTypes(const moe::HostFunctionContract &f) {
  std::vector<std::string> types;
  for (const moe::HostFunctionParam &param : f.params)
    types.push_back(param.type.str());
  return types;
}

std::vector<std::string> strings(ArrayRef<llvm::StringLiteral> values) {
  std::vector<std::string> texts;
  for (StringRef value : values)
    texts.push_back(value.str());
  return texts;
}

class GPUContractTest : public ::testing::Test {
protected:
  void SetUp() override {
    // The dialects buildLibraryHostFunction needs, and moe for the op names.
    context.loadDialect<arith::ArithDialect, func::FuncDialect, gpu::GPUDialect,
                        LLVM::LLVMDialect, memref::MemRefDialect,
                        scf::SCFDialect, moe::MoEDialect>();
  }

  MLIRContext context;
};

TEST_F(GPUContractTest, EveryHostFunctionHasTheContractsSignature) {
  ASSERT_FALSE(moe::gpuHostFunctionContracts().empty());
  for (const moe::HostFunctionContract &contract :
       moe::gpuHostFunctionContracts()) {
    SCOPED_TRACE(contract.name.str());
    OpBuilder b(&context);
    OwningOpRef<ModuleOp> module = ModuleOp::create(b.getUnknownLoc());
    FailureOr<func::FuncOp> function =
        moe::buildLibraryHostFunction(*module, contract.name);
    ASSERT_TRUE(succeeded(function))
        << "the builder does not make " << contract.name.str();
    FunctionType type = function->getFunctionType();
    EXPECT_EQ(printed(type.getInputs()), contractTypes(contract));
    EXPECT_EQ(printed(type.getResults()), strings(contract.results));
    // The contract's strings are types the parser reads back as the same.
    for (const moe::HostFunctionParam &param : contract.params) {
      Type parsed = parseType(param.type, &context);
      ASSERT_TRUE(parsed) << param.name.str() << ": '" << param.type.str()
                          << "' does not parse";
      EXPECT_EQ(printed(parsed), param.type.str());
    }
    EXPECT_TRUE(context.isOperationRegistered(contract.opName))
        << "no op " << contract.opName.str();
  }
}

TEST_F(GPUContractTest, TheContractListsTheBuildersHostFunctions) {
  llvm::StringSet<> contract;
  std::vector<std::string> contractOrder;
  for (const moe::HostFunctionContract &function :
       moe::gpuHostFunctionContracts()) {
    EXPECT_TRUE(contract.insert(function.name).second)
        << function.name.str() << " is in the contract twice";
    contractOrder.push_back(function.name.str());
  }
  llvm::StringSet<> built;
  std::vector<std::string> builtOrder;
  for (StringRef name : moe::libraryHostFunctionNames()) {
    built.insert(name);
    builtOrder.push_back(name.str());
    EXPECT_TRUE(contract.contains(name))
        << "the builder makes " << name.str() << ", the contract lacks it";
    EXPECT_NE(moe::lookupHostFunctionContract(name), nullptr) << name.str();
  }
  for (const moe::HostFunctionContract &function :
       moe::gpuHostFunctionContracts())
    EXPECT_TRUE(built.contains(function.name))
        << "the contract lists " << function.name.str()
        << ", the builder does not make it";
  // Both in the library's order.
  EXPECT_EQ(contractOrder, builtOrder);
  EXPECT_EQ(moe::lookupHostFunctionContract("__moe_gpu_nothing"), nullptr);
}

TEST_F(GPUContractTest, TheLimitsTableHoldsTheConstants) {
  namespace c = moe::gpu_contract;
  EXPECT_EQ(c::kChip, "sm_90a");
  llvm::StringMap<const moe::GPULimit *> limits;
  for (const moe::GPULimit &limit : moe::gpuLimits()) {
    EXPECT_TRUE(limits.insert({limit.name, &limit}).second) << limit.name.str();
    EXPECT_FALSE(limit.reason.empty()) << limit.name.str();
  }
  for (StringRef name : {"tile_multiple", "max_width", "max_experts",
                         "max_expert_groups", "data_dtype", "activations",
                         "capacity_factor_supported", "expert_bias_supported"})
    ASSERT_TRUE(limits.contains(name)) << "the contract has no " << name.str();
  auto integer = [&](StringRef name) -> int64_t {
    const moe::GPULimit *limit = limits.lookup(name);
    EXPECT_EQ(limit->kind, moe::GPULimit::Kind::Integer) << name.str();
    return limit->integer;
  };
  EXPECT_EQ(integer("tile_multiple"), c::kTileMultiple);
  EXPECT_EQ(integer("max_width"), c::kMaxWidth);
  EXPECT_EQ(integer("max_experts"), c::kMaxExperts);
  EXPECT_EQ(integer("max_expert_groups"), c::kMaxExpertGroups);
  EXPECT_EQ(strings(limits.lookup("tile_multiple")->appliesTo),
            (std::vector<std::string>{"d", "n", "m"}));
  EXPECT_EQ(limits.lookup("data_dtype")->string, c::kDataDtype);
  EXPECT_EQ(strings(limits.lookup("activations")->strings),
            strings(c::kActivations));
  EXPECT_EQ(limits.lookup("capacity_factor_supported")->boolean,
            c::kCapacityFactorSupported);
  EXPECT_EQ(limits.lookup("expert_bias_supported")->boolean,
            c::kExpertBiasSupported);
  // The widths the conversion checks tile evenly.
  EXPECT_EQ(c::kMaxWidth % c::kTileMultiple, 0);
}

} // namespace
