//===- MemorySizeTest.cpp - Memory size parsing and printing ------------===//

#include "moe/Support/MemorySize.h"

#include "gtest/gtest.h"

using namespace mlir::moe;

namespace {

TEST(MemorySize, PlainBytes) {
  EXPECT_EQ(parseMemorySize("0"), 0u);
  EXPECT_EQ(parseMemorySize("812345678"), 812345678u);
  EXPECT_EQ(parseMemorySize("512B"), 512u);
  EXPECT_EQ(parseMemorySize("  64 B "), 64u);
}

TEST(MemorySize, BinaryUnits) {
  EXPECT_EQ(parseMemorySize("1KiB"), 1024u);
  EXPECT_EQ(parseMemorySize("3MiB"), 3u << 20);
  EXPECT_EQ(parseMemorySize("4GiB"), 4ull << 30);
  EXPECT_EQ(parseMemorySize("2 TiB"), 2ull << 40);
}

TEST(MemorySize, DecimalUnits) {
  EXPECT_EQ(parseMemorySize("1kB"), 1000u);
  EXPECT_EQ(parseMemorySize("1KB"), 1000u);
  EXPECT_EQ(parseMemorySize("80GB"), 80'000'000'000ull);
  EXPECT_EQ(parseMemorySize("1TB"), 1'000'000'000'000ull);
}

TEST(MemorySize, Fractions) {
  EXPECT_EQ(parseMemorySize("1.5KiB"), 1536u);
  EXPECT_EQ(parseMemorySize("0.25GiB"), 1ull << 28);
  EXPECT_EQ(parseMemorySize("1.875GB"), 1'875'000'000ull);
  EXPECT_EQ(parseMemorySize(".5KiB"), 512u);
}

TEST(MemorySize, Errors) {
  std::string error;
  EXPECT_FALSE(parseMemorySize("", &error));
  EXPECT_EQ(error, "empty memory size");
  EXPECT_FALSE(parseMemorySize("4GiX", &error));
  EXPECT_NE(error.find("unknown unit 'GiX'"), std::string::npos) << error;
  EXPECT_FALSE(parseMemorySize("-1GiB", &error));
  EXPECT_NE(error.find("non-negative number"), std::string::npos) << error;
  EXPECT_FALSE(parseMemorySize("GiB", &error));
  EXPECT_FALSE(parseMemorySize("1.2.3GiB", &error));
  EXPECT_NE(error.find("malformed"), std::string::npos) << error;
  EXPECT_FALSE(parseMemorySize("0.5B", &error));
  EXPECT_NE(error.find("whole number of bytes"), std::string::npos) << error;
  EXPECT_FALSE(parseMemorySize("20000000TiB", &error));
  EXPECT_NE(error.find("too large"), std::string::npos) << error;
  EXPECT_FALSE(parseMemorySize("99999999999999999999999", &error));
  EXPECT_NE(error.find("too large"), std::string::npos) << error;
  EXPECT_FALSE(parseMemorySize(".", &error));
}

// Twelve decimals of a large number times TiB passed 2^128 and wrapped to a
// small count (256 MiB for this one) before the product was checked.
TEST(MemorySize, ProductPastOneHundredTwentyEightBits) {
  std::string error;
  EXPECT_FALSE(
      parseMemorySize("309485009821345.068968921681TiB", &error).has_value());
  EXPECT_NE(error.find("too large"), std::string::npos) << error;
  EXPECT_FALSE(parseMemorySize("999999999999999999.999999999999TiB", &error)
                   .has_value());
  EXPECT_NE(error.find("too large"), std::string::npos) << error;
  // A large count with a fraction still parses exactly.
  EXPECT_EQ(parseMemorySize("16777215.5TiB"),
            16777215ull * (1ull << 40) + (1ull << 39));
}

TEST(MemorySize, LargestExactValue) {
  EXPECT_EQ(parseMemorySize("18446744073709551615"), UINT64_MAX);
  EXPECT_FALSE(parseMemorySize("18446744073709551616"));
}

TEST(MemorySize, Format) {
  EXPECT_EQ(formatMemorySize(0), "0 B");
  EXPECT_EQ(formatMemorySize(1023), "1023 B");
  EXPECT_EQ(formatMemorySize(1024), "1.00 KiB");
  EXPECT_EQ(formatMemorySize(1536), "1.50 KiB");
  EXPECT_EQ(formatMemorySize(4ull << 30), "4.00 GiB");
  EXPECT_EQ(formatMemorySize(UINT64_MAX), "16.00 EiB");
}

TEST(MemorySize, FormatRoundTripsThroughParse) {
  for (uint64_t bytes : {1ull << 10, 3ull << 20, 5ull << 30, 7ull << 40}) {
    std::string text = formatMemorySize(bytes);
    text.erase(text.find(' '), 1);
    EXPECT_EQ(parseMemorySize(text), bytes) << text;
  }
}

} // namespace
