//===- SplitBackward.cpp - kernels of the unfused combine and FFN backward ===//
//
// moe.combine_grad (dy by row, d_weights by slot) and the dx reduction of
// moe.expert_ffn_grad (each token's rows of dX_e summed in row order), for
// the expert-parallel layer, whose combine runs on another rank than the
// experts. Memory-bound: 16-byte vectors of bf16, 8 columns a thread; every
// index read from memory is checked before use; every sum has a fixed order.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"
#include "SimpleKernels.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe::kernels;
using Pred = arith::CmpIPredicate;

namespace {

/// An scf.for from `lower` to `upper` by `step` carrying `inits`.
SmallVector<Value>
buildForN(OpBuilder &b, Location loc, Value lower, Value upper, Value step,
          ValueRange inits,
          llvm::function_ref<SmallVector<Value>(Value, ValueRange)> body) {
  auto loop = scf::ForOp::create(b, loc, lower, upper, step, inits);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(loop.getBody());
  SmallVector<Value> next =
      body(loop.getInductionVar(), loop.getRegionIterArgs());
  scf::YieldOp::create(b, loc, next);
  return SmallVector<Value>(loop.getResults());
}

} // namespace

void mlir::moe::kernels::buildScaleRowsKernel(OpBuilder &b, Location loc) {
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type(), index = b.getIndexType();
  MemRefType rowsBuffer = flatBuffer(bf16);
  MemRefType ids = flatBuffer(b.getI32Type());
  gpu::GPUFuncOp kernel = createKernel(b, loc, "moe_scale_rows",
                                       {rowsBuffer, flatBuffer(f32), ids, index,
                                        index, index, index, rowsBuffer});
  Value src = kernel.getArgument(0), weights = kernel.getArgument(1),
        sources = kernel.getArgument(2), numSlots = kernel.getArgument(3),
        k = kernel.getArgument(4), numRows = kernel.getArgument(5),
        d = kernel.getArgument(6), out = kernel.getArgument(7);
  auto wideF32 = VectorType::get({kColumns}, f32);
  auto wideBf16 = VectorType::get({kColumns}, bf16);
  llvm::MaybeAlign align(16);

  // out[r] = weights[s] * src[s / k] for the slot s = sources[r] that owns
  // row r, a zero row where none does.
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value row = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value c8 = indexConstant(b, loc, kColumns);
  Value stride = indexConstant(b, loc, kColumns * kSimpleThreads);
  Value zeros = floatConstant(b, loc, wideBf16, 0.0);
  Value ok = arith::CmpIOp::create(b, loc, Pred::ult, row, numRows);
  buildIf(b, loc, ok, [&] {
    Value at = memref::LoadOp::create(b, loc, sources, row);
    CheckedIndex owner = checkIndex(b, loc, at, numSlots);
    Value slot = owner.index, valid = owner.valid;
    Value outBase = arith::MulIOp::create(b, loc, row, d);
    Value col0 = arith::MulIOp::create(b, loc, tid, c8);
    buildIfElse(
        b, loc, valid,
        [&] {
          Value w = memref::LoadOp::create(b, loc, weights, slot);
          Value wv = vector::BroadcastOp::create(b, loc, wideF32, w);
          Value t = divU32(b, loc, slot, k); // the slot's token
          Value srcBase = arith::MulIOp::create(b, loc, t, d);
          buildFor(b, loc, col0, d, stride, [&](Value col) {
            Value srcIndex = arith::AddIOp::create(b, loc, srcBase, col);
            Value v = vector::LoadOp::create(b, loc, wideBf16, src, srcIndex,
                                             /*nontemporal=*/false, align);
            Value vf = arith::ExtFOp::create(b, loc, wideF32, v);
            Value scaled = arith::MulFOp::create(b, loc, wv, vf);
            Value rounded = arith::TruncFOp::create(b, loc, wideBf16, scaled);
            Value outIndex = arith::AddIOp::create(b, loc, outBase, col);
            vector::StoreOp::create(b, loc, rounded, out, outIndex,
                                    /*nontemporal=*/false, align);
          });
        },
        [&] {
          buildFor(b, loc, col0, d, stride, [&](Value col) {
            Value outIndex = arith::AddIOp::create(b, loc, outBase, col);
            vector::StoreOp::create(b, loc, zeros, out, outIndex,
                                    /*nontemporal=*/false, align);
          });
        });
  });
  gpu::ReturnOp::create(b, loc);
}

void mlir::moe::kernels::buildRowDotsKernel(OpBuilder &b, Location loc) {
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type(), index = b.getIndexType();
  MemRefType rowsBuffer = flatBuffer(bf16);
  gpu::GPUFuncOp kernel =
      createKernel(b, loc, "moe_row_dots",
                   {rowsBuffer, rowsBuffer, flatBuffer(b.getI32Type()), index,
                    index, index, index, flatBuffer(f32)});
  Value dout = kernel.getArgument(0), y = kernel.getArgument(1),
        rows = kernel.getArgument(2), numSlots = kernel.getArgument(3),
        k = kernel.getArgument(4), numRows = kernel.getArgument(5),
        d = kernel.getArgument(6), dWeights = kernel.getArgument(7);
  auto wideF32 = VectorType::get({kColumns}, f32);

  // A warp a slot s = t * k + j: <dout[t], y[rows[s]]> in f32, each lane's
  // columns 8 apart in order, then the lanes by xor shuffles; 0 for a slot
  // without a row.
  WarpSlot warp = buildWarpSlot(b, loc, rows, numSlots);
  Value lane = warp.lane, slot = warp.slot, inSlots = warp.inSlots,
        r = warp.row;
  Value c0 = indexConstant(b, loc, 0);
  Value c8 = indexConstant(b, loc, kColumns);
  Value stride = indexConstant(b, loc, kColumns * kWarp);
  Value zeroF = f32Constant(b, loc, 0.0f);
  Value zeros = floatConstant(b, loc, wideF32, 0.0);
  CheckedIndex yRow = checkIndex(b, loc, r, numRows);
  Value row = yRow.index;
  // A slot without a row runs no columns and sums to 0.
  Value t = divU32(b, loc, slot, k); // the slot's token
  Value outBase = arith::MulIOp::create(b, loc, t, d);
  Value yBase = arith::MulIOp::create(b, loc, row, d);
  Value col0 = arith::MulIOp::create(b, loc, lane, c8);
  Value end = arith::SelectOp::create(b, loc, yRow.valid, d, c0);
  Value part = buildWarpRowDot(b, loc, dout, outBase, y, yBase, col0, end,
                               stride, zeros, zeroF);
  Value lead = arith::CmpIOp::create(b, loc, Pred::eq, lane, c0);
  Value store = arith::AndIOp::create(b, loc, lead, inSlots);
  buildIf(b, loc, store,
          [&] { memref::StoreOp::create(b, loc, part, dWeights, slot); });
  gpu::ReturnOp::create(b, loc);
}

void mlir::moe::kernels::buildLinkRowsKernel(OpBuilder &b, Location loc) {
  Type index = b.getIndexType();
  MemRefType buffer = flatBuffer(b.getI32Type());
  gpu::GPUFuncOp kernel = createKernel(
      b, loc, "moe_link_rows",
      {buffer, buffer, index, index, index, buffer, buffer, buffer});
  Value tokenIds = kernel.getArgument(0), offsets = kernel.getArgument(1),
        numOffsets = kernel.getArgument(2), numRows = kernel.getArgument(3),
        numTokens = kernel.getArgument(4), head = kernel.getArgument(5),
        count = kernel.getArgument(6), next = kernel.getArgument(7);

  // Each row of an expert (offsets[0] <= r < offsets[E]) joins its token's
  // list: head[t] takes r, next[r] the previous head; count[t] counts them.
  // The lists' order is the atomics', their sets are not: the sum orders
  // them.
  Value gid = buildGlobalThreadId(b, loc);
  Value c0 = indexConstant(b, loc, 0);
  Value c1 = indexConstant(b, loc, 1);
  Value one = i32Constant(b, loc, 1);
  Value in = arith::CmpIOp::create(b, loc, Pred::ult, gid, numRows);
  Value some = arith::CmpIOp::create(b, loc, Pred::ugt, numOffsets, c0);
  Value go = arith::AndIOp::create(b, loc, in, some);
  buildIf(b, loc, go, [&] {
    Value last = arith::SubIOp::create(b, loc, numOffsets, c1);
    Value lo32 = memref::LoadOp::create(b, loc, offsets, c0);
    Value hi32 = memref::LoadOp::create(b, loc, offsets, last);
    Value r32 = arith::IndexCastOp::create(b, loc, b.getI32Type(), gid);
    Value afterLo = arith::CmpIOp::create(b, loc, Pred::sge, r32, lo32);
    Value beforeHi = arith::CmpIOp::create(b, loc, Pred::slt, r32, hi32);
    Value queued = arith::AndIOp::create(b, loc, afterLo, beforeHi);
    buildIf(b, loc, queued, [&] {
      Value id = memref::LoadOp::create(b, loc, tokenIds, gid);
      CheckedIndex tok = checkIndex(b, loc, id, numTokens);
      Value token = tok.index, valid = tok.valid;
      buildIf(b, loc, valid, [&] {
        Value old = memref::AtomicRMWOp::create(
            b, loc, arith::AtomicRMWKind::assign, r32, head, token);
        memref::StoreOp::create(b, loc, old, next, gid);
        memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi, one,
                                    count, token);
      });
    });
  });
  gpu::ReturnOp::create(b, loc);
}

void mlir::moe::kernels::buildTokenSumKernel(OpBuilder &b, Location loc) {
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type(), i32 = b.getI32Type(),
       index = b.getIndexType();
  MemRefType rowsBuffer = flatBuffer(bf16);
  MemRefType buffer = flatBuffer(i32);
  gpu::GPUFuncOp kernel = createKernel(
      b, loc, "moe_token_sum",
      {rowsBuffer, buffer, buffer, buffer, index, index, index, rowsBuffer});
  Value src = kernel.getArgument(0), head = kernel.getArgument(1),
        count = kernel.getArgument(2), next = kernel.getArgument(3),
        numRows = kernel.getArgument(4), numTokens = kernel.getArgument(5),
        d = kernel.getArgument(6), out = kernel.getArgument(7);
  auto wideF32 = VectorType::get({kColumns}, f32);
  auto wideBf16 = VectorType::get({kColumns}, bf16);
  llvm::MaybeAlign align(16);

  // out[t] = the rows of token t's list (moe_link_rows) summed in f32 in
  // ascending row order, rounded once; a zero row for a token without rows.
  // Step i takes the smallest row above step i - 1's by a walk of the list
  // (a token has few rows: k, or one in the expert-parallel layer).
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value t = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value c0 = indexConstant(b, loc, 0);
  Value c1 = indexConstant(b, loc, 1);
  Value c8 = indexConstant(b, loc, kColumns);
  Value stride = indexConstant(b, loc, kColumns * kSimpleThreads);
  Value zeros = floatConstant(b, loc, wideF32, 0.0);
  Value none = i32Constant(b, loc, -1);
  Value rows32 = arith::IndexCastOp::create(b, loc, i32, numRows);
  Value ok = arith::CmpIOp::create(b, loc, Pred::ult, t, numTokens);
  buildIf(b, loc, ok, [&] {
    Value n32 = memref::LoadOp::create(b, loc, count, t);
    Value nRaw = arith::IndexCastOp::create(b, loc, index, n32);
    Value nPos = arith::MaxSIOp::create(b, loc, nRaw, c0);
    Value n = arith::MinSIOp::create(b, loc, nPos, numRows);
    Value first = memref::LoadOp::create(b, loc, head, t);
    Value outBase = arith::MulIOp::create(b, loc, t, d);
    Value col0 = arith::MulIOp::create(b, loc, tid, c8);
    buildFor(b, loc, col0, d, stride, [&](Value col) {
      SmallVector<Value> done = buildForN(
          b, loc, c0, n, c1, ValueRange{zeros, none},
          [&](Value, ValueRange carried) -> SmallVector<Value> {
            Value acc = carried[0], prev = carried[1];
            // The smallest row of the list above prev (numRows if none).
            SmallVector<Value> walk = buildForN(
                b, loc, c0, n, c1, ValueRange{first, rows32},
                [&](Value, ValueRange state) -> SmallVector<Value> {
                  Value cur = state[0], best = state[1];
                  CheckedIndex curRow = checkIndex(b, loc, cur, numRows);
                  Value at = curRow.index, valid = curRow.valid;
                  Value above =
                      arith::CmpIOp::create(b, loc, Pred::sgt, cur, prev);
                  Value below =
                      arith::CmpIOp::create(b, loc, Pred::slt, cur, best);
                  Value better = arith::AndIOp::create(b, loc, above, below);
                  Value take = arith::AndIOp::create(b, loc, valid, better);
                  Value nextBest =
                      arith::SelectOp::create(b, loc, take, cur, best);
                  Value nextCur = buildIfElse(
                      b, loc, i32, valid,
                      [&] {
                        return memref::LoadOp::create(b, loc, next, at)
                            .getResult();
                      },
                      [&] { return none; });
                  return {nextCur, nextBest};
                });
            Value best = walk[1];
            CheckedIndex bestRow = checkIndex(b, loc, best, numRows);
            Value row = bestRow.index, valid = bestRow.valid;
            Value sum = buildIfElse(
                b, loc, wideF32, valid,
                [&] {
                  Value base = arith::MulIOp::create(b, loc, row, d);
                  Value at = arith::AddIOp::create(b, loc, base, col);
                  Value v =
                      vector::LoadOp::create(b, loc, wideBf16, src, at,
                                             /*nontemporal=*/false, align);
                  Value vf = arith::ExtFOp::create(b, loc, wideF32, v);
                  return arith::AddFOp::create(b, loc, acc, vf).getResult();
                },
                [&] { return acc; });
            return {sum, best};
          });
      Value rounded = arith::TruncFOp::create(b, loc, wideBf16, done[0]);
      Value outIndex = arith::AddIOp::create(b, loc, outBase, col);
      vector::StoreOp::create(b, loc, rounded, out, outIndex,
                              /*nontemporal=*/false, align);
    });
  });
  gpu::ReturnOp::create(b, loc);
}
