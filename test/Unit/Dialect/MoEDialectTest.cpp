//===- MoEDialectTest.cpp - Dialect, pass and pipeline C++ API tests ----===//

#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/InitAll.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"

#include "gtest/gtest.h"

using namespace mlir;
using namespace mlir::moe;

namespace {

constexpr const char *kLayer = R"mlir(
func.func @layer(%x: tensor<37x48xf32>, %wr: tensor<48x5xf32>,
                 %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>)
    -> (tensor<37x48xf32>, tensor<37x5xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      {activation = #moe.activation<swiglu>,
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>,
        tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
  return %out, %logits : tensor<37x48xf32>, tensor<37x5xf32>
}
)mlir";

class MoEDialectTest : public ::testing::Test {
protected:
  MoEDialectTest() {
    DialectRegistry registry;
    registry.insert<arith::ArithDialect, func::FuncDialect>();
    registerAllMoEDialects(registry);
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
  }

  /// Parses `source`, collecting diagnostics instead of printing them.
  OwningOpRef<ModuleOp> parse(StringRef source) {
    return parseSourceString<ModuleOp>(source, &context);
  }

  MLIRContext context;
};

TEST_F(MoEDialectTest, RoutingAttrDefaultsAndAccessors) {
  auto routing =
      RoutingAttr::get(&context, ScoringFunc::sigmoid, 8,
                       /*renormalize=*/true, /*numGroups=*/8,
                       /*topkGroups=*/4, /*scalingFactor=*/llvm::APFloat(2.5),
                       /*roundLogits=*/true);
  EXPECT_EQ(routing.getTopK(), 8);
  EXPECT_TRUE(routing.getRoundLogits());
  EXPECT_EQ(routing.getNumGroups(), 8);
  EXPECT_EQ(routing.getTopkGroups(), 4);
  EXPECT_DOUBLE_EQ(routing.getScalingFactorValue(), 2.5);
  std::string text;
  llvm::raw_string_ostream os(text);
  os << Attribute(routing);
  EXPECT_NE(text.find("num_groups = 8"), std::string::npos) << text;
  EXPECT_NE(text.find("round_logits = true"), std::string::npos) << text;

  auto plain = RoutingAttr::get(&context, ScoringFunc::softmax, 2, false, 1, 1,
                                llvm::APFloat(1.0), false);
  text.clear();
  os << Attribute(plain);
  EXPECT_EQ(text, "#moe.routing<scoring = softmax, top_k = 2>");
}

TEST_F(MoEDialectTest, RoutingAttrVerifierRejectsBadGroups) {
  std::string message;
  ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
    message = diag.str();
    return success();
  });
  auto bad = RoutingAttr::getChecked(
      [&] { return emitError(UnknownLoc::get(&context)); }, &context,
      ScoringFunc::sigmoid, int64_t{8}, true, /*numGroups=*/int64_t{4},
      /*topkGroups=*/int64_t{5}, llvm::APFloat(1.0), false);
  EXPECT_FALSE(bad);
  EXPECT_NE(message.find("topk_groups must be in [1, num_groups = 4]"),
            std::string::npos)
      << message;
}

TEST_F(MoEDialectTest, HostTensorTypeMirrorsDeviceTensor) {
  auto host = HostTensorType::get(&context, {4, ShapedType::kDynamic},
                                  Float32Type::get(&context));
  EXPECT_EQ(host.getDeviceType(),
            RankedTensorType::get({4, ShapedType::kDynamic},
                                  Float32Type::get(&context)));
}

TEST_F(MoEDialectTest, GatedActivations) {
  EXPECT_TRUE(isGated(Activation::swiglu));
  EXPECT_FALSE(isGated(Activation::gelu));
  EXPECT_FALSE(isGated(Activation::silu));
  EXPECT_FALSE(isGated(Activation::gelu_tanh));
}

TEST_F(MoEDialectTest, DecomposeThroughPassManager) {
  OwningOpRef<ModuleOp> module = parse(kLayer);
  ASSERT_TRUE(module);
  PassManager pm(&context);
  pm.addPass(createMoEDecompose());
  ASSERT_TRUE(succeeded(pm.run(*module)));
  int layers = 0, routers = 0, dispatches = 0, experts = 0, combines = 0;
  module->walk([&](Operation *op) {
    layers += isa<LayerOp>(op);
    routers += isa<RouterOp>(op);
    dispatches += isa<DispatchOp>(op);
    experts += isa<ExpertFFNOp>(op);
    combines += isa<CombineOp>(op);
  });
  EXPECT_EQ(layers, 0);
  EXPECT_EQ(routers, 1);
  EXPECT_EQ(dispatches, 1);
  EXPECT_EQ(experts, 1);
  EXPECT_EQ(combines, 1);
  DispatchOp dispatch;
  module->walk([&](DispatchOp op) { dispatch = op; });
  EXPECT_EQ(dispatch.getTokenIds().getType().getDimSize(0), 37 * 2);
  EXPECT_EQ(dispatch.getOffsets().getType().getDimSize(0), 6);
}

TEST_F(MoEDialectTest, PipelineOptionsAreValidated) {
  registerAllMoEPasses();
  std::string errors;
  llvm::raw_string_ostream errorStream(errors);
  OpPassManager good("builtin.module");
  EXPECT_TRUE(succeeded(parsePassPipeline(
      "moe-training-pipeline{chip=sm_90a memory-budget=4GiB offload=auto}",
      good, errorStream)))
      << errors;
  OpPassManager badChip("builtin.module");
  EXPECT_TRUE(failed(parsePassPipeline("moe-training-pipeline{chip=sm_80}",
                                       badChip, errorStream)));
  OpPassManager badBudget("builtin.module");
  EXPECT_TRUE(failed(parsePassPipeline(
      "moe-training-pipeline{memory-budget=4GiX}", badBudget, errorStream)));
  OpPassManager badOffload("builtin.module");
  EXPECT_TRUE(failed(parsePassPipeline(
      "moe-training-pipeline{offload=sometimes}", badOffload, errorStream)));
}

} // namespace
