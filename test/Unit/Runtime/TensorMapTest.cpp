//===- TensorMapTest.cpp - CUDA 13 rules of cuTensorMapEncodeTiled -*- C++
//-*-===//
//
// moeTensorMapValidate without a driver: valid descriptors (the 128x64 bf16
// 128B-swizzle box of our GEMM tiles among them) and one failing case per
// rule, each naming the rule.
//
//===----------------------------------------------------------------------===//

#include "RuntimeTestUtils.h"

#include <cuda.h>

#include <cstring>
#include <set>
#include <string>

using namespace moe::runtime::test;

namespace {

// A descriptor that passes, changed field by field in the tests.
struct Descriptor {
  moeTensorMap map;
  const void *mapPointer = nullptr;
  uint32_t dataType = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  uint32_t rank = 2;
  const void *address = nullptr;
  uint64_t dims[5] = {4096, 8192, 1, 1, 1};  // K = 4096 bf16, 8192 rows
  uint64_t strides[4] = {4096 * 2, 0, 0, 0}; // bytes
  uint32_t box[5] = {64, 128, 1, 1, 1};      // 64 bf16 = 128 B
  uint32_t elementStrides[5] = {1, 1, 1, 1, 1};
  const uint32_t *elementStridesPointer = elementStrides;
  uint32_t interleave = CU_TENSOR_MAP_INTERLEAVE_NONE;
  uint32_t swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  uint32_t l2Promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  uint32_t oobFill = CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE;

  Descriptor() {
    mapPointer = &map;
    address = reinterpret_cast<const void *>(uintptr_t(0x7f0000000000));
  }

  moeStatus validate(moeTensorMapRule *rule) const {
    return moeTensorMapValidate(mapPointer, dataType, rank, address, dims,
                                strides, box, elementStridesPointer, interleave,
                                swizzle, l2Promotion, oobFill, rule);
  }
};

// Expects `d` to fail with `rule` and the matching status, and the message
// to name the rule.
void expectRule(const Descriptor &d, moeTensorMapRule rule, const char *what) {
  moeTensorMapRule failed = MOE_TMA_RULE_OK;
  moeStatus status = d.validate(&failed);
  moeStatus expected = rule == MOE_TMA_RULE_MAP_ALIGNMENT ||
                               rule == MOE_TMA_RULE_ADDRESS_ALIGNMENT ||
                               rule == MOE_TMA_RULE_STRIDE_MULTIPLE
                           ? MOE_ERROR_MISALIGNED
                           : MOE_ERROR_INVALID_ARGUMENT;
  EXPECT_EQ(status, expected) << what << ": " << moeGetLastErrorMessage();
  EXPECT_EQ(failed, rule) << what << ": got " << moeTensorMapRuleString(failed)
                          << " (" << moeGetLastErrorMessage() << ")";
  EXPECT_NE(lastMessage().find(moeTensorMapRuleString(rule)), std::string::npos)
      << what << ": " << lastMessage();
}

void expectValid(const Descriptor &d, const char *what) {
  moeTensorMapRule failed = MOE_TMA_RULE_NULL_POINTER;
  EXPECT_EQ(d.validate(&failed), MOE_SUCCESS)
      << what << ": " << moeGetLastErrorMessage();
  EXPECT_EQ(failed, MOE_TMA_RULE_OK) << what;
}

TEST(RuntimeTensorMap, ValidDescriptors) {
  Descriptor gemmTile; // 128 rows x 64 bf16, 128B swizzle
  expectValid(gemmTile, "128x64 bf16 128B swizzle");

  Descriptor noSwizzle;
  noSwizzle.swizzle = CU_TENSOR_MAP_SWIZZLE_NONE;
  noSwizzle.box[0] = 256; // 512 B inner box: fine without swizzle
  expectValid(noSwizzle, "256-wide box without swizzle");

  Descriptor rank1;
  rank1.rank = 1;
  rank1.dims[0] = uint64_t(1) << 32;
  rank1.box[0] = 8;
  rank1.swizzle = CU_TENSOR_MAP_SWIZZLE_NONE;
  expectValid(rank1, "rank 1 of 2^32 elements");

  Descriptor rank5;
  rank5.rank = 5;
  for (int i = 0; i < 5; ++i)
    rank5.dims[i] = 16;
  rank5.dataType = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  rank5.box[0] = 16;
  rank5.swizzle = CU_TENSOR_MAP_SWIZZLE_64B; // 16 x 4 B = 64 B
  for (int i = 0; i < 4; ++i)
    rank5.strides[i] = uint64_t(64) << (4 * i);
  rank5.elementStrides[4] = 8;
  expectValid(rank5, "rank 5 fp32 64B swizzle");

  Descriptor fp8;
  fp8.dataType = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  fp8.box[0] = 128; // 128 B
  expectValid(fp8, "uint8 128-wide 128B swizzle");

  Descriptor nullElementStrides;
  nullElementStrides.elementStridesPointer = nullptr;
  expectValid(nullElementStrides, "null elementStrides (all 1)");

  Descriptor interleaved;
  interleaved.rank = 3;
  interleaved.dataType = CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  interleaved.interleave = CU_TENSOR_MAP_INTERLEAVE_32B;
  interleaved.swizzle = CU_TENSOR_MAP_SWIZZLE_32B;
  interleaved.strides[0] = 4096 * 2;
  interleaved.strides[1] = 4096 * 2 * 8192;
  interleaved.box[2] = 1;
  interleaved.box[0] = 16;
  expectValid(interleaved, "rank 3 with 32B interleave");

  Descriptor nanFill;
  nanFill.oobFill = CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA;
  expectValid(nanFill, "NaN fill on bf16");

  // The largest stride below 2^40 that is a multiple of 16.
  Descriptor largeStride;
  largeStride.strides[0] = (uint64_t(1) << 40) - 16;
  expectValid(largeStride, "stride 2^40 - 16");
}

TEST(RuntimeTensorMap, NullPointers) {
  Descriptor d;
  d.mapPointer = nullptr;
  expectRule(d, MOE_TMA_RULE_NULL_POINTER, "null map");
  d = Descriptor();
  d.address = nullptr;
  expectRule(d, MOE_TMA_RULE_NULL_POINTER, "null address");
  moeTensorMapRule rule = MOE_TMA_RULE_OK;
  Descriptor valid;
  EXPECT_EQ(moeTensorMapValidate(&valid.map, valid.dataType, 2, valid.address,
                                 nullptr, valid.strides, valid.box, nullptr, 0,
                                 0, 0, 0, &rule),
            MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(rule, MOE_TMA_RULE_NULL_POINTER);
  EXPECT_EQ(moeTensorMapValidate(&valid.map, valid.dataType, 2, valid.address,
                                 valid.dims, nullptr, valid.box, nullptr, 0, 0,
                                 0, 0, &rule),
            MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(rule, MOE_TMA_RULE_NULL_POINTER);
  EXPECT_NE(lastMessage().find("globalStrides is null"), std::string::npos);
  EXPECT_EQ(moeTensorMapValidate(&valid.map, valid.dataType, 2, valid.address,
                                 valid.dims, valid.strides, nullptr, nullptr, 0,
                                 0, 0, 0, &rule),
            MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(rule, MOE_TMA_RULE_NULL_POINTER);
}

TEST(RuntimeTensorMap, MapAlignment) {
  Descriptor d;
  d.mapPointer = reinterpret_cast<const char *>(&d.map) + 16;
  expectRule(d, MOE_TMA_RULE_MAP_ALIGNMENT, "map at +16");
}

TEST(RuntimeTensorMap, DataType) {
  Descriptor d;
  d.dataType = CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B + 1;
  expectRule(d, MOE_TMA_RULE_DATA_TYPE, "data type past the enum");
}

TEST(RuntimeTensorMap, Rank) {
  Descriptor d;
  d.rank = 0;
  expectRule(d, MOE_TMA_RULE_RANK, "rank 0");
  d.rank = 6;
  expectRule(d, MOE_TMA_RULE_RANK, "rank 6");
  Descriptor interleaved;
  interleaved.interleave = CU_TENSOR_MAP_INTERLEAVE_16B;
  expectRule(interleaved, MOE_TMA_RULE_RANK, "rank 2 interleaved");
}

TEST(RuntimeTensorMap, AddressAlignment) {
  Descriptor d;
  d.address = reinterpret_cast<const void *>(uintptr_t(0x7f0000000008));
  expectRule(d, MOE_TMA_RULE_ADDRESS_ALIGNMENT, "address at +8");
  // 16-aligned is not enough with 32B interleave.
  Descriptor interleaved;
  interleaved.rank = 3;
  interleaved.interleave = CU_TENSOR_MAP_INTERLEAVE_32B;
  interleaved.swizzle = CU_TENSOR_MAP_SWIZZLE_32B;
  interleaved.box[0] = 16;
  interleaved.strides[1] = 4096 * 2 * 8192;
  interleaved.address =
      reinterpret_cast<const void *>(uintptr_t(0x7f0000000010));
  expectRule(interleaved, MOE_TMA_RULE_ADDRESS_ALIGNMENT,
             "address at +16 with 32B interleave");
}

TEST(RuntimeTensorMap, GlobalDim) {
  Descriptor d;
  d.dims[1] = 0;
  expectRule(d, MOE_TMA_RULE_GLOBAL_DIM, "dim 0");
  d = Descriptor();
  d.dims[0] = (uint64_t(1) << 32) + 1;
  expectRule(d, MOE_TMA_RULE_GLOBAL_DIM, "dim 2^32 + 1");
  Descriptor packed;
  packed.dataType = CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B;
  packed.box[0] = 32;
  packed.swizzle = CU_TENSOR_MAP_SWIZZLE_NONE;
  packed.dims[0] = 4097;
  expectRule(packed, MOE_TMA_RULE_GLOBAL_DIM, "odd dim for 16U4_ALIGN8B");
}

TEST(RuntimeTensorMap, StrideMultiple) {
  Descriptor d;
  d.strides[0] = 4096 * 2 + 8;
  expectRule(d, MOE_TMA_RULE_STRIDE_MULTIPLE, "stride + 8");
}

TEST(RuntimeTensorMap, StrideRange) {
  Descriptor d;
  d.strides[0] = uint64_t(1) << 40;
  expectRule(d, MOE_TMA_RULE_STRIDE_RANGE, "stride 2^40");
}

TEST(RuntimeTensorMap, BoxDim) {
  Descriptor d;
  d.box[1] = 257;
  expectRule(d, MOE_TMA_RULE_BOX_DIM, "box 257");
  d.box[1] = 0;
  expectRule(d, MOE_TMA_RULE_BOX_DIM, "box 0");
}

TEST(RuntimeTensorMap, BoxInnerBytes) {
  Descriptor d;
  d.box[0] = 36; // 72 B
  d.swizzle = CU_TENSOR_MAP_SWIZZLE_NONE;
  expectRule(d, MOE_TMA_RULE_BOX_INNER_BYTES, "72-byte inner box");
}

TEST(RuntimeTensorMap, SwizzleSpan) {
  Descriptor d;
  d.box[0] = 128; // 256 B against 128B swizzle
  expectRule(d, MOE_TMA_RULE_SWIZZLE_SPAN, "256 B in a 128 B span");
  Descriptor small;
  small.swizzle = CU_TENSOR_MAP_SWIZZLE_32B;
  small.box[0] = 32; // 64 B against 32B swizzle
  expectRule(small, MOE_TMA_RULE_SWIZZLE_SPAN, "64 B in a 32 B span");
}

TEST(RuntimeTensorMap, ElementStride) {
  Descriptor d;
  d.elementStrides[1] = 9;
  expectRule(d, MOE_TMA_RULE_ELEMENT_STRIDE, "element stride 9");
  d.elementStrides[1] = 0;
  expectRule(d, MOE_TMA_RULE_ELEMENT_STRIDE, "element stride 0");
}

TEST(RuntimeTensorMap, Interleave) {
  Descriptor d;
  d.interleave = CU_TENSOR_MAP_INTERLEAVE_32B + 1;
  expectRule(d, MOE_TMA_RULE_INTERLEAVE, "interleave past the enum");
  Descriptor wrongSwizzle;
  wrongSwizzle.rank = 3;
  wrongSwizzle.interleave = CU_TENSOR_MAP_INTERLEAVE_32B;
  wrongSwizzle.swizzle = CU_TENSOR_MAP_SWIZZLE_128B;
  wrongSwizzle.strides[1] = 4096 * 2 * 8192;
  expectRule(wrongSwizzle, MOE_TMA_RULE_INTERLEAVE,
             "32B interleave with 128B swizzle");
}

TEST(RuntimeTensorMap, Swizzle) {
  Descriptor d;
  d.swizzle = CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B + 1;
  expectRule(d, MOE_TMA_RULE_SWIZZLE, "swizzle past the enum");
  Descriptor packed;
  packed.dataType = CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B;
  packed.dims[0] = 4096;
  packed.box[0] = 128;
  packed.swizzle = CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B; // 16U6 only
  expectRule(packed, MOE_TMA_RULE_SWIZZLE,
             "128B_ATOM_64B swizzle on 16U4_ALIGN16B");
}

TEST(RuntimeTensorMap, L2Promotion) {
  Descriptor d;
  d.l2Promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B + 1;
  expectRule(d, MOE_TMA_RULE_L2_PROMOTION, "l2 promotion past the enum");
}

TEST(RuntimeTensorMap, OobFill) {
  Descriptor d;
  d.oobFill = CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA + 1;
  expectRule(d, MOE_TMA_RULE_OOB_FILL, "oob fill past the enum");
  Descriptor integer;
  integer.dataType = CU_TENSOR_MAP_DATA_TYPE_INT32;
  integer.box[0] = 32;
  integer.oobFill = CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA;
  expectRule(integer, MOE_TMA_RULE_OOB_FILL, "NaN fill on int32");
}

TEST(RuntimeTensorMap, RuleStrings) {
  std::set<std::string> seen;
  for (int rule = 0; rule < MOE_NUM_TMA_RULES; ++rule) {
    std::string text =
        moeTensorMapRuleString(static_cast<moeTensorMapRule>(rule));
    EXPECT_FALSE(text.empty());
    EXPECT_NE(text, "unknown tensor map rule") << rule;
    EXPECT_TRUE(seen.insert(text).second) << "duplicate: " << text;
  }
  EXPECT_STREQ(
      moeTensorMapRuleString(static_cast<moeTensorMapRule>(MOE_NUM_TMA_RULES)),
      "unknown tensor map rule");
}

TEST(RuntimeTensorMap, FailedRuleIsOptional) {
  Descriptor d;
  d.box[1] = 300;
  EXPECT_EQ(d.validate(nullptr), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastMessage().find("boxDim[1] = 300"), std::string::npos)
      << lastMessage();
}

} // namespace
