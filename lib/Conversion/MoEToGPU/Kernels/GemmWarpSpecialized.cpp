//===- GemmWarpSpecialized.cpp - the warp-specialized GEMM kernels --------===//
//
// The persistent GEMMs with a producer warpgroup (docs/gpu-kernels.md §6.4):
// it issues every copy of the ring while the two consumer warpgroups only
// wait on the ring's full[s] mbarriers, run wgmma, release slots on empty[s]
// and write C out. Both roles walk the same tiles, by a static schedule or
// (schedule = dynamic) by tile ids the producer claims from a global counter
// and hands to the consumers through a two-entry ring.
//
//===----------------------------------------------------------------------===//

#include "GemmKernelBuilder.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

#include <functional>

using namespace mlir;
using namespace mlir::moe::kernels;
using Pred = arith::CmpIPredicate;

namespace {
constexpr int64_t kBM = moe_gpu::kTileM, kBK = moe_gpu::kTileK;
constexpr int64_t kGemmThreads = moe_gpu::kConsumerThreads;
} // namespace

//===----------------------------------------------------------------------===//
// The consumers' k-loops
//===----------------------------------------------------------------------===//

GemmKernelBuilder::RingPos GemmKernelBuilder::advance(Value slot, Value ph) {
  // The ring slot after `slot` and its phase parity (flipped on wrapping).
  Value nxt = add(slot, c(1));
  Value wrap = cmp(Pred::eq, nxt, c(g.stages));
  Value nslot = select(wrap, c(0), nxt);
  Value flipped = xori(ph, cI32(1));
  return {nslot, select(wrap, flipped, ph)};
}

Value GemmKernelBuilder::wgBusy(const Tile &s) {
  // Whether warpgroup wg's 64 rows of the tile hold any of the expert's, as a
  // vote of the warp, so that ptxas sees it uniform.
  Value x = mul(wg, c(64));
  Value first = add(s.m0, x);
  Value busy = cmp(Pred::ult, first, s.mEnd);
  Value mask = cI32(-1);
  return NVVM::VoteSyncOp::create(b, loc, i1, mask, busy,
                                  NVVM::VoteSyncKind::all);
}

GemmKernelBuilder::LoopResult
GemmKernelBuilder::mainloopWs(const Tile &s, Value slot0, Value ph0) {
  if (!g.idleSkip)
    return kloopWs(s, slot0, ph0);
  Value busy = wgBusy(s);
  SmallVector<Value> r = ifValues(
      busy, {accTy, indexTy, i32Ty},
      [&]() -> SmallVector<Value> {
        LoopResult l = kloopWs(s, slot0, ph0);
        return {l.acc, l.slot, l.phase};
      },
      [&]() -> SmallVector<Value> {
        LoopResult l = idleKloopWs(s, slot0, ph0);
        return {l.acc, l.slot, l.phase};
      });
  return {r[0], r[1], r[2]};
}

GemmKernelBuilder::LoopResult
GemmKernelBuilder::idleKloopWs(const Tile &s, Value slot0, Value ph0) {
  // A warpgroup with no rows in the tile waits for each slot (so no release
  // runs ahead of the producer's phase) and frees it at once.
  Value lb = c(0), step = c(1);
  Operation *loop = forLoop(lb, s.numk, step, {slot0, ph0},
                            [&](Value, ValueRange iter) -> SmallVector<Value> {
                              Value rs = iter[0], ph = iter[1];
                              Value bar = fullBar(i32(rs));
                              tryWaitParity(bar, ph);
                              ifBegin(cmp(Pred::eq, lane, c(0)));
                              mbarrierArrive(emptyBar(i32(rs)));
                              ifEnd();
                              RingPos next = advance(rs, ph);
                              return {next.slot, next.phase};
                            });
  // Zeros: an undefined accumulator made ptxas spill in down and dX.
  Value acc = LLVM::ZeroOp::create(b, loc, accTy);
  return {acc, loop->getResult(0), loop->getResult(1)};
}

GemmKernelBuilder::LoopResult
GemmKernelBuilder::kloopWs(const Tile &s, Value slot0, Value ph0) {
  // A consumer's k-loop: wait for full[slot], multiply, and release the slot
  // of the step before once its wgmma have completed. The weight gradients'
  // last, partial k-step runs apart after the loop with only the wgmma whose
  // 16 K-rows hold tokens (a wgmma under a branch in the loop made ptxas
  // fence every one of them).
  Value acc0 = LLVM::ZeroOp::create(b, loc, accTy);
  Value nloop = s.numk;
  if (!g.varlenM) {
    Value steps = div(s.kcnt, cI32(kBK));
    nloop = indexCastUI(steps);
  }
  auto waitFull = [&](Value slot, Value parity) {
    Value bar = fullBar(i32(slot));
    tryWaitParity(bar, parity);
    // The producer's cp.async wrote through the generic proxy; wgmma reads
    // through the async proxy.
    fenceProxyAsync();
  };
  auto release = [&](Value cond, Value slot) {
    // Lane 0 of each warp frees `slot` if cond.
    Value lane0 = cmp(Pred::eq, lane, c(0));
    ifBegin(andi(cond, lane0));
    mbarrierArrive(emptyBar(i32(slot)));
    ifEnd();
  };
  Value lb = c(0), step = c(1), prev0 = c(0);
  Operation *loop =
      forLoop(lb, nloop, step, {acc0, slot0, ph0, prev0},
              [&](Value kt, ValueRange iter) -> SmallVector<Value> {
                Value a0 = iter[0], rs = iter[1], ph = iter[2], prev = iter[3];
                waitFull(rs, ph);
                Value cur = wgmmaStage(a0, rs);
                // The step before has been read.
                release(cmp(Pred::ugt, kt, c(0)), prev);
                RingPos next = advance(rs, ph);
                return {cur, next.slot, next.phase, rs};
              });
  Value looped = cmp(Pred::ugt, nloop, c(0));
  Value acc = loop->getResult(0), slot = loop->getResult(1),
        parity = loop->getResult(2), last = loop->getResult(3);
  if (g.varlenM) {
    NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
    release(looped, last);
    return {acc, slot, parity};
  }
  Value kleft;
  {
    Value n32 = i32(nloop);
    Value done = mul(n32, cI32(kBK));
    kleft = sub(s.kcnt, done);
  }
  // The tail with `count` wgmma, or a branch on kleft between count and
  // more.
  std::function<Value(int64_t)> partialStep = [&](int64_t count) -> Value {
    if (count == 4)
      return wgmmaStage(acc, slot, 4, 0);
    Value more = cmp(Pred::sgt, kleft, cI32(16 * count));
    return ifValues(
        more, {accTy},
        [&]() -> SmallVector<Value> { return {partialStep(count + 1)}; },
        [&]() -> SmallVector<Value> {
          return {wgmmaStage(acc, slot, count, 0)};
        })[0];
  };
  Value hasTail = cmp(Pred::sgt, kleft, cI32(0));
  SmallVector<Value> r = ifValues(
      hasTail, {accTy, indexTy, i32Ty},
      [&]() -> SmallVector<Value> {
        waitFull(slot, parity);
        Value tailAcc = partialStep(1);
        release(looped, last);
        release(cI1(true), slot);
        RingPos next = advance(slot, parity);
        return {tailAcc, next.slot, next.phase};
      },
      [&]() -> SmallVector<Value> {
        NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
        release(looped, last);
        return {acc, slot, parity};
      });
  return {r[0], r[1], r[2]};
}

//===----------------------------------------------------------------------===//
// The tile loops of the two roles
//===----------------------------------------------------------------------===//

void GemmKernelBuilder::tileLoop(
    function_ref<RingPos(Value, Value, Value)> tile) {
  // scf.for over this CTA's tiles carrying the ring position.
  Value sl0 = c(0), ph0 = cI32(0);
  forLoop(bid, total, gridx, {sl0, ph0},
          [&](Value t, ValueRange iter) -> SmallVector<Value> {
            RingPos next = tile(t, iter[0], iter[1]);
            return {next.slot, next.phase};
          });
}

void GemmKernelBuilder::tileWhile(
    ValueRange inits, function_ref<SmallVector<Value>(ValueRange)> body) {
  // scf.while over the tiles carrying (tile, slot, parity, entry, parity)
  // while the tile is below `total`.
  SmallVector<Type> types = {indexTy, indexTy, i32Ty, indexTy, i32Ty};
  auto loop = scf::WhileOp::create(b, loc, types, inits);
  OpBuilder::InsertionGuard guard(b);
  SmallVector<Location> locs(types.size(), loc);
  Block *before = b.createBlock(&loop.getBefore(), {}, types, locs);
  Value more = cmp(Pred::ult, before->getArgument(0), total);
  scf::ConditionOp::create(b, loc, more, before->getArguments());
  Block *after = b.createBlock(&loop.getAfter(), {}, types, locs);
  SmallVector<Value> next = body(after->getArguments());
  scf::YieldOp::create(b, loc, next);
}

std::pair<Value, Value> GemmKernelBuilder::advanceTileRing(Value j, Value q) {
  // The tile ring's entry after j (of 2) and its parity.
  Value nj = xori(j, c(1));
  Value wrap = cmp(Pred::eq, j, c(1));
  Value flipped = xori(q, cI32(1));
  return {nj, select(wrap, flipped, q)};
}

Value GemmKernelBuilder::uniformTile(Value p) {
  // The tile id at p through redux.sync: a uniform register, so that what
  // the tile derives from it stays on the uniform datapath.
  Value t = LLVM::LoadOp::create(b, loc, i32Ty, p, /*alignment=*/0,
                                 /*isVolatile=*/true);
  Value mask = cI32(-1);
  t = NVVM::ReduxOp::create(b, loc, i32Ty, t, NVVM::ReduxKind::UMIN, mask);
  return indexCastUI(t);
}

GemmKernelBuilder::RingPos
GemmKernelBuilder::produceStep(const Tile &s, Value kt, Value slot,
                               Value parity, function_ref<StageRows()> srcs) {
  // One k-step of the producer: wait for the slot to be free, then issue its
  // copies. A fresh barrier's phase before the first (parity 1) counts as
  // complete.
  Value bar = emptyBar(i32(slot));
  Value flipped = xori(parity, cI32(1));
  tryWaitParity(bar, flipped);
  Value enabled = cI1(true);
  issueStage(s, kt, slot, enabled, srcs());
  return advance(slot, parity);
}

Value GemmKernelBuilder::idsK0(Value kt) {
  Value kt32 = i32(kt);
  return mul(kt32, cI32(kBK));
}

std::pair<Value, Value> GemmKernelBuilder::idsAt(const Tile &s, Value k0,
                                                 bool ofA) {
  Value bytes = mul(k0, cI32(4));
  Value bytes64 = zext(bytes);
  Value p = gep1(ofA ? s.idsA : s.idsB, bytes64);
  return {p, sub(s.kcnt, k0)};
}

GemmKernelBuilder::RingPos GemmKernelBuilder::producerTile(
    Value t, Value sl, Value ph,
    function_ref<void(const Tile &, Value)> afterStep,
    function_ref<void(const Tile &)> afterLoop) {
  Tile s = setup(t);
  Value lb = c(0), step = c(1);
  Operation *loop =
      forLoop(lb, s.numk, step, {sl, ph},
              [&](Value kt, ValueRange iter) -> SmallVector<Value> {
                // The token ids first: their loads overlap the wait for the
                // slot.
                StageRows srcs = loadRows(s, kt);
                RingPos next =
                    produceStep(s, kt, iter[0], iter[1], [&] { return srcs; });
                if (afterStep)
                  afterStep(s, kt);
                return {next.slot, next.phase};
              });
  if (afterLoop)
    afterLoop(s);
  return {loop->getResult(0), loop->getResult(1)};
}

void GemmKernelBuilder::producerTilesPipelined() {
  // The producer's tiles with the gathered ids a k-step ahead: the last
  // k-step of a tile loads the next tile's first (and a tile with no k-steps
  // passes its own first on, which are none).
  Tile s0 = setup(bid);
  Value k00;
  {
    Value zero = c(0);
    k00 = idsK0(zero);
  }
  SmallVector<Value> ids0 =
      laneIdsAt([&](bool ofA) { return idsAt(s0, k00, ofA); });
  size_t nid = ids0.size();
  Value sl0 = c(0), ph0 = cI32(0);
  SmallVector<Value> inits = {sl0, ph0};
  llvm::append_range(inits, ids0);
  forLoop(
      bid, total, gridx, inits,
      [&](Value t, ValueRange iter) -> SmallVector<Value> {
        Tile s = setup(t);
        Value nextT = add(t, gridx);
        Tile sn = setup(nextT);
        Value lb = c(0), step = c(1);
        Operation *kloop =
            forLoop(lb, s.numk, step, iter,
                    [&](Value kt, ValueRange kiter) -> SmallVector<Value> {
                      Value ksl = kiter[0], kph = kiter[1];
                      ValueRange kids = kiter.drop_front(2);
                      // The next k-step's ids first: their latency overlaps
                      // this step's wait and copies.
                      Value kn = add(kt, c(1));
                      Value last = cmp(Pred::eq, kn, s.numk);
                      Value hereK0 = idsK0(kn);
                      Value zero = c(0);
                      Value thereK0 = idsK0(zero);
                      SmallVector<Value> nxt = laneIdsAt([&](bool ofA) {
                        auto [p1, l1] = idsAt(s, hereK0, ofA);
                        auto [p2, l2] = idsAt(sn, thereK0, ofA);
                        Value p = select(last, p2, p1);
                        return std::make_pair(p, select(last, l2, l1));
                      });
                      SmallVector<Value> held(kids);
                      RingPos next = produceStep(s, kt, ksl, kph, [&] {
                        return loadRows(s, kt, ArrayRef<Value>(held));
                      });
                      SmallVector<Value> yielded = {next.slot, next.phase};
                      llvm::append_range(yielded, nxt);
                      return yielded;
                    });
        // No k-steps: this tile loaded nothing, the next one's first ids are
        // still due.
        Value empty = cmp(Pred::eq, s.numk, c(0));
        SmallVector<Value> first = ifValues(
            empty, SmallVector<Type>(nid, i32Ty),
            [&]() -> SmallVector<Value> {
              Value zero = c(0);
              Value k0 = idsK0(zero);
              return laneIdsAt([&](bool ofA) { return idsAt(sn, k0, ofA); });
            },
            [&]() -> SmallVector<Value> {
              return SmallVector<Value>(kloop->getResults().drop_front(2));
            });
        SmallVector<Value> yielded = {kloop->getResult(0), kloop->getResult(1)};
        llvm::append_range(yielded, first);
        return yielded;
      });
}

void GemmKernelBuilder::producerTilesDynamic() {
  // The producer warpgroup of the dynamic schedule: publish tile t to the
  // consumers (a tile past the end: none left, and they stop), claim the
  // next while t loads, and pass it to the warpgroup through next[j] and
  // barrier 2.
  Value slotPtr;
  {
    Value counter = gptr(tileCounter);
    Value slot32 = i32(counterSlot);
    Value bytes = mul(slot32, cI32(4));
    Value bytes64 = zext(bytes);
    slotPtr = gep1(counter, bytes64);
  }
  auto publish = [&](Value t, Value j, Value q) {
    // (the whole warpgroup waits: a wait loop in thread 0's branch took the
    // ring slots off the uniform datapath)
    Value bar = tileEmpty(i32(j));
    Value flipped = xori(q, cI32(1));
    tryWaitParity(bar, flipped);
    ifBegin(isT0);
    Value t32 = i32(t);
    Value word = schedWord(0, i32(j));
    LLVM::StoreOp::create(b, loc, t32, word, /*alignment=*/0,
                          /*isVolatile=*/true);
    mbarrierArrive(tileFull(i32(j)));
    ifEnd();
  };
  auto claim = [&](Value nxtPtr) {
    // Thread 0 takes the next tile from the counter into next[j] (the first
    // tiles are 0 .. grid - 1, one a CTA; the counter hands out the rest).
    Value one = cI32(1);
    Value claimed =
        LLVM::AtomicRMWOp::create(b, loc, LLVM::AtomicBinOp::add, slotPtr, one,
                                  LLVM::AtomicOrdering::monotonic);
    Value grid32 = i32(gridx);
    Value tile = add(claimed, grid32);
    LLVM::StoreOp::create(b, loc, tile, nxtPtr, /*alignment=*/0,
                          /*isVolatile=*/true);
  };
  // (published at the end of the tile before, as the consumers receive it)
  {
    Value j0 = c(0), q0 = cI32(0);
    publish(bid, j0, q0);
  }
  Value sl0 = c(0), ph0 = cI32(0), j0 = c(0), q0 = cI32(0);
  tileWhile(
      {bid, sl0, ph0, j0, q0}, [&](ValueRange args) -> SmallVector<Value> {
        Value t = args[0], sl = args[1], ph = args[2], j = args[3], q = args[4];
        Value nxtPtr = schedWord(8, i32(j));
        // The claim waits for the atomic's answer: it goes after the loads of
        // k-step min(numk, STAGES) - 1, where the producer next waits for a
        // free slot anyway.
        auto afterStep = [&](const Tile &s, Value kt) {
          Value m = minu(s.numk, c(g.stages));
          Value when = sub(m, c(1));
          Value at = cmp(Pred::eq, kt, when);
          ifBegin(andi(isT0, at));
          claim(nxtPtr);
          ifEnd();
        };
        auto afterLoop = [&](const Tile &s) {
          // A tile with no k-steps (past the experts' last) claims here.
          Value none = cmp(Pred::eq, s.numk, c(0));
          ifBegin(andi(isT0, none));
          claim(nxtPtr);
          ifEnd();
        };
        RingPos next = producerTile(t, sl, ph, afterStep, afterLoop);
        // (next[j] is written again two tiles on, after every producer thread
        // has passed the barrier of the tile between)
        Value id = cI32(2);
        Value count = cI32(128);
        NVVM::BarrierOp::create(b, loc, Type(), id, count,
                                NVVM::BarrierReductionAttr(), Value());
        Value nxt = uniformTile(nxtPtr);
        auto [nj, nq] = advanceTileRing(j, q);
        publish(nxt, nj, nq);
        return {nxt, next.slot, next.phase, nj, nq};
      });
}

void GemmKernelBuilder::consumerTilesDynamic() {
  // The consumer warpgroups of the dynamic schedule: the tiles the producer
  // publishes, until one past the end, each received at the end of the tile
  // before.
  auto receive = [&](Value j, Value q) -> SmallVector<Value> {
    Value bar = tileFull(i32(j));
    tryWaitParity(bar, q);
    Value word = schedWord(0, i32(j));
    Value t = uniformTile(word);
    mbarrierArrive(tileEmpty(i32(j)));
    auto [nj, nq] = advanceTileRing(j, q);
    return {t, nj, nq};
  };
  SmallVector<Value> first;
  {
    Value j0 = c(0), q0 = cI32(0);
    first = receive(j0, q0);
  }
  Value sl0 = c(0), ph0 = cI32(0);
  tileWhile({first[0], sl0, ph0, first[1], first[2]},
            [&](ValueRange args) -> SmallVector<Value> {
              Value t = args[0], sl = args[1], ph = args[2], j = args[3],
                    q = args[4];
              RingPos next = consumerTile(t, sl, ph);
              SmallVector<Value> r = receive(j, q);
              return {r[0], next.slot, next.phase, r[1], r[2]};
            });
}

GemmKernelBuilder::RingPos GemmKernelBuilder::consumerTile(Value t, Value sl,
                                                           Value ph) {
  Tile s = setup(t);
  LoopResult r = mainloopWs(s, sl, ph);
  ifBegin(s.valid);
  Value acc = g.bias ? addBias(s, r.acc) : r.acc;
  if (g.bulkStore) {
    // This thread's copy of the last tile has read its staging row.
    NVVM::CpAsyncBulkWaitGroupOp::create(b, loc, 0, b.getUnitAttr());
  }
  consumerBarrier(); // the last tile's stores have read the staging buffer
  if (g.bulkStore) {
    auto store = [&](bool byBoxes) {
      if (byBoxes)
        stageBoxesStmatrix(stagePtr, acc);
      else
        stageRowsStmatrix(stagePtr, acc);
      // The generic-proxy writes, visible to the bulk copies (async proxy).
      fenceProxyAsync();
      consumerBarrier();
      if (byBoxes)
        tmaStoreBoxes(s, stagePtr);
      else
        bulkStoreRows(s, stagePtr);
    };
    if (g.tmaStoreRows && !g.reduceStore) {
      // (a branch the whole consumer warpgroup pair takes alike)
      Value end = add(s.m0, c(kBM));
      Value whole = cmp(Pred::ule, end, s.mEnd);
      ifElse(whole, [&] { store(true); }, [&] { store(false); });
    } else {
      store(g.tmaStore || g.reduceStore);
    }
  } else {
    for (int64_t h : {0, 1})
      stageHalf(stage, acc, h);
    consumerBarrier();
    for (int64_t h : {0, 1})
      writeHalf(s, stage, h);
  }
  ifEnd();
  return {r.slot, r.phase};
}

void GemmKernelBuilder::buildWarpSpecialized() {
  {
    Value at = add(pad, c(g.ringBytes));
    Value len = c(g.stageCBytes / 2);
    stage = memref::ViewOp::create(b, loc, sbf16Ty, smem, at, ValueRange{len});
  }
  stagePtr = gep3(sptr, cI32(g.ringBytes));

  // Both roles walk the same tiles in the same order; a tile's k-steps go
  // round the ring, each slot's phase parity flipping on every wrap.
  Value producer = cmp(Pred::uge, tid, c(kGemmThreads));
  ifElse(
      producer,
      [&] {
        NVVM::SetMaxRegisterOp::create(b, loc, g.producerRegisters,
                                       NVVM::SetMaxRegisterAction::decrease);
        if (!g.varlenM && (g.gatherA || g.gatherB))
          producerTilesPipelined();
        else if (g.dynamic)
          producerTilesDynamic();
        else
          tileLoop([&](Value t, Value sl, Value ph) {
            return producerTile(t, sl, ph);
          });
        // The last copies land before the warpgroup exits.
        NVVM::CpAsyncCommitGroupOp::create(b, loc);
        NVVM::CpAsyncWaitGroupOp::create(b, loc, 0);
      },
      [&] {
        NVVM::SetMaxRegisterOp::create(b, loc, g.consumerRegisters,
                                       NVVM::SetMaxRegisterAction::increase);
        if (g.dynamic)
          consumerTilesDynamic();
        else
          tileLoop([&](Value t, Value sl, Value ph) {
            return consumerTile(t, sl, ph);
          });
        // The last tile's copies complete before the CTA (and its shared
        // memory) goes.
        if (g.bulkStore)
          NVVM::CpAsyncBulkWaitGroupOp::create(b, loc, 0, UnitAttr());
      });
}
