//===- MoEToLinalg.cpp - moe to linalg/tensor/scf (CPU path) -*- C++ -*-===//

#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"

namespace mlir::moe {
#define GEN_PASS_DEF_CONVERTMOETOLINALG
#include "moe/Conversion/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {
struct ConvertMoEToLinalgPass
    : public mlir::moe::impl::ConvertMoEToLinalgBase<ConvertMoEToLinalgPass> {
  void runOnOperation() override {
    getOperation()->emitError("convert-moe-to-linalg is not implemented yet");
    signalPassFailure();
  }
};
} // namespace
