//===- Router.cpp - moe_router_scores, _select, _grad_logits --------------===//
//
// The router's kernels, a warp a token: the scores (softmax or sigmoid of the
// logits), the top-k (group-limited) selection with its weights, and the
// backward pass to the logits. Lane l of a token's warp walks experts l,
// l + 32, ...; sums and maxima over the experts end in xor shuffles so that
// every lane holds the token's value.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

#include <cmath>
#include <tuple>

using namespace mlir;
using namespace mlir::moe::kernels;

namespace {

/// The lanes a shuffle exchanges with, in the order of the reductions.
constexpr int32_t kXorMasks[] = {16, 8, 4, 2, 1};

/// Warps a block of the warp-a-token kernels.
constexpr int64_t kTokenWarps = kSimpleThreads / 32;

/// The experts moe_router_select_counts' shared table holds (the contract's
/// max_experts).
constexpr int64_t kMaxCountedExperts = 1024;

Value i64Constant(OpBuilder &b, Location loc, int64_t value) {
  return arith::ConstantIntOp::create(b, loc, b.getI64Type(), value);
}

Value toI32(OpBuilder &b, Location loc, Value index) {
  return arith::IndexCastOp::create(b, loc, b.getI32Type(), index);
}

Value callF32(OpBuilder &b, Location loc, StringRef callee,
              ValueRange operands) {
  return func::CallOp::create(b, loc, callee, TypeRange{b.getF32Type()},
                              operands)
      .getResult(0);
}

Value xorShuffle(OpBuilder &b, Location loc, Value value, Value mask,
                 Value width) {
  return gpu::ShuffleOp::create(b, loc, value, mask, width,
                                gpu::ShuffleMode::XOR)
      .getShuffleResult();
}

/// The prelude of a kernel run a warp a token: the token is the warp's, and
/// the constants of the expert loops and the shuffles come first.
struct WarpPerToken {
  Value lane;
  Value token;
  /// 32 : index, the step of a loop over the experts.
  Value warpSize;
  /// 32 : i32, the shuffles' width.
  Value width;
  /// kXorMasks as i32 constants.
  SmallVector<Value, 5> masks;
};

WarpPerToken buildWarpPerToken(OpBuilder &b, Location loc) {
  WarpPerToken w;
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  w.warpSize = indexConstant(b, loc, 32);
  Value warps = indexConstant(b, loc, kTokenWarps);
  w.lane = arith::RemUIOp::create(b, loc, tid, w.warpSize);
  Value warp = arith::DivUIOp::create(b, loc, tid, w.warpSize);
  Value first = arith::MulIOp::create(b, loc, bid, warps);
  w.token = arith::AddIOp::create(b, loc, first, warp);
  w.width = i32Constant(b, loc, 32);
  for (int32_t mask : kXorMasks)
    w.masks.push_back(i32Constant(b, loc, mask));
  return w;
}

/// `value` combined over the warp by xor shuffles: every lane gets the result.
template <typename CombineOp>
Value warpAllReduce(OpBuilder &b, Location loc, const WarpPerToken &w,
                    Value value) {
  for (Value mask : w.masks) {
    Value other = xorShuffle(b, loc, value, mask, w.width);
    value = CombineOp::create(b, loc, value, other);
  }
  return value;
}

/// A loop over this lane's experts (lane, lane + 32, ... < E).
scf::ForOp createExpertLoop(OpBuilder &b, Location loc, const WarpPerToken &w,
                            Value numExperts, ValueRange initArgs = {}) {
  return scf::ForOp::create(b, loc, w.lane, numExperts, w.warpSize, initArgs);
}

/// The softmax's max and sum of exp over a token's logits, both reduced over
/// the warp (base: the token's first logit).
std::pair<Value, Value> buildSoftmaxMaxAndSum(OpBuilder &b, Location loc,
                                              const WarpPerToken &w,
                                              Value logits, Value base,
                                              Value numExperts, Value minusInf,
                                              Value zero) {
  OpBuilder::InsertionGuard guard(b);
  auto maxLoop = createExpertLoop(b, loc, w, numExperts, minusInf);
  b.setInsertionPointToStart(maxLoop.getBody());
  {
    Value i = arith::AddIOp::create(b, loc, base, maxLoop.getInductionVar());
    Value l = memref::LoadOp::create(b, loc, logits, i);
    Value m =
        arith::MaximumFOp::create(b, loc, maxLoop.getRegionIterArgs()[0], l);
    scf::YieldOp::create(b, loc, m);
  }
  b.setInsertionPointAfter(maxLoop);
  Value max = warpAllReduce<arith::MaximumFOp>(b, loc, w, maxLoop.getResult(0));

  auto sumLoop = createExpertLoop(b, loc, w, numExperts, zero);
  b.setInsertionPointToStart(sumLoop.getBody());
  {
    Value i = arith::AddIOp::create(b, loc, base, sumLoop.getInductionVar());
    Value l = memref::LoadOp::create(b, loc, logits, i);
    Value d = arith::SubFOp::create(b, loc, l, max);
    Value x = callF32(b, loc, "__moe_gpu_exp", d);
    Value s = arith::AddFOp::create(b, loc, sumLoop.getRegionIterArgs()[0], x);
    scf::YieldOp::create(b, loc, s);
  }
  b.setInsertionPointAfter(sumLoop);
  Value sum = warpAllReduce<arith::AddFOp>(b, loc, w, sumLoop.getResult(0));
  return {max, sum};
}

} // namespace

//===----------------------------------------------------------------------===//
// moe_router_scores
//===----------------------------------------------------------------------===//

void mlir::moe::kernels::buildRouterScoresKernel(OpBuilder &b, Location loc) {
  Type f32 = b.getF32Type(), index = b.getIndexType();
  MemRefType buffer = flatBuffer(f32);
  gpu::GPUFuncOp kernel = createKernel(
      b, loc, "moe_router_scores",
      {buffer, buffer, index, index, b.getI32Type(), b.getI1Type()});
  Value logits = kernel.getArgument(0), scores = kernel.getArgument(1),
        numTokens = kernel.getArgument(2), numExperts = kernel.getArgument(3),
        scoring = kernel.getArgument(4), round = kernel.getArgument(5);

  WarpPerToken w = buildWarpPerToken(b, loc);
  // The constants of the one-thread-a-token body; c0 and c1 went with its
  // expert loops.
  indexConstant(b, loc, 0);
  indexConstant(b, loc, 1);
  Value zero = f32Constant(b, loc, 0.0f);
  Value one = f32Constant(b, loc, 1.0f);
  Value minusInf = f32Constant(b, loc, -INFINITY);
  Value ok = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, w.token,
                                   numTokens);
  auto ifOk = scf::IfOp::create(b, loc, ok, /*withElseRegion=*/false);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifOk.thenBlock());
    Value base = arith::MulIOp::create(b, loc, w.token, numExperts);

    // Rounds the logits to bf16 in place.
    auto ifRound = scf::IfOp::create(b, loc, round, /*withElseRegion=*/false);
    b.setInsertionPointToStart(ifRound.thenBlock());
    {
      auto loop = createExpertLoop(b, loc, w, numExperts);
      b.setInsertionPointToStart(loop.getBody());
      Value i = arith::AddIOp::create(b, loc, base, loop.getInductionVar());
      Value l = memref::LoadOp::create(b, loc, logits, i);
      Value h = arith::TruncFOp::create(b, loc, b.getBF16Type(), l);
      Value r = arith::ExtFOp::create(b, loc, f32, h);
      memref::StoreOp::create(b, loc, r, logits, i);
    }
    b.setInsertionPointAfter(ifRound);

    Value softmaxCode = i32Constant(b, loc, 0);
    Value soft = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq,
                                       scoring, softmaxCode);
    auto ifSoft = scf::IfOp::create(b, loc, soft, /*withElseRegion=*/true);
    b.setInsertionPointToStart(ifSoft.thenBlock());
    {
      auto [max, sum] = buildSoftmaxMaxAndSum(b, loc, w, logits, base,
                                              numExperts, minusInf, zero);
      auto loop = createExpertLoop(b, loc, w, numExperts);
      b.setInsertionPointToStart(loop.getBody());
      Value i = arith::AddIOp::create(b, loc, base, loop.getInductionVar());
      Value l = memref::LoadOp::create(b, loc, logits, i);
      Value d = arith::SubFOp::create(b, loc, l, max);
      Value x = callF32(b, loc, "__moe_gpu_exp", d);
      Value p = arith::DivFOp::create(b, loc, x, sum);
      memref::StoreOp::create(b, loc, p, scores, i);
    }
    b.setInsertionPointToStart(ifSoft.elseBlock());
    {
      auto loop = createExpertLoop(b, loc, w, numExperts);
      b.setInsertionPointToStart(loop.getBody());
      Value i = arith::AddIOp::create(b, loc, base, loop.getInductionVar());
      Value l = memref::LoadOp::create(b, loc, logits, i);
      Value nl = arith::NegFOp::create(b, loc, l);
      Value x = callF32(b, loc, "__moe_gpu_exp", nl);
      Value den = arith::AddFOp::create(b, loc, x, one);
      Value p = arith::DivFOp::create(b, loc, one, den);
      memref::StoreOp::create(b, loc, p, scores, i);
    }
  }
  gpu::ReturnOp::create(b, loc);
}

//===----------------------------------------------------------------------===//
// moe_router_select
//===----------------------------------------------------------------------===//

namespace {

/// A candidate as a key ordered by `better`: (class, value, index), class 2
/// for a number, 1 for NaN, 0 for no candidate.
struct Key {
  Value cls, value, index;
};

/// The selection kernel's builder: its arguments, the constants of its
/// prelude, and the comparisons and warp reductions over keys.
class SelectBuilder {
public:
  /// With `counts`, moe_router_select_counts: the selection counts of each
  /// expert too, added to a buffer of E (moe_aux_counts' counts).
  SelectBuilder(OpBuilder &b, Location loc, bool counts = false)
      : b(b), loc(loc), withCounts(counts) {}

  void build();

private:
  /// a before b: the larger value first, the smaller index on a tie, NaN
  /// after every number (the smaller index first among NaNs), no candidate
  /// last.
  Value better(const Key &a, const Key &other);
  /// cond ? a : other, member by member.
  Key pick(Value cond, const Key &a, const Key &other);
  /// The key of `value` at `index`, class 0 unless `candidate`.
  Key key(Value candidate, Value value, Value index);
  /// The best key of the warp, in every lane.
  Key warpBest(Key a);
  /// scores[base + e] + bias[e] (0 without a bias).
  Value biasedScore(Value expert);
  /// The selected groups as an i64 mask: lane l scores groups l and l + 32,
  /// the warp picks topk_groups of them.
  void buildGroupSelection(Value multi);
  /// The best key of group `group` (its best two scores summed), or no
  /// candidate if there is no such group.
  scf::IfOp buildGroupScore(Value group);

  Value cmpi(arith::CmpIPredicate predicate, Value lhs, Value rhs) {
    return arith::CmpIOp::create(b, loc, predicate, lhs, rhs);
  }
  Value cmpf(arith::CmpFPredicate predicate, Value lhs, Value rhs) {
    return arith::CmpFOp::create(b, loc, predicate, lhs, rhs);
  }
  Value select(Value cond, Value a, Value other) {
    return arith::SelectOp::create(b, loc, cond, a, other);
  }

  OpBuilder &b;
  Location loc;
  bool withCounts;

  // Arguments.
  Value scores, bias, numBias, numTokens, numExperts, topK, numGroups,
      topKGroups, renorm, scaling, weights, experts;
  // Prelude constants.
  Value c0, c1, c31, c32, c0I32, c1I32, c2I32, cm1I32, c32I32, c1I64, c0I64,
      allGroups, zero, trueValue;
  SmallVector<Value, 5> masks;
  // Per-token values.
  Value lane, lead, base, outBase, hasBias, groupSize, groupMask;
};

Value SelectBuilder::better(const Key &a, const Key &other) {
  using arith::CmpFPredicate;
  using arith::CmpIPredicate;
  Value greaterClass = cmpi(CmpIPredicate::sgt, a.cls, other.cls);
  Value sameClass = cmpi(CmpIPredicate::eq, a.cls, other.cls);
  Value number = cmpi(CmpIPredicate::eq, a.cls, c2I32);
  Value nan = cmpi(CmpIPredicate::eq, a.cls, c1I32);
  Value greater = cmpf(CmpFPredicate::OGT, a.value, other.value);
  Value equal = cmpf(CmpFPredicate::OEQ, a.value, other.value);
  Value lowerIndex = cmpi(CmpIPredicate::slt, a.index, other.index);
  Value tie = arith::AndIOp::create(b, loc, equal, lowerIndex);
  Value byValue = arith::OrIOp::create(b, loc, greater, tie);
  Value numberFirst = arith::AndIOp::create(b, loc, number, byValue);
  Value nanFirst = arith::AndIOp::create(b, loc, nan, lowerIndex);
  Value first = arith::OrIOp::create(b, loc, numberFirst, nanFirst);
  Value firstInClass = arith::AndIOp::create(b, loc, sameClass, first);
  return arith::OrIOp::create(b, loc, greaterClass, firstInClass);
}

Key SelectBuilder::pick(Value cond, const Key &a, const Key &other) {
  Value cls = select(cond, a.cls, other.cls);
  Value value = select(cond, a.value, other.value);
  Value index = select(cond, a.index, other.index);
  return {cls, value, index};
}

Key SelectBuilder::key(Value candidate, Value value, Value index) {
  Value nan = cmpf(arith::CmpFPredicate::UNO, value, value);
  Value cls = select(nan, c1I32, c2I32);
  return {select(candidate, cls, c0I32), value, index};
}

Key SelectBuilder::warpBest(Key a) {
  for (Value mask : masks) {
    Key other;
    other.cls = xorShuffle(b, loc, a.cls, mask, c32I32);
    other.value = xorShuffle(b, loc, a.value, mask, c32I32);
    other.index = xorShuffle(b, loc, a.index, mask, c32I32);
    Value takeOther = better(other, a);
    a = pick(takeOther, other, a);
  }
  return a;
}

Value SelectBuilder::biasedScore(Value expert) {
  Value i = arith::AddIOp::create(b, loc, base, expert);
  Value score = memref::LoadOp::create(b, loc, scores, i);
  auto ifBias = scf::IfOp::create(b, loc, b.getF32Type(), hasBias,
                                  /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifBias.thenBlock());
    Value biasValue = memref::LoadOp::create(b, loc, bias, expert);
    scf::YieldOp::create(b, loc, biasValue);
    b.setInsertionPointToStart(ifBias.elseBlock());
    scf::YieldOp::create(b, loc, zero);
  }
  return arith::AddFOp::create(b, loc, score, ifBias.getResult(0));
}

scf::IfOp SelectBuilder::buildGroupScore(Value group) {
  Type i32 = b.getI32Type(), f32 = b.getF32Type();
  Value valid = cmpi(arith::CmpIPredicate::ult, group, numGroups);
  auto ifValid = scf::IfOp::create(b, loc, TypeRange{i32, f32}, valid,
                                   /*withElseRegion=*/true);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(ifValid.thenBlock());
  Value lo = arith::MulIOp::create(b, loc, group, groupSize);
  Value hi = arith::AddIOp::create(b, loc, lo, groupSize);
  // The group's best two (first, second) in one pass.
  auto loop = scf::ForOp::create(b, loc, lo, hi, c1,
                                 {c0I32, zero, cm1I32, c0I32, zero, cm1I32});
  {
    OpBuilder::InsertionGuard loopGuard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value e = loop.getInductionVar();
    ValueRange iter = loop.getRegionIterArgs();
    Key first{iter[0], iter[1], iter[2]}, second{iter[3], iter[4], iter[5]};
    Value value = biasedScore(e);
    Value index = toI32(b, loc, e);
    Key x = key(trueValue, value, index);
    Value beatsFirst = better(x, first);
    Value beatsSecond = better(x, second);
    Key newFirst = pick(beatsFirst, x, first);
    Key newSecond = pick(beatsFirst, first, pick(beatsSecond, x, second));
    scf::YieldOp::create(b, loc,
                         ValueRange{newFirst.cls, newFirst.value,
                                    newFirst.index, newSecond.cls,
                                    newSecond.value, newSecond.index});
  }
  Value two = cmpi(arith::CmpIPredicate::ugt, groupSize, c1);
  Value total =
      arith::AddFOp::create(b, loc, loop.getResult(1), loop.getResult(4));
  Value score = select(two, total, loop.getResult(1));
  Key groupKey = key(trueValue, score, c0I32);
  scf::YieldOp::create(b, loc, ValueRange{groupKey.cls, score});
  b.setInsertionPointToStart(ifValid.elseBlock());
  scf::YieldOp::create(b, loc, ValueRange{c0I32, zero});
  return ifValid;
}

void SelectBuilder::buildGroupSelection(Value multi) {
  Type i64 = b.getI64Type();
  auto ifMulti = scf::IfOp::create(b, loc, i64, multi, /*withElseRegion=*/true);
  groupMask = ifMulti.getResult(0);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(ifMulti.thenBlock());

  struct GroupCandidate {
    Key key;
    Value group;
  };
  SmallVector<GroupCandidate, 2> groups;
  for (Value offset : {c0, c32}) {
    Value group = arith::AddIOp::create(b, loc, lane, offset);
    scf::IfOp score = buildGroupScore(group);
    Value index = toI32(b, loc, group);
    groups.push_back({{score.getResult(0), score.getResult(1), index}, group});
  }

  auto loop = scf::ForOp::create(b, loc, c0, topKGroups, c1, c0I64);
  {
    OpBuilder::InsertionGuard loopGuard(b);
    b.setInsertionPointToStart(loop.getBody());
    Value mask = loop.getRegionIterArgs()[0];
    SmallVector<Key, 2> candidates;
    for (const GroupCandidate &g : groups) {
      Value g64 = arith::IndexCastOp::create(b, loc, i64, g.group);
      Value bit = arith::ShLIOp::create(b, loc, c1I64, g64);
      Value masked = arith::AndIOp::create(b, loc, mask, bit);
      Value taken = cmpi(arith::CmpIPredicate::ne, masked, c0I64);
      candidates.push_back(
          {select(taken, c0I32, g.key.cls), g.key.value, g.key.index});
    }
    Value secondFirst = better(candidates[1], candidates[0]);
    Key mine = pick(secondFirst, candidates[1], candidates[0]);
    Key winner = warpBest(mine);
    Value winner64 = arith::ExtUIOp::create(b, loc, i64, winner.index);
    Value bit = arith::ShLIOp::create(b, loc, c1I64, winner64);
    Value newMask = arith::OrIOp::create(b, loc, mask, bit);
    scf::YieldOp::create(b, loc, newMask);
  }
  scf::YieldOp::create(b, loc, loop.getResult(0));
  b.setInsertionPointToStart(ifMulti.elseBlock());
  scf::YieldOp::create(b, loc, allGroups);
}

void SelectBuilder::build() {
  Type f32 = b.getF32Type(), index = b.getIndexType(), i32 = b.getI32Type();
  MemRefType f32Buffer = flatBuffer(f32);
  SmallVector<Type> argTypes = {
      f32Buffer, f32Buffer, index,         index, index,     index,
      index,     index,     b.getI1Type(), f32,   f32Buffer, flatBuffer(i32)};
  if (withCounts)
    argTypes.push_back(flatBuffer(i32));
  gpu::GPUFuncOp kernel = createKernel(
      b, loc, withCounts ? "moe_router_select_counts" : "moe_router_select",
      argTypes);
  scores = kernel.getArgument(0);
  bias = kernel.getArgument(1);
  numBias = kernel.getArgument(2);
  numTokens = kernel.getArgument(3);
  numExperts = kernel.getArgument(4);
  topK = kernel.getArgument(5);
  numGroups = kernel.getArgument(6);
  topKGroups = kernel.getArgument(7);
  renorm = kernel.getArgument(8);
  scaling = kernel.getArgument(9);
  weights = kernel.getArgument(10);
  experts = kernel.getArgument(11);

  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  c0 = indexConstant(b, loc, 0);
  c1 = indexConstant(b, loc, 1);
  c31 = indexConstant(b, loc, 31);
  c32 = indexConstant(b, loc, 32);
  Value warps = indexConstant(b, loc, kTokenWarps);
  c0I32 = i32Constant(b, loc, 0);
  c1I32 = i32Constant(b, loc, 1);
  c2I32 = i32Constant(b, loc, 2);
  cm1I32 = i32Constant(b, loc, -1);
  // The masks 2 and 1 of the shuffles are the class constants.
  Value c16I32 = i32Constant(b, loc, 16);
  Value c8I32 = i32Constant(b, loc, 8);
  Value c4I32 = i32Constant(b, loc, 4);
  masks = {c16I32, c8I32, c4I32, c2I32, c1I32};
  c32I32 = i32Constant(b, loc, 32);
  c1I64 = i64Constant(b, loc, 1);
  c0I64 = i64Constant(b, loc, 0);
  allGroups = i64Constant(b, loc, -1);
  zero = f32Constant(b, loc, 0.0f);
  trueValue = arith::ConstantIntOp::create(b, loc, b.getI1Type(), 1);
  lane = arith::RemUIOp::create(b, loc, tid, c32);
  Value warp = arith::DivUIOp::create(b, loc, tid, c32);
  Value first = arith::MulIOp::create(b, loc, bid, warps);
  Value token = arith::AddIOp::create(b, loc, first, warp);
  lead = cmpi(arith::CmpIPredicate::eq, lane, c0);
  // The block's counts in shared memory, one global atomic an expert a block
  // after (integer sums: the same whatever the order).
  Value shared, counts;
  if (withCounts) {
    counts = kernel.getArgument(12);
    auto type =
        MemRefType::get({kMaxCountedExperts}, i32, MemRefLayoutAttrInterface(),
                        gpu::AddressSpaceAttr::get(
                            b.getContext(), gpu::AddressSpace::Workgroup));
    shared = kernel.addWorkgroupAttribution(type, loc);
    Value threads = indexConstant(b, loc, kSimpleThreads);
    auto zeroLoop = scf::ForOp::create(b, loc, tid, numExperts, threads);
    {
      OpBuilder::InsertionGuard loopGuard(b);
      b.setInsertionPointToStart(zeroLoop.getBody());
      memref::StoreOp::create(b, loc, c0I32, shared,
                              zeroLoop.getInductionVar());
    }
    gpu::BarrierOp::create(b, loc);
  }
  // The token is the whole warp's, so the shuffles below see every lane.
  Value ok = cmpi(arith::CmpIPredicate::ult, token, numTokens);
  auto ifOk = scf::IfOp::create(b, loc, ok, /*withElseRegion=*/false);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifOk.thenBlock());
    base = arith::MulIOp::create(b, loc, token, numExperts);
    outBase = arith::MulIOp::create(b, loc, token, topK);
    hasBias = cmpi(arith::CmpIPredicate::ugt, numBias, c0);
    groupSize = arith::DivUIOp::create(b, loc, numExperts, numGroups);
    // This lane's experts: lane + 32 i < E.
    Value rounded = arith::AddIOp::create(b, loc, numExperts, c31);
    Value left = arith::SubIOp::create(b, loc, rounded, lane);
    Value laneExperts = arith::DivUIOp::create(b, loc, left, c32);
    Value multi = cmpi(arith::CmpIPredicate::ugt, numGroups, c1);
    buildGroupSelection(multi);

    // k picks among the experts of the selected groups: (taken, total),
    // taken a mask of this lane's picks.
    auto picks = scf::ForOp::create(b, loc, c0, topK, c1, {c0I32, zero});
    {
      OpBuilder::InsertionGuard loopGuard(b);
      b.setInsertionPointToStart(picks.getBody());
      Value j = picks.getInductionVar();
      Value taken = picks.getRegionIterArgs()[0];
      Value total = picks.getRegionIterArgs()[1];

      auto scan = scf::ForOp::create(b, loc, c0, laneExperts, c1,
                                     {c0I32, zero, cm1I32});
      {
        OpBuilder::InsertionGuard scanGuard(b);
        b.setInsertionPointToStart(scan.getBody());
        Value it = scan.getInductionVar();
        ValueRange iter = scan.getRegionIterArgs();
        Key current{iter[0], iter[1], iter[2]};
        Value strided = arith::MulIOp::create(b, loc, it, c32);
        Value e = arith::AddIOp::create(b, loc, strided, lane);
        Value g = arith::DivUIOp::create(b, loc, e, groupSize);
        Value g64 = arith::IndexCastOp::create(b, loc, b.getI64Type(), g);
        Value groupBit = arith::ShLIOp::create(b, loc, c1I64, g64);
        Value inMask = arith::AndIOp::create(b, loc, groupMask, groupBit);
        Value inGroup = cmpi(arith::CmpIPredicate::ne, inMask, c0I64);
        Value it32 = toI32(b, loc, it);
        Value mineBit = arith::ShLIOp::create(b, loc, c1I32, it32);
        Value takenBit = arith::AndIOp::create(b, loc, taken, mineBit);
        Value free = cmpi(arith::CmpIPredicate::eq, takenBit, c0I32);
        Value candidate = arith::AndIOp::create(b, loc, inGroup, free);
        Value value = biasedScore(e);
        Value e32 = toI32(b, loc, e);
        Key x = key(candidate, value, e32);
        Value takeX = better(x, current);
        Key next = pick(takeX, x, current);
        scf::YieldOp::create(b, loc,
                             ValueRange{next.cls, next.value, next.index});
      }
      Key winner =
          warpBest({scan.getResult(0), scan.getResult(1), scan.getResult(2)});
      // The verifier leaves a candidate every round; a pick of none would
      // read scores[base].
      Value clamped = arith::MaxSIOp::create(b, loc, winner.index, c0I32);
      Value wi = arith::IndexCastOp::create(b, loc, index, clamped);
      Value owner = arith::RemUIOp::create(b, loc, wi, c32);
      Value own = cmpi(arith::CmpIPredicate::eq, owner, lane);
      Value slotOfLane = arith::DivUIOp::create(b, loc, wi, c32);
      Value slot32 = toI32(b, loc, slotOfLane);
      Value ownBit = arith::ShLIOp::create(b, loc, c1I32, slot32);
      Value withOwn = arith::OrIOp::create(b, loc, taken, ownBit);
      Value newTaken = select(own, withOwn, taken);
      Value ui = arith::AddIOp::create(b, loc, base, wi);
      Value u = memref::LoadOp::create(b, loc, scores, ui);
      Value slot = arith::AddIOp::create(b, loc, outBase, j);
      auto ifLead = scf::IfOp::create(b, loc, lead, /*withElseRegion=*/false);
      {
        OpBuilder::InsertionGuard leadGuard(b);
        b.setInsertionPointToStart(ifLead.thenBlock());
        memref::StoreOp::create(b, loc, winner.index, experts, slot);
        memref::StoreOp::create(b, loc, u, weights, slot);
        if (withCounts) {
          // A negative index is a huge one as unsigned: outside the experts.
          Value wu = arith::IndexCastUIOp::create(b, loc, index, winner.index);
          Value inRange = cmpi(arith::CmpIPredicate::ult, wu, numExperts);
          auto ifIn = scf::IfOp::create(b, loc, inRange, false);
          b.setInsertionPointToStart(ifIn.thenBlock());
          memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi, c1I32,
                                      shared, wu);
        }
      }
      Value newTotal = arith::AddFOp::create(b, loc, total, u);
      scf::YieldOp::create(b, loc, ValueRange{newTaken, newTotal});
    }

    // Renormalisation and scaling of the k weights.
    Value sum = picks.getResult(1);
    Value nonzero = cmpf(arith::CmpFPredicate::UNE, sum, zero);
    Value divide = arith::AndIOp::create(b, loc, renorm, nonzero);
    auto ifLead = scf::IfOp::create(b, loc, lead, /*withElseRegion=*/false);
    b.setInsertionPointToStart(ifLead.thenBlock());
    auto loop = scf::ForOp::create(b, loc, c0, topK, c1);
    b.setInsertionPointToStart(loop.getBody());
    Value slot = arith::AddIOp::create(b, loc, outBase, loop.getInductionVar());
    Value weight = memref::LoadOp::create(b, loc, weights, slot);
    Value divided = arith::DivFOp::create(b, loc, weight, sum);
    Value renormed = select(divide, divided, weight);
    Value scaled = arith::MulFOp::create(b, loc, renormed, scaling);
    memref::StoreOp::create(b, loc, scaled, weights, slot);
  }
  if (withCounts) {
    gpu::BarrierOp::create(b, loc);
    Value threads = indexConstant(b, loc, kSimpleThreads);
    auto flush = scf::ForOp::create(b, loc, tid, numExperts, threads);
    b.setInsertionPointToStart(flush.getBody());
    Value e = flush.getInductionVar();
    Value n = memref::LoadOp::create(b, loc, shared, e);
    Value some = cmpi(arith::CmpIPredicate::ne, n, c0I32);
    auto ifSome = scf::IfOp::create(b, loc, some, false);
    b.setInsertionPointToStart(ifSome.thenBlock());
    memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi, n, counts,
                                e);
    b.setInsertionPointAfter(flush);
  }
  gpu::ReturnOp::create(b, loc);
}

} // namespace

void mlir::moe::kernels::buildRouterSelectKernel(OpBuilder &b, Location loc) {
  SelectBuilder(b, loc).build();
}

void mlir::moe::kernels::buildRouterSelectCountsKernel(OpBuilder &b,
                                                       Location loc) {
  SelectBuilder(b, loc, /*counts=*/true).build();
}

//===----------------------------------------------------------------------===//
// moe_router_grad_logits
//===----------------------------------------------------------------------===//

namespace {

/// Routing slot j of a token: its index in the [T, k] arrays, its expert
/// as an index, and whether that expert is in [0, E).
struct Slot {
  Value index, expert, valid;
};

Slot loadSlot(OpBuilder &b, Location loc, Value experts, Value outBase, Value j,
              Value zeroI32, Value numExperts) {
  Value si = arith::AddIOp::create(b, loc, outBase, j);
  Value ej = memref::LoadOp::create(b, loc, experts, si);
  Value eji = arith::IndexCastOp::create(b, loc, b.getIndexType(), ej);
  Value nonNegative =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sge, ej, zeroI32);
  Value inRange =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::slt, eji, numExperts);
  Value valid = arith::AndIOp::create(b, loc, nonNegative, inRange);
  return {si, eji, valid};
}

} // namespace

namespace {

/// moe_router_grad_logits, and with `aux` moe_router_grad_logits_aux, which
/// adds the auxiliary losses' d_logits (buildAuxGradTerm) where the plain
/// kernel adds d_logits' input: its arguments after ldl are the selection
/// counts, d_load_balance, d_z_loss (0-d) and T * k.
void buildRouterGradLogits(OpBuilder &b, Location loc, bool aux) {
  Type f32 = b.getF32Type(), index = b.getIndexType(), i1 = b.getI1Type();
  MemRefType f32Buffer = flatBuffer(f32);
  SmallVector<Type> argTypes = {f32Buffer,
                                flatBuffer(b.getI32Type()),
                                f32Buffer,
                                f32Buffer,
                                i1,
                                index,
                                index,
                                index,
                                b.getI32Type(),
                                i1,
                                f32,
                                flatBuffer(b.getBF16Type()),
                                index};
  if (aux) {
    auto scalar = MemRefType::get({}, f32);
    argTypes.append({flatBuffer(b.getI32Type()), scalar, scalar, index});
  }
  gpu::GPUFuncOp kernel = createKernel(
      b, loc, aux ? "moe_router_grad_logits_aux" : "moe_router_grad_logits",
      argTypes);
  Value logits = kernel.getArgument(0), experts = kernel.getArgument(1),
        dw = kernel.getArgument(2), dlin = kernel.getArgument(3),
        hasDlin = kernel.getArgument(4), numTokens = kernel.getArgument(5),
        numExperts = kernel.getArgument(6), topK = kernel.getArgument(7),
        scoring = kernel.getArgument(8), renorm = kernel.getArgument(9),
        scaling = kernel.getArgument(10), dl = kernel.getArgument(11),
        ldl = kernel.getArgument(12);

  WarpPerToken w = buildWarpPerToken(b, loc);
  Value c0 = indexConstant(b, loc, 0);
  Value c1 = indexConstant(b, loc, 1);
  Value zeroI32 = i32Constant(b, loc, 0);
  Value zero = f32Constant(b, loc, 0.0f);
  Value one = f32Constant(b, loc, 1.0f);
  Value minusInf = f32Constant(b, loc, -INFINITY);
  Value ok = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, w.token,
                                   numTokens);
  auto ifOk = scf::IfOp::create(b, loc, ok, /*withElseRegion=*/false);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(ifOk.thenBlock());
  Value base = arith::MulIOp::create(b, loc, w.token, numExperts);
  Value outBase = arith::MulIOp::create(b, loc, w.token, topK);
  Value soft =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, scoring, zeroI32);
  Value max, sum;
  std::tie(max, sum) = buildSoftmaxMaxAndSum(b, loc, w, logits, base,
                                             numExperts, minusInf, zero);
  auto score = [&](Value logit) {
    return callF32(b, loc, "__moe_gpu_score", {logit, max, sum, soft});
  };
  std::function<Value(Value, Value)> auxTerm;
  if (aux)
    auxTerm = buildAuxGradTerm(b, loc,
                               {logits, kernel.getArgument(13),
                                kernel.getArgument(14), kernel.getArgument(15),
                                numTokens, numExperts, kernel.getArgument(16),
                                scoring, base, w.lane, max, sum});

  // S = sum_j u_j and sum_j dw_j u_j over the valid picks.
  auto sums = scf::ForOp::create(b, loc, c0, topK, c1, {zero, zero});
  {
    OpBuilder::InsertionGuard loopGuard(b);
    b.setInsertionPointToStart(sums.getBody());
    Value s = sums.getRegionIterArgs()[0], wsum = sums.getRegionIterArgs()[1];
    Slot slot = loadSlot(b, loc, experts, outBase, sums.getInductionVar(),
                         zeroI32, numExperts);
    auto ifValid = scf::IfOp::create(b, loc, TypeRange{f32, f32}, slot.valid,
                                     /*withElseRegion=*/true);
    b.setInsertionPointToStart(ifValid.thenBlock());
    Value li = arith::AddIOp::create(b, loc, base, slot.expert);
    Value l = memref::LoadOp::create(b, loc, logits, li);
    Value u = score(l);
    Value dwj = memref::LoadOp::create(b, loc, dw, slot.index);
    Value s2 = arith::AddFOp::create(b, loc, s, u);
    Value p = arith::MulFOp::create(b, loc, dwj, u);
    Value wsum2 = arith::AddFOp::create(b, loc, wsum, p);
    scf::YieldOp::create(b, loc, ValueRange{s2, wsum2});
    b.setInsertionPointToStart(ifValid.elseBlock());
    scf::YieldOp::create(b, loc, ValueRange{s, wsum});
    b.setInsertionPointAfter(ifValid);
    scf::YieldOp::create(b, loc, ifValid.getResults());
  }
  Value total = sums.getResult(0), weighted = sums.getResult(1);
  Value nonzero =
      arith::CmpFOp::create(b, loc, arith::CmpFPredicate::UNE, total, zero);
  Value totalSquared = arith::MulFOp::create(b, loc, total, total);
  auto dweight = [&](Value dwj) {
    return callF32(
        b, loc, "__moe_gpu_dweight",
        {dwj, total, weighted, totalSquared, nonzero, renorm, scaling});
  };

  // <ds, s> = sum_j du_j u_j.
  auto dsdot = scf::ForOp::create(b, loc, c0, topK, c1, zero);
  {
    OpBuilder::InsertionGuard loopGuard(b);
    b.setInsertionPointToStart(dsdot.getBody());
    Value acc = dsdot.getRegionIterArgs()[0];
    Slot slot = loadSlot(b, loc, experts, outBase, dsdot.getInductionVar(),
                         zeroI32, numExperts);
    auto ifValid =
        scf::IfOp::create(b, loc, f32, slot.valid, /*withElseRegion=*/true);
    b.setInsertionPointToStart(ifValid.thenBlock());
    Value li = arith::AddIOp::create(b, loc, base, slot.expert);
    Value l = memref::LoadOp::create(b, loc, logits, li);
    Value u = score(l);
    Value dwj = memref::LoadOp::create(b, loc, dw, slot.index);
    Value du = dweight(dwj);
    Value p = arith::MulFOp::create(b, loc, du, u);
    Value acc2 = arith::AddFOp::create(b, loc, acc, p);
    scf::YieldOp::create(b, loc, acc2);
    b.setInsertionPointToStart(ifValid.elseBlock());
    scf::YieldOp::create(b, loc, acc);
    b.setInsertionPointAfter(ifValid);
    scf::YieldOp::create(b, loc, ifValid.getResult(0));
  }

  auto loop = createExpertLoop(b, loc, w, numExperts);
  b.setInsertionPointToStart(loop.getBody());
  Value e = loop.getInductionVar();
  Value li = arith::AddIOp::create(b, loc, base, e);
  Value l = memref::LoadOp::create(b, loc, logits, li);
  Value s = score(l);
  // ds_e: the gradient of the weights of the slots that picked e.
  auto ds = scf::ForOp::create(b, loc, c0, topK, c1, zero);
  {
    OpBuilder::InsertionGuard loopGuard(b);
    b.setInsertionPointToStart(ds.getBody());
    Value acc = ds.getRegionIterArgs()[0];
    Value si = arith::AddIOp::create(b, loc, outBase, ds.getInductionVar());
    Value ej = memref::LoadOp::create(b, loc, experts, si);
    Value eji = arith::IndexCastOp::create(b, loc, index, ej);
    Value same =
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, eji, e);
    auto ifSame = scf::IfOp::create(b, loc, f32, same, /*withElseRegion=*/true);
    b.setInsertionPointToStart(ifSame.thenBlock());
    Value dwj = memref::LoadOp::create(b, loc, dw, si);
    Value du = dweight(dwj);
    Value acc2 = arith::AddFOp::create(b, loc, acc, du);
    scf::YieldOp::create(b, loc, acc2);
    b.setInsertionPointToStart(ifSame.elseBlock());
    scf::YieldOp::create(b, loc, acc);
    b.setInsertionPointAfter(ifSame);
    scf::YieldOp::create(b, loc, ifSame.getResult(0));
  }
  auto g = scf::IfOp::create(b, loc, f32, soft, /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard ifGuard(b);
    b.setInsertionPointToStart(g.thenBlock());
    Value q =
        arith::SubFOp::create(b, loc, ds.getResult(0), dsdot.getResult(0));
    Value v = arith::MulFOp::create(b, loc, s, q);
    scf::YieldOp::create(b, loc, v);
    b.setInsertionPointToStart(g.elseBlock());
    Value oneMinusS = arith::SubFOp::create(b, loc, one, s);
    Value slope = arith::MulFOp::create(b, loc, s, oneMinusS);
    Value sigmoidGrad = arith::MulFOp::create(b, loc, ds.getResult(0), slope);
    scf::YieldOp::create(b, loc, sigmoidGrad);
  }
  Value gl;
  if (aux) {
    // The aux losses' d_logits, then the add that the plain kernel makes of
    // d_logits' input.
    Value x = auxTerm(e, l);
    gl = arith::AddFOp::create(b, loc, g.getResult(0), x);
  } else {
    auto g2 = scf::IfOp::create(b, loc, f32, hasDlin, /*withElseRegion=*/true);
    {
      OpBuilder::InsertionGuard ifGuard(b);
      b.setInsertionPointToStart(g2.thenBlock());
      Value x = memref::LoadOp::create(b, loc, dlin, li);
      Value y = arith::AddFOp::create(b, loc, g.getResult(0), x);
      scf::YieldOp::create(b, loc, y);
      b.setInsertionPointToStart(g2.elseBlock());
      scf::YieldOp::create(b, loc, g.getResult(0));
    }
    gl = g2.getResult(0);
  }
  Value gb = arith::TruncFOp::create(b, loc, b.getBF16Type(), gl);
  Value row = arith::MulIOp::create(b, loc, w.token, ldl);
  Value dli = arith::AddIOp::create(b, loc, row, e);
  memref::StoreOp::create(b, loc, gb, dl, dli);
  b.setInsertionPointAfter(ifOk);
  gpu::ReturnOp::create(b, loc);
}

} // namespace

void mlir::moe::kernels::buildRouterGradLogitsKernel(OpBuilder &b,
                                                     Location loc) {
  buildRouterGradLogits(b, loc, /*aux=*/false);
}

void mlir::moe::kernels::buildRouterGradLogitsAuxKernel(OpBuilder &b,
                                                        Location loc) {
  buildRouterGradLogits(b, loc, /*aux=*/true);
}
