//===- HopperDescriptorsTest.cpp - wgmma descriptors and 128B swizzle ---===//

#include "moe/Conversion/MoEToGPU/HopperDescriptors.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Matchers.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Transforms/GreedyPatternRewriteDriver.h"
#include "llvm/Support/raw_ostream.h"

#include "gtest/gtest.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

using namespace mlir;
using namespace mlir::moe::hopper;

namespace {

//===----------------------------------------------------------------------===//
// Descriptors
//===----------------------------------------------------------------------===//

TEST(WgmmaDescriptor, GoldenConstantsFromFields) {
  // The kernels' two: 128B swizzle, SBO 1024 B, LBO 16 KiB / 8 KiB.
  EXPECT_EQ(wgmmaDescriptorConstant(Swizzle::Bytes128, 16 * 1024, 1024),
            std::optional<uint64_t>(0x4000004004000000));
  EXPECT_EQ(wgmmaDescriptorConstant(Swizzle::Bytes128, 8 * 1024, 1024),
            std::optional<uint64_t>(0x4000004002000000));
  EXPECT_EQ(wgmmaTileDescriptorConstant(OperandMajor::KMajor),
            kDescriptorKMajor);
  EXPECT_EQ(wgmmaTileDescriptorConstant(OperandMajor::MNMajor),
            kDescriptorMNMajor);
  EXPECT_EQ(kDescriptorKMajor, 0x4000004004000000u);
  EXPECT_EQ(kDescriptorMNMajor, 0x4000004002000000u);
}

TEST(WgmmaDescriptor, FieldPositions) {
  // LBO at bit 16, SBO at bit 32, both in 16-byte units; swizzle at bit 62.
  EXPECT_EQ(wgmmaDescriptorConstant(Swizzle::None, 16, 0),
            std::optional<uint64_t>(uint64_t{1} << 16));
  EXPECT_EQ(wgmmaDescriptorConstant(Swizzle::None, 0, 16),
            std::optional<uint64_t>(uint64_t{1} << 32));
  EXPECT_EQ(wgmmaDescriptorConstant(Swizzle::Bytes128, 0, 0),
            std::optional<uint64_t>(uint64_t{1} << 62));
  EXPECT_EQ(wgmmaDescriptorConstant(Swizzle::Bytes64, 0, 0),
            std::optional<uint64_t>(uint64_t{2} << 62));
  EXPECT_EQ(wgmmaDescriptorConstant(Swizzle::Bytes32, 0, 0),
            std::optional<uint64_t>(uint64_t{3} << 62));
  // The largest offsets fill bits 16-29 and 32-45 and nothing else.
  EXPECT_EQ(wgmmaDescriptorConstant(Swizzle::None, 0x3FFF0, 0x3FFF0),
            std::optional<uint64_t>(0x00003FFF3FFF0000));
}

TEST(WgmmaDescriptor, RejectsBadOffsets) {
  std::string error;
  EXPECT_FALSE(wgmmaDescriptorConstant(Swizzle::Bytes128, 8, 1024, &error));
  EXPECT_EQ(error, "leading byte offset 8 is not a multiple of 16 bytes");
  EXPECT_FALSE(wgmmaDescriptorConstant(Swizzle::Bytes128, 1024, 1000, &error));
  EXPECT_EQ(error, "stride byte offset 1000 is not a multiple of 16 bytes");
  EXPECT_FALSE(
      wgmmaDescriptorConstant(Swizzle::Bytes128, 1 << 18, 1024, &error));
  EXPECT_EQ(error, "leading byte offset 262144 does not fit the descriptor's "
                   "14-bit field (at most 262128 bytes)");
  EXPECT_FALSE(
      wgmmaDescriptorConstant(Swizzle::Bytes128, 1024, uint64_t{1} << 40));
  // The error is optional.
  EXPECT_FALSE(wgmmaDescriptorConstant(Swizzle::None, 17, 0));
  EXPECT_TRUE(wgmmaDescriptorConstant(Swizzle::None, 262128, 262128));
}

TEST(WgmmaDescriptor, AddressField) {
  constexpr uint64_t k = kDescriptorKMajor;
  EXPECT_EQ(wgmmaDescriptor(0, k), k);
  EXPECT_EQ(wgmmaDescriptor(0x400, k), k | 0x40);
  EXPECT_EQ(wgmmaDescriptor(0x3FFF0, kDescriptorMNMajor),
            kDescriptorMNMajor | 0x3FFF);
  // The low 4 bits are below the field's unit.
  EXPECT_EQ(wgmmaDescriptor(0x1238, k), k | 0x123);
  // Bits 18 and above are masked: they would run into the reserved bits 14-15
  // and the LBO field.
  EXPECT_EQ(wgmmaDescriptor(0x40000, k), k);
  EXPECT_EQ(wgmmaDescriptor(0x7'0001'2340, k), k | 0x1234);
  EXPECT_EQ(wgmmaDescriptor(~uint64_t{0}, 0), 0x3FFFu);
}

//===----------------------------------------------------------------------===//
// 128B swizzle
//===----------------------------------------------------------------------===//

TEST(Swizzle128B, PermutationWithinEachAtom) {
  for (uint64_t atom = 0; atom < 4; ++atom) {
    for (uint64_t r = 0; r < kSwizzleRows; ++r) {
      uint64_t row = atom * kSwizzleRows + r;
      std::set<uint64_t> chunks;
      for (uint64_t chunk = 0; chunk < 8; ++chunk)
        chunks.insert(swizzle128BChunk(row, chunk));
      EXPECT_EQ(chunks, (std::set<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7}))
          << "row " << row;
    }
    // A column of the atom (one chunk, 8 rows) lands in 8 different chunks:
    // why the swizzle avoids bank conflicts.
    for (uint64_t chunk = 0; chunk < 8; ++chunk) {
      std::set<uint64_t> chunks;
      for (uint64_t r = 0; r < kSwizzleRows; ++r)
        chunks.insert(swizzle128BChunk(atom * kSwizzleRows + r, chunk));
      EXPECT_EQ(chunks.size(), 8u) << "chunk " << chunk;
    }
  }
  // The pattern repeats every 8 rows; chunk bits above 3 pass through (the
  // SwiGLU epilogue's up half, chunk q + 8).
  EXPECT_EQ(swizzle128BChunk(13, 2), swizzle128BChunk(5, 2));
  EXPECT_EQ(swizzle128BChunk(3, 9), 10u);
}

TEST(Swizzle128B, ElementOffsets) {
  EXPECT_EQ(kMajorElementOffset(0, 0), 0u);
  EXPECT_EQ(kMajorElementOffset(1, 0), 72u);      // 64 + (0 ^ 1) * 8
  EXPECT_EQ(kMajorElementOffset(3, 5), 240u);     // 192 + (5 ^ 3) * 8
  EXPECT_EQ(kMajorElementOffset(10, 7), 680u);    // 640 + (7 ^ 2) * 8
  EXPECT_EQ(kMajorElementOffset(255, 7), 16320u); // 16320 + (7 ^ 7) * 8
  EXPECT_EQ(mnMajorElementOffset(0, 0, 0), 0u);
  EXPECT_EQ(mnMajorElementOffset(1, 0, 0), 4096u);
  EXPECT_EQ(mnMajorElementOffset(2, 9, 4), 8808u);   // 8192 + 576 + 5 * 8
  EXPECT_EQ(mnMajorElementOffset(3, 63, 7), 16320u); // 12288 + 4032 + 0
}

TEST(Swizzle128B, TilesAreFilledExactlyOnce) {
  // A K-major A tile (128 rows) and an MN-major B tile (4 boxes of 64 K-rows):
  // every 8-element slot of the tile is written by exactly one chunk.
  std::vector<int> kMajor(128 * 8, 0);
  for (uint64_t row = 0; row < 128; ++row)
    for (uint64_t chunk = 0; chunk < 8; ++chunk)
      ++kMajor[kMajorElementOffset(row, chunk) / kChunkElements];
  EXPECT_EQ(std::count(kMajor.begin(), kMajor.end(), 1), 128 * 8);

  std::vector<int> mnMajor(4 * kBoxElements / kChunkElements, 0);
  for (uint64_t box = 0; box < 4; ++box)
    for (uint64_t row = 0; row < 64; ++row)
      for (uint64_t chunk = 0; chunk < 8; ++chunk)
        ++mnMajor[mnMajorElementOffset(box, row, chunk) / kChunkElements];
  EXPECT_EQ(std::count(mnMajor.begin(), mnMajor.end(), 1),
            static_cast<long>(mnMajor.size()));
}

//===----------------------------------------------------------------------===//
// IR builders
//===----------------------------------------------------------------------===//

class HopperIRTest : public ::testing::Test {
protected:
  HopperIRTest() : builder(&context), loc(UnknownLoc::get(&context)) {
    context.loadDialect<arith::ArithDialect, func::FuncDialect>();
    module = ModuleOp::create(loc);
  }

  /// A function @name(argTypes) -> resultType whose body is being built.
  func::FuncOp beginFunc(StringRef name, TypeRange argTypes, Type resultType) {
    builder.setInsertionPointToEnd(module->getBody());
    auto func = func::FuncOp::create(
        builder, loc, name, builder.getFunctionType(argTypes, resultType));
    Block *entry = func.addEntryBlock();
    builder.setInsertionPointToEnd(entry);
    return func;
  }

  static std::string print(Operation *op) {
    std::string text;
    llvm::raw_string_ostream os(text);
    op->print(os);
    return text;
  }

  static std::vector<std::string> opNames(func::FuncOp func) {
    std::vector<std::string> names;
    for (Operation &op : func.getBody().front())
      names.push_back(op.getName().getStringRef().str());
    return names;
  }

  /// The constant `func` returns after folding, or nullopt.
  static std::optional<uint64_t> foldedResult(func::FuncOp func) {
    if (failed(applyPatternsGreedily(func, FrozenRewritePatternSet())))
      return std::nullopt;
    auto ret = cast<func::ReturnOp>(func.getBody().front().getTerminator());
    APInt value;
    if (!matchPattern(ret.getOperand(0), m_ConstantInt(&value)))
      return std::nullopt;
    return value.getZExtValue();
  }

  MLIRContext context;
  OpBuilder builder;
  Location loc;
  OwningOpRef<ModuleOp> module;
};

TEST_F(HopperIRTest, DescriptorEmitsTheKernelsOps) {
  func::FuncOp func =
      beginFunc("desc", {builder.getI64Type()}, builder.getI64Type());
  ConstantCache constants(func.getBody().front(), loc);
  Value desc = buildWgmmaDescriptor(builder, loc, func.getArgument(0),
                                    kDescriptorKMajor, constants);
  func::ReturnOp::create(builder, loc, desc);
  ASSERT_TRUE(succeeded(verify(func)));
  // The kernels' descriptor: constants at the top in request order, then
  // andi, shrui, ori.
  EXPECT_EQ(print(func),
            "func.func @desc(%arg0: i64) -> i64 {\n"
            "  %c262143_i64 = arith.constant 262143 : i64\n"
            "  %c4_i64 = arith.constant 4 : i64\n"
            "  %c4611686293372403712_i64 = arith.constant 4611686293372403712 "
            ": i64\n"
            "  %0 = arith.andi %arg0, %c262143_i64 : i64\n"
            "  %1 = arith.shrui %0, %c4_i64 : i64\n"
            "  %2 = arith.ori %1, %c4611686293372403712_i64 : i64\n"
            "  return %2 : i64\n"
            "}");
}

TEST_F(HopperIRTest, DescriptorConstantsAreCachedPerFunction) {
  Type i64 = builder.getI64Type();
  func::FuncOp func = beginFunc("descs", {i64, i64}, i64);
  ConstantCache constants(func.getBody().front(), loc);
  // A constant requested before (by the kernel's own code) is reused, and
  // keeps its place.
  Value four = constants(4, i64);
  Value a = buildWgmmaDescriptor(builder, loc, func.getArgument(0),
                                 kDescriptorKMajor, constants);
  Value b = buildWgmmaDescriptor(builder, loc, func.getArgument(1),
                                 kDescriptorMNMajor, constants);
  func::ReturnOp::create(builder, loc,
                         arith::AddIOp::create(builder, loc, a, b).getResult());
  ASSERT_TRUE(succeeded(verify(func)));
  EXPECT_EQ(opNames(func),
            (std::vector<std::string>{"arith.constant", "arith.constant",
                                      "arith.constant", "arith.constant",
                                      "arith.andi", "arith.shrui", "arith.ori",
                                      "arith.andi", "arith.shrui", "arith.ori",
                                      "arith.addi", "func.return"}));
  std::vector<int64_t> values;
  for (auto constant : func.getBody().getOps<arith::ConstantIntOp>())
    values.push_back(constant.value());
  EXPECT_EQ(values, (std::vector<int64_t>{4, 0x3FFFF, 0x4000004004000000,
                                          0x4000004002000000}));
  auto shrui =
      cast<arith::ShRUIOp>(a.getDefiningOp()->getOperand(0).getDefiningOp());
  EXPECT_EQ(shrui.getRhs(), four);
}

TEST_F(HopperIRTest, DescriptorFoldsToValue) {
  for (uint64_t address : {uint64_t{0}, uint64_t{0x12340},
                           uint64_t{0x7'0001'2348}, uint64_t{0x3FFFF}}) {
    Type i64 = builder.getI64Type();
    func::FuncOp func = beginFunc("fold", {}, i64);
    ConstantCache constants(func.getBody().front(), loc);
    Value addr = arith::ConstantIntOp::create(
        builder, loc, static_cast<int64_t>(address), 64);
    Value desc =
        buildWgmmaDescriptor(builder, loc, addr, kDescriptorMNMajor, constants);
    func::ReturnOp::create(builder, loc, desc);
    EXPECT_EQ(foldedResult(func), std::optional<uint64_t>(wgmmaDescriptor(
                                      address, kDescriptorMNMajor)))
        << "address " << address;
    func.erase();
  }
}

TEST_F(HopperIRTest, KMajorOffsetEmitsTheKernelsOps) {
  Type index = builder.getIndexType();
  func::FuncOp func = beginFunc("k_soff", {index, index}, index);
  ConstantCache constants(func.getBody().front(), loc);
  Value off = buildKMajorElementOffset(builder, loc, func.getArgument(0),
                                       func.getArgument(1), constants);
  func::ReturnOp::create(builder, loc, off);
  ASSERT_TRUE(succeeded(verify(func)));
  // kswz = xor(chunk, rem(row, 8)); add(mul(row, 64), mul(kswz, 8)).
  EXPECT_EQ(print(func),
            "func.func @k_soff(%arg0: index, %arg1: index) -> index {\n"
            "  %c8 = arith.constant 8 : index\n"
            "  %c64 = arith.constant 64 : index\n"
            "  %0 = arith.remui %arg0, %c8 : index\n"
            "  %1 = arith.xori %arg1, %0 : index\n"
            "  %2 = arith.muli %arg0, %c64 : index\n"
            "  %3 = arith.muli %1, %c8 : index\n"
            "  %4 = arith.addi %2, %3 : index\n"
            "  return %4 : index\n"
            "}");
}

TEST_F(HopperIRTest, MNMajorOffsetOrders) {
  Type index = builder.getIndexType();
  auto build = [&](StringRef name, SwizzleOrder order) {
    func::FuncOp func = beginFunc(name, {index, index, index}, index);
    ConstantCache constants(func.getBody().front(), loc);
    Value off = buildMNMajorElementOffset(
        builder, loc, func.getArgument(0), func.getArgument(1),
        func.getArgument(2), order, constants);
    func::ReturnOp::create(builder, loc, off);
    EXPECT_TRUE(succeeded(verify(func)));
    return func;
  };
  // m_soff: swz = xor(chunk, rem(row, 8));
  // add(add(mul(box, 4096), mul(row, 64)), mul(swz, 8)).
  EXPECT_EQ(print(build("m_soff", SwizzleOrder::First)),
            "func.func @m_soff(%arg0: index, %arg1: index, %arg2: index) -> "
            "index {\n"
            "  %c8 = arith.constant 8 : index\n"
            "  %c4096 = arith.constant 4096 : index\n"
            "  %c64 = arith.constant 64 : index\n"
            "  %0 = arith.remui %arg1, %c8 : index\n"
            "  %1 = arith.xori %arg2, %0 : index\n"
            "  %2 = arith.muli %arg0, %c4096 : index\n"
            "  %3 = arith.muli %arg1, %c64 : index\n"
            "  %4 = arith.addi %2, %3 : index\n"
            "  %5 = arith.muli %1, %c8 : index\n"
            "  %6 = arith.addi %4, %5 : index\n"
            "  return %6 : index\n"
            "}");
  // a_soff_mn: add(add(mul(box, 4096), mul(row, 64)),
  //                mul(xor(chunk, rem(row, 8)), 8)).
  EXPECT_EQ(print(build("a_soff_mn", SwizzleOrder::Last)),
            "func.func @a_soff_mn(%arg0: index, %arg1: index, %arg2: index) "
            "-> index {\n"
            "  %c4096 = arith.constant 4096 : index\n"
            "  %c64 = arith.constant 64 : index\n"
            "  %c8 = arith.constant 8 : index\n"
            "  %0 = arith.muli %arg0, %c4096 : index\n"
            "  %1 = arith.muli %arg1, %c64 : index\n"
            "  %2 = arith.addi %0, %1 : index\n"
            "  %3 = arith.remui %arg1, %c8 : index\n"
            "  %4 = arith.xori %arg2, %3 : index\n"
            "  %5 = arith.muli %4, %c8 : index\n"
            "  %6 = arith.addi %2, %5 : index\n"
            "  return %6 : index\n"
            "}");
}

TEST_F(HopperIRTest, OffsetsFoldToValues) {
  Type index = builder.getIndexType();
  struct Case {
    uint64_t box, row, chunk;
  };
  for (Case c : {Case{0, 0, 0}, Case{0, 3, 5}, Case{2, 9, 4}, Case{3, 63, 7}}) {
    for (SwizzleOrder order : {SwizzleOrder::First, SwizzleOrder::Last}) {
      func::FuncOp func = beginFunc("mn", {}, index);
      ConstantCache constants(func.getBody().front(), loc);
      auto value = [&](uint64_t v) -> Value {
        return arith::ConstantIndexOp::create(builder, loc,
                                              static_cast<int64_t>(v));
      };
      Value box = value(c.box), row = value(c.row), chunk = value(c.chunk);
      func::ReturnOp::create(builder, loc,
                             buildMNMajorElementOffset(builder, loc, box, row,
                                                       chunk, order,
                                                       constants));
      EXPECT_EQ(
          foldedResult(func),
          std::optional<uint64_t>(mnMajorElementOffset(c.box, c.row, c.chunk)));
      func.erase();
    }
    func::FuncOp func = beginFunc("k", {}, index);
    ConstantCache constants(func.getBody().front(), loc);
    Value row = arith::ConstantIndexOp::create(builder, loc, c.row);
    Value chunk = arith::ConstantIndexOp::create(builder, loc, c.chunk);
    func::ReturnOp::create(
        builder, loc,
        buildKMajorElementOffset(builder, loc, row, chunk, constants));
    EXPECT_EQ(foldedResult(func),
              std::optional<uint64_t>(kMajorElementOffset(c.row, c.chunk)));
    func.erase();
  }
}

} // namespace
