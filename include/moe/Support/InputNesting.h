//===- InputNesting.h - Refuse deeply nested input text -----*- C++ -*-===//
//
// MLIR's parser descends recursively into nested attributes, types and
// regions, so text nested some thousands of levels deep overflows the stack.
// The tools measure the nesting of their input first and refuse what is
// deeper than any real layer (the deepest file of the project nests 7).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_SUPPORT_INPUTNESTING_H
#define MOE_SUPPORT_INPUTNESTING_H

#include "llvm/ADT/StringRef.h"

#include <optional>
#include <string>

namespace mlir::moe {

/// The deepest nesting of (), [], {} and <> the tools take.
constexpr unsigned kMaxInputNesting = 512;

/// Where and why input nests too deeply.
struct NestingError {
  unsigned line, column;
  std::string message;
};

/// Fails at the first bracket that nests `text` deeper than `limit`.
/// Comments (`//` to the end of the line) and string literals do not count;
/// `->` is an arrow, not a closing bracket.
std::optional<NestingError>
checkInputNesting(llvm::StringRef text, unsigned limit = kMaxInputNesting);

} // namespace mlir::moe

#endif // MOE_SUPPORT_INPUTNESTING_H
