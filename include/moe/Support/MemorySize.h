//===- MemorySize.h - Parse and print byte counts -----------*- C++ -*-===//
//
// Memory budgets are given by users as text ("4GiB", "1.5 GB", "812345678").
//
//===----------------------------------------------------------------------===//

#ifndef MOE_SUPPORT_MEMORYSIZE_H
#define MOE_SUPPORT_MEMORYSIZE_H

#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <optional>
#include <string>

namespace mlir::moe {

/// Parses a byte count: a non-negative decimal number followed by an optional
/// unit, B, kB/KB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB (powers of
/// 1024), with optional spaces between. Fractions must give a whole number
/// of bytes ("1.5KiB" is 1536, "0.5B" is an error). On failure returns
/// nullopt and, if `error` is given, says why.
std::optional<uint64_t> parseMemorySize(llvm::StringRef text,
                                        std::string *error = nullptr);

/// Prints a byte count with the largest binary unit that keeps it >= 1,
/// two decimals: 4294967296 -> "4.00 GiB", 512 -> "512 B".
std::string formatMemorySize(uint64_t bytes);

} // namespace mlir::moe

#endif // MOE_SUPPORT_MEMORYSIZE_H
