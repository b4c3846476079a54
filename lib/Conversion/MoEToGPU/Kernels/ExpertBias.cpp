//===- ExpertBias.cpp - the expert biases' gradients ----------------------===//
//
// d_b_gate_up[e] and d_b_down[e] are column sums over expert e's rows of the
// dispatch queue (of dH, and of the rows' routing-weighted dout), and the
// routing weight's gradient gains <dout[t], b_down[e]>. Memory-bound: 16-byte
// vectors of bf16, 8 columns a thread; every index read from memory is
// checked before use; every sum has a fixed order, so the gradients are the
// same bits run after run.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"
#include "SimpleKernels.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe::kernels;
using Pred = arith::CmpIPredicate;

namespace {

Value toIndex(OpBuilder &b, Location loc, Value i32) {
  return arith::IndexCastOp::create(b, loc, b.getIndexType(), i32);
}

/// The expert of queue row `row`: how many of offsets[1..E) are at most it
/// (`c0`, `c1`: the kernel's index constants 0 and 1).
Value expertOfRow(OpBuilder &b, Location loc, Value offsets, Value numExperts,
                  Value row, Value c0, Value c1) {
  return buildFor(b, loc, c1, numExperts, c1, c0, [&](Value i, Value count) {
    Value next =
        toIndex(b, loc, memref::LoadOp::create(b, loc, offsets, i).getResult());
    Value past = arith::CmpIOp::create(b, loc, Pred::sle, next, row);
    Value add = arith::SelectOp::create(b, loc, past, c1, c0);
    return arith::AddIOp::create(b, loc, count, add).getResult();
  });
}

} // namespace

void mlir::moe::kernels::buildSegmentColumnSumKernel(OpBuilder &b,
                                                     Location loc) {
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type(), i1 = b.getI1Type(),
       index = b.getIndexType();
  MemRefType ids = flatBuffer(b.getI32Type());
  gpu::GPUFuncOp kernel =
      createKernel(b, loc, "moe_segment_colsum",
                   {flatBuffer(bf16), ids, i1, flatBuffer(f32), i1, ids, index,
                    index, index, index, index, flatBuffer(f32)});
  Value src = kernel.getArgument(0), rowIds = kernel.getArgument(1),
        hasIds = kernel.getArgument(2), scales = kernel.getArgument(3),
        hasScales = kernel.getArgument(4), offsets = kernel.getArgument(5),
        numExperts = kernel.getArgument(6),
        numQueueRows = kernel.getArgument(7),
        numSrcRows = kernel.getArgument(8), cols = kernel.getArgument(9),
        numSlices = kernel.getArgument(10), out = kernel.getArgument(11);
  auto wideF32 = VectorType::get({kColumns}, f32);
  auto wideBf16 = VectorType::get({kColumns}, bf16);
  llvm::MaybeAlign align(16);

  // Block (x, y): columns [8 * (128 x + tid), +8) of slice s = y / E of
  // expert e = y % E. The expert's rows [offsets[e], offsets[e + 1]) split
  // into S slices of ceil(rows / S); the slice's rows r in order: the sum of
  // scale[r] * src[ids[r] or r] in f32, into out[s, e, columns]. Offsets are
  // clamped to the queue's rows; a row id outside [0, numSrcRows) adds
  // nothing. Divisions in 32 bits: ptxas's
  // 64-bit division takes a stack frame.
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value bx = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value by = gpu::BlockIdOp::create(b, loc, gpu::Dimension::y);
  Value c1 = indexConstant(b, loc, 1);
  Value c8 = indexConstant(b, loc, kColumns);
  Value threads = indexConstant(b, loc, kSimpleThreads);
  Value one = f32Constant(b, loc, 1.0f);
  Value zeros = floatConstant(b, loc, wideF32, 0.0);
  Value thread = arith::AddIOp::create(
      b, loc, arith::MulIOp::create(b, loc, bx, threads), tid);
  Value col = arith::MulIOp::create(b, loc, thread, c8);
  Value e = remU32(b, loc, by, numExperts);
  Value s = divU32(b, loc, by, numExperts);
  Value inCols = arith::CmpIOp::create(b, loc, Pred::ult, col, cols);
  Value inSlices = arith::CmpIOp::create(b, loc, Pred::ult, s, numSlices);
  Value ok = arith::AndIOp::create(b, loc, inCols, inSlices);
  buildIf(b, loc, ok, [&] {
    Value eNext = arith::AddIOp::create(b, loc, e, c1);
    // A negative offset extends to more than any size: the unsigned min
    // takes it to the end. Offsets that decrease give the expert no rows.
    Value loRead =
        toIndex(b, loc, memref::LoadOp::create(b, loc, offsets, e).getResult());
    Value lo = arith::MinUIOp::create(b, loc, loRead, numQueueRows);
    Value hiRead = toIndex(
        b, loc, memref::LoadOp::create(b, loc, offsets, eNext).getResult());
    Value hi = arith::MinUIOp::create(
        b, loc, arith::MaxSIOp::create(b, loc, hiRead, lo), numQueueRows);
    Value rows = arith::SubIOp::create(b, loc, hi, lo);
    Value sMinus = arith::SubIOp::create(b, loc, numSlices, c1);
    Value chunk =
        divU32(b, loc, arith::AddIOp::create(b, loc, rows, sMinus), numSlices);
    Value start = arith::AddIOp::create(
        b, loc, lo, arith::MulIOp::create(b, loc, s, chunk));
    Value startIn = arith::MinUIOp::create(b, loc, start, hi);
    Value end = arith::MinUIOp::create(
        b, loc, arith::AddIOp::create(b, loc, startIn, chunk), hi);
    Value sum =
        buildFor(b, loc, startIn, end, c1, zeros, [&](Value r, Value acc) {
          Value srcRow = buildIfElse(
              b, loc, index, hasIds,
              [&] {
                return toIndex(
                    b, loc,
                    memref::LoadOp::create(b, loc, rowIds, r).getResult());
              },
              [&] { return r; });
          Value valid =
              arith::CmpIOp::create(b, loc, Pred::ult, srcRow, numSrcRows);
          return buildIfElse(
              b, loc, wideF32, valid,
              [&] {
                Value base = arith::MulIOp::create(b, loc, srcRow, cols);
                Value at = arith::AddIOp::create(b, loc, base, col);
                Value v = vector::LoadOp::create(b, loc, wideBf16, src, at,
                                                 /*nontemporal=*/false, align);
                Value vf = arith::ExtFOp::create(b, loc, wideF32, v);
                Value scale = buildIfElse(
                    b, loc, f32, hasScales,
                    [&] {
                      return memref::LoadOp::create(b, loc, scales, r)
                          .getResult();
                    },
                    [&] { return one; });
                Value sv = vector::BroadcastOp::create(b, loc, wideF32, scale);
                Value scaled = arith::MulFOp::create(b, loc, sv, vf);
                return arith::AddFOp::create(b, loc, acc, scaled).getResult();
              },
              [&] { return acc; });
        });
    Value sliceRow = arith::AddIOp::create(
        b, loc, arith::MulIOp::create(b, loc, s, numExperts), e);
    Value outBase = arith::MulIOp::create(b, loc, sliceRow, cols);
    Value outAt = arith::AddIOp::create(b, loc, outBase, col);
    vector::StoreOp::create(b, loc, sum, out, outAt, /*nontemporal=*/false,
                            align);
  });
  gpu::ReturnOp::create(b, loc);
}

void mlir::moe::kernels::buildBiasDWeightsKernel(OpBuilder &b, Location loc) {
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type(), index = b.getIndexType();
  MemRefType rowsBuffer = flatBuffer(bf16);
  MemRefType ids = flatBuffer(b.getI32Type());
  gpu::GPUFuncOp kernel =
      createKernel(b, loc, "moe_bias_dweights",
                   {rowsBuffer, rowsBuffer, ids, ids, index, index, index,
                    index, index, flatBuffer(f32)});
  Value dout = kernel.getArgument(0), bDown = kernel.getArgument(1),
        rows = kernel.getArgument(2), offsets = kernel.getArgument(3),
        numExperts = kernel.getArgument(4), numSlots = kernel.getArgument(5),
        k = kernel.getArgument(6), numRows = kernel.getArgument(7),
        d = kernel.getArgument(8), dWeights = kernel.getArgument(9);
  auto wideF32 = VectorType::get({kColumns}, f32);

  // A warp a slot s = t * k + j with row r = rows[s] of expert e
  // (offsets[e] <= r < offsets[e + 1]): d_weights[s] += <dout[t], b_down[e]>
  // in f32, each lane's columns 8 apart in order, then the lanes by xor
  // shuffles. A slot without a row (dropped) keeps its d_weights.
  WarpSlot warp = buildWarpSlot(b, loc, rows, numSlots);
  Value lane = warp.lane, slot = warp.slot, inSlots = warp.inSlots,
        r32 = warp.row;
  Value c0 = indexConstant(b, loc, 0);
  Value c1 = indexConstant(b, loc, 1);
  Value c8 = indexConstant(b, loc, kColumns);
  Value stride = indexConstant(b, loc, kColumns * kWarp);
  Value zeroF = f32Constant(b, loc, 0.0f);
  Value zeros = floatConstant(b, loc, wideF32, 0.0);
  Value row = toIndex(b, loc, r32);
  Value hasRow = arith::CmpIOp::create(b, loc, Pred::ult, row, numRows);
  // (the warp reads the same words)
  Value expert = expertOfRow(b, loc, offsets, numExperts, row, c0, c1);
  Value t = divU32(b, loc, slot, k);
  Value outBase = arith::MulIOp::create(b, loc, t, d);
  Value biasBase = arith::MulIOp::create(b, loc, expert, d);
  Value col0 = arith::MulIOp::create(b, loc, lane, c8);
  Value end = arith::SelectOp::create(b, loc, hasRow, d, c0);
  Value part = buildWarpRowDot(b, loc, dout, outBase, bDown, biasBase, col0,
                               end, stride, zeros, zeroF);
  Value lead = arith::CmpIOp::create(b, loc, Pred::eq, lane, c0);
  Value store = arith::AndIOp::create(
      b, loc, arith::AndIOp::create(b, loc, lead, inSlots), hasRow);
  buildIf(b, loc, store, [&] {
    Value held = memref::LoadOp::create(b, loc, dWeights, slot);
    Value sum = arith::AddFOp::create(b, loc, held, part);
    memref::StoreOp::create(b, loc, sum, dWeights, slot);
  });
  gpu::ReturnOp::create(b, loc);
}
