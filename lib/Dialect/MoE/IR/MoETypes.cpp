//===- MoETypes.cpp - MoE dialect types ---------------------*- C++ -*-===//

#include "moe/Dialect/MoE/IR/MoETypes.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::moe;

#define GET_TYPEDEF_CLASSES
#include "moe/Dialect/MoE/IR/MoEOpsTypes.cpp.inc"

// `!moe.host_tensor<4x?x8xbf16>`: the shape syntax of a ranked tensor.
Type HostTensorType::parse(AsmParser &parser) {
  SmallVector<int64_t> shape;
  Type elementType;
  SMLoc loc = parser.getCurrentLocation();
  if (parser.parseLess() ||
      parser.parseDimensionList(shape, /*allowDynamic=*/true,
                                /*withTrailingX=*/true) ||
      parser.parseType(elementType) || parser.parseGreater())
    return Type();
  return HostTensorType::getChecked([&] { return parser.emitError(loc); },
                                    parser.getContext(), shape, elementType);
}

void HostTensorType::print(AsmPrinter &printer) const {
  printer << "<";
  printer.printDimensionList(getShape());
  if (!getShape().empty())
    printer << "x";
  printer << getElementType() << ">";
}

LogicalResult
HostTensorType::verify(function_ref<InFlightDiagnostic()> emitError,
                       ArrayRef<int64_t> shape, Type elementType) {
  for (int64_t size : shape)
    if (size < 0 && !ShapedType::isDynamic(size))
      return emitError() << "host tensor dimensions must be non-negative, got "
                         << size;
  if (!elementType.isIntOrIndexOrFloat())
    return emitError()
           << "host tensor element type must be an integer or float, got "
           << elementType;
  return success();
}

void MoEDialect::registerTypes() {
  addTypes<
#define GET_TYPEDEF_LIST
#include "moe/Dialect/MoE/IR/MoEOpsTypes.cpp.inc"
      >();
}
