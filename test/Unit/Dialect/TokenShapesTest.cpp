//===- TokenShapesTest.cpp - the sizes that follow the token count -------===//
//
// A layer with T = 37 tokens goes through decomposition, each activation
// plan, backward generation, offload and the folded adds twice: with a static
// T, and with a dynamic one (max_tokens = 64). Every tensor value of the
// static functions has the rows a token getRowsPerToken says (37, 74 = T * k,
// or neither), and every value of the dynamic functions, sized at 37 tokens,
// has the type of its static twin. A hand-written rank of an expert-parallel
// layer is held to the same two rules.
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

/// Every tensor value of `module`, in order: arguments, then results.
SmallVector<Value> tensorValues(ModuleOp module) {
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

namespace {

void loadDialects(MLIRContext &context) {
  DialectRegistry registry;
  registry
      .insert<arith::ArithDialect, func::FuncDialect, tensor::TensorDialect>();
  registerAllMoEDialects(registry);
  context.appendDialectRegistry(registry);
  context.loadAllAvailableDialects();
}

/// One rank of an expert-parallel layer with T = `tokens` tokens ("37" or
/// "?"): d = 48, E = 4 experts over ep_size = 2 ranks, capacity 50 (100 rows
/// received), k = 2; its forward, the local halves and pieces of backward.
/// Beside it, a function of k = 1 that gathers x by token ids and scatters
/// the rows back to their tokens.
std::string expertParallelText(StringRef tokens) {
  bool dynamic = tokens == "?";
  std::string text = R"mlir(
func.func @ep(%x: tensor<TTx48xf32>, %wr: tensor<48x4xf32>,
              %wgu: tensor<2x48x80xf32>, %wd: tensor<2x40x48xf32>) BOUND {
  %w, %e, %logits = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 2>}
      : tensor<TTx48xf32>, tensor<48x4xf32> -> tensor<TTx2xf32>, tensor<TTx2xi32>, tensor<TTx4xf32>
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 4 : i64}
      : tensor<TTx2xi32> -> tensor<RRxi32>, tensor<5xi32>, tensor<TTx2xi32>
  %recv, %counts, %dropped = moe.ep_dispatch %x, %offsets gather(%ids : tensor<RRxi32>)
      {capacity = 50 : i64, ep_size = 2 : i64}
      : tensor<TTx48xf32>, tensor<5xi32> -> tensor<100x48xf32>, tensor<2x2xi32>, tensor<2xi32>
  %qids, %qoffsets = moe.ep_queues %counts {capacity = 50 : i64}
      : tensor<2x2xi32> -> tensor<100xi32>, tensor<3xi32>
  %y, %h = moe.expert_ffn %recv, %qids, %qoffsets, %wgu, %wd {activation = #moe.activation<swiglu>}
      : tensor<100x48xf32>, tensor<100xi32>, tensor<3xi32>, tensor<2x48x80xf32>,
        tensor<2x40x48xf32> -> tensor<100x48xf32>, tensor<100x80xf32>
  %yrecv = moe.scatter_rows %y, %qids : tensor<100x48xf32>, tensor<100xi32> -> tensor<100x48xf32>
  %yback = moe.ep_combine %yrecv, %offsets {capacity = 50 : i64, ep_size = 2 : i64}
      : tensor<100x48xf32>, tensor<5xi32> -> tensor<RRx48xf32>
  %out = moe.combine %yback, %w, %rows
      : tensor<RRx48xf32>, tensor<TTx2xf32>, tensor<TTx2xi32> -> tensor<TTx48xf32>
  %send, %scounts, %sdropped = moe.ep_pack %yback, %offsets
      {capacity = 50 : i64, ep_size = 2 : i64, overflow = #moe.ep_overflow<drop>}
      : tensor<RRx48xf32>, tensor<5xi32> -> tensor<100x48xf32>, tensor<2x2xi32>, tensor<2xi32>
  %unpacked = moe.ep_unpack %send, %offsets {capacity = 50 : i64, ep_size = 2 : i64}
      : tensor<100x48xf32>, tensor<5xi32> -> tensor<RRx48xf32>
  %summed = moe.ep_unpack %send, %offsets reduce(%rows : tensor<TTx2xi32>)
      {capacity = 50 : i64, ep_size = 2 : i64}
      : tensor<100x48xf32>, tensor<5xi32> -> tensor<TTx48xf32>
  %xrows = moe.gather_rows %x, %ids : tensor<TTx48xf32>, tensor<RRxi32> -> tensor<RRx48xf32>
  %dyrecv, %dcounts, %ddropped = moe.ep_dispatch %unpacked, %offsets
      {capacity = 50 : i64, ep_size = 2 : i64, overflow = #moe.ep_overflow<drop>}
      : tensor<RRx48xf32>, tensor<5xi32> -> tensor<100x48xf32>, tensor<2x2xi32>, tensor<2xi32>
  %dyq = moe.gather_rows %dyrecv, %qids : tensor<100x48xf32>, tensor<100xi32> -> tensor<100x48xf32>
  %dxrecv, %dwgu, %dwd = moe.expert_ffn_grad %recv, %qids, %qoffsets, %wgu, %wd, %h, %dyq
      {activation = #moe.activation<swiglu>}
      : tensor<100x48xf32>, tensor<100xi32>, tensor<3xi32>, tensor<2x48x80xf32>,
        tensor<2x40x48xf32>, tensor<100x80xf32>, tensor<100x48xf32>
      -> tensor<100x48xf32>, tensor<2x48x80xf32>, tensor<2x40x48xf32>
  %dx = moe.ep_combine %dxrecv, %offsets reduce(%rows : tensor<TTx2xi32>)
      {capacity = 50 : i64, ep_size = 2 : i64}
      : tensor<100x48xf32>, tensor<5xi32> -> tensor<TTx48xf32>
  return
}

func.func @tokens_back(%x: tensor<TTx48xf32>, %wr: tensor<48x4xf32>) BOUND {
  %w, %e, %logits = moe.router %x, %wr {routing = #moe.routing<scoring = softmax, top_k = 1>}
      : tensor<TTx48xf32>, tensor<48x4xf32> -> tensor<TTx1xf32>, tensor<TTx1xi32>, tensor<TTx4xf32>
  %ids, %offsets, %rows = moe.dispatch %e {num_experts = 4 : i64}
      : tensor<TTx1xi32> -> tensor<TTxi32>, tensor<5xi32>, tensor<TTx1xi32>
  %xrows = moe.gather_rows %x, %ids : tensor<TTx48xf32>, tensor<TTxi32> -> tensor<TTx48xf32>
  %xback = moe.scatter_rows %xrows, %ids : tensor<TTx48xf32>, tensor<TTxi32> -> tensor<TTx48xf32>
  return
}
)mlir";
  auto replaceAll = [&](StringRef from, StringRef to) {
    for (size_t at; (at = text.find(from.str())) != std::string::npos;)
      text.replace(at, from.size(), to.str());
  };
  replaceAll("RR", dynamic ? "?" : "74");
  replaceAll("TT", tokens);
  replaceAll("BOUND", dynamic ? "attributes {moe.max_tokens = 64 : i64}" : "");
  return text;
}

// The leading sizes of the expert-parallel ops: the rows a rank sends and
// receives, the counts and the queues are fixed; what comes home is T * k
// rows, or T summed per token; rows by index follow their indices.
TEST(TokenShapes, ExpertParallelValues) {
  MLIRContext context;
  loadDialects(context);
  OwningOpRef<ModuleOp> fixed =
      parseSourceString<ModuleOp>(expertParallelText("37"), &context);
  OwningOpRef<ModuleOp> dynamic =
      parseSourceString<ModuleOp>(expertParallelText("?"), &context);
  ASSERT_TRUE(fixed && dynamic);
  SmallVector<Value> fixedValues = tensorValues(*fixed);
  SmallVector<Value> dynamicValues = tensorValues(*dynamic);
  ASSERT_EQ(fixedValues.size(), dynamicValues.size());
  ASSERT_GT(fixedValues.size(), 40u);
  for (auto [fixedValue, dynamicValue] :
       llvm::zip_equal(fixedValues, dynamicValues)) {
    std::string what;
    llvm::raw_string_ostream(what) << fixedValue;
    // The static function: the rows a token its types show (k = 2 in @ep,
    // 1 in @tokens_back, where T * k = T).
    std::optional<int64_t> rows = getRowsPerToken(fixedValue);
    ASSERT_TRUE(rows.has_value()) << what;
    int64_t dim = leadingDim(fixedValue);
    if (*rows == 0)
      EXPECT_TRUE(dim != kTokens && dim != kTokens * kTopK) << what;
    else
      EXPECT_EQ(dim, *rows * kTokens) << what;
    // The dynamic one: at 37 tokens, the static types and their bytes.
    EXPECT_EQ(getRowsPerToken(dynamicValue), rows) << what;
    std::optional<RankedTensorType> type =
        getTypeAtTokens(dynamicValue, kTokens);
    ASSERT_TRUE(type.has_value()) << what;
    EXPECT_EQ(Type(*type), fixedValue.getType()) << what;
    std::optional<TokenBytes> bytes = getTokenBytes(dynamicValue);
    ASSERT_TRUE(bytes.has_value()) << what;
    ByteSizeStatus status;
    EXPECT_EQ(bytes->at(kTokens),
              getByteSize(cast<ShapedType>(fixedValue.getType()), status))
        << what;
  }
}

// Arguments read by the expert-parallel ops (a stage of a split layer): x
// gathered by token ids, rows in expert order, the routing pairs' rows, and
// the fixed [S * C] rows, counts and queues. A scatter_rows result of
// indices no op explains: fixed when static, what its uses say when dynamic.
TEST(TokenShapes, ExpertParallelArguments) {
  MLIRContext context;
  loadDialects(context);
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(R"mlir(
func.func @stage(%x: tensor<?x48xf32>, %ids: tensor<?xi32>, %offsets: tensor<5xi32>,
                 %rows: tensor<?x2xi32>, %dy: tensor<?x48xf32>,
                 %returned: tensor<100x48xf32>, %counts: tensor<2x2xi32>,
                 %qids: tensor<100xi32>, %recv: tensor<100x48xf32>,
                 %unknown: tensor<100xi32>)
    attributes {moe.max_tokens = 64 : i64} {
  %send, %c, %d = moe.ep_pack %x, %offsets gather(%ids : tensor<?xi32>)
      {capacity = 50 : i64, ep_size = 2 : i64}
      : tensor<?x48xf32>, tensor<5xi32> -> tensor<100x48xf32>, tensor<2x2xi32>, tensor<2xi32>
  %dsend, %dc, %dd = moe.ep_dispatch %dy, %offsets {capacity = 50 : i64, ep_size = 2 : i64}
      : tensor<?x48xf32>, tensor<5xi32> -> tensor<100x48xf32>, tensor<2x2xi32>, tensor<2xi32>
  %dx = moe.ep_unpack %returned, %offsets reduce(%rows : tensor<?x2xi32>)
      {capacity = 50 : i64, ep_size = 2 : i64}
      : tensor<100x48xf32>, tensor<5xi32> -> tensor<?x48xf32>
  %back = moe.ep_unpack %returned, %offsets {capacity = 50 : i64, ep_size = 2 : i64}
      : tensor<100x48xf32>, tensor<5xi32> -> tensor<?x48xf32>
  %qids2, %qoffsets = moe.ep_queues %counts {capacity = 50 : i64}
      : tensor<2x2xi32> -> tensor<100xi32>, tensor<3xi32>
  %q = moe.gather_rows %recv, %qids : tensor<100x48xf32>, tensor<100xi32> -> tensor<100x48xf32>
  %s0 = moe.scatter_rows %q, %unknown : tensor<100x48xf32>, tensor<100xi32> -> tensor<74x48xf32>
  %s1 = moe.scatter_rows %q, %unknown : tensor<100x48xf32>, tensor<100xi32> -> tensor<?x48xf32>
  %s1send, %s1c, %s1d = moe.ep_pack %s1, %offsets {capacity = 50 : i64, ep_size = 2 : i64}
      : tensor<?x48xf32>, tensor<5xi32> -> tensor<100x48xf32>, tensor<2x2xi32>, tensor<2xi32>
  %s2 = moe.scatter_rows %q, %unknown : tensor<100x48xf32>, tensor<100xi32> -> tensor<?x48xf32>
  return
}
)mlir",
                                                             &context);
  ASSERT_TRUE(module);
  auto func = *module->getOps<func::FuncOp>().begin();
  // k = 2 comes from rows_of, the only routing pairs of the function.
  const std::optional<int64_t> expected[] = {1, 2, 0, 1, 2, 0, 0, 0, 0, 0};
  for (auto [argument, rows] : llvm::zip_equal(func.getArguments(), expected))
    EXPECT_EQ(getRowsPerToken(argument), rows) << argument.getArgNumber();
  Block &body = func.front();
  // The first op of `name`'s result.
  auto resultOf = [&](StringRef name, unsigned result = 0) -> Value {
    for (Operation &op : body)
      if (op.getName().getStringRef() == name)
        return op.getResult(result);
    return Value();
  };
  EXPECT_EQ(getRowsPerToken(resultOf("moe.ep_pack")), 0);
  EXPECT_EQ(getRowsPerToken(resultOf("moe.ep_dispatch", 1)), 0);
  EXPECT_EQ(getRowsPerToken(resultOf("moe.ep_queues")), 0);
  EXPECT_EQ(getRowsPerToken(resultOf("moe.gather_rows")), 0);
  SmallVector<Value> unpacked, scattered;
  for (Operation &op : body) {
    if (isa<EPUnpackOp>(op))
      unpacked.push_back(op.getResult(0));
    if (isa<ScatterRowsOp>(op))
      scattered.push_back(op.getResult(0));
  }
  ASSERT_EQ(unpacked.size(), 2u);
  ASSERT_EQ(scattered.size(), 3u);
  EXPECT_EQ(getRowsPerToken(unpacked[0]), 1);
  EXPECT_EQ(getRowsPerToken(unpacked[1]), 2);
  std::optional<RankedTensorType> back = getTypeAtTokens(unpacked[1], 37);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->getDimSize(0), 74);
  EXPECT_EQ(getRowsPerToken(scattered[0]), 0);
  EXPECT_EQ(getRowsPerToken(scattered[1]), 2);
  EXPECT_EQ(getRowsPerToken(scattered[2]), 0);
  EXPECT_FALSE(getTypeAtTokens(scattered[2], 37).has_value());
}

} // namespace
