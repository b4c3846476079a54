//===- GemmEpilogue.cpp - the GEMM kernels' epilogues ---------------------===//
//
// What the GEMMs do with a finished accumulator: the persistent kernels stage
// C in bf16 (half tiles, or by stmatrix for bulk and TMA stores) and write it
// out; the one-tile kernels stage the tile in the ring and walk it row-wise
// (store_f32, and the dSwiGLU with its dH, w*a and dS outputs).
//
//===----------------------------------------------------------------------===//

#include "GemmKernelBuilder.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <functional>
#include <tuple>

using namespace mlir;
using namespace mlir::moe::kernels;
using moe_gpu::GemmEpilogue;
using Pred = arith::CmpIPredicate;

namespace {
constexpr int64_t kBM = moe_gpu::kTileM, kBN = moe_gpu::kTileN;
constexpr int64_t kGemmThreads = moe_gpu::kConsumerThreads;
/// bf16 values a 16-byte group.
constexpr int64_t kV = 8;
constexpr int64_t kBulkRow = kBN + 8;
/// A TMA store box: 128 rows of 64 bf16.
constexpr int64_t kTmaBoxBytes = kBM * 64 * 2;
} // namespace

//===----------------------------------------------------------------------===//
// The persistent kernels' epilogues
//===----------------------------------------------------------------------===//

Value GemmKernelBuilder::outBase(const Tile &s) {
  // Where the tile's C block starts: expert e's [M, N] block of a weight
  // gradient's [E, M, N] output, 0 for the others.
  if (g.epi == GemmEpilogue::StoreBf16)
    return c(0);
  Value em = mul(s.expert, dimM);
  return mul(em, dimN);
}

void GemmKernelBuilder::writeHalf(const Tile &s, Value stage, int64_t h) {
  // Half h of C from the staging buffer to global memory in 16-byte stores.
  // A thread keeps one column group and walks rows 16 (SwiGLU: 32) apart, so
  // its addresses are one pointer and a fixed step.
  Value m0 = s.m0, n0 = s.n0, mEnd = s.mEnd;
  int64_t base = h * kBM * kBN / 2;
  auto vec8 = VectorType::get({kV}, bf16);
  auto sload = [&](Value idx) -> Value {
    return vector::LoadOp::create(b, loc, vec8, stage, idx,
                                  /*nontemporal=*/false, llvm::MaybeAlign(16));
  };
  auto gstore = [&](Value vec, Value p) {
    LLVM::StoreOp::create(b, loc, vec, p, /*alignment=*/16);
  };
  // a - b as i32 (negative when b is past a).
  auto left = [&](Value x, Value y) {
    Value x32 = i32(x);
    Value y32 = i32(y);
    return sub(x32, y32);
  };

  if (g.swigluTile()) {
    // Rows tid/8 + 32 j, 16-byte group q = tid%8 of the 64 gate columns (and
    // group q + 8: the same up columns).
    Value half = dimN;
    Value q = rem(tid, c(8));
    Value lr0 = div(tid, c(8));
    Value swz = rem(lr0, c(8));
    Value row0;
    {
      Value baseIdx = c(base);
      Value x = mul(lr0, c(kBN / 2));
      row0 = add(baseIdx, x);
    }
    Value gIdx;
    {
      Value x = xori(q, swz);
      Value y = mul(x, c(kV));
      gIdx = add(row0, y);
    }
    Value uIdx;
    {
      Value q8 = add(q, c(8));
      Value x = xori(q8, swz);
      Value y = mul(x, c(kV));
      uIdx = add(row0, y);
    }
    Value col;
    {
      Value first = c(64 * h);
      Value x = mul(q, c(kV));
      Value y = add(first, x);
      col = add(n0, y);
    }
    Value colOk = cmp(Pred::ult, col, half);
    Value r0 = add(m0, lr0);
    Value mleft = left(mEnd, r0);
    Value half2;
    {
      Value h32 = i32(half);
      half2 = mul(h32, cI32(2));
    }
    Value hp;
    {
      Value width = mul(half, c(2));
      Value x = mul(r0, width);
      Value y = add(x, col);
      Value y64 = i64(y);
      Value bytes = mul(y64, cI64(2));
      hp = gep1(houtPtr, bytes);
    }
    Value ap;
    if (g.storeA) {
      Value x = mul(r0, half);
      Value y = add(x, col);
      Value y64 = i64(y);
      Value bytes = mul(y64, cI64(2));
      ap = gep1(aoutPtr, bytes);
    }
    Value hStep;
    {
      Value rows = cI32(32);
      Value x = mul(half2, cI32(2));
      hStep = wide(rows, x);
    }
    Value aStepOut;
    {
      Value rows = cI32(32);
      aStepOut = wide(rows, half2);
    }
    Value upOff = zext(half2);
    for (int64_t j = 0; j < kBM * (kBN / 4) / kV / kGemmThreads; ++j) {
      if (j) {
        hp = gep1(hp, hStep);
        if (g.storeA)
          ap = gep1(ap, aStepOut);
      }
      Value gv = sload(add(gIdx, c(j * 32 * (kBN / 2))));
      Value uv = sload(add(uIdx, c(j * 32 * (kBN / 2))));
      Value more = cmp(Pred::sgt, mleft, cI32(32 * j));
      ifBegin(andi(colOk, more));
      gstore(gv, hp);
      gstore(uv, gep1(hp, upOff));
      if (g.storeA) {
        // a = silu(g) * u from the bf16-rounded h, as backward sees it.
        SmallVector<Value> avals;
        for (int64_t u = 0; u < kV; ++u) {
          Value ge =
              vector::ExtractOp::create(b, loc, gv, ArrayRef<int64_t>{u});
          Value g32 = arith::ExtFOp::create(b, loc, f32, ge);
          Value ue =
              vector::ExtractOp::create(b, loc, uv, ArrayRef<int64_t>{u});
          Value u32 = arith::ExtFOp::create(b, loc, f32, ue);
          Value silu = siluParts(g32).second;
          Value prod = fmul(silu, u32);
          avals.push_back(arith::TruncFOp::create(b, loc, bf16, prod));
        }
        Value av = vector::FromElementsOp::create(b, loc, vec8, avals);
        gstore(av, ap);
      }
      ifEnd();
    }
    return;
  }
  // A non-gated activation's tile goes out as a plain one (H, of n columns),
  // with A = act(H) beside it.
  bool act = g.epi == GemmEpilogue::Swiglu;
  Value ldOut = act ? dimN : ldc;
  Value obase = act ? c(0) : outBase(s);
  Value q = rem(tid, c(16));
  Value l0 = div(tid, c(16));
  Value step;
  {
    Value rows = cI32(16);
    Value ldc32 = i32(ldOut);
    Value x = mul(ldc32, cI32(2));
    step = wide(rows, x);
  }
  // 16-byte group q of row l0 + 16 j.
  Value sidx;
  {
    Value baseIdx = c(base);
    Value x = mul(l0, c(kBN / 2));
    Value rowIdx = add(baseIdx, x);
    Value l8 = rem(l0, c(8));
    Value swz = xori(q, l8);
    Value y = mul(swz, c(kV));
    sidx = add(rowIdx, y);
  }
  Value col;
  {
    Value first = c(128 * h);
    Value x = mul(q, c(kV));
    Value y = add(first, x);
    col = add(n0, y);
  }
  Value colOk = cmp(Pred::ult, col, dimN);
  Value r0 = add(m0, l0);
  Value mleft = left(mEnd, r0);
  Value p, ap;
  {
    Value x = mul(r0, ldOut);
    Value y = add(x, col);
    Value first = add(obase, y);
    Value first64 = i64(first);
    Value bytes = mul(first64, cI64(2));
    // M, N and the varlen ends are multiples of 8 here, so a group is all in
    // or out.
    p = gep1(act ? houtPtr : coutPtr, bytes);
    if (act && g.storeA)
      ap = gep1(aoutPtr, bytes);
  }
  for (int64_t j = 0; j < kBM * (kBN / 2) / kV / kGemmThreads; ++j) {
    if (j) {
      p = gep1(p, step);
      if (ap)
        ap = gep1(ap, step);
    }
    Value vec = sload(add(sidx, c(j * 16 * (kBN / 2))));
    Value more = cmp(Pred::sgt, mleft, cI32(16 * j));
    ifBegin(andi(colOk, more));
    gstore(vec, p);
    if (ap) {
      // a = act(h) from the bf16-rounded h, as backward sees it.
      SmallVector<Value> avals;
      for (int64_t u = 0; u < kV; ++u) {
        Value he = vector::ExtractOp::create(b, loc, vec, ArrayRef<int64_t>{u});
        Value h32 = arith::ExtFOp::create(b, loc, f32, he);
        Value a32 = activationParts(h32, /*withGrad=*/false).first;
        avals.push_back(arith::TruncFOp::create(b, loc, bf16, a32));
      }
      Value av = vector::FromElementsOp::create(b, loc, vec8, avals);
      gstore(av, ap);
    }
    ifEnd();
  }
}

void GemmKernelBuilder::stageHalf(Value stage, Value acc, int64_t h) {
  // Half h of the tile into the staging buffer as bf16 pairs: row r, 16-byte
  // group q at q ^ (r % 8), free of bank conflicts. Plain stores take
  // columns [128 h, 128 h + 128); SwiGLU takes gate columns [64 h, 64 h + 64)
  // and the same up columns, so a row holds both halves of its outputs.
  Value base = c(h * kBM * kBN / 2);
  Value swz = div(lane, c(4)); // (fragment row) % 8
  SmallVector<std::pair<int64_t, int64_t>> groups;
  if (g.swigluTile()) {
    for (int64_t q = 0; q < 8; ++q)
      groups.push_back({8 * h + q, q});
    for (int64_t q = 0; q < 8; ++q)
      groups.push_back({16 + 8 * h + q, 8 + q});
  } else {
    for (int64_t q = 0; q < 16; ++q)
      groups.push_back({16 * h + q, q});
  }
  auto vec2 = VectorType::get({2}, bf16);
  for (auto [j, jl] : groups) {
    for (int64_t i = 0; i < 2; ++i) {
      Value row = add(qrow, c(8 * i));
      SmallVector<Value> vals;
      for (int64_t cc = 0; cc < 2; ++cc) {
        Value f = extractAcc(acc, 4 * j + 2 * i + cc);
        vals.push_back(arith::TruncFOp::create(b, loc, bf16, f));
      }
      Value idx;
      {
        Value x = mul(row, c(kBN / 2));
        Value group = c(jl);
        Value y = xori(group, swz);
        Value z = mul(y, c(kV));
        Value zq = add(z, qcol);
        Value xz = add(x, zq);
        idx = add(base, xz);
      }
      Value vec = vector::FromElementsOp::create(b, loc, vec2, vals);
      vector::StoreOp::create(b, loc, vec, stage, idx, /*nontemporal=*/false,
                              llvm::MaybeAlign(4));
    }
  }
}

Value GemmKernelBuilder::addBias(const Tile &s, Value acc) {
  // acc + the tile's expert's bias row, before the activation or the store.
  // Values 4j + 2i + {0, 1} sit at tile columns 8j + qcol + {0, 1}: one
  // 4-byte load of the row a group j (dimN is a multiple of 64, so a pair is
  // aligned and whole). A gated tile's groups [0, 16) are gate columns
  // n0 + 8j + qcol and [16, 32) the same up columns, which H (and the bias
  // row, 2 dimN wide) holds dimN further on. Groups past dimN load nothing:
  // their values are not stored.
  // The down GEMM's tile is d columns of y: its bias row is d wide.
  bool gatedTile = g.swigluTile();
  Value width = gatedTile ? mul(dimN, c(2)) : dimN;
  Value rowBase = mul(s.expert, width);
  Value first = add(rowBase, add(s.n0, qcol));
  Value base = gep1(biasPtr, mul(i64(first), cI64(2)));
  Value upBase = gatedTile ? gep1(base, mul(i64(dimN), cI64(2))) : base;
  int64_t half = gatedTile ? kBN / 16 : kBN / 8; // column groups a half
  auto vec2 = VectorType::get({2}, bf16);
  for (int64_t j = 0; j < kBN / 8; ++j) {
    int64_t jl = j % half;
    Value col = add(s.n0, c(8 * jl));
    Value ok = cmp(Pred::ult, col, dimN);
    Value p = gep1(j < half ? base : upBase, cI64(16 * jl));
    Value pair = ifValues(
        ok, {i32Ty},
        [&]() -> SmallVector<Value> {
          return {LLVM::LoadOp::create(b, loc, i32Ty, p, /*alignment=*/4)};
        },
        [&]() -> SmallVector<Value> { return {cI32(0)}; })[0];
    Value bf = LLVM::BitcastOp::create(b, loc, vec2, pair);
    for (int64_t cc = 0; cc < 2; ++cc) {
      Value one = LLVM::ExtractElementOp::create(b, loc, bf, cI32(cc));
      Value bias32 = arith::ExtFOp::create(b, loc, f32, one);
      for (int64_t i = 0; i < 2; ++i) {
        int64_t v = 4 * j + 2 * i + cc;
        Value sum = fadd(extractAcc(acc, v), bias32);
        acc =
            LLVM::InsertValueOp::create(b, loc, acc, sum, ArrayRef<int64_t>{v});
      }
    }
  }
  return acc;
}

Value GemmKernelBuilder::packedBf16x2(Value acc, int64_t v) {
  // Accumulator values v and v + 1 as two bf16 in an i32, an stmatrix
  // register.
  Value lo = extractAcc(acc, v);
  Value hi = extractAcc(acc, v + 1);
  Value pair = vector::FromElementsOp::create(b, loc, VectorType::get({2}, f32),
                                              ValueRange{lo, hi});
  Value bf = arith::TruncFOp::create(b, loc, VectorType::get({2}, bf16), pair);
  return LLVM::BitcastOp::create(b, loc, i32Ty, bf);
}

void GemmKernelBuilder::stmatrixTile(
    Value acc, function_ref<std::function<Value(int64_t)>(Value)> place) {
  // The warp's 16 rows of C into shared memory, two column groups of both
  // 8-row halves an stmatrix.x4: lane l gives the address of row l%8 of
  // matrix l/8 (rows 0-7 and 8-15 of group j, then of group j + 1).
  Value row;
  {
    Value x = div(lane, c(8));
    Value y = rem(x, c(2));
    Value z = mul(y, c(8));
    Value l8 = rem(lane, c(8));
    Value zl = add(z, l8);
    row = add(warpRow0, zl);
  }
  std::function<Value(int64_t)> dstOf = place(row);
  for (int64_t j = 0; j < kBN / kV; j += 2) {
    SmallVector<Value> regs;
    for (int64_t q = 0; q < 4; ++q)
      regs.push_back(packedBf16x2(acc, 4 * j + 2 * q));
    Value dst = dstOf(j);
    NVVM::StMatrixOp::create(b, loc, dst, regs, NVVM::MMALayout::row,
                             NVVM::LdStMatrixShapeAttr::get(ctx, 8, 8),
                             NVVM::LdStMatrixEltType::B16);
  }
}

void GemmKernelBuilder::stageRowsStmatrix(Value stagePtrIn, Value acc) {
  // C into the padded staging rows (BULK_ROW elements a row).
  stmatrixTile(acc, [&](Value row) -> std::function<Value(int64_t)> {
    Value x = mul(row, c(kBulkRow));
    Value l16 = div(lane, c(16));
    Value y = mul(l16, c(kV));
    Value off = add(x, y);
    Value bytes = mul(off, c(2));
    Value base = gep3(stagePtrIn, i32(bytes));
    return [this, base](int64_t j) -> Value {
      return j ? gep3(base, cI32(j * kV * 2)) : base;
    };
  });
}

void GemmKernelBuilder::stageBoxesStmatrix(Value stagePtrIn, Value acc) {
  // C into four 128x64 boxes of 128-byte rows, 128B-swizzled as the TMA
  // store reads them: 16-byte group q of row r at q ^ (r % 8). Lane l's row
  // is r % 8 = l % 8 and its group j + l / 16 with j even, so its swizzled
  // group is (j % 8) ^ (l / 16 ^ l % 8): four offsets a lane.
  stmatrixTile(acc, [&](Value row) -> std::function<Value(int64_t)> {
    Value l16 = div(lane, c(16));
    Value l8 = rem(lane, c(8));
    Value w = xori(l16, l8);
    Value rowBytes = mul(row, c(128));
    Value base = gep3(stagePtrIn, i32(rowBytes));
    SmallVector<Value> groupOff;
    for (int64_t k : {0, 2, 4, 6}) {
      Value x = xori(w, c(k));
      Value y = mul(x, c(16));
      groupOff.push_back(i32(y));
    }
    SmallVector<Value> boxes;
    for (int64_t box = 0; box < kBN / 64; ++box)
      boxes.push_back(box ? gep3(base, cI32(box * kTmaBoxBytes)) : base);
    return [this, boxes, groupOff](int64_t j) -> Value {
      return gep3(boxes[j / 8], groupOff[(j % 8) / 2]);
    };
  });
}

void GemmKernelBuilder::tmaStoreBoxes(const Tile &s, Value stagePtrIn) {
  // Consumer thread 0 stores the four boxes to expert e's block of C (or to
  // rows m0 + [0, 128) of the varlen-M GEMMs' C); the map clips rows past M
  // and columns past N.
  ifBegin(cmp(Pred::eq, tid, c(0)));
  Value m0 = i32(s.m0);
  Value n0 = i32(s.n0);
  SmallVector<Value> ex;
  if (g.tmaStore)
    ex.push_back(i32(s.expert));
  for (int64_t box = 0; box < kBN / 64; ++box) {
    Value src = box ? gep3(stagePtrIn, cI32(box * kTmaBoxBytes)) : stagePtrIn;
    Value col = box ? add(n0, cI32(64 * box)) : n0;
    if (g.reduceStore) {
      NVVM::CpAsyncBulkTensorReduceOp::create(
          b, loc, cmap, src, NVVM::TMAReduxKind::ADD, NVVM::TMAStoreMode::TILE,
          ValueRange{col, m0}, Value());
      continue;
    }
    SmallVector<Value> coords = {col, m0};
    llvm::append_range(coords, ex);
    NVVM::CpAsyncBulkTensorSharedCTAToGlobalOp::create(
        b, loc, cmap, src, coords, Value(), NVVM::TMAStoreMode::TILE, Value());
  }
  NVVM::CpAsyncBulkCommitGroupOp::create(b, loc);
  ifEnd();
}

void GemmKernelBuilder::bulkStoreRows(const Tile &s, Value stagePtrIn) {
  // Consumer thread t < BM copies staging row t to row m0 + t of C in one
  // cp.async.bulk, if that row is the tile's. A partial last N tile copies
  // its columns rounded up to 8 (a bulk copy moves multiples of 16 bytes).
  Value m0 = s.m0, n0 = s.n0, mEnd = s.mEnd;
  Value obase = outBase(s);
  Value row = add(m0, tid);
  Value inTile = cmp(Pred::ult, tid, c(kBM));
  Value inRows = cmp(Pred::ult, row, mEnd);
  ifBegin(andi(inTile, inRows));
  Value dst;
  {
    Value x = mul(row, ldc);
    Value y = add(x, n0);
    Value first = add(obase, y);
    Value first64 = i64(first);
    Value bytes = mul(first64, cI64(2));
    dst = gep1(coutPtr, bytes);
  }
  Value src;
  {
    Value bytes = mul(tid, c(kBulkRow * 2));
    src = gep3(stagePtrIn, i32(bytes));
  }
  Value size;
  {
    Value left = sub(dimN, n0);
    Value up = add(left, c(kV - 1));
    Value groups = div(up, c(kV));
    Value cols8 = mul(groups, c(kV));
    Value cols = minu(cols8, c(kBN));
    Value bytes = mul(cols, c(2));
    size = i32(bytes);
  }
  NVVM::CpAsyncBulkSharedCTAToGlobalOp::create(b, loc, dst, src, size, Value(),
                                               Value());
  NVVM::CpAsyncBulkCommitGroupOp::create(b, loc);
  ifEnd();
}

//===----------------------------------------------------------------------===//
// SwiGLU and its gradient
//===----------------------------------------------------------------------===//

std::pair<Value, Value> GemmKernelBuilder::siluParts(Value g32) {
  // (sigmoid(g), silu(g)) in f32.
  Value sgm = func::CallOp::create(b, loc, "__moe_gpu_sigmoid", TypeRange{f32},
                                   ValueRange{g32})
                  .getResult(0);
  return {sgm, fmul(g32, sgm)};
}

std::pair<Value, Value> GemmKernelBuilder::activationParts(Value x,
                                                           bool withGrad) {
  // (act(x), act'(x)) in f32 of a non-gated activation (act' null without
  // withGrad), from the library's SFU exp and sigmoid: no libdevice. One
  // statement an op or constant (the text is pinned).
  auto call = [&](StringRef name, Value v) {
    return func::CallOp::create(b, loc, name, TypeRange{f32}, ValueRange{v})
        .getResult(0);
  };
  // p * q + r with r a constant.
  auto fmaConst = [&](Value p, Value q, double r) {
    Value rc = cF32(r);
    return ffma(p, q, rc);
  };
  auto mulConst = [&](Value p, double q) {
    Value qc = cF32(q);
    return fmul(p, qc);
  };
  auto constMinus = [&](double p, Value q) {
    Value pc = cF32(p);
    return fsub(pc, q);
  };
  switch (g.config.activation) {
  case moe_gpu::GemmActivation::Swiglu:
    break;
  case moe_gpu::GemmActivation::Silu: {
    // d silu / dx = s + s (x - silu)
    auto [sgm, silu] = siluParts(x);
    if (!withGrad)
      return {silu, Value()};
    Value xs = fsub(x, silu);
    Value grad = ffma(sgm, xs, sgm);
    return {silu, grad};
  }
  case moe_gpu::GemmActivation::GeluTanh: {
    // 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3);
    // the derivative s + x s (1 - s) 2u'.
    constexpr double kTwoSqrt2OverPi = 2.0 * 0.7978845608028654;
    Value x2 = fmul(x, x);
    Value c3 = cF32(0.044715);
    Value inner = fmaConst(x2, c3, 1.0);
    Value xi = fmul(x, inner);
    Value u2 = mulConst(xi, kTwoSqrt2OverPi);
    Value sgm = call("__moe_gpu_sigmoid", u2);
    Value gelu = fmul(x, sgm);
    if (!withGrad)
      return {gelu, Value()};
    Value c3x3 = cF32(3.0 * 0.044715);
    Value du = fmaConst(x2, c3x3, 1.0);
    Value du2 = mulConst(du, kTwoSqrt2OverPi);
    Value oneMinus = constMinus(1.0, sgm);
    Value xs = fmul(gelu, oneMinus);
    Value grad = ffma(xs, du2, sgm);
    return {gelu, grad};
  }
  case moe_gpu::GemmActivation::GeluErf: {
    // x Phi(x), Phi(x) = 0.5 (1 + erf(x / sqrt 2)) with erf of |z| by
    // Abramowitz and Stegun 7.1.26 (error under 1.5e-7); the derivative
    // Phi(x) + x exp(-x^2 / 2) / sqrt(2 pi).
    Value zero = cF32(0.0);
    Value neg =
        arith::CmpFOp::create(b, loc, arith::CmpFPredicate::OLT, x, zero);
    Value z = mulConst(x, 0.7071067811865476);
    Value nz = constMinus(0.0, z);
    Value az = arith::SelectOp::create(b, loc, neg, nz, z);
    Value p = cF32(0.3275911);
    Value den = fmaConst(az, p, 1.0);
    Value one = cF32(1.0);
    Value t = arith::DivFOp::create(b, loc, one, den);
    Value poly = cF32(1.061405429);
    for (double coefficient :
         {-1.453152027, 1.421413741, -0.284496736, 0.254829592})
      poly = fmaConst(poly, t, coefficient);
    poly = fmul(poly, t);
    Value z2 = fmul(z, z);
    Value nz2 = constMinus(0.0, z2);
    Value e = call("__moe_gpu_exp", nz2);
    Value erfc = fmul(poly, e);           // 1 - erf|z|
    Value halfErfc = mulConst(erfc, 0.5); // Phi(-|x|)
    Value phiPos = constMinus(1.0, halfErfc);
    Value phi = arith::SelectOp::create(b, loc, neg, halfErfc, phiPos);
    Value gelu = fmul(x, phi);
    if (!withGrad)
      return {gelu, Value()};
    Value xe = fmul(x, e);
    Value invSqrt2Pi = cF32(0.3989422804014327);
    Value grad = ffma(xe, invSqrt2Pi, phi);
    return {gelu, grad};
  }
  }
  llvm_unreachable("a non-gated activation");
}

SmallVector<Value> GemmKernelBuilder::dswigluLoads(Value r, Value col) {
  // What the dSwiGLU of row r, columns col + [0, V) of h reads: gate and up
  // as vector<8xbf16> (and w = wrow[r] with routing weights). r and col are
  // in bounds: the caller clamps them, so the loads need no branch.
  Value half = dimN;
  Value hrow;
  if (!g.gated) { // h [R, n]: one group
    hrow = mul(r, half);
    Value idx = add(hrow, col);
    SmallVector<Value> vals = {
        vector::LoadOp::create(b, loc, VectorType::get({kV}, bf16), hsaved, idx,
                               /*nontemporal=*/false, llvm::MaybeAlign(16))};
    if (g.hasW)
      vals.push_back(memref::LoadOp::create(b, loc, wrow, r));
    return vals;
  }
  {
    Value width = mul(half, c(2));
    hrow = mul(r, width);
  }
  SmallVector<Value> vals;
  Value zero = c(0);
  for (Value off : {zero, half}) {
    Value x = add(off, col);
    Value idx = add(hrow, x);
    vals.push_back(vector::LoadOp::create(b, loc, VectorType::get({kV}, bf16),
                                          hsaved, idx, /*nontemporal=*/false,
                                          llvm::MaybeAlign(16)));
  }
  if (g.hasW)
    vals.push_back(memref::LoadOp::create(b, loc, wrow, r));
  return vals;
}

SmallVector<Type> GemmKernelBuilder::dswigluLoadTypes() {
  SmallVector<Type> types(g.gated ? 2 : 1, VectorType::get({kV}, bf16));
  if (g.hasW)
    types.push_back(f32);
  return types;
}

GemmKernelBuilder::DswigluRow GemmKernelBuilder::dswigluWiden(Value r,
                                                              ValueRange raw) {
  // (hrow, w, gate, up) of row r from dswigluLoads' values: w = 1 without
  // routing weights.
  DswigluRow row;
  if (!g.gated) { // gs holds h
    row.w = g.hasW ? raw[1] : cF32(1.0);
    row.hrow = mul(r, dimN);
    row.gs = bf16x8ToF32(raw[0]);
    return row;
  }
  row.w = g.hasW ? raw[2] : cF32(1.0);
  Value width = mul(dimN, c(2));
  row.hrow = mul(r, width);
  row.gs = bf16x8ToF32(raw[0]);
  row.us = bf16x8ToF32(raw[1]);
  return row;
}

Value GemmKernelBuilder::dswigluGroup(Value r, Value col, ArrayRef<Value> aAccs,
                                      const DswigluRow &loaded, Value ok) {
  // dSwiGLU of row r, columns col + [0, V) of h: aAccs = dA there (unscaled,
  // f32). Stores dH (gate and up) and w*a where ok, and returns the row's
  // part of dS there (0 elsewhere). 12 f32 operations a value: fused
  // multiply-adds where a product is summed, and d silu / dg as
  // s + s (g - silu).
  Value half = dimN;
  Value w = loaded.w;
  auto bf = [&](Value x) -> Value {
    return arith::TruncFOp::create(b, loc, bf16, x);
  };
  auto vstore = [&](ArrayRef<Value> vals, Value idx, Value mem) {
    Value vec = vector::FromElementsOp::create(
        b, loc, VectorType::get({kV}, bf16), vals);
    vector::StoreOp::create(b, loc, vec, mem, idx, /*nontemporal=*/false,
                            llvm::MaybeAlign(16));
  };
  SmallVector<Value> dgs, dus, was;
  Value part = cF32(0.0);
  if (!g.gated) {
    // dH = w dA act'(h), w*a = w act(h), dS += dA act(h).
    for (int64_t u = 0; u < kV; ++u) {
      auto [a, dact] = activationParts(loaded.gs[u], /*withGrad=*/true);
      Value da = fmul(aAccs[u], w);
      dgs.push_back(bf(fmul(da, dact)));
      was.push_back(bf(fmul(w, a)));
      part = ffma(aAccs[u], a, part);
    }
    ifBegin(ok);
    vstore(dgs, add(loaded.hrow, col), dh);
    {
      Value x = mul(r, half);
      vstore(was, add(x, col), wa);
    }
    ifEnd();
    return select(ok, part, cF32(0.0));
  }
  for (int64_t u = 0; u < kV; ++u) {
    Value gu = loaded.gs[u], uu = loaded.us[u];
    auto [sgm, silu] = siluParts(gu);
    Value a = fmul(silu, uu);
    Value da = fmul(aAccs[u], w);
    // d silu / dg = s (1 + g (1 - s)) = s + s (g - silu)
    Value gs = fsub(gu, silu);
    Value dsilu = ffma(sgm, gs, sgm);
    Value du = fmul(da, uu);
    dgs.push_back(bf(fmul(du, dsilu)));
    dus.push_back(bf(fmul(da, silu)));
    was.push_back(bf(fmul(w, a)));
    part = ffma(aAccs[u], a, part);
  }
  ifBegin(ok);
  vstore(dgs, add(loaded.hrow, col), dh);
  {
    Value x = add(half, col);
    vstore(dus, add(loaded.hrow, x), dh);
  }
  {
    Value x = mul(r, half);
    vstore(was, add(x, col), wa);
  }
  ifEnd();
  return select(ok, part, cF32(0.0));
}

//===----------------------------------------------------------------------===//
// The one-tile kernels' epilogue, through the ring
//===----------------------------------------------------------------------===//

void GemmKernelBuilder::ringEpilogue(const Tile &s, Value acc) {
  // The ring is free after the k-loop: the tile goes through it so that the
  // epilogue walks it in an order that makes the global stores coalesced.
  // store_f32 stages the f32 tile; the dSwiGLU stages dA rounded to bf16 by
  // stmatrix into rows of BULK_ROW elements, read back 8 values a lane.
  Value m0 = s.m0, n0 = s.n0, mEnd = s.mEnd;
  bool dswiglu = g.epi == GemmEpilogue::Dswiglu;
  int64_t rowsPerBatch = g.dactUnroll * (kGemmThreads / 32);

  // The dSwiGLU walks rows (a warp a row, 8 columns a lane): warp w takes
  // rows w + 8 i of the batch at ep. Rows past the expert's end and columns
  // past n read the last valid ones (no branch holds a load) and store
  // nothing.
  struct Columns {
    Value lc, colOk, colIn, lastRow;
  } cols;
  auto dswigluRow = [&](Value ep, int64_t u) {
    // (tile row, clamped row, whether to store) of the warp's row u of the
    // batch at ep.
    Value x = add(ep, warp);
    Value lr = add(x, c(8 * u));
    Value r = add(m0, lr);
    Value rOk = cmp(Pred::ult, r, mEnd);
    Value rIn = select(rOk, r, cols.lastRow);
    Value ok = andi(rOk, cols.colOk);
    return std::make_tuple(lr, rIn, ok);
  };
  auto batchLoads = [&](Value ep) {
    SmallVector<Value> loads;
    for (int64_t u = 0; u < g.dactUnroll; ++u) {
      Value rIn = std::get<1>(dswigluRow(ep, u));
      llvm::append_range(loads, dswigluLoads(rIn, cols.colIn));
    }
    return loads;
  };
  SmallVector<Value> firstLoads;
  if (dswiglu) {
    Value half = dimN;
    cols.lc = mul(lane, c(kV));
    Value col = add(n0, cols.lc);
    cols.colOk = cmp(Pred::ult, col, half);
    Value lastCol = sub(half, c(kV));
    cols.colIn = select(cols.colOk, col, lastCol);
    cols.lastRow = sub(mEnd, c(1));
    // The first batch's loads fly while dA is staged.
    firstLoads = batchLoads(c(0));
  }
  gpuBarrier();
  Value stageView;
  if (dswiglu) {
    Value len = c(kBM * kBulkRow);
    stageView =
        memref::ViewOp::create(b, loc, sbf16Ty, smem, pad, ValueRange{len});
    stageRowsStmatrix(sptr, acc);
  } else {
    Value len = c(kBM * kBN);
    stageView =
        memref::ViewOp::create(b, loc, sf32Ty, smem, pad, ValueRange{len});
  }

  // Rows of 256 f32 with the column XOR-ed by row % 32: row-wise and
  // column-wise walks over the tile are both free of bank conflicts.
  auto stageIndex = [&](Value lr, Value lc) {
    Value x = mul(lr, c(kBN));
    Value r32 = rem(lr, c(32));
    Value y = xori(lc, r32);
    return add(x, y);
  };
  if (!dswiglu) {
    for (int64_t v = 0; v < kBN / 2; ++v) {
      int64_t j = v / 4, i = (v / 2) % 2, cc = v % 2;
      Value val = extractAcc(acc, v);
      Value lr = add(qrow, c(8 * i));
      Value lc = add(qcol, c(8 * j + cc));
      Value idx = stageIndex(lr, lc);
      memref::StoreOp::create(b, loc, val, stageView, idx);
    }
  }
  gpuBarrier();

  if (g.epi == GemmEpilogue::StoreF32) {
    Value count = c(kBM * kBN / kV);
    Value step = c(kGemmThreads);
    forLoop(
        tid, count, step, {}, [&](Value it, ValueRange) -> SmallVector<Value> {
          Value lr = div(it, c(kBN / kV));
          Value r8 = rem(it, c(kBN / kV));
          Value lc = mul(r8, c(kV));
          SmallVector<Value> vals;
          for (int64_t u = 0; u < kV; ++u) {
            Value col = add(lc, c(u));
            Value idx = stageIndex(lr, col);
            vals.push_back(memref::LoadOp::create(b, loc, stageView, idx));
          }
          Value r = add(m0, lr);
          Value col = add(n0, lc);
          // M, N and the varlen ends are multiples of 8 here, so a group
          // is all in or out.
          Value inRows = cmp(Pred::ult, r, mEnd);
          Value inCols = cmp(Pred::ult, col, dimN);
          ifBegin(andi(inRows, inCols));
          Value vec = vector::FromElementsOp::create(
              b, loc, VectorType::get({kV}, f32), vals);
          Value x = mul(r, ldc);
          Value idx = add(x, col);
          vector::StoreOp::create(b, loc, vec, cout, idx,
                                  /*nontemporal=*/false, llvm::MaybeAlign(16));
          ifEnd();
          return {};
        });
    return;
  }

  // dSwiGLU: acc = dA (unscaled) for columns n0 + [0, 256) of n; the weight
  // gradients read dH and w*a MN-major from these rows. With dS, each warp
  // sums its row's products acc * a in a fixed order.
  Value stageDs;
  {
    Value at = add(pad, c(g.ringBytes));
    Value len = c(kBM);
    stageDs = memref::ViewOp::create(b, loc, sf32Ty, smem, at, ValueRange{len});
  }
  // dA of row lr, columns lc + [0, V) in f32.
  auto stagedGroup = [&](Value lr, Value lc) {
    Value x = mul(lr, c(kBulkRow));
    Value idx = add(x, lc);
    Value vec = vector::LoadOp::create(b, loc, VectorType::get({kV}, bf16),
                                       stageView, idx, /*nontemporal=*/false,
                                       llvm::MaybeAlign(16));
    return bf16x8ToF32(vec);
  };
  auto finishRow = [&](Value lr, Value rIn, Value ok,
                       const DswigluRow &loaded) {
    SmallVector<Value> aAccs = stagedGroup(lr, cols.lc);
    Value part = dswigluGroup(rIn, cols.colIn, aAccs, loaded, ok);
    if (!g.hasDs)
      return;
    // A warp holds one row, 8 columns a lane.
    for (int64_t mask : {16, 8, 4, 2, 1}) {
      Value offset = cI32(mask);
      Value width = cI32(32);
      Value other = gpu::ShuffleOp::create(b, loc, part, offset, width,
                                           gpu::ShuffleMode::XOR)
                        .getShuffleResult();
      part = fadd(part, other);
    }
    ifBegin(cmp(Pred::eq, lane, c(0)));
    memref::StoreOp::create(b, loc, part, stageDs, lr);
    ifEnd();
  };
  // A warp's dact_unroll rows a batch, their H (and w) loaded a batch ahead
  // and carried through the loop: a batch's loads wait behind the previous
  // batch's arithmetic instead of in front of its own (the last batch loads
  // itself again, L1 hits, so that no branch holds a load).
  size_t perRow = dswigluLoadTypes().size();
  Value lb = c(0), ub = c(kBM), step = c(rowsPerBatch);
  forLoop(lb, ub, step, firstLoads,
          [&](Value ep, ValueRange carried) -> SmallVector<Value> {
            Value ahead = add(ep, c(rowsPerBatch));
            Value nextEp = minu(ahead, c(kBM - rowsPerBatch));
            SmallVector<Value> nxt = batchLoads(nextEp);
            for (int64_t u = 0; u < g.dactUnroll; ++u) {
              auto [lr, rIn, ok] = dswigluRow(ep, u);
              DswigluRow loaded =
                  dswigluWiden(rIn, carried.slice(perRow * u, perRow));
              finishRow(lr, rIn, ok, loaded);
            }
            return nxt;
          });
  gpuBarrier();
  if (g.hasDs) {
    Value r = add(m0, tid);
    Value inTile = cmp(Pred::ult, tid, c(kBM));
    Value inRows = cmp(Pred::ult, r, mEnd);
    ifBegin(andi(inTile, inRows));
    Value total = memref::LoadOp::create(b, loc, stageDs, tid);
    Value x = mul(r, numNtiles);
    Value at = add(x, s.by);
    memref::StoreOp::create(b, loc, total, dspart, at);
    ifEnd();
  }
}
