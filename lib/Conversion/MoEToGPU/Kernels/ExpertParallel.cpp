//===- ExpertParallel.cpp - row copies and queues of expert parallelism ---===//
//
// The kernels of the local expert-parallel ops (moe.ep_pack, ep_unpack,
// ep_queues) and of moe.gather_rows / scatter_rows. Every row move is one
// gather, moe_gather_rows (a block a row, 8 columns a thread by 16-byte
// vectors, a zero row for an index outside the source): the small kernels
// before it turn each op's layout into the source row of every result row.
// Each index read from memory is checked against the buffer it indexes before
// use; a bad one gives a zero row or is skipped.
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

/// Columns a thread of the row kernels moves at once: one 16-byte vector of
/// bf16.
constexpr int64_t kRowColumns = 8;

/// Rank `s`'s block of the dispatch offsets (`numOffsets` of them, E + 1,
/// with `local` experts a rank): its first row offsets[s * local], the rows
/// it has (offsets[(s + 1) * local] - first, at least 0) and those kept (at
/// most `capacity`), and whether the block lies inside the offsets (else it
/// is empty).
struct RankBlock {
  Value first, rows, kept, inside;
};

RankBlock loadRankBlock(OpBuilder &b, Location loc, Value offsets,
                        Value numOffsets, Value s, Value local,
                        Value capacity) {
  Type i32 = b.getI32Type(), index = b.getIndexType();
  Value c0 = indexConstant(b, loc, 0);
  Value zero = i32Constant(b, loc, 0);
  Value firstIndex = arith::MulIOp::create(b, loc, s, local);
  Value lastIndex = arith::AddIOp::create(b, loc, firstIndex, local);
  Value inside =
      arith::CmpIOp::create(b, loc, Pred::ult, lastIndex, numOffsets);
  auto load = [&](Value at) {
    return buildIfElse(
        b, loc, i32, inside,
        [&] { return memref::LoadOp::create(b, loc, offsets, at).getResult(); },
        [&] { return zero; });
  };
  Value first32 = load(firstIndex);
  Value last32 = load(lastIndex);
  Value first = arith::IndexCastOp::create(b, loc, index, first32);
  Value last = arith::IndexCastOp::create(b, loc, index, last32);
  Value span = arith::SubIOp::create(b, loc, last, first);
  Value rows = arith::MaxSIOp::create(b, loc, span, c0);
  Value kept = arith::MinSIOp::create(b, loc, rows, capacity);
  return {first, rows, kept, inside};
}

/// An i32 of an index value (the kernels' indices fit: row counts are below
/// 2^31).
Value toI32(OpBuilder &b, Location loc, Value index) {
  return arith::IndexCastOp::create(b, loc, b.getI32Type(), index);
}

} // namespace

void mlir::moe::kernels::buildGatherRowsKernel(OpBuilder &b, Location loc) {
  Type bf16 = b.getBF16Type(), index = b.getIndexType();
  MemRefType rowsBuffer = flatBuffer(bf16);
  gpu::GPUFuncOp kernel = createKernel(b, loc, "moe_gather_rows",
                                       {rowsBuffer, flatBuffer(b.getI32Type()),
                                        index, index, index, rowsBuffer});
  Value src = kernel.getArgument(0), indices = kernel.getArgument(1),
        numSrc = kernel.getArgument(2), numRows = kernel.getArgument(3),
        d = kernel.getArgument(4), out = kernel.getArgument(5);
  auto wide = VectorType::get({kRowColumns}, bf16);
  llvm::MaybeAlign align(16);

  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value row = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value c8 = indexConstant(b, loc, kRowColumns);
  Value stride = indexConstant(b, loc, kRowColumns * kSimpleThreads);
  Value zeros = floatConstant(b, loc, wide, 0.0);
  Value ok = arith::CmpIOp::create(b, loc, Pred::ult, row, numRows);
  buildIf(b, loc, ok, [&] {
    Value at = memref::LoadOp::create(b, loc, indices, row);
    CheckedIndex source = checkIndex(b, loc, at, numSrc);
    Value outBase = arith::MulIOp::create(b, loc, row, d);
    Value col0 = arith::MulIOp::create(b, loc, tid, c8);
    buildIfElse(
        b, loc, source.valid,
        [&] {
          Value srcBase = arith::MulIOp::create(b, loc, source.index, d);
          buildFor(b, loc, col0, d, stride, [&](Value col) {
            Value srcIndex = arith::AddIOp::create(b, loc, srcBase, col);
            Value v = vector::LoadOp::create(b, loc, wide, src, srcIndex,
                                             /*nontemporal=*/false, align);
            Value outIndex = arith::AddIOp::create(b, loc, outBase, col);
            vector::StoreOp::create(b, loc, v, out, outIndex,
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

void mlir::moe::kernels::buildInvertRowsKernel(OpBuilder &b, Location loc) {
  Type i32 = b.getI32Type(), index = b.getIndexType();
  MemRefType buffer = flatBuffer(i32);
  gpu::GPUFuncOp kernel =
      createKernel(b, loc, "moe_invert_rows", {buffer, index, index, buffer});
  Value indices = kernel.getArgument(0), numIndices = kernel.getArgument(1),
        numOut = kernel.getArgument(2), inverse = kernel.getArgument(3);

  // inverse[indices[i]] = i; of two i with one index the larger wins (an
  // atomic max over -1), as the last write does in order.
  Value gid = buildGlobalThreadId(b, loc);
  Value in = arith::CmpIOp::create(b, loc, Pred::ult, gid, numIndices);
  buildIf(b, loc, in, [&] {
    Value at = memref::LoadOp::create(b, loc, indices, gid);
    CheckedIndex target = checkIndex(b, loc, at, numOut);
    buildIf(b, loc, target.valid, [&] {
      Value i = toI32(b, loc, gid);
      memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::maxs, i,
                                  inverse, target.index);
    });
  });
  gpu::ReturnOp::create(b, loc);
}

void mlir::moe::kernels::buildEPPackRowsKernel(OpBuilder &b, Location loc) {
  Type i32 = b.getI32Type(), index = b.getIndexType();
  MemRefType buffer = flatBuffer(i32);
  gpu::GPUFuncOp kernel =
      createKernel(b, loc, "moe_ep_pack_rows",
                   {buffer, index, buffer, index, b.getI1Type(), index, index,
                    index, index, buffer, buffer, buffer});
  Value offsets = kernel.getArgument(0), numOffsets = kernel.getArgument(1),
        tokenIds = kernel.getArgument(2), numIds = kernel.getArgument(3),
        gather = kernel.getArgument(4), ranks = kernel.getArgument(5),
        local = kernel.getArgument(6), capacity = kernel.getArgument(7),
        numSlots = kernel.getArgument(8), sources = kernel.getArgument(9),
        counts = kernel.getArgument(10), dropped = kernel.getArgument(11);

  Value gid = buildGlobalThreadId(b, loc);
  Value c0 = indexConstant(b, loc, 0);
  Value minusOne = i32Constant(b, loc, -1);
  // Slot gid = s * C + j of the send rows: the source row of its block's
  // row j where j is kept (the id of that row with gather), else -1.
  Value inSlots = arith::CmpIOp::create(b, loc, Pred::ult, gid, numSlots);
  buildIf(b, loc, inSlots, [&] {
    Value s = arith::DivUIOp::create(b, loc, gid, capacity);
    Value sc = arith::MulIOp::create(b, loc, s, capacity);
    Value j = arith::SubIOp::create(b, loc, gid, sc);
    Value inRanks = arith::CmpIOp::create(b, loc, Pred::ult, s, ranks);
    Value v = buildIfElse(
        b, loc, i32, inRanks,
        [&] {
          RankBlock block =
              loadRankBlock(b, loc, offsets, numOffsets, s, local, capacity);
          Value isKept =
              arith::CmpIOp::create(b, loc, Pred::slt, j, block.kept);
          Value i = arith::AddIOp::create(b, loc, block.first, j);
          Value inIds = arith::CmpIOp::create(b, loc, Pred::ult, i, numIds);
          Value valid = arith::AndIOp::create(b, loc, isKept, inIds);
          return buildIfElse(
              b, loc, i32, valid,
              [&] {
                return buildIfElse(
                    b, loc, i32, gather,
                    [&] {
                      return memref::LoadOp::create(b, loc, tokenIds, i)
                          .getResult();
                    },
                    [&] { return toI32(b, loc, i); });
              },
              [&] { return minusOne; });
        },
        [&] { return minusOne; });
    memref::StoreOp::create(b, loc, v, sources, gid);
  });
  // Expert gid = s * El + e: its rows among the kept prefix of rank s's
  // block.
  Value numCounts = arith::MulIOp::create(b, loc, ranks, local);
  Value inCounts = arith::CmpIOp::create(b, loc, Pred::ult, gid, numCounts);
  buildIf(b, loc, inCounts, [&] {
    Value s = arith::DivUIOp::create(b, loc, gid, local);
    RankBlock block =
        loadRankBlock(b, loc, offsets, numOffsets, s, local, capacity);
    Value end = arith::AddIOp::create(b, loc, block.first, block.kept);
    Value next = arith::AddIOp::create(b, loc, gid, indexConstant(b, loc, 1));
    // Experts gid and gid + 1 lie in the block, so inside the offsets where
    // it does.
    Value n = buildIfElse(
        b, loc, index, block.inside,
        [&] {
          Value lo32 = memref::LoadOp::create(b, loc, offsets, gid);
          Value hi32 = memref::LoadOp::create(b, loc, offsets, next);
          Value lo = arith::IndexCastOp::create(b, loc, index, lo32);
          Value hi = arith::IndexCastOp::create(b, loc, index, hi32);
          Value loKept = arith::MinSIOp::create(b, loc, lo, end);
          Value hiKept = arith::MinSIOp::create(b, loc, hi, end);
          Value span = arith::SubIOp::create(b, loc, hiKept, loKept);
          return arith::MaxSIOp::create(b, loc, span, c0).getResult();
        },
        [&] { return c0; });
    memref::StoreOp::create(b, loc, toI32(b, loc, n), counts, gid);
  });
  // Rank gid: its rows past the capacity.
  Value inRanks = arith::CmpIOp::create(b, loc, Pred::ult, gid, ranks);
  buildIf(b, loc, inRanks, [&] {
    RankBlock block =
        loadRankBlock(b, loc, offsets, numOffsets, gid, local, capacity);
    Value over = arith::SubIOp::create(b, loc, block.rows, block.kept);
    memref::StoreOp::create(b, loc, toI32(b, loc, over), dropped, gid);
  });
  gpu::ReturnOp::create(b, loc);
}

void mlir::moe::kernels::buildEPUnpackRowsKernel(OpBuilder &b, Location loc) {
  Type index = b.getIndexType();
  MemRefType buffer = flatBuffer(b.getI32Type());
  gpu::GPUFuncOp kernel =
      createKernel(b, loc, "moe_ep_unpack_rows",
                   {buffer, index, index, index, index, index, buffer});
  Value offsets = kernel.getArgument(0), numOffsets = kernel.getArgument(1),
        ranks = kernel.getArgument(2), local = kernel.getArgument(3),
        capacity = kernel.getArgument(4), numRows = kernel.getArgument(5),
        sources = kernel.getArgument(6);

  // Slot gid = s * C + j of the returned rows goes back to row
  // offsets[s * El] + j where j is kept: sources[row] = gid. Of two slots
  // with one row (overlapping blocks) the larger wins, as the later rank's
  // write does in order.
  Value gid = buildGlobalThreadId(b, loc);
  Value slots = arith::MulIOp::create(b, loc, ranks, capacity);
  Value inSlots = arith::CmpIOp::create(b, loc, Pred::ult, gid, slots);
  buildIf(b, loc, inSlots, [&] {
    Value s = arith::DivUIOp::create(b, loc, gid, capacity);
    Value sc = arith::MulIOp::create(b, loc, s, capacity);
    Value j = arith::SubIOp::create(b, loc, gid, sc);
    RankBlock block =
        loadRankBlock(b, loc, offsets, numOffsets, s, local, capacity);
    Value isKept = arith::CmpIOp::create(b, loc, Pred::slt, j, block.kept);
    Value row = arith::AddIOp::create(b, loc, block.first, j);
    Value inRows = arith::CmpIOp::create(b, loc, Pred::ult, row, numRows);
    Value valid = arith::AndIOp::create(b, loc, isKept, inRows);
    buildIf(b, loc, valid, [&] {
      Value slot = toI32(b, loc, gid);
      memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::maxs, slot,
                                  sources, row);
    });
  });
  gpu::ReturnOp::create(b, loc);
}

void mlir::moe::kernels::buildEPUnpackSumKernel(OpBuilder &b, Location loc) {
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type(), index = b.getIndexType();
  MemRefType rowsBuffer = flatBuffer(bf16);
  MemRefType buffer = flatBuffer(b.getI32Type());
  gpu::GPUFuncOp kernel =
      createKernel(b, loc, "moe_ep_unpack_sum",
                   {rowsBuffer, buffer, buffer, index, index, index, index,
                    index, rowsBuffer});
  Value src = kernel.getArgument(0), sources = kernel.getArgument(1),
        rowsOf = kernel.getArgument(2), numSrc = kernel.getArgument(3),
        numRows = kernel.getArgument(4), numTokens = kernel.getArgument(5),
        k = kernel.getArgument(6), d = kernel.getArgument(7),
        out = kernel.getArgument(8);
  auto wideF32 = VectorType::get({kRowColumns}, f32);
  auto wideBf16 = VectorType::get({kRowColumns}, bf16);
  llvm::MaybeAlign align(16);

  // out[t] = sum over j < k, in order, of the unpacked row rows_of[t, j]
  // (returned row sources[r], zero for a row nothing returned) in f32,
  // rounded once: moe_gather_sum's order and arithmetic without weights.
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value t = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value c0 = indexConstant(b, loc, 0);
  Value c1 = indexConstant(b, loc, 1);
  Value c8 = indexConstant(b, loc, kRowColumns);
  Value stride = indexConstant(b, loc, kRowColumns * kSimpleThreads);
  Value zeros = floatConstant(b, loc, wideF32, 0.0);
  Value ok = arith::CmpIOp::create(b, loc, Pred::ult, t, numTokens);
  buildIf(b, loc, ok, [&] {
    Value slotBase = arith::MulIOp::create(b, loc, t, k);
    Value outBase = arith::MulIOp::create(b, loc, t, d);
    Value col0 = arith::MulIOp::create(b, loc, tid, c8);
    buildFor(b, loc, col0, d, stride, [&](Value col) {
      Value sum = buildFor(b, loc, c0, k, c1, zeros, [&](Value j, Value acc) {
        Value slot = arith::AddIOp::create(b, loc, slotBase, j);
        Value r = memref::LoadOp::create(b, loc, rowsOf, slot);
        CheckedIndex row = checkIndex(b, loc, r, numRows);
        return buildIfElse(
            b, loc, wideF32, row.valid,
            [&] {
              Value m = memref::LoadOp::create(b, loc, sources, row.index);
              CheckedIndex source = checkIndex(b, loc, m, numSrc);
              return buildIfElse(
                  b, loc, wideF32, source.valid,
                  [&] {
                    Value src0 = arith::MulIOp::create(b, loc, source.index, d);
                    Value srcIndex = arith::AddIOp::create(b, loc, src0, col);
                    Value v =
                        vector::LoadOp::create(b, loc, wideBf16, src, srcIndex,
                                               /*nontemporal=*/false, align);
                    Value vf = arith::ExtFOp::create(b, loc, wideF32, v);
                    return arith::AddFOp::create(b, loc, acc, vf).getResult();
                  },
                  [&] { return acc; });
            },
            [&] { return acc; });
      });
      Value rounded = arith::TruncFOp::create(b, loc, wideBf16, sum);
      Value outIndex = arith::AddIOp::create(b, loc, outBase, col);
      vector::StoreOp::create(b, loc, rounded, out, outIndex,
                              /*nontemporal=*/false, align);
    });
  });
  gpu::ReturnOp::create(b, loc);
}

void mlir::moe::kernels::buildEPQueuePlanKernel(OpBuilder &b, Location loc) {
  Type index = b.getIndexType();
  MemRefType buffer = flatBuffer(b.getI32Type());
  gpu::GPUFuncOp kernel =
      createKernel(b, loc, "moe_ep_queue_plan",
                   {buffer, index, index, index, buffer, buffer});
  Value counts = kernel.getArgument(0), ranks = kernel.getArgument(1),
        local = kernel.getArgument(2), capacity = kernel.getArgument(3),
        plan = kernel.getArgument(4), offsets = kernel.getArgument(5);

  // The plan holds, for each (local expert e, rank s) at p = e * S + s (the
  // queue order): the rows taken (counts[s, e] cut at what is left of rank
  // s's C), their first received row, and their first queue position.
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value c0 = indexConstant(b, loc, 0);
  Value c1 = indexConstant(b, loc, 1);
  Value threads = indexConstant(b, loc, kSimpleThreads);
  Value zero = i32Constant(b, loc, 0);
  Value entries = arith::MulIOp::create(b, loc, ranks, local);
  Value startsAt = entries;
  Value queuedAt = arith::AddIOp::create(b, loc, entries, entries);
  // A thread a rank: its experts' rows in order, within its C rows.
  buildFor(b, loc, tid, ranks, threads, [&](Value s) {
    Value base = arith::MulIOp::create(b, loc, s, capacity);
    Value countBase = arith::MulIOp::create(b, loc, s, local);
    buildFor(b, loc, c0, local, c1, c0, [&](Value e, Value used) {
      Value ci = arith::AddIOp::create(b, loc, countBase, e);
      Value n32 = memref::LoadOp::create(b, loc, counts, ci);
      Value n = arith::IndexCastOp::create(b, loc, index, n32);
      Value positive = arith::MaxSIOp::create(b, loc, n, c0);
      Value room = arith::SubIOp::create(b, loc, capacity, used);
      Value take = arith::MinSIOp::create(b, loc, positive, room);
      Value p0 = arith::MulIOp::create(b, loc, e, ranks);
      Value p = arith::AddIOp::create(b, loc, p0, s);
      memref::StoreOp::create(b, loc, toI32(b, loc, take), plan, p);
      Value start = arith::AddIOp::create(b, loc, base, used);
      Value sp = arith::AddIOp::create(b, loc, startsAt, p);
      memref::StoreOp::create(b, loc, toI32(b, loc, start), plan, sp);
      return arith::AddIOp::create(b, loc, used, take).getResult();
    });
  });
  gpu::BarrierOp::create(b, loc);
  // A thread an expert: its rows over the ranks, into offsets[e + 1].
  buildFor(b, loc, tid, local, threads, [&](Value e) {
    Value p0 = arith::MulIOp::create(b, loc, e, ranks);
    Value total =
        buildFor(b, loc, c0, ranks, c1, zero, [&](Value s, Value run) {
          Value p = arith::AddIOp::create(b, loc, p0, s);
          Value take = memref::LoadOp::create(b, loc, plan, p);
          return arith::AddIOp::create(b, loc, run, take).getResult();
        });
    Value e1 = arith::AddIOp::create(b, loc, e, c1);
    memref::StoreOp::create(b, loc, total, offsets, e1);
  });
  gpu::BarrierOp::create(b, loc);
  // Thread 0 turns the totals into offsets.
  Value first = arith::CmpIOp::create(b, loc, Pred::eq, tid, c0);
  buildIf(b, loc, first, [&] {
    memref::StoreOp::create(b, loc, zero, offsets, c0);
    buildFor(b, loc, c0, local, c1, zero, [&](Value e, Value acc) {
      Value e1 = arith::AddIOp::create(b, loc, e, c1);
      Value n = memref::LoadOp::create(b, loc, offsets, e1);
      Value next = arith::AddIOp::create(b, loc, acc, n);
      memref::StoreOp::create(b, loc, next, offsets, e1);
      return next;
    });
  });
  gpu::BarrierOp::create(b, loc);
  // A thread an expert: each rank's first queue position.
  buildFor(b, loc, tid, local, threads, [&](Value e) {
    Value p0 = arith::MulIOp::create(b, loc, e, ranks);
    Value from = memref::LoadOp::create(b, loc, offsets, e);
    buildFor(b, loc, c0, ranks, c1, from, [&](Value s, Value run) {
      Value p = arith::AddIOp::create(b, loc, p0, s);
      Value qp = arith::AddIOp::create(b, loc, queuedAt, p);
      memref::StoreOp::create(b, loc, run, plan, qp);
      Value take = memref::LoadOp::create(b, loc, plan, p);
      return arith::AddIOp::create(b, loc, run, take).getResult();
    });
  });
  gpu::ReturnOp::create(b, loc);
}

void mlir::moe::kernels::buildEPQueueFillKernel(OpBuilder &b, Location loc) {
  Type index = b.getIndexType();
  MemRefType buffer = flatBuffer(b.getI32Type());
  gpu::GPUFuncOp kernel =
      createKernel(b, loc, "moe_ep_queue_fill",
                   {buffer, index, index, buffer, index, buffer});
  Value plan = kernel.getArgument(0), entries = kernel.getArgument(1),
        local = kernel.getArgument(2), offsets = kernel.getArgument(3),
        numSlots = kernel.getArgument(4), tokenIds = kernel.getArgument(5);

  // Block p writes the queue run of plan entry p; then every block writes
  // -1 to its share of the slots past the queues.
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value p = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value blocks = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);
  Value c0 = indexConstant(b, loc, 0);
  Value threads = indexConstant(b, loc, kSimpleThreads);
  Value minusOne = i32Constant(b, loc, -1);
  Value inEntries = arith::CmpIOp::create(b, loc, Pred::ult, p, entries);
  buildIf(b, loc, inEntries, [&] {
    Value take32 = memref::LoadOp::create(b, loc, plan, p);
    Value sp = arith::AddIOp::create(b, loc, entries, p);
    Value start = memref::LoadOp::create(b, loc, plan, sp);
    Value twice = arith::AddIOp::create(b, loc, entries, entries);
    Value qp = arith::AddIOp::create(b, loc, twice, p);
    Value queued32 = memref::LoadOp::create(b, loc, plan, qp);
    Value take = arith::IndexCastOp::create(b, loc, index, take32);
    Value queued = arith::IndexCastOp::create(b, loc, index, queued32);
    buildFor(b, loc, tid, take, threads, [&](Value j) {
      Value q = arith::AddIOp::create(b, loc, queued, j);
      Value inSlots = arith::CmpIOp::create(b, loc, Pred::ult, q, numSlots);
      buildIf(b, loc, inSlots, [&] {
        Value row = arith::AddIOp::create(b, loc, start, toI32(b, loc, j));
        memref::StoreOp::create(b, loc, row, tokenIds, q);
      });
    });
  });
  Value total32 = memref::LoadOp::create(b, loc, offsets, local);
  Value total = arith::IndexCastOp::create(b, loc, index, total32);
  Value tailStart = arith::MaxSIOp::create(b, loc, total, c0);
  Value blockStart = arith::MulIOp::create(b, loc, p, threads);
  Value own = arith::AddIOp::create(b, loc, blockStart, tid);
  Value from = arith::AddIOp::create(b, loc, tailStart, own);
  Value step = arith::MulIOp::create(b, loc, blocks, threads);
  buildFor(b, loc, from, numSlots, step, [&](Value q) {
    memref::StoreOp::create(b, loc, minusOne, tokenIds, q);
  });
  gpu::ReturnOp::create(b, loc);
}
