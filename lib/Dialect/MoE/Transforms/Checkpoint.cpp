//===- Checkpoint.cpp - moe.checkpoint regions --------------*- C++ -*-===//

#include "moe/Dialect/MoE/Transforms/Checkpoint.h"
#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/IR/PatternMatch.h"

using namespace mlir;
using namespace mlir::moe;

void mlir::moe::inlineCheckpoints(Operation *root) {
  SmallVector<CheckpointOp> checkpoints;
  root->walk([&](CheckpointOp op) { checkpoints.push_back(op); });
  IRRewriter rewriter(root->getContext());
  for (CheckpointOp op : checkpoints) {
    rewriter.inlineBlockBefore(&op.getBody().front(), op, op.getInputs());
    auto yield = cast<YieldOp>(op->getPrevNode());
    SmallVector<Value> results(yield.getValues());
    rewriter.replaceOp(op, results);
    rewriter.eraseOp(yield);
  }
}
