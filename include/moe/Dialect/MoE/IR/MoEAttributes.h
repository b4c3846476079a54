//===- MoEAttributes.h - MoE dialect attributes and enums ---*- C++ -*-===//

#ifndef MOE_DIALECT_MOE_IR_MOEATTRIBUTES_H
#define MOE_DIALECT_MOE_IR_MOEATTRIBUTES_H

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectImplementation.h"

#include "moe/Dialect/MoE/IR/MoEEnums.h.inc"

namespace mlir::moe {
/// Parses a bool attribute parameter spelled `true` or `false`.
inline FailureOr<bool> parseBoolParameter(AsmParser &parser) {
  SMLoc loc = parser.getCurrentLocation();
  StringRef keyword;
  if (succeeded(parser.parseOptionalKeyword(&keyword, {"true", "false"})))
    return keyword == "true";
  return parser.emitError(loc, "expected 'true' or 'false'");
}

/// Parses an f64 attribute parameter (`scaling_factor = 2.5`); MLIR 22 has
/// field parsers for integers only.
inline FailureOr<llvm::APFloat> parseF64Parameter(AsmParser &parser) {
  double value;
  if (parser.parseFloat(value))
    return failure();
  return llvm::APFloat(value);
}

/// Gated activations (SwiGLU) read a gate and an up projection, so their
/// first FFN weight is twice as wide as the FFN size.
inline bool isGated(Activation activation) {
  return activation == Activation::swiglu;
}
} // namespace mlir::moe

#define GET_ATTRDEF_CLASSES
#include "moe/Dialect/MoE/IR/MoEAttributes.h.inc"

#endif // MOE_DIALECT_MOE_IR_MOEATTRIBUTES_H
