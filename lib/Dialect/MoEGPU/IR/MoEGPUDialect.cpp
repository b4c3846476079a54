//===- MoEGPUDialect.cpp - moe_gpu dialect ------------------*- C++ -*-===//

#include "moe/Dialect/MoEGPU/IR/MoEGPUDialect.h"
#include "moe/Dialect/MoEGPU/IR/MoEGPUAttributes.h"

using namespace mlir;
using namespace mlir::moe_gpu;

#include "moe/Dialect/MoEGPU/IR/MoEGPUDialect.cpp.inc"

void MoEGPUDialect::initialize() { registerAttributes(); }
