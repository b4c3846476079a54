//===- MoEGPUConfigTest.cpp - #moe_gpu.gemm: names, shared memory, rules -===//
//
// The golden numbers below are each kernel's name, launch shared memory and
// threads: those of the library's kernels and their variants as the GPU ran
// them (the kernel text is pinned by test/Conversion/MoEToGPU/
// emit-library.mlir), so a change here is a change of what a kernel launches
// with.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoEGPU/IR/MoEGPUAttributes.h"
#include "moe/Dialect/MoEGPU/IR/MoEGPUDialect.h"

#include "mlir/AsmParser/AsmParser.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/Location.h"
#include "mlir/IR/MLIRContext.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/raw_ostream.h"

#include "gtest/gtest.h"

#include <functional>
#include <string>
#include <vector>

using namespace mlir;
using namespace mlir::moe_gpu;

namespace {

struct Golden {
  const char *name;
  int64_t launchSmem;
  int64_t threads;
};

// The library's GEMMs, in its order.
constexpr Golden kDefaultLibrary[] = {
    {"moe_gemm_up_gather", 218224, 384},
    {"moe_gemm_up_rows", 218224, 384},
    {"moe_gemm_up_gather_h", 218224, 384},
    {"moe_gemm_up_rows_h", 218224, 384},
    {"moe_gemm_rows_mn_bf16", 220272, 384},
    {"moe_gemm_rows_mn_f32", 202848, 256},
    {"moe_gemm_rows_k_bf16", 220272, 384},
    {"moe_gemm_dact_gather", 202848, 256},
    {"moe_gemm_dact_rows", 202848, 256},
    {"moe_gemm_wgrad_gather", 214064, 384},
    {"moe_gemm_wgrad_gather_a", 214064, 384},
    {"moe_gemm_wgrad_rows", 216112, 384},
    {"moe_gemm_rows_k_bf16_acc", 220272, 384},
};

class MoEGPUConfigTest : public ::testing::Test {
protected:
  MoEGPUConfigTest() { context.loadDialect<MoEGPUDialect>(); }

  /// The default config named `name`.
  GemmConfigAttr defaultConfig(StringRef name) {
    for (GemmConfigAttr attr : defaultGemmConfigs(&context))
      if (attr.kernelName() == name)
        return attr;
    ADD_FAILURE() << "no default config " << name.str();
    return {};
  }

  /// What a kernel computes, every build parameter left to its default.
  static GemmConfig kind(GemmConfigAttr attr) {
    GemmConfig c = attr.getConfig();
    GemmConfig k;
    k.a = c.a;
    k.b = c.b;
    k.gathered = c.gathered;
    k.epilogue = c.epilogue;
    k.storeA = c.storeA;
    k.withRouterWeight = c.withRouterWeight;
    k.withDs = c.withDs;
    k.accumulate = c.accumulate;
    k.problem = c.problem;
    return k;
  }

  /// The first verifier error of `config`, empty when it verifies.
  std::string verifierError(const GemmConfig &config) {
    std::string message;
    ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
      if (message.empty())
        message = diag.str();
      return success();
    });
    if (succeeded(verifyGemmConfig(
            config, [&] { return emitError(UnknownLoc::get(&context)); })))
      return "";
    return message.empty() ? "(no message)" : message;
  }

  static std::string print(Attribute attr) {
    std::string text;
    llvm::raw_string_ostream os(text);
    attr.print(os);
    return text;
  }

  MLIRContext context;
};

TEST_F(MoEGPUConfigTest, DefaultLibrary) {
  SmallVector<GemmConfigAttr> configs = defaultGemmConfigs(&context);
  ASSERT_EQ(configs.size(), std::size(kDefaultLibrary));
  for (auto [attr, golden] : llvm::zip(configs, kDefaultLibrary)) {
    ASSERT_TRUE(attr);
    EXPECT_EQ(attr.kernelName(), golden.name);
    EXPECT_EQ(attr.launchSharedMemoryBytes(), golden.launchSmem) << golden.name;
    EXPECT_EQ(attr.threads(), golden.threads) << golden.name;
    EXPECT_EQ(attr.persistent(), golden.threads == 384) << golden.name;
    EXPECT_EQ(verifierError(attr.getConfig()), "") << golden.name;
  }
  // Only the last accumulates.
  EXPECT_TRUE(
      llvm::none_of(ArrayRef(configs).drop_back(),
                    [](GemmConfigAttr attr) { return attr.getAccumulate(); }));
  EXPECT_TRUE(configs.back().getAccumulate());
}

// The printed form of each default config (as test/Dialect/MoEGPU/
// gemm-config.mlir spells them).
TEST_F(MoEGPUConfigTest, PrintedDefaults) {
  const char *printed[] = {
      "a = gather, b = w_mn_swiglu, epilogue = swiglu, store_a = true, "
      "problem = varlen_m",
      "a = rows, b = w_mn_swiglu, epilogue = swiglu, store_a = true, "
      "problem = varlen_m",
      "a = gather, b = w_mn_swiglu, epilogue = swiglu, problem = varlen_m",
      "a = rows, b = w_mn_swiglu, epilogue = swiglu, problem = varlen_m",
      "a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m",
      "a = rows, b = w_mn, epilogue = store_f32, problem = varlen_m",
      "a = rows, b = w_k, epilogue = store_bf16, problem = varlen_m",
      "a = gather, b = w_k, epilogue = dswiglu, with_router_weight = true, "
      "with_ds = true, problem = varlen_m",
      "a = rows, b = w_k, epilogue = dswiglu, problem = varlen_m",
      "a = mn, b = rows_mn, gathered = b, epilogue = store_bf16_w, "
      "problem = varlen_k",
      "a = mn, b = rows_mn, gathered = a, epilogue = store_bf16_w, "
      "problem = varlen_k",
      "a = mn, b = rows_mn, epilogue = store_bf16_w, problem = varlen_k",
      "a = rows, b = w_k, epilogue = store_bf16, accumulate = true, "
      "problem = varlen_m",
  };
  SmallVector<GemmConfigAttr> configs = defaultGemmConfigs(&context);
  ASSERT_EQ(configs.size(), std::size(printed));
  for (auto [attr, text] : llvm::zip(configs, printed))
    EXPECT_EQ(print(attr), "#moe_gpu.gemm<" + std::string(text) + ">");
}

// The names of the variants in test/Dialect/MoEGPU/gemm-config.mlir.
TEST_F(MoEGPUConfigTest, NamesOfVariants) {
  const std::pair<const char *, const char *> variants[] = {
      {"a = mn, b = rows_mn, gathered = b, epilogue = store_bf16_w, "
       "problem = varlen_k, warp_specialized = false",
       "moe_gemm_wgrad_gather_nows"},
      {"a = rows, b = w_k, epilogue = store_bf16, problem = varlen_m, "
       "stages = 2, registers = [80, 208], schedule = dynamic, group_m = 8",
       "moe_gemm_rows_k_bf16_s2_regs80x208_dyn_g8"},
      {"a = gather, b = w_mn_swiglu, epilogue = swiglu, store_a = true, "
       "problem = varlen_m, schedule = dynamic, idle_skip = false",
       "moe_gemm_up_gather_dyn_noskip"},
      {"a = mn, b = rows_mn, gathered = a, epilogue = store_bf16_w, "
       "problem = varlen_k, rows_tma = false, store = bulk_rows",
       "moe_gemm_wgrad_gather_a_norowstma_storebulk"},
      {"a = rows, b = w_mn, epilogue = store_bf16, problem = varlen_m, "
       "store = threads",
       "moe_gemm_rows_mn_bf16_storethreads"},
      {"a = gather, b = w_k, epilogue = dswiglu, with_router_weight = true, "
       "problem = varlen_m, stages = 3, dact_unroll = 8",
       "moe_gemm_dact_gather_nods_s3_u8"},
      {"a = gather, b = w_mn, epilogue = store_bf16, problem = varlen_m",
       "moe_gemm_gather_mn_bf16"},
  };
  for (auto [text, name] : variants) {
    auto attr = dyn_cast_or_null<GemmConfigAttr>(
        parseAttribute("#moe_gpu.gemm<" + std::string(text) + ">", &context));
    ASSERT_TRUE(attr) << text;
    EXPECT_EQ(attr.kernelName(), name);
  }
}

TEST_F(MoEGPUConfigTest, DefaultsOfEachKind) {
  GemmConfigAttr upGather = defaultConfig("moe_gemm_up_gather");
  EXPECT_EQ(upGather.getStages(), 3);
  EXPECT_TRUE(upGather.getWarpSpecialized());
  EXPECT_EQ(upGather.getStore(), StorePath::Threads);
  GemmConfigAttr down = defaultConfig("moe_gemm_rows_mn_bf16");
  EXPECT_EQ(down.getStore(), StorePath::TmaBoxes);
  GemmConfigAttr logits = defaultConfig("moe_gemm_rows_mn_f32");
  EXPECT_EQ(logits.getStages(), 4);
  EXPECT_FALSE(logits.getWarpSpecialized());
  EXPECT_EQ(logits.getStore(), StorePath::Ring);
  GemmConfigAttr wgrad = defaultConfig("moe_gemm_wgrad_gather");
  EXPECT_TRUE(wgrad.getRowsTma());
  EXPECT_EQ(wgrad.getStore(), StorePath::TmaBoxes);
  GemmConfigAttr wgradRows = defaultConfig("moe_gemm_wgrad_rows");
  EXPECT_FALSE(wgradRows.getRowsTma());
  EXPECT_EQ(wgradRows.getStore(), StorePath::BulkRows);
}

struct Variant {
  const char *params;
  const char *kernel;
  std::function<void(GemmConfig &)> change;
  const char *name;
  int64_t launchSmem;
  int64_t threads;
};

// Launch shared memory, threads and the name of configs off the defaults.
TEST_F(MoEGPUConfigTest, Variants) {
  auto noWs = [](GemmConfig &c) { c.warpSpecialized = false; };
  auto stages2 = [](GemmConfig &c) { c.stages = 2; };
  auto threadStore = [](GemmConfig &c) { c.store = StorePath::Threads; };
  auto bulkStore = [](GemmConfig &c) { c.store = StorePath::BulkRows; };
  auto dynamic = [](GemmConfig &c) { c.schedule = TileSchedule::Dynamic; };
  const Variant variants[] = {
      {"warp_specialized = false", "moe_gemm_up_gather", noWs,
       "moe_gemm_up_gather_nows", 169048, 256},
      {"warp_specialized = false", "moe_gemm_rows_mn_bf16", noWs,
       "moe_gemm_rows_mn_bf16_nows", 169048, 256},
      {"warp_specialized = false", "moe_gemm_wgrad_gather", noWs,
       "moe_gemm_wgrad_gather_nows", 164864, 256},
      {"warp_specialized = false", "moe_gemm_wgrad_rows", noWs,
       "moe_gemm_wgrad_rows_nows", 164864, 256},
      {"warp_specialized = false", "moe_gemm_up_rows", noWs,
       "moe_gemm_up_rows_nows", 169048, 256},
      {"stages = 2", "moe_gemm_up_gather", stages2, "moe_gemm_up_gather_s2",
       169056, 384},
      {"stages = 2", "moe_gemm_rows_mn_bf16", stages2,
       "moe_gemm_rows_mn_bf16_s2", 171104, 384},
      {"stages = 2", "moe_gemm_wgrad_gather", stages2,
       "moe_gemm_wgrad_gather_s2", 164896, 384},
      {"stages = 2", "moe_gemm_wgrad_rows", stages2, "moe_gemm_wgrad_rows_s2",
       166944, 384},
      {"store = threads", "moe_gemm_rows_mn_bf16", threadStore,
       "moe_gemm_rows_mn_bf16_storethreads", 218224, 384},
      {"store = threads", "moe_gemm_wgrad_gather", threadStore,
       "moe_gemm_wgrad_gather_storethreads", 214064, 384},
      {"store = threads", "moe_gemm_wgrad_rows", threadStore,
       "moe_gemm_wgrad_rows_storethreads", 214064, 384},
      {"store = bulk_rows", "moe_gemm_rows_k_bf16", bulkStore,
       "moe_gemm_rows_k_bf16_storebulk", 220272, 384},
      {"store = bulk_rows", "moe_gemm_wgrad_gather_a", bulkStore,
       "moe_gemm_wgrad_gather_a_storebulk", 216112, 384},
      {"schedule = dynamic", "moe_gemm_up_gather", dynamic,
       "moe_gemm_up_gather_dyn", 218272, 384},
      {"schedule = dynamic", "moe_gemm_rows_mn_bf16", dynamic,
       "moe_gemm_rows_mn_bf16_dyn", 220320, 384},
      {"schedule = dynamic, idle_skip = false", "moe_gemm_rows_k_bf16",
       [](GemmConfig &c) {
         c.schedule = TileSchedule::Dynamic;
         c.idleSkip = false;
       },
       "moe_gemm_rows_k_bf16_dyn_noskip", 220320, 384},
      {"rows_tma = false", "moe_gemm_wgrad_gather",
       [](GemmConfig &c) { c.rowsTma = false; },
       "moe_gemm_wgrad_gather_norowstma", 214064, 384},
  };
  for (const Variant &v : variants) {
    GemmConfig config = kind(defaultConfig(v.kernel));
    v.change(config);
    SCOPED_TRACE(std::string(v.params) + ": " + v.kernel);
    ASSERT_EQ(verifierError(config), "");
    auto attr = GemmConfigAttr::get(&context, config);
    EXPECT_EQ(attr.kernelName(), v.name);
    EXPECT_EQ(attr.launchSharedMemoryBytes(), v.launchSmem);
    EXPECT_EQ(attr.threads(), v.threads);
  }
}

// stages = 4: the up projection's ring and staging need more shared memory
// than a CTA gets.
TEST_F(MoEGPUConfigTest, SharedMemoryLimit) {
  GemmConfig config = kind(defaultConfig("moe_gemm_up_gather"));
  config.stages = 4;
  EXPECT_EQ(gemmLaunchSharedMemoryBytes(config), 267392);
  EXPECT_EQ(verifierError(config),
            "needs 267392 bytes of shared memory, over the 232448 (227 KiB) "
            "a CTA gets on sm_90a");
}

TEST_F(MoEGPUConfigTest, RegisterSplit) {
  GemmConfig config = kind(defaultConfig("moe_gemm_rows_mn_bf16"));
  EXPECT_EQ(gemmLaunchRegisters(config), 168);
  // (P, C) splits the kernels can run, and some they cannot.
  const std::pair<int64_t, int64_t> accepted[] = {
      {72, 216}, {80, 208}, {56, 224}, {168, 168}, {24, 232}};
  const std::pair<int64_t, int64_t> refused[] = {
      {70, 216}, {72, 264}, {176, 216}, {72, 160}, {64, 232}, {16, 168}};
  for (auto [p, q] : accepted) {
    config.producerRegisters = p;
    config.consumerRegisters = q;
    EXPECT_EQ(verifierError(config), "") << p << "," << q;
  }
  for (auto [p, q] : refused) {
    config.producerRegisters = p;
    config.consumerRegisters = q;
    EXPECT_NE(verifierError(config), "") << p << "," << q;
  }
}

/// Every combination of what a kernel computes, and of build parameters
/// changed one or two at a time.
static std::vector<GemmConfig> candidateConfigs() {
  std::vector<GemmConfig> kinds;
  for (auto a : {AOperand::Gather, AOperand::Rows, AOperand::Mn})
    for (auto b :
         {BOperand::WMn, BOperand::WMnSwiglu, BOperand::WK, BOperand::RowsMn})
      for (auto gathered :
           {GatheredOperand::None, GatheredOperand::A, GatheredOperand::B})
        for (auto epilogue : {GemmEpilogue::StoreBf16, GemmEpilogue::StoreBf16W,
                              GemmEpilogue::StoreF32, GemmEpilogue::Swiglu,
                              GemmEpilogue::Dswiglu})
          for (auto problem : {GemmProblem::VarlenM, GemmProblem::VarlenK})
            for (unsigned flags = 0; flags < 16; ++flags) {
              GemmConfig c;
              c.a = a;
              c.b = b;
              c.gathered = gathered;
              c.epilogue = epilogue;
              c.problem = problem;
              c.storeA = flags & 1;
              c.withRouterWeight = flags & 2;
              c.withDs = flags & 4;
              c.accumulate = flags & 8;
              kinds.push_back(c);
            }

  using Change = std::function<void(GemmConfig &)>;
  std::vector<Change> changes = {
      [](GemmConfig &) {},
      [](GemmConfig &c) { c.stages = 2; },
      [](GemmConfig &c) { c.stages = 3; },
      [](GemmConfig &c) { c.stages = 4; },
      [](GemmConfig &c) { c.warpSpecialized = false; },
      [](GemmConfig &c) { c.warpSpecialized = true; },
      [](GemmConfig &c) {
        c.producerRegisters = 80;
        c.consumerRegisters = 208;
      },
      [](GemmConfig &c) {
        c.producerRegisters = 56;
        c.consumerRegisters = 224;
      },
      [](GemmConfig &c) { c.schedule = TileSchedule::Dynamic; },
      [](GemmConfig &c) { c.idleSkip = false; },
      [](GemmConfig &c) { c.groupM = 8; },
      [](GemmConfig &c) { c.groupM = 32; },
      [](GemmConfig &c) { c.rowsTma = false; },
      [](GemmConfig &c) { c.rowsTma = true; },
      [](GemmConfig &c) { c.store = StorePath::Ring; },
      [](GemmConfig &c) { c.store = StorePath::Threads; },
      [](GemmConfig &c) { c.store = StorePath::BulkRows; },
      [](GemmConfig &c) { c.store = StorePath::TmaBoxes; },
      [](GemmConfig &c) { c.dactUnroll = 1; },
      [](GemmConfig &c) { c.dactUnroll = 8; },
      [](GemmConfig &c) { c.bias = true; },
  };
  std::vector<GemmConfig> out;
  for (const GemmConfig &k : kinds)
    for (size_t i = 0; i < changes.size(); ++i)
      for (size_t j = i; j < changes.size(); ++j) {
        GemmConfig c = k;
        changes[i](c);
        changes[j](c);
        out.push_back(c);
      }
  return out;
}

TEST_F(MoEGPUConfigTest, DistinctConfigsHaveDistinctNames) {
  llvm::StringMap<GemmConfig> byName;
  size_t valid = 0;
  for (const GemmConfig &candidate : candidateConfigs()) {
    if (!verifierError(candidate).empty())
      continue;
    ++valid;
    GemmConfig config = candidate.resolved();
    std::string name = gemmKernelName(config);
    // Symbol-safe: [a-z0-9_].
    EXPECT_TRUE(llvm::all_of(name, [](char ch) {
      return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_';
    })) << name;
    auto [it, inserted] = byName.try_emplace(name, config);
    if (!inserted)
      EXPECT_TRUE(it->second == config) << "two configs named " << name;
  }
  // Every default kernel is among them, and many variants of each.
  for (const Golden &golden : kDefaultLibrary)
    EXPECT_TRUE(byName.count(golden.name)) << golden.name;
  EXPECT_GT(byName.size(), 700u);
  EXPECT_GE(valid, byName.size());
  RecordProperty("valid_configs", static_cast<int>(valid));
  RecordProperty("distinct_names", static_cast<int>(byName.size()));
}

TEST_F(MoEGPUConfigTest, PrintedFormParsesBack) {
  size_t checked = 0;
  for (const GemmConfig &candidate : candidateConfigs()) {
    if (!verifierError(candidate).empty())
      continue;
    auto attr = GemmConfigAttr::get(&context, candidate);
    std::string text = print(attr);
    Attribute parsed = parseAttribute(text, &context);
    ASSERT_TRUE(parsed) << text;
    EXPECT_EQ(parsed, attr) << text;
    EXPECT_EQ(print(parsed), text);
    ++checked;
  }
  EXPECT_GT(checked, 1000u);
}

TEST_F(MoEGPUConfigTest, ParseErrors) {
  ScopedDiagnosticHandler handler(&context,
                                  [](Diagnostic &) { return success(); });
  for (const char *text : {
           "#moe_gpu.gemm<b = w_mn, epilogue = store_bf16, problem = "
           "varlen_m>",
           "#moe_gpu.gemm<a = rows, a = rows, b = w_mn, epilogue = "
           "store_bf16, problem = varlen_m>",
           "#moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, "
           "problem = varlen_m, stage = 3>",
           "#moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, "
           "problem = varlen_m, tile = [128, 256]>",
           "#moe_gpu.gemm<a = rows, b = w_mn, epilogue = store_bf16, "
           "problem = varlen_m, pdl = 1>",
           "#moe_gpu.gemm<a = rows, b = w_mn, epilogue = bf16, "
           "problem = varlen_m>",
       })
    EXPECT_FALSE(parseAttribute(text, &context)) << text;
}

} // namespace
