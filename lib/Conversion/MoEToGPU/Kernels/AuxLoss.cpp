//===- AuxLoss.cpp - the kernels of the auxiliary losses ------------------===//
//
// The auxiliary losses of moe.aux_loss and their gradient. No float atomics:
// the selection counts are integer atomics (whose sum does not depend on the
// order), and every float sum runs in an order fixed by the sizes alone, so
// that the losses and d_logits are the same bits run to run.
//
// - moe_aux_counts: the selections of each expert, a chunk of 1024 slots a
//   block (shared-memory counts, then one global atomic an expert a block).
// - moe_aux_partials: a block a chunk of tokens. Its warps work out each
//   token's logsumexp (and the sum of its sigmoids) into shared memory, 64
//   tokens at a time; then a thread an expert adds the token's score to the
//   expert's sum, in token order, and one more column sums logsumexp^2.
// - moe_aux_columns: a warp a column, the chunks' partial sums of an expert
//   (and of lse^2), lanes over the chunks, then xor shuffles.
// - moe_aux_finish: one block, load_balance = E * sum_e f_e * P_e and z_loss
//   = mean lse^2 from the column sums.
// - moe_aux_loss_grad: a warp a token, d_logits from the counts.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"
#include "SimpleKernels.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

#include <cmath>
#include <tuple>

using namespace mlir;
using namespace mlir::moe::kernels;

namespace {

/// The experts a shared-memory table holds (the contract's max_experts).
constexpr int64_t kMaxExperts = 1024;
/// Routing slots a block of moe_aux_counts counts.
constexpr int64_t kCountChunk = 1024;
/// Tokens whose statistics moe_aux_partials holds in shared memory at once.
constexpr int64_t kStatTokens = 64;
constexpr int64_t kWarps = kSimpleThreads / 32;
constexpr int32_t kXorMasks[] = {16, 8, 4, 2, 1};

/// The ops of a kernel body, one op a call.
struct K {
  OpBuilder &b;
  Location loc;

  Type f32() { return b.getF32Type(); }
  Value c(int64_t v) { return indexConstant(b, loc, v); }
  Value cf(float v) { return f32Constant(b, loc, v); }
  Value ci(int32_t v) { return i32Constant(b, loc, v); }
  Value add(Value x, Value y) { return arith::AddIOp::create(b, loc, x, y); }
  Value sub(Value x, Value y) { return arith::SubIOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return arith::MulIOp::create(b, loc, x, y); }
  Value divu(Value x, Value y) { return arith::DivUIOp::create(b, loc, x, y); }
  Value remu(Value x, Value y) { return arith::RemUIOp::create(b, loc, x, y); }
  Value minu(Value x, Value y) { return arith::MinUIOp::create(b, loc, x, y); }
  Value fadd(Value x, Value y) { return arith::AddFOp::create(b, loc, x, y); }
  Value fsub(Value x, Value y) { return arith::SubFOp::create(b, loc, x, y); }
  Value fmul(Value x, Value y) { return arith::MulFOp::create(b, loc, x, y); }
  Value fdiv(Value x, Value y) { return arith::DivFOp::create(b, loc, x, y); }
  Value fmax(Value x, Value y) {
    return arith::MaximumFOp::create(b, loc, x, y);
  }
  Value ult(Value x, Value y) {
    return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, x, y);
  }
  Value eq(Value x, Value y) {
    return arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, x, y);
  }
  Value select(Value cond, Value x, Value y) {
    return arith::SelectOp::create(b, loc, cond, x, y);
  }
  Value load(Value mem, ValueRange indices) {
    return memref::LoadOp::create(b, loc, mem, indices);
  }
  void store(Value v, Value mem, ValueRange indices) {
    memref::StoreOp::create(b, loc, v, mem, indices);
  }
  /// An index as f32 (exact up to 2^24, rounded past it).
  Value toF32(Value index) {
    Value i = arith::IndexCastUIOp::create(b, loc, b.getI64Type(), index);
    return arith::UIToFPOp::create(b, loc, f32(), i);
  }
  Value call(StringRef callee, Value x) {
    return func::CallOp::create(b, loc, callee, TypeRange{f32()}, ValueRange{x})
        .getResult(0);
  }
  Value exp(Value x) { return call("__moe_gpu_exp", x); }
  Value sigmoid(Value x) { return call("__moe_gpu_sigmoid", x); }
  /// ln(x) = log2(x) ln 2 by lg2.approx (~2^-22 absolute near 1).
  Value log(Value x) {
    Value l2 =
        NVVM::InlinePtxOp::create(b, loc, TypeRange{f32()}, ValueRange{x},
                                  ValueRange{}, "lg2.approx.ftz.f32 $0, $1;",
                                  /*predicate=*/Value())
            ->getResult(0);
    return fmul(l2, cf(0.693147182f));
  }
  void barrier() { gpu::BarrierOp::create(b, loc); }
  Value shared(gpu::GPUFuncOp kernel, int64_t size, Type element) {
    auto type =
        MemRefType::get({size}, element, MemRefLayoutAttrInterface(),
                        gpu::AddressSpaceAttr::get(
                            b.getContext(), gpu::AddressSpace::Workgroup));
    return kernel.addWorkgroupAttribution(type, loc);
  }
  /// `value` summed (or maxed) over the warp by xor shuffles, in a fixed
  /// order: every lane gets the same bits.
  Value warpSum(Value value, bool max = false) {
    Value width = ci(32);
    for (int32_t m : kXorMasks) {
      Value mask = ci(m);
      Value other = gpu::ShuffleOp::create(b, loc, value, mask, width,
                                           gpu::ShuffleMode::XOR)
                        .getShuffleResult();
      value = max ? fmax(value, other) : fadd(value, other);
    }
    return value;
  }
  /// sum over this lane's experts (lane, lane + 32, ... < E) of term(e, l),
  /// l the token's logit of expert e at `base + e`, then over the warp.
  Value laneSum(Value logits, Value base, Value lane, Value numExperts,
                Value init, function_ref<Value(Value, Value, Value)> term,
                bool max = false) {
    Value partial = buildFor(b, loc, lane, numExperts, c(32), init,
                             [&](Value e, Value acc) {
                               Value i = add(base, e);
                               Value l = load(logits, i);
                               return term(e, l, acc);
                             });
    return warpSum(partial, max);
  }
};

/// A token's max and sum of exp(l - max) over its logits, warp-reduced.
std::pair<Value, Value> softmaxStats(K &k, Value logits, Value base, Value lane,
                                     Value numExperts) {
  Value max = k.laneSum(
      logits, base, lane, numExperts, k.cf(-INFINITY),
      [&](Value, Value l, Value acc) { return k.fmax(acc, l); }, true);
  Value sum = k.laneSum(logits, base, lane, numExperts, k.cf(0.0f),
                        [&](Value, Value l, Value acc) {
                          return k.fadd(acc, k.exp(k.fsub(l, max)));
                        });
  return {max, sum};
}

} // namespace

//===----------------------------------------------------------------------===//
// moe_aux_counts
//===----------------------------------------------------------------------===//

void mlir::moe::kernels::buildAuxCountsKernel(OpBuilder &b, Location loc) {
  Type i32 = b.getI32Type(), index = b.getIndexType();
  MemRefType slots = flatBuffer(i32);
  gpu::GPUFuncOp kernel =
      createKernel(b, loc, "moe_aux_counts", {slots, index, index, slots});
  Value experts = kernel.getArgument(0), numSlots = kernel.getArgument(1),
        numExperts = kernel.getArgument(2), counts = kernel.getArgument(3);
  K k{b, loc};
  Value shared = k.shared(kernel, kMaxExperts, i32);
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value threads = k.c(kSimpleThreads);
  Value zero = k.ci(0), one = k.ci(1);
  buildFor(b, loc, tid, numExperts, threads,
           [&](Value e) { k.store(zero, shared, e); });
  k.barrier();
  Value base = k.mul(bid, k.c(kCountChunk));
  buildFor(b, loc, tid, k.c(kCountChunk), threads, [&](Value s) {
    Value i = k.add(base, s);
    buildIf(b, loc, k.ult(i, numSlots), [&] {
      Value x = k.load(experts, i);
      Value e = arith::IndexCastOp::create(b, loc, index, x);
      // A negative slot is a huge index as unsigned: outside the experts.
      buildIf(b, loc, k.ult(e, numExperts), [&] {
        memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi, one,
                                    shared, e);
      });
    });
  });
  k.barrier();
  buildFor(b, loc, tid, numExperts, threads, [&](Value e) {
    Value n = k.load(shared, e);
    Value some =
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ne, n, zero);
    buildIf(b, loc, some, [&] {
      memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi, n, counts,
                                  e);
    });
  });
  gpu::ReturnOp::create(b, loc);
}

//===----------------------------------------------------------------------===//
// moe_aux_partials
//===----------------------------------------------------------------------===//

namespace {

/// moe_router_scores_aux's work: `before` the statistics of a chunk's tokens
/// (the block's, on logits [first, last)), `after` those of a token (its
/// warp's; base: the token's first logit) with the softmax's max and sum.
struct TokenHooks {
  function_ref<void(K &, Value first, Value last, Value tid)> before;
  function_ref<void(K &, Value base, Value lane, Value max, Value sum,
                    Value soft)>
      after;
};

/// moe_aux_partials' body in `kernel`: a block a chunk of tokens, its
/// per-expert score sums and lse^2 in a row of `partials`.
void buildPartialsBody(OpBuilder &b, Location loc, gpu::GPUFuncOp kernel,
                       Value logits, Value numTokens, Value numExperts,
                       Value scoring, Value chunkTokens, Value numChunks,
                       Value partials, TokenHooks hooks = {}) {
  Type f32 = b.getF32Type();
  K k{b, loc};
  // A column an expert and one of the tokens' lse^2; a token's lse and the
  // sum of its sigmoids (1 for softmax). `acc` is rounded up to 16 bytes:
  // the statistics after it are stored a pair at a time, which LLVM merges
  // into one 8-byte store (misaligned after 1025 floats on the GPU).
  Value acc = k.shared(kernel, kMaxExperts + 4, f32);
  Value stats = k.shared(kernel, 2 * kStatTokens, f32);
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value threads = k.c(kSimpleThreads);
  Value c0 = k.c(0), c1 = k.c(1), c2 = k.c(2);
  Value lane = k.remu(tid, k.c(32));
  Value warp = k.divu(tid, k.c(32));
  Value zero = k.cf(0.0f), one = k.cf(1.0f);
  Value soft = k.eq(scoring, k.ci(0));
  Value columns = k.add(numExperts, c1);
  // The whole block takes one side: its barriers are uniform.
  buildIf(b, loc, k.ult(bid, numChunks), [&] {
    Value start = k.mul(bid, chunkTokens);
    Value stop = k.minu(k.add(start, chunkTokens), numTokens);
    buildFor(b, loc, tid, columns, threads,
             [&](Value e) { k.store(zero, acc, e); });
    // The first sub-chunk's barrier orders this before the statistics.
    if (hooks.before)
      hooks.before(k, k.mul(start, numExperts), k.mul(stop, numExperts), tid);
    buildFor(b, loc, start, stop, k.c(kStatTokens), [&](Value sub) {
      Value subStop = k.minu(k.add(sub, k.c(kStatTokens)), stop);
      // The last sub-chunk's readers are done with the statistics.
      k.barrier();
      buildFor(b, loc, k.add(sub, warp), subStop, k.c(kWarps), [&](Value t) {
        Value base = k.mul(t, numExperts);
        Value max, sum;
        std::tie(max, sum) = softmaxStats(k, logits, base, lane, numExperts);
        Value lse = k.fadd(max, k.log(sum));
        if (hooks.after)
          hooks.after(k, base, lane, max, sum, soft);
        Value total = buildIfElse(
            b, loc, f32, soft, [&] { return one; },
            [&] {
              return k.laneSum(logits, base, lane, numExperts, zero,
                               [&](Value, Value l, Value a) {
                                 return k.fadd(a, k.sigmoid(l));
                               });
            });
        buildIf(b, loc, k.eq(lane, c0), [&] {
          Value slot = k.mul(k.sub(t, sub), c2);
          k.store(lse, stats, slot);
          k.store(total, stats, k.add(slot, c1));
        });
      });
      k.barrier();
      // A thread a column, its tokens in order.
      buildFor(b, loc, tid, columns, threads, [&](Value e) {
        Value a = k.load(acc, e);
        auto tokens = [&](function_ref<Value(Value, Value)> term) {
          return buildFor(b, loc, sub, subStop, c1, a, [&](Value t, Value s) {
            Value slot = k.mul(k.sub(t, sub), c2);
            return k.fadd(s, term(t, slot));
          });
        };
        Value r = buildIfElse(
            b, loc, f32, k.ult(e, numExperts),
            [&] {
              return buildIfElse(
                  b, loc, f32, soft,
                  [&] {
                    return tokens([&](Value t, Value slot) {
                      Value l = k.load(logits, k.add(k.mul(t, numExperts), e));
                      Value lse = k.load(stats, slot);
                      return k.exp(k.fsub(l, lse));
                    });
                  },
                  [&] {
                    return tokens([&](Value t, Value slot) {
                      Value l = k.load(logits, k.add(k.mul(t, numExperts), e));
                      Value total = k.load(stats, k.add(slot, c1));
                      return k.fdiv(k.sigmoid(l), total);
                    });
                  });
            },
            [&] {
              return tokens([&](Value, Value slot) {
                Value lse = k.load(stats, slot);
                return k.fmul(lse, lse);
              });
            });
        k.store(r, acc, e);
      });
    });
    // Each thread stores the columns it summed.
    Value row = k.mul(bid, columns);
    buildFor(b, loc, tid, columns, threads, [&](Value e) {
      Value v = k.load(acc, e);
      k.store(v, partials, k.add(row, e));
    });
  });
  gpu::ReturnOp::create(b, loc);
}

} // namespace

void mlir::moe::kernels::buildAuxPartialsKernel(OpBuilder &b, Location loc) {
  Type f32 = b.getF32Type(), index = b.getIndexType();
  MemRefType buffer = flatBuffer(f32);
  gpu::GPUFuncOp kernel = createKernel(
      b, loc, "moe_aux_partials",
      {buffer, index, index, b.getI32Type(), index, index, buffer});
  buildPartialsBody(b, loc, kernel, kernel.getArgument(0),
                    kernel.getArgument(1), kernel.getArgument(2),
                    kernel.getArgument(3), kernel.getArgument(4),
                    kernel.getArgument(5), kernel.getArgument(6));
}

//===----------------------------------------------------------------------===//
// moe_router_grad_logits_aux's term
//===----------------------------------------------------------------------===//

std::function<Value(Value, Value)>
mlir::moe::kernels::buildAuxGradTerm(OpBuilder &b, Location loc,
                                     const AuxGradInputs &in) {
  K k{b, loc};
  Type f32 = k.f32();
  Value logits = in.logits, counts = in.counts, numExperts = in.numExperts,
        numSlots = in.numSlots, base = in.base, lane = in.lane, max = in.max,
        sum = in.sum;
  // moe_aux_loss_grad's ops, so that its d_logits are the same bits.
  Value c0 = k.c(0);
  Value zero = k.cf(0.0f), one = k.cf(1.0f), two = k.cf(2.0f);
  Value soft = k.eq(in.scoring, k.ci(0));
  Value dlb = k.load(in.dLoadBalance, {});
  Value dz = k.load(in.dZLoss, {});
  Value tokensF = k.toF32(in.numTokens);
  Value expertsF = k.toF32(numExperts);
  Value slotsF = k.toF32(numSlots);
  Value scale = k.fdiv(k.fmul(dlb, expertsF), tokensF);
  Value noSlots = k.eq(numSlots, c0);
  auto g = [=](Value e) mutable {
    Value n = k.load(counts, e);
    Value nf = arith::SIToFPOp::create(k.b, k.loc, f32, n);
    Value f = k.select(noSlots, zero, k.fdiv(nf, slotsF));
    return k.fmul(scale, f);
  };
  Value lse = k.fadd(max, k.log(sum));
  Value zc = k.fdiv(k.fmul(k.fmul(dz, two), lse), tokensF);
  auto softmax = [=](Value l) mutable {
    return k.fdiv(k.exp(k.fsub(l, max)), sum);
  };
  // (inner, total): <g, p> and, for sigmoid, the sum of the sigmoids.
  auto stats = scf::IfOp::create(b, loc, TypeRange{f32, f32}, soft,
                                 /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(stats.thenBlock());
    Value inner = k.laneSum(logits, base, lane, numExperts, zero,
                            [&](Value e, Value l, Value a) {
                              return k.fadd(a, k.fmul(g(e), softmax(l)));
                            });
    scf::YieldOp::create(b, loc, ValueRange{inner, one});
    b.setInsertionPointToStart(stats.elseBlock());
    Value total = k.laneSum(
        logits, base, lane, numExperts, zero,
        [&](Value, Value l, Value a) { return k.fadd(a, k.sigmoid(l)); });
    Value innerS = k.laneSum(
        logits, base, lane, numExperts, zero, [&](Value e, Value l, Value a) {
          return k.fadd(a, k.fdiv(k.fmul(g(e), k.sigmoid(l)), total));
        });
    scf::YieldOp::create(b, loc, ValueRange{innerS, total});
  }
  Value inner = stats.getResult(0), total = stats.getResult(1);
  return [=, &b](Value e, Value l) mutable -> Value {
    return buildIfElse(
        b, loc, f32, soft,
        [&] {
          Value p = softmax(l);
          Value d = k.fsub(g(e), inner);
          return k.fmul(p, k.fadd(d, zc));
        },
        [&] {
          Value s = k.sigmoid(l);
          Value d = k.fdiv(k.fsub(g(e), inner), total);
          Value ds = k.fmul(d, k.fmul(s, k.fsub(one, s)));
          return k.fadd(ds, k.fmul(zc, softmax(l)));
        });
  };
}

//===----------------------------------------------------------------------===//
// moe_router_scores_aux
//===----------------------------------------------------------------------===//

void mlir::moe::kernels::buildRouterScoresAuxKernel(OpBuilder &b,
                                                    Location loc) {
  Type f32 = b.getF32Type(), index = b.getIndexType();
  MemRefType buffer = flatBuffer(f32);
  gpu::GPUFuncOp kernel =
      createKernel(b, loc, "moe_router_scores_aux",
                   {buffer, buffer, index, index, b.getI32Type(), b.getI1Type(),
                    index, index, buffer});
  Value logits = kernel.getArgument(0), scores = kernel.getArgument(1),
        round = kernel.getArgument(5);
  // moe_router_scores' rounding and scores, with the same ops (the same
  // bits), then the statistics of moe_aux_partials on the rounded logits.
  // The chunk's logits by the whole block, in a pass of their own (inside
  // the token loop the rounding made ptxas spill).
  auto rounding = [&](K &k, Value first, Value last, Value tid) {
    buildIf(b, loc, round, [&] {
      Value i0 = k.add(first, tid);
      buildFor(b, loc, i0, last, k.c(kSimpleThreads), [&](Value i) {
        Value l = k.load(logits, i);
        Value h = arith::TruncFOp::create(b, loc, b.getBF16Type(), l);
        k.store(arith::ExtFOp::create(b, loc, f32, h), logits, i);
      });
    });
  };
  auto scoring = [&](K &k, Value base, Value lane, Value max, Value sum,
                     Value soft) {
    Value numExperts = kernel.getArgument(3);
    Value one = k.cf(1.0f);
    auto store = [&](function_ref<Value(Value)> score) {
      buildFor(b, loc, lane, numExperts, k.c(32), [&](Value e) {
        Value i = k.add(base, e);
        k.store(score(k.load(logits, i)), scores, i);
      });
    };
    buildIfElse(
        b, loc, soft,
        [&] {
          store([&](Value l) { return k.fdiv(k.exp(k.fsub(l, max)), sum); });
        },
        [&] {
          store([&](Value l) {
            Value x = k.exp(arith::NegFOp::create(b, loc, l));
            return k.fdiv(one, k.fadd(x, one));
          });
        });
  };
  buildPartialsBody(b, loc, kernel, logits, kernel.getArgument(2),
                    kernel.getArgument(3), kernel.getArgument(4),
                    kernel.getArgument(6), kernel.getArgument(7),
                    kernel.getArgument(8), {rounding, scoring});
}

//===----------------------------------------------------------------------===//
// moe_aux_columns
//===----------------------------------------------------------------------===//

void mlir::moe::kernels::buildAuxColumnsKernel(OpBuilder &b, Location loc) {
  Type f32 = b.getF32Type(), index = b.getIndexType();
  MemRefType buffer = flatBuffer(f32);
  gpu::GPUFuncOp kernel =
      createKernel(b, loc, "moe_aux_columns", {buffer, index, index, buffer});
  Value partials = kernel.getArgument(0), numChunks = kernel.getArgument(1),
        numExperts = kernel.getArgument(2), sums = kernel.getArgument(3);
  K k{b, loc};
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value c0 = k.c(0), c1 = k.c(1);
  Value lane = k.remu(tid, k.c(32));
  Value column = k.add(k.mul(bid, k.c(kWarps)), k.divu(tid, k.c(32)));
  Value columns = k.add(numExperts, c1);
  Value zero = k.cf(0.0f);
  // A warp a column: lane l sums chunks l, l + 32, ... in order, then the
  // lanes by xor shuffles (the whole warp takes one side).
  buildIf(b, loc, k.ult(column, columns), [&] {
    Value partial = buildFor(b, loc, lane, numChunks, k.c(32), zero,
                             [&](Value ch, Value acc) {
                               Value i = k.add(k.mul(ch, columns), column);
                               return k.fadd(acc, k.load(partials, i));
                             });
    Value total = k.warpSum(partial);
    buildIf(b, loc, k.eq(lane, c0), [&] { k.store(total, sums, column); });
  });
  gpu::ReturnOp::create(b, loc);
}

//===----------------------------------------------------------------------===//
// moe_aux_finish
//===----------------------------------------------------------------------===//

void mlir::moe::kernels::buildAuxFinishKernel(OpBuilder &b, Location loc) {
  Type f32 = b.getF32Type(), index = b.getIndexType();
  auto scalar = MemRefType::get({}, f32);
  gpu::GPUFuncOp kernel =
      createKernel(b, loc, "moe_aux_finish",
                   {flatBuffer(f32), flatBuffer(b.getI32Type()), index, index,
                    index, scalar, scalar});
  Value sums = kernel.getArgument(0), counts = kernel.getArgument(1),
        numTokens = kernel.getArgument(2), numExperts = kernel.getArgument(3),
        numSlots = kernel.getArgument(4), loadBalance = kernel.getArgument(5),
        zLoss = kernel.getArgument(6);
  K k{b, loc};
  Value shared = k.shared(kernel, kSimpleThreads, f32);
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value threads = k.c(kSimpleThreads);
  Value c0 = k.c(0), c1 = k.c(1);
  Value zero = k.cf(0.0f);
  Value slotsF = k.toF32(numSlots);
  // sum_e f_e * S_e: this thread's experts in order, then the threads' sums
  // in thread order.
  Value lb =
      buildFor(b, loc, tid, numExperts, threads, zero, [&](Value e, Value acc) {
        Value n = k.load(counts, e);
        Value nf = arith::SIToFPOp::create(b, loc, f32, n);
        Value f = k.fdiv(nf, slotsF);
        return k.fadd(acc, k.fmul(f, k.load(sums, e)));
      });
  k.store(lb, shared, tid);
  k.barrier();
  buildIf(b, loc, k.eq(tid, c0), [&] {
    Value lbSum =
        buildFor(b, loc, c0, threads, c1, zero, [&](Value i, Value acc) {
          return k.fadd(acc, k.load(shared, i));
        });
    Value zSum = k.load(sums, numExperts);
    Value tokensF = k.toF32(numTokens);
    Value expertsF = k.toF32(numExperts);
    // No selections (T = 0 or k = 0): every f_e is 0.
    Value noSlots = k.eq(numSlots, c0);
    Value noTokens = k.eq(numTokens, c0);
    Value lbValue = k.fdiv(k.fmul(expertsF, lbSum), tokensF);
    Value lbOut = k.select(noSlots, zero, lbValue);
    Value zOut = k.select(noTokens, zero, k.fdiv(zSum, tokensF));
    k.store(lbOut, loadBalance, {});
    k.store(zOut, zLoss, {});
  });
  gpu::ReturnOp::create(b, loc);
}

//===----------------------------------------------------------------------===//
// moe_aux_loss_grad
//===----------------------------------------------------------------------===//

void mlir::moe::kernels::buildAuxLossGradKernel(OpBuilder &b, Location loc) {
  Type f32 = b.getF32Type(), index = b.getIndexType();
  auto scalar = MemRefType::get({}, f32);
  MemRefType buffer = flatBuffer(f32);
  gpu::GPUFuncOp kernel =
      createKernel(b, loc, "moe_aux_loss_grad",
                   {buffer, flatBuffer(b.getI32Type()), scalar, scalar, index,
                    index, index, b.getI32Type(), buffer});
  Value logits = kernel.getArgument(0), counts = kernel.getArgument(1),
        dLoadBalance = kernel.getArgument(2), dZLoss = kernel.getArgument(3),
        numTokens = kernel.getArgument(4), numExperts = kernel.getArgument(5),
        numSlots = kernel.getArgument(6), scoring = kernel.getArgument(7),
        dLogits = kernel.getArgument(8);
  K k{b, loc};
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value c0 = k.c(0);
  Value lane = k.remu(tid, k.c(32));
  Value token = k.add(k.mul(bid, k.c(kWarps)), k.divu(tid, k.c(32)));
  Value zero = k.cf(0.0f), one = k.cf(1.0f), two = k.cf(2.0f);
  Value soft = k.eq(scoring, k.ci(0));
  buildIf(b, loc, k.ult(token, numTokens), [&] {
    Value dlb = k.load(dLoadBalance, {});
    Value dz = k.load(dZLoss, {});
    Value tokensF = k.toF32(numTokens);
    Value expertsF = k.toF32(numExperts);
    Value slotsF = k.toF32(numSlots);
    // g_e = d_lb * E * f_e / T with f_e = counts_e / (T k); 0 without slots.
    Value scale = k.fdiv(k.fmul(dlb, expertsF), tokensF);
    Value noSlots = k.eq(numSlots, c0);
    auto g = [&](Value e) {
      Value n = k.load(counts, e);
      Value nf = arith::SIToFPOp::create(b, loc, f32, n);
      Value f = k.select(noSlots, zero, k.fdiv(nf, slotsF));
      return k.fmul(scale, f);
    };
    Value base = k.mul(token, numExperts);
    Value max, sum;
    std::tie(max, sum) = softmaxStats(k, logits, base, lane, numExperts);
    Value lse = k.fadd(max, k.log(sum));
    // The z-loss's part: d_z * 2 lse / T times the softmax.
    Value zc = k.fdiv(k.fmul(k.fmul(dz, two), lse), tokensF);
    auto softmax = [&](Value l) { return k.fdiv(k.exp(k.fsub(l, max)), sum); };
    auto store = [&](function_ref<Value(Value, Value)> value) {
      buildFor(b, loc, lane, numExperts, k.c(32), [&](Value e) {
        Value i = k.add(base, e);
        Value l = k.load(logits, i);
        k.store(value(e, l), dLogits, i);
      });
    };
    buildIfElse(
        b, loc, soft,
        [&] {
          // p (g - <g, p>) + zc p.
          Value inner = k.laneSum(logits, base, lane, numExperts, zero,
                                  [&](Value e, Value l, Value a) {
                                    return k.fadd(a, k.fmul(g(e), softmax(l)));
                                  });
          store([&](Value e, Value l) {
            Value p = softmax(l);
            Value d = k.fsub(g(e), inner);
            return k.fmul(p, k.fadd(d, zc));
          });
        },
        [&] {
          // p = s / S: (g - <g, p>) / S * s (1 - s) + zc softmax.
          Value total = k.laneSum(
              logits, base, lane, numExperts, zero,
              [&](Value, Value l, Value a) { return k.fadd(a, k.sigmoid(l)); });
          Value inner = k.laneSum(
              logits, base, lane, numExperts, zero,
              [&](Value e, Value l, Value a) {
                return k.fadd(a, k.fdiv(k.fmul(g(e), k.sigmoid(l)), total));
              });
          store([&](Value e, Value l) {
            Value s = k.sigmoid(l);
            Value d = k.fdiv(k.fsub(g(e), inner), total);
            Value ds = k.fmul(d, k.fmul(s, k.fsub(one, s)));
            return k.fadd(ds, k.fmul(zc, softmax(l)));
          });
        });
  });
  gpu::ReturnOp::create(b, loc);
}
