//===- Dispatch.cpp - routing slots to expert-ordered rows ----------------===//
//
// The dispatch in three kernels (rank within a chunk of 1024 slots and
// per-chunk expert counts; one block's scan of the counts into expert
// offsets; each slot's row and each row's token), and the offsets of the
// grouped kernels' problems (moe_single_offsets, moe_split_offsets).
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"
#include "SimpleKernels.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"

using namespace mlir;
using namespace mlir::moe::kernels;

namespace {

/// Routing slots a block of moe_dispatch_rank ranks (DISPATCH_CHUNK).
constexpr int64_t kDispatchChunk = 1024;

/// A routing slot's expert `x` (i32) as an index, and whether it is one of
/// the `numExperts` experts (0 <= x < E): what the dispatch kernels check
/// before they use a slot.
struct CheckedExpert {
  Value index;
  Value valid;
};

CheckedExpert checkExpert(OpBuilder &b, Location loc, Value x, Value numExperts,
                          Value zero) {
  Value index = arith::IndexCastOp::create(b, loc, b.getIndexType(), x);
  Value notNegative =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sge, x, zero);
  Value below = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::slt, index,
                                      numExperts);
  Value valid = arith::AndIOp::create(b, loc, notNegative, below);
  return {index, valid};
}

} // namespace

void mlir::moe::kernels::buildDispatchRankKernel(OpBuilder &b, Location loc) {
  Type i32 = b.getI32Type(), index = b.getIndexType();
  MemRefType slots = flatBuffer(i32);
  gpu::GPUFuncOp kernel = createKernel(b, loc, "moe_dispatch_rank",
                                       {slots, index, index, slots, slots});
  Value experts = kernel.getArgument(0), numSlots = kernel.getArgument(1),
        numExperts = kernel.getArgument(2), rank = kernel.getArgument(3),
        counts = kernel.getArgument(4);
  // The chunk's experts and its per-expert counts.
  auto chunkType = MemRefType::get(
      {kDispatchChunk}, i32, MemRefLayoutAttrInterface(),
      gpu::AddressSpaceAttr::get(b.getContext(), gpu::AddressSpace::Workgroup));
  Value shared = kernel.addWorkgroupAttribution(chunkType, loc);
  Value sharedCounts = kernel.addWorkgroupAttribution(chunkType, loc);

  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value c0 = indexConstant(b, loc, 0);
  Value c1 = indexConstant(b, loc, 1);
  Value threads = indexConstant(b, loc, kSimpleThreads);
  Value chunk = indexConstant(b, loc, kDispatchChunk);
  Value minusOne = i32Constant(b, loc, -1);
  Value zero = i32Constant(b, loc, 0);
  Value one = i32Constant(b, loc, 1);
  Value base = arith::MulIOp::create(b, loc, bid, chunk);
  // The chunk's experts into shared memory, -1 for an invalid or absent slot.
  buildFor(b, loc, tid, chunk, threads, [&](Value s) {
    Value i = arith::AddIOp::create(b, loc, base, s);
    Value in =
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, i, numSlots);
    Value v = buildIfElse(
        b, loc, i32, in,
        [&] {
          Value x = memref::LoadOp::create(b, loc, experts, i);
          CheckedExpert expert = checkExpert(b, loc, x, numExperts, zero);
          return arith::SelectOp::create(b, loc, expert.valid, x, minusOne)
              .getResult();
        },
        [&] { return minusOne; });
    memref::StoreOp::create(b, loc, v, shared, s);
    memref::StoreOp::create(b, loc, zero, sharedCounts, s);
  });
  gpu::BarrierOp::create(b, loc);
  // A slot's rank: the earlier slots of the chunk with its expert.
  buildFor(b, loc, tid, chunk, threads, [&](Value s) {
    Value i = arith::AddIOp::create(b, loc, base, s);
    Value v = memref::LoadOp::create(b, loc, shared, s);
    Value ok =
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sge, v, zero);
    buildIf(b, loc, ok, [&] {
      Value r = buildFor(b, loc, c0, s, c1, zero, [&](Value j, Value acc) {
        Value w = memref::LoadOp::create(b, loc, shared, j);
        Value same =
            arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, w, v);
        Value inc = arith::SelectOp::create(b, loc, same, one, zero);
        return arith::AddIOp::create(b, loc, acc, inc).getResult();
      });
      memref::StoreOp::create(b, loc, r, rank, i);
      Value vi = arith::IndexCastOp::create(b, loc, index, v);
      memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi, one,
                                  sharedCounts, vi);
    });
  });
  gpu::BarrierOp::create(b, loc);
  Value countBase = arith::MulIOp::create(b, loc, bid, numExperts);
  buildFor(b, loc, tid, numExperts, threads, [&](Value e) {
    Value n = memref::LoadOp::create(b, loc, sharedCounts, e);
    Value ci = arith::AddIOp::create(b, loc, countBase, e);
    memref::StoreOp::create(b, loc, n, counts, ci);
  });
  gpu::ReturnOp::create(b, loc);
}

namespace {

/// moe_dispatch_scan, and with `capped` moe_dispatch_scan_capacity, whose
/// expert totals are at most its `capacity` argument (the pairs an expert
/// keeps). The dropless kernel's ops and their order are its pinned text.
void buildScan(OpBuilder &b, Location loc, StringRef name, bool capped) {
  Type index = b.getIndexType();
  MemRefType buffer = flatBuffer(b.getI32Type());
  SmallVector<Type> argTypes = {buffer, index, index};
  if (capped)
    argTypes.push_back(index);
  argTypes.push_back(buffer);
  gpu::GPUFuncOp kernel = createKernel(b, loc, name, argTypes);
  Value counts = kernel.getArgument(0), numChunks = kernel.getArgument(1),
        numExperts = kernel.getArgument(2),
        offsets = kernel.getArgument(capped ? 4 : 3);
  Value capacity = capped ? kernel.getArgument(3) : Value();

  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value c0 = indexConstant(b, loc, 0);
  Value c1 = indexConstant(b, loc, 1);
  Value threads = indexConstant(b, loc, kSimpleThreads);
  Value zero = i32Constant(b, loc, 0);
  // Per expert: the chunk counts become exclusive prefixes in chunk order,
  // and offsets[e + 1] the expert's total (kept pairs with a capacity).
  buildFor(b, loc, tid, numExperts, threads, [&](Value e) {
    Value total =
        buildFor(b, loc, c0, numChunks, c1, zero, [&](Value ch, Value run) {
          Value i0 = arith::MulIOp::create(b, loc, ch, numExperts);
          Value i = arith::AddIOp::create(b, loc, i0, e);
          Value n = memref::LoadOp::create(b, loc, counts, i);
          memref::StoreOp::create(b, loc, run, counts, i);
          return arith::AddIOp::create(b, loc, run, n).getResult();
        });
    if (capped) {
      Value cap = arith::IndexCastOp::create(b, loc, b.getI32Type(), capacity);
      total = arith::MinUIOp::create(b, loc, total, cap);
    }
    Value e1 = arith::AddIOp::create(b, loc, e, c1);
    memref::StoreOp::create(b, loc, total, offsets, e1);
  });
  gpu::BarrierOp::create(b, loc);
  // Thread 0 turns the totals into offsets.
  Value first =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, tid, c0);
  buildIf(b, loc, first, [&] {
    memref::StoreOp::create(b, loc, zero, offsets, c0);
    buildFor(b, loc, c0, numExperts, c1, zero, [&](Value e, Value acc) {
      Value e1 = arith::AddIOp::create(b, loc, e, c1);
      Value n = memref::LoadOp::create(b, loc, offsets, e1);
      Value next = arith::AddIOp::create(b, loc, acc, n);
      memref::StoreOp::create(b, loc, next, offsets, e1);
      return next;
    });
  });
  gpu::ReturnOp::create(b, loc);
}

/// moe_dispatch_place, and with `capped` moe_dispatch_place_capacity: a
/// pair whose rank among its expert's pairs (the earlier chunks' count plus
/// its rank in its chunk) is at least the `capacity` argument is dropped
/// (row -1), so each expert keeps its first `capacity` pairs in slot order.
void buildPlace(OpBuilder &b, Location loc, StringRef name, bool capped) {
  Type i32 = b.getI32Type(), index = b.getIndexType();
  MemRefType buffer = flatBuffer(i32);
  SmallVector<Type> argTypes = {buffer, buffer, buffer, buffer,
                                index,  index,  index,  index};
  if (capped)
    argTypes.push_back(index);
  argTypes.append({buffer, buffer});
  gpu::GPUFuncOp kernel = createKernel(b, loc, name, argTypes);
  unsigned out = capped ? 9 : 8;
  Value experts = kernel.getArgument(0), rank = kernel.getArgument(1),
        counts = kernel.getArgument(2), offsets = kernel.getArgument(3),
        numSlots = kernel.getArgument(4), k = kernel.getArgument(5),
        numExperts = kernel.getArgument(6), numRows = kernel.getArgument(7),
        tokenIds = kernel.getArgument(out), rows = kernel.getArgument(out + 1);
  Value capacity = capped ? kernel.getArgument(8) : Value();

  Value gid = buildGlobalThreadId(b, loc);
  Value zero = i32Constant(b, loc, 0);
  Value minusOne = i32Constant(b, loc, -1);
  Value chunk = indexConstant(b, loc, kDispatchChunk);
  // The slot's row: its expert's offset, the earlier chunks' count of the
  // expert, and its rank in its chunk; -1 for an invalid or dropped slot.
  Value in =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, gid, numSlots);
  buildIf(b, loc, in, [&] {
    Value x = memref::LoadOp::create(b, loc, experts, gid);
    CheckedExpert expert = checkExpert(b, loc, x, numExperts, zero);
    auto place = [&] {
      Value ch = arith::DivUIOp::create(b, loc, gid, chunk);
      Value ci0 = arith::MulIOp::create(b, loc, ch, numExperts);
      Value ci = arith::AddIOp::create(b, loc, ci0, expert.index);
      Value before = memref::LoadOp::create(b, loc, counts, ci);
      Value offset = memref::LoadOp::create(b, loc, offsets, expert.index);
      Value rk = memref::LoadOp::create(b, loc, rank, gid);
      auto store = [&](Value row) {
        memref::StoreOp::create(b, loc, row, rows, gid);
        Value t = arith::DivUIOp::create(b, loc, gid, k);
        Value ti = arith::IndexCastOp::create(b, loc, i32, t);
        Value rowIndex = arith::IndexCastOp::create(b, loc, index, row);
        memref::StoreOp::create(b, loc, ti, tokenIds, rowIndex);
      };
      if (!capped) {
        Value r0 = arith::AddIOp::create(b, loc, offset, before);
        store(arith::AddIOp::create(b, loc, r0, rk));
        return;
      }
      Value position = arith::AddIOp::create(b, loc, before, rk);
      Value cap = arith::IndexCastOp::create(b, loc, i32, capacity);
      Value kept = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult,
                                         position, cap);
      buildIfElse(
          b, loc, kept,
          [&] { store(arith::AddIOp::create(b, loc, offset, position)); },
          [&] { memref::StoreOp::create(b, loc, minusOne, rows, gid); });
    };
    buildIfElse(b, loc, expert.valid, place,
                [&] { memref::StoreOp::create(b, loc, minusOne, rows, gid); });
  });
  // Rows past the used ones (offsets[E] on) get token 0.
  Value inRows =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, gid, numRows);
  buildIf(b, loc, inRows, [&] {
    Value used = memref::LoadOp::create(b, loc, offsets, numExperts);
    Value usedIndex = arith::IndexCastOp::create(b, loc, index, used);
    Value tail = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::uge, gid,
                                       usedIndex);
    buildIf(b, loc, tail,
            [&] { memref::StoreOp::create(b, loc, zero, tokenIds, gid); });
  });
  gpu::ReturnOp::create(b, loc);
}

} // namespace

void mlir::moe::kernels::buildDispatchScanKernel(OpBuilder &b, Location loc) {
  buildScan(b, loc, "moe_dispatch_scan", /*capped=*/false);
}

void mlir::moe::kernels::buildDispatchScanCapacityKernel(OpBuilder &b,
                                                         Location loc) {
  buildScan(b, loc, "moe_dispatch_scan_capacity", /*capped=*/true);
}

void mlir::moe::kernels::buildDispatchPlaceKernel(OpBuilder &b, Location loc) {
  buildPlace(b, loc, "moe_dispatch_place", /*capped=*/false);
}

void mlir::moe::kernels::buildDispatchPlaceCapacityKernel(OpBuilder &b,
                                                          Location loc) {
  buildPlace(b, loc, "moe_dispatch_place_capacity", /*capped=*/true);
}

void mlir::moe::kernels::buildSingleOffsetsKernel(OpBuilder &b, Location loc) {
  Type i32 = b.getI32Type();
  gpu::GPUFuncOp kernel = createKernel(b, loc, "moe_single_offsets",
                                       {flatBuffer(i32), b.getIndexType()});
  Value offsets = kernel.getArgument(0), numRows = kernel.getArgument(1);

  // The first-thread prelude; its 7 and -8 (for rounding counts to a
  // multiple of 8) go unused here but are part of the kernel's pinned text.
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value c0 = indexConstant(b, loc, 0);
  Value c1 = indexConstant(b, loc, 1);
  Value zero = i32Constant(b, loc, 0);
  i32Constant(b, loc, 7);
  i32Constant(b, loc, -8);
  Value firstThread =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, tid, c0);
  Value firstBlock =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, bid, c0);
  Value first = arith::AndIOp::create(b, loc, firstThread, firstBlock);

  buildIf(b, loc, first, [&] {
    Value rowsI32 = arith::IndexCastOp::create(b, loc, i32, numRows);
    memref::StoreOp::create(b, loc, zero, offsets, c0);
    memref::StoreOp::create(b, loc, rowsI32, offsets, c1);
  });
  gpu::ReturnOp::create(b, loc);
}

void mlir::moe::kernels::buildSplitOffsetsKernel(OpBuilder &b, Location loc) {
  Type i32 = b.getI32Type(), index = b.getIndexType();
  gpu::GPUFuncOp kernel = createKernel(b, loc, "moe_split_offsets",
                                       {flatBuffer(i32), index, index, index});
  Value offsets = kernel.getArgument(0), numRows = kernel.getArgument(1),
        chunk = kernel.getArgument(2), numSlices = kernel.getArgument(3);

  Value gid = buildGlobalThreadId(b, loc);
  Value in =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ule, gid, numSlices);
  buildIf(b, loc, in, [&] {
    Value at = arith::MulIOp::create(b, loc, gid, chunk);
    Value offset = arith::MinUIOp::create(b, loc, at, numRows);
    Value offsetI32 = arith::IndexCastOp::create(b, loc, i32, offset);
    memref::StoreOp::create(b, loc, offsetI32, offsets, gid);
  });
  gpu::ReturnOp::create(b, loc);
}
