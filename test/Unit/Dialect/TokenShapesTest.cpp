//===- TokenShapesTest.cpp - the sizes that follow the token count -------===//
//
// A layer with T = 37 tokens goes through decomposition, each activation
// plan, backward generation, offload and the folded adds twice: with a static
// T, and with a dynamic one (max_tokens = 64). Every tensor value of the
// static functions has the rows a token getRowsPerToken says (37, 74 = T * k,
// or neither), and every value of the dynamic functions, sized at 37 tokens,
// has the type of its static twin.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/IR/TokenShapes.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/InitAll.h"
#include "moe/Support/ByteSize.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"

#include "gtest/gtest.h"

#include <string>

using namespace mlir;
using namespace mlir::moe;

namespace {

constexpr int64_t kTokens = 37, kTopK = 2;

/// The layer with token count `tokens` ("37" or "?"): d = 48, E = 5, n = 40,
/// a shared expert of m = 24.
std::string layerText(StringRef tokens) {
  std::string bound = tokens == "?" ? "max_tokens = 64, " : "";
  std::string text = R"mlir(
func.func @layer(%x: tensor<TTx48xf32>, %wr: tensor<48x5xf32>,
                 %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>,
                 %sgu: tensor<48x48xf32>, %sd: tensor<24x48xf32>)
    -> (tensor<TTx48xf32>, tensor<TTx5xf32>) {
  %out, %logits = moe.layer %x, %wr, %wgu, %wd
      shared(%sgu, %sd : tensor<48x48xf32>, tensor<24x48xf32>)
      {activation = #moe.activation<swiglu>, BOUND
       routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
      : tensor<TTx48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>,
        tensor<5x40x48xf32> -> tensor<TTx48xf32>, tensor<TTx5xf32>
  return %out, %logits : tensor<TTx48xf32>, tensor<TTx5xf32>
}
)mlir";
  for (size_t at; (at = text.find("TT")) != std::string::npos;)
    text.replace(at, 2, tokens.str());
  text.replace(text.find("BOUND"), 5, bound);
  return text;
}

class TokenShapesTest : public ::testing::TestWithParam<const char *> {
protected:
  TokenShapesTest() {
    DialectRegistry registry;
    registry.insert<arith::ArithDialect, func::FuncDialect,
                    tensor::TensorDialect>();
    registerAllMoEDialects(registry);
    registerAllMoEPasses();
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
  }

  /// The layer through the training passes under the activation plan.
  OwningOpRef<ModuleOp> train(StringRef tokens) {
    OwningOpRef<ModuleOp> module =
        parseSourceString<ModuleOp>(layerText(tokens), &context);
    if (!module)
      return nullptr;
    PassManager pm(&context);
    std::string pipeline =
        std::string("moe-decompose,func.func(moe-plan-activations{report="
                    "false policy=") +
        GetParam() + "}),moe-generate-backward,moe-offload,moe-fold-adds";
    if (failed(parsePassPipeline(pipeline, pm)) || failed(pm.run(*module)))
      return nullptr;
    return module;
  }

  /// Every tensor value of `module`, in order: arguments, then results.
  static SmallVector<Value> tensorValues(ModuleOp module) {
    SmallVector<Value> values;
    module.walk([&](Operation *op) {
      for (Region &region : op->getRegions())
        for (Block &block : region)
          for (BlockArgument argument : block.getArguments())
            values.push_back(argument);
      for (Value result : op->getResults())
        values.push_back(result);
    });
    llvm::erase_if(values, [](Value value) {
      Type type = value.getType();
      auto tensor = dyn_cast<RankedTensorType>(type);
      return !isa<HostTensorType>(type) && (!tensor || tensor.getRank() == 0);
    });
    return values;
  }

  MLIRContext context;
};

int64_t leadingDim(Value value) {
  Type type = value.getType();
  if (auto host = dyn_cast<HostTensorType>(type))
    return host.getDeviceType().getDimSize(0);
  return cast<RankedTensorType>(type).getDimSize(0);
}

TEST_P(TokenShapesTest, StaticRowsMatchTheTypes) {
  OwningOpRef<ModuleOp> module = train("37");
  ASSERT_TRUE(module);
  SmallVector<Value> values = tensorValues(*module);
  ASSERT_GT(values.size(), 30u);
  for (Value value : values) {
    std::optional<int64_t> rows = getRowsPerToken(value);
    ASSERT_TRUE(rows.has_value());
    int64_t dim = leadingDim(value);
    std::string what;
    llvm::raw_string_ostream(what) << value;
    if (*rows == 0)
      EXPECT_TRUE(dim != kTokens && dim != kTokens * kTopK) << what;
    else
      EXPECT_EQ(dim, *rows * kTokens) << what;
  }
}

TEST_P(TokenShapesTest, DynamicTypesAtTheTokensAreTheStaticOnes) {
  OwningOpRef<ModuleOp> fixed = train("37");
  OwningOpRef<ModuleOp> dynamic = train("?");
  ASSERT_TRUE(fixed && dynamic);
  SmallVector<Value> fixedValues = tensorValues(*fixed);
  SmallVector<Value> dynamicValues = tensorValues(*dynamic);
  ASSERT_EQ(fixedValues.size(), dynamicValues.size());
  for (auto [fixedValue, dynamicValue] :
       llvm::zip_equal(fixedValues, dynamicValues)) {
    std::optional<RankedTensorType> type =
        getTypeAtTokens(dynamicValue, kTokens);
    std::string what;
    llvm::raw_string_ostream(what) << dynamicValue;
    ASSERT_TRUE(type.has_value()) << what;
    Type expected = fixedValue.getType();
    if (auto host = dyn_cast<HostTensorType>(expected))
      expected = host.getDeviceType();
    EXPECT_EQ(Type(*type), expected) << what;
    // The bytes: per token for a dynamic leading dimension, fixed otherwise.
    std::optional<TokenBytes> bytes = getTokenBytes(dynamicValue);
    ASSERT_TRUE(bytes.has_value()) << what;
    ByteSizeStatus status;
    EXPECT_EQ(bytes->at(kTokens),
              getByteSize(cast<ShapedType>(expected), status))
        << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, TokenShapesTest,
                         ::testing::Values("keep", "recompute", "offload"));

} // namespace

namespace {

// An argument of expert-ordered rows read only by an op that does not show k
// (the token ids of a recomputation in backward): k is the function's, from
// its routing pairs.
TEST(TokenShapes, RowsOfAnArgumentTakeTheFunctionsK) {
  DialectRegistry registry;
  registry
      .insert<arith::ArithDialect, func::FuncDialect, tensor::TensorDialect>();
  registerAllMoEDialects(registry);
  MLIRContext context(registry);
  context.loadAllAvailableDialects();
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(R"mlir(
func.func @f(%x: tensor<?x48xf32>, %ids: tensor<?xi32>, %offsets: tensor<6xi32>,
             %wgu: tensor<5x48x80xf32>, %wd: tensor<5x40x48xf32>,
             %w: tensor<?x2xf32>, %rows: tensor<?x2xi32>) -> tensor<?x48xf32>
    attributes {moe.max_tokens = 64 : i64} {
  %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<?x48xf32>, tensor<?xi32>, tensor<6xi32>, tensor<5x48x80xf32>,
        tensor<5x40x48xf32> -> tensor<?x48xf32>, tensor<?x80xf32>
  %out = moe.combine %y, %w, %rows
      : tensor<?x48xf32>, tensor<?x2xf32>, tensor<?x2xi32> -> tensor<?x48xf32>
  return %out : tensor<?x48xf32>
}
)mlir",
                                                             &context);
  ASSERT_TRUE(module);
  auto func = *module->getOps<func::FuncOp>().begin();
  EXPECT_EQ(getRowsPerToken(func.getArgument(1)), 2);
  EXPECT_EQ(getRowsPerToken(func.getArgument(0)), 1);
  EXPECT_EQ(getRowsPerToken(func.getArgument(3)), 0);
  std::optional<RankedTensorType> h =
      getTypeAtTokens(func.front().front().getResult(1), 37);
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->getDimSize(0), 74);
}

} // namespace
