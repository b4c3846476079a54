//===- MoETypes.h - MoE dialect types -----------------------*- C++ -*-===//

#ifndef MOE_DIALECT_MOE_IR_MOETYPES_H
#define MOE_DIALECT_MOE_IR_MOETYPES_H

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Types.h"

#define GET_TYPEDEF_CLASSES
#include "moe/Dialect/MoE/IR/MoEOpsTypes.h.inc"

#endif // MOE_DIALECT_MOE_IR_MOETYPES_H
