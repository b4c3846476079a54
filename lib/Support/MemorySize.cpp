//===- MemorySize.cpp - Parse and print byte counts ---------*- C++ -*-===//

#include "moe/Support/MemorySize.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/ADT/Twine.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

using namespace mlir::moe;

static std::optional<uint64_t> fail(std::string *error,
                                    const llvm::Twine &why) {
  if (error)
    *error = why.str();
  return std::nullopt;
}

std::optional<uint64_t> mlir::moe::parseMemorySize(llvm::StringRef text,
                                                   std::string *error) {
  llvm::StringRef input = text.trim();
  if (input.empty())
    return fail(error, "empty memory size");
  size_t numberEnd = 0;
  while (numberEnd < input.size() &&
         (llvm::isDigit(input[numberEnd]) || input[numberEnd] == '.'))
    ++numberEnd;
  llvm::StringRef number = input.take_front(numberEnd);
  llvm::StringRef unit = input.drop_front(numberEnd).trim();
  if (number.empty())
    return fail(error, "memory size '" + text +
                           "' must start with a non-negative number");
  auto [whole, fraction] = number.split('.');
  if (fraction.contains('.') || (whole.empty() && fraction.empty()))
    return fail(error, "malformed number in memory size '" + text + "'");

  std::optional<uint64_t> scale =
      llvm::StringSwitch<std::optional<uint64_t>>(unit)
          .Cases({"", "B"}, 1ull)
          .Cases({"kB", "KB"}, 1000ull)
          .Case("MB", 1000ull * 1000)
          .Case("GB", 1000ull * 1000 * 1000)
          .Case("TB", 1000ull * 1000 * 1000 * 1000)
          .Case("KiB", 1ull << 10)
          .Case("MiB", 1ull << 20)
          .Case("GiB", 1ull << 30)
          .Case("TiB", 1ull << 40)
          .Default(std::nullopt);
  if (!scale)
    return fail(error, "unknown unit '" + unit + "' in memory size '" + text +
                           "' (use B, kB, MB, GB, TB, KiB, MiB, GiB or TiB)");

  // Exact arithmetic: value = (whole * 10^f + fraction) * scale / 10^f.
  if (fraction.size() > 12)
    return fail(error, "too many decimals in memory size '" + text + "'");
  unsigned __int128 denominator = 1, numerator = 0;
  for (char digit : whole) {
    numerator = numerator * 10 + (digit - '0');
    if (numerator > UINT64_MAX)
      return fail(error, "memory size '" + text + "' is too large");
  }
  for (char digit : fraction) {
    numerator = numerator * 10 + (digit - '0');
    denominator *= 10;
  }
  // numerator < 10^32 and scale <= 2^40 could pass 2^128: compare first.
  if (numerator > ~static_cast<unsigned __int128>(0) / *scale)
    return fail(error, "memory size '" + text + "' is too large");
  unsigned __int128 scaled = numerator * *scale;
  if (scaled % denominator != 0)
    return fail(error,
                "memory size '" + text + "' is not a whole number of bytes");
  unsigned __int128 bytes = scaled / denominator;
  if (bytes > UINT64_MAX)
    return fail(error, "memory size '" + text + "' is too large");
  return static_cast<uint64_t>(bytes);
}

std::string mlir::moe::formatMemorySize(uint64_t bytes) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  std::string result;
  llvm::raw_string_ostream os(result);
  if (bytes < 1024) {
    os << bytes << " B";
    return result;
  }
  double value = static_cast<double>(bytes) / 1024.0;
  unsigned unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(units)) {
    value /= 1024.0;
    ++unit;
  }
  os << llvm::format("%.2f ", value) << units[unit];
  return result;
}
