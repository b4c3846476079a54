//===- OptionParsers.h - Validating parsers for pass options -*- C++ -*-===//
//
// Pass and pipeline options whose text must be checked when it is parsed, so
// that `memory-budget=4GiX` fails with a message instead of being ignored.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_SUPPORT_OPTIONPARSERS_H
#define MOE_SUPPORT_OPTIONPARSERS_H

#include "moe/Support/MemorySize.h"

#include "llvm/Support/CommandLine.h"

namespace mlir::moe {

/// A memory size option ("4GiB"); the empty string means "no limit".
class MemorySizeOptionParser : public llvm::cl::parser<std::string> {
public:
  using llvm::cl::parser<std::string>::parser;

  bool parse(llvm::cl::Option &option, llvm::StringRef argName,
             llvm::StringRef arg, std::string &value) {
    std::string error;
    if (!arg.empty() && !parseMemorySize(arg, &error))
      return option.error(error, argName);
    value = arg.str();
    return false;
  }
};

/// The GPU architectures moe-mlir generates kernels for.
inline bool isSupportedChip(llvm::StringRef chip) { return chip == "sm_90a"; }

/// A target chip option; only chips with wgmma and setmaxnreg are accepted.
class ChipOptionParser : public llvm::cl::parser<std::string> {
public:
  using llvm::cl::parser<std::string>::parser;

  bool parse(llvm::cl::Option &option, llvm::StringRef argName,
             llvm::StringRef arg, std::string &value) {
    if (!isSupportedChip(arg))
      return option.error("unsupported chip '" + arg +
                              "': the kernels use wgmma and setmaxnreg, which "
                              "need sm_90a",
                          argName);
    value = arg.str();
    return false;
  }
};

} // namespace mlir::moe

#endif // MOE_SUPPORT_OPTIONPARSERS_H
