//===- MoEGPUDialect.h - moe_gpu dialect --------------------*- C++ -*-===//

#ifndef MOE_DIALECT_MOEGPU_IR_MOEGPUDIALECT_H
#define MOE_DIALECT_MOEGPU_IR_MOEGPUDIALECT_H

#include "mlir/IR/Dialect.h"

#include "moe/Dialect/MoEGPU/IR/MoEGPUDialect.h.inc"

#endif // MOE_DIALECT_MOEGPU_IR_MOEGPUDIALECT_H
