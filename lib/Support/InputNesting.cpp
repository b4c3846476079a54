//===- InputNesting.cpp - Refuse deeply nested input text ---*- C++ -*-===//

#include "moe/Support/InputNesting.h"

#include "llvm/ADT/Twine.h"

using namespace mlir::moe;

std::optional<NestingError> mlir::moe::checkInputNesting(llvm::StringRef text,
                                                         unsigned limit) {
  unsigned depth = 0, line = 1;
  size_t lineStart = 0;
  for (size_t i = 0, e = text.size(); i < e; ++i) {
    char c = text[i];
    if (c == '\n') {
      ++line;
      lineStart = i + 1;
    } else if (c == '/' && text.substr(i).starts_with("//")) {
      i = text.find('\n', i);
      if (i == llvm::StringRef::npos)
        break;
      --i; // the newline is counted above
    } else if (c == '"') {
      // To the closing quote; an escape takes the character after it.
      for (++i; i < e && text[i] != '"'; ++i)
        if (text[i] == '\\')
          ++i;
    } else if (c == '(' || c == '[' || c == '{' || c == '<') {
      if (++depth > limit)
        return NestingError{
            line, static_cast<unsigned>(i - lineStart + 1),
            ("the input nests brackets more than " + llvm::Twine(limit) +
             " levels deep, which the tools refuse (the parser would "
             "overflow its stack)")
                .str()};
    } else if (c == ')' || c == ']' || c == '}' ||
               (c == '>' && !(i > 0 && text[i - 1] == '-'))) {
      if (depth > 0)
        --depth;
    }
  }
  return std::nullopt;
}
