//===- MoEAttributes.cpp - MoE dialect attributes -----------*- C++ -*-===//

#include "moe/Dialect/MoE/IR/MoEAttributes.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

#include <cmath>

using namespace mlir;
using namespace mlir::moe;

#include "moe/Dialect/MoE/IR/MoEEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "moe/Dialect/MoE/IR/MoEAttributes.cpp.inc"

LogicalResult RoutingAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                  ScoringFunc scoring, int64_t topK,
                                  bool renormalize, int64_t numGroups,
                                  int64_t topkGroups,
                                  llvm::APFloat scalingFactor,
                                  bool /*roundLogits*/) {
  if (topK < 1)
    return emitError() << "top_k must be at least 1, got " << topK;
  if (numGroups < 1)
    return emitError() << "num_groups must be at least 1, got " << numGroups;
  if (topkGroups < 1 || topkGroups > numGroups)
    return emitError() << "topk_groups must be in [1, num_groups = "
                       << numGroups << "], got " << topkGroups;
  double scaling = scalingFactor.convertToDouble();
  if (!std::isfinite(scaling) || scaling <= 0.0)
    return emitError() << "scaling_factor must be a positive finite number, "
                          "got "
                       << scaling;
  return success();
}

void MoEDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "moe/Dialect/MoE/IR/MoEAttributes.cpp.inc"
      >();
}
