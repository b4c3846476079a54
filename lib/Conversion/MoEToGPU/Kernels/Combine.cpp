//===- Combine.cpp - gathers, sums and repacks of expert-ordered rows -----===//
//
// The combine's gather-sums (a block a token, 8 columns a thread), the routing
// weights and their gradient in row order, the sum of a split weight
// gradient's slices, and the router matrices' column padding.
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

namespace {

/// Columns a thread of the gather-sums takes: one 16-byte vector of bf16.
constexpr int64_t kGatherColumns = 8;

/// out[t, :] = sum over j < k of w[t, j] * src[rows[t, j], :] in f32 (w = 1
/// without weights, rows < 0 skipped), j ascending. With `accumulate`
/// (moe_gather_sum_acc) the sum starts from out's values instead of zero:
/// out's 8 values are loaded before the sum over j, just after the out index
/// is computed, and stored back after it.
void buildGatherSum(OpBuilder &b, Location loc, StringRef name,
                    bool accumulate) {
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type(), i32 = b.getI32Type(),
       index = b.getIndexType();
  MemRefType bf16Buffer = flatBuffer(bf16);
  gpu::GPUFuncOp kernel =
      createKernel(b, loc, name,
                   {bf16Buffer, flatBuffer(i32), flatBuffer(f32), b.getI1Type(),
                    index, index, index, bf16Buffer});
  Value src = kernel.getArgument(0), rows = kernel.getArgument(1),
        weights = kernel.getArgument(2), hasWeights = kernel.getArgument(3),
        numTokens = kernel.getArgument(4), k = kernel.getArgument(5),
        d = kernel.getArgument(6), out = kernel.getArgument(7);
  auto wideF32 = VectorType::get({kGatherColumns}, f32);
  auto wideBf16 = VectorType::get({kGatherColumns}, bf16);
  llvm::MaybeAlign align(16);

  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value t = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value c0 = indexConstant(b, loc, 0);
  Value c1 = indexConstant(b, loc, 1);
  Value c8 = indexConstant(b, loc, kGatherColumns);
  Value stride = indexConstant(b, loc, kGatherColumns * kSimpleThreads);
  Value zero = i32Constant(b, loc, 0);
  Value one = f32Constant(b, loc, 1.0f);
  Value zeros;
  if (!accumulate)
    zeros = floatConstant(b, loc, wideF32, 0.0);
  Value ok =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, t, numTokens);
  buildIf(b, loc, ok, [&] {
    Value slotBase = arith::MulIOp::create(b, loc, t, k);
    Value outBase = arith::MulIOp::create(b, loc, t, d);
    Value col0 = arith::MulIOp::create(b, loc, tid, c8);
    buildFor(b, loc, col0, d, stride, [&](Value col) {
      Value outIndex, init = zeros;
      if (accumulate) {
        outIndex = arith::AddIOp::create(b, loc, outBase, col);
        Value held = vector::LoadOp::create(b, loc, wideBf16, out, outIndex,
                                            /*nontemporal=*/false, align);
        init = arith::ExtFOp::create(b, loc, wideF32, held);
      }
      Value sum = buildFor(b, loc, c0, k, c1, init, [&](Value j, Value acc) {
        Value slot = arith::AddIOp::create(b, loc, slotBase, j);
        Value r = memref::LoadOp::create(b, loc, rows, slot);
        Value valid =
            arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sge, r, zero);
        return buildIfElse(
            b, loc, wideF32, valid,
            [&] {
              Value ri = arith::IndexCastOp::create(b, loc, index, r);
              Value src0 = arith::MulIOp::create(b, loc, ri, d);
              Value srcIndex = arith::AddIOp::create(b, loc, src0, col);
              Value v = vector::LoadOp::create(b, loc, wideBf16, src, srcIndex,
                                               /*nontemporal=*/false, align);
              Value vf = arith::ExtFOp::create(b, loc, wideF32, v);
              Value w = buildIfElse(
                  b, loc, f32, hasWeights,
                  [&] {
                    return memref::LoadOp::create(b, loc, weights, slot)
                        .getResult();
                  },
                  [&] { return one; });
              Value wb = vector::BroadcastOp::create(b, loc, wideF32, w);
              Value product = arith::MulFOp::create(b, loc, vf, wb);
              return arith::AddFOp::create(b, loc, acc, product).getResult();
            },
            [&] { return acc; });
      });
      Value rounded = arith::TruncFOp::create(b, loc, wideBf16, sum);
      if (!accumulate)
        outIndex = arith::AddIOp::create(b, loc, outBase, col);
      vector::StoreOp::create(b, loc, rounded, out, outIndex,
                              /*nontemporal=*/false, align);
    });
  });
  gpu::ReturnOp::create(b, loc);
}

/// dst[r, c] = src[r, c] for c < ncopy, else 0, for c < cdst: src's rows of
/// csrc columns repacked to cdst columns.
void buildRepack(OpBuilder &b, Location loc, StringRef name, Type element) {
  Type index = b.getIndexType();
  MemRefType buffer = flatBuffer(element);
  gpu::GPUFuncOp kernel =
      createKernel(b, loc, name, {buffer, buffer, index, index, index, index});
  Value src = kernel.getArgument(0), dst = kernel.getArgument(1),
        numRows = kernel.getArgument(2), srcCols = kernel.getArgument(3),
        dstCols = kernel.getArgument(4), copyCols = kernel.getArgument(5);

  Value gid = buildGlobalThreadId(b, loc);
  Value zero = floatConstant(b, loc, element, 0.0);
  Value total = arith::MulIOp::create(b, loc, numRows, dstCols);
  Value in =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, gid, total);
  buildIf(b, loc, in, [&] {
    Value r = arith::DivUIOp::create(b, loc, gid, dstCols);
    Value col = arith::RemUIOp::create(b, loc, gid, dstCols);
    Value keep =
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, col, copyCols);
    Value v = buildIfElse(
        b, loc, element, keep,
        [&] {
          Value si0 = arith::MulIOp::create(b, loc, r, srcCols);
          Value si = arith::AddIOp::create(b, loc, si0, col);
          return memref::LoadOp::create(b, loc, src, si).getResult();
        },
        [&] { return zero; });
    memref::StoreOp::create(b, loc, v, dst, gid);
  });
  gpu::ReturnOp::create(b, loc);
}

/// dst[r, c] = bf16(sum over s of src[s, r, c]) in f32, s ascending: the
/// slices of a split reduction, each `numRows` rows of `srcCols` columns,
/// summed into `numRows` rows of `dstCols`.
void buildSumSplits(OpBuilder &b, Location loc, StringRef name, Type element) {
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type(), index = b.getIndexType();
  gpu::GPUFuncOp kernel = createKernel(
      b, loc, name,
      {flatBuffer(element), flatBuffer(bf16), index, index, index, index});
  Value src = kernel.getArgument(0), dst = kernel.getArgument(1),
        numRows = kernel.getArgument(2), srcCols = kernel.getArgument(3),
        dstCols = kernel.getArgument(4), numSlices = kernel.getArgument(5);

  Value gid = buildGlobalThreadId(b, loc);
  Value c0 = indexConstant(b, loc, 0);
  Value c1 = indexConstant(b, loc, 1);
  Value zero = f32Constant(b, loc, 0.0f);
  Value total = arith::MulIOp::create(b, loc, numRows, dstCols);
  Value in =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, gid, total);
  buildIf(b, loc, in, [&] {
    Value r = arith::DivUIOp::create(b, loc, gid, dstCols);
    Value col = arith::RemUIOp::create(b, loc, gid, dstCols);
    Value row0 = arith::MulIOp::create(b, loc, r, srcCols);
    Value at = arith::AddIOp::create(b, loc, row0, col);
    Value slice = arith::MulIOp::create(b, loc, numRows, srcCols);
    // The slices in order of s, summed in f32.
    Value sum =
        buildFor(b, loc, c0, numSlices, c1, zero, [&](Value s, Value acc) {
          Value offset = arith::MulIOp::create(b, loc, s, slice);
          Value i = arith::AddIOp::create(b, loc, offset, at);
          Value v = memref::LoadOp::create(b, loc, src, i);
          Value vf = element == f32 ? v : arith::ExtFOp::create(b, loc, f32, v);
          return arith::AddFOp::create(b, loc, acc, vf).getResult();
        });
    Value rounded = arith::TruncFOp::create(b, loc, bf16, sum);
    memref::StoreOp::create(b, loc, rounded, dst, gid);
  });
  gpu::ReturnOp::create(b, loc);
}

} // namespace

void mlir::moe::kernels::buildGatherSumKernel(OpBuilder &b, Location loc) {
  buildGatherSum(b, loc, "moe_gather_sum", /*accumulate=*/false);
}

void mlir::moe::kernels::buildGatherSumAccKernel(OpBuilder &b, Location loc) {
  buildGatherSum(b, loc, "moe_gather_sum_acc", /*accumulate=*/true);
}

void mlir::moe::kernels::buildScatterWeightsKernel(OpBuilder &b, Location loc) {
  Type f32 = b.getF32Type(), i32 = b.getI32Type();
  gpu::GPUFuncOp kernel = createKernel(
      b, loc, "moe_scatter_weights",
      {flatBuffer(f32), flatBuffer(i32), b.getIndexType(), flatBuffer(f32)});
  Value weights = kernel.getArgument(0), rows = kernel.getArgument(1),
        numSlots = kernel.getArgument(2), rowWeights = kernel.getArgument(3);

  Value gid = buildGlobalThreadId(b, loc);
  Value zero = i32Constant(b, loc, 0);
  Value in =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, gid, numSlots);
  buildIf(b, loc, in, [&] {
    Value r = memref::LoadOp::create(b, loc, rows, gid);
    Value ok =
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sge, r, zero);
    buildIf(b, loc, ok, [&] {
      Value ri = arith::IndexCastOp::create(b, loc, b.getIndexType(), r);
      Value w = memref::LoadOp::create(b, loc, weights, gid);
      memref::StoreOp::create(b, loc, w, rowWeights, ri);
    });
  });
  gpu::ReturnOp::create(b, loc);
}

void mlir::moe::kernels::buildDWeightsKernel(OpBuilder &b, Location loc) {
  Type f32 = b.getF32Type(), index = b.getIndexType();
  gpu::GPUFuncOp kernel =
      createKernel(b, loc, "moe_dweights",
                   {flatBuffer(f32), flatBuffer(b.getI32Type()), index, index,
                    flatBuffer(f32)});
  Value partials = kernel.getArgument(0), rows = kernel.getArgument(1),
        numSlots = kernel.getArgument(2), numTiles = kernel.getArgument(3),
        dWeights = kernel.getArgument(4);

  Value gid = buildGlobalThreadId(b, loc);
  Value c0 = indexConstant(b, loc, 0);
  Value c1 = indexConstant(b, loc, 1);
  Value zero = i32Constant(b, loc, 0);
  Value zeroF = f32Constant(b, loc, 0.0f);
  Value in =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, gid, numSlots);
  buildIf(b, loc, in, [&] {
    Value r = memref::LoadOp::create(b, loc, rows, gid);
    Value ok =
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sge, r, zero);
    // The row's partials over the N tiles, in tile order; 0 for no row.
    Value s = buildIfElse(
        b, loc, f32, ok,
        [&] {
          Value ri = arith::IndexCastOp::create(b, loc, index, r);
          Value base = arith::MulIOp::create(b, loc, ri, numTiles);
          return buildFor(
              b, loc, c0, numTiles, c1, zeroF, [&](Value i, Value acc) {
                Value ii = arith::AddIOp::create(b, loc, base, i);
                Value p = memref::LoadOp::create(b, loc, partials, ii);
                return arith::AddFOp::create(b, loc, acc, p).getResult();
              });
        },
        [&] { return zeroF; });
    memref::StoreOp::create(b, loc, s, dWeights, gid);
  });
  gpu::ReturnOp::create(b, loc);
}

void mlir::moe::kernels::buildRepackBf16Kernel(OpBuilder &b, Location loc) {
  buildRepack(b, loc, "moe_repack_bf16", b.getBF16Type());
}

void mlir::moe::kernels::buildRepackF32Kernel(OpBuilder &b, Location loc) {
  buildRepack(b, loc, "moe_repack_f32", b.getF32Type());
}

void mlir::moe::kernels::buildSumSplitsBf16Kernel(OpBuilder &b, Location loc) {
  buildSumSplits(b, loc, "moe_sum_splits_bf16", b.getBF16Type());
}

void mlir::moe::kernels::buildSumSplitsF32Kernel(OpBuilder &b, Location loc) {
  buildSumSplits(b, loc, "moe_sum_splits_f32", b.getF32Type());
}
