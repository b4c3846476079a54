//===- Gemm.cpp - the grouped GEMM kernels (moe_gemm_*) -------------------===//
//
// A CTA computes 128x256 tiles of C with two consumer warpgroups, each 64 rows
// of m64n256k16 wgmma; A and B stream through a ring of 128B-swizzled stages
// in shared memory (docs/gpu-kernels.md §6). This file builds the prelude,
// the tile schedule, the copies into the ring, the k-loop of the kernels
// without a producer warpgroup (persistent, or one tile a CTA, whose
// epilogue stages C in the ring) and the entry points;
// GemmWarpSpecialized.cpp builds the kernels with a producer warpgroup,
// GemmEpilogue.cpp the epilogues.
//
//===----------------------------------------------------------------------===//

#include "GemmKernelBuilder.h"
#include "Kernels.h"

#include "moe/Conversion/MoEToGPU/HopperDescriptors.h"
#include "moe/Dialect/MoEGPU/IR/MoEGPUDialect.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

#include <algorithm>

using namespace mlir;
using namespace mlir::moe::kernels;
using moe_gpu::AOperand;
using moe_gpu::BOperand;
using moe_gpu::GemmConfig;
using moe_gpu::GemmEpilogue;
using Pred = arith::CmpIPredicate;

namespace {
// The tile and its ring.
constexpr int64_t kBM = moe_gpu::kTileM, kBN = moe_gpu::kTileN,
                  kBK = moe_gpu::kTileK;
constexpr int64_t kGemmThreads = moe_gpu::kConsumerThreads;
constexpr int64_t kATileBytes = kBM * kBK * 2;
constexpr int64_t kBTileBytes = kBK * kBN * 2;
constexpr int64_t kStageBytes = kATileBytes + kBTileBytes;
constexpr int64_t kStageCBytes = kBM * kBN * 2;
/// A row of C staged for bulk copies: 512 bytes and 16 of padding.
constexpr int64_t kBulkRow = kBN + 8;
constexpr int64_t kBulkStageCBytes = kBM * kBulkRow * 2;
/// The experts whose cumulative M-tile counts a CTA keeps in shared memory.
constexpr int64_t kTableExperts = 4 * kGemmThreads;
constexpr int64_t kCumBytes = 4 * (kTableExperts + 1 + 8) + 28;
/// mbarrier.try_wait.parity's suspend-time hint.
constexpr int64_t kWaitTicks = 0x989680;
} // namespace

//===----------------------------------------------------------------------===//
// GemmTraits
//===----------------------------------------------------------------------===//

GemmTraits::GemmTraits(const GemmConfig &unresolved)
    : config(unresolved.resolved()) {
  const GemmConfig &c = config;
  name = moe_gpu::gemmKernelName(c);
  a = c.a;
  b = c.b;
  epi = c.epilogue;
  varlenM = c.problem == moe_gpu::GemmProblem::VarlenM;
  gatherA = c.gathered == moe_gpu::GatheredOperand::A;
  gatherB = c.gathered == moe_gpu::GatheredOperand::B;
  hasW = c.withRouterWeight;
  hasDs = c.withDs;
  storeA = c.storeA;
  gated = moe_gpu::isGatedActivation(c);
  bias = c.bias;
  persistent = moe_gpu::isPersistentEpilogue(epi);
  ws = *c.warpSpecialized;
  threads = moe_gpu::gemmThreads(c);
  bool rowsTma = ws && *c.rowsTma && !varlenM;
  tmaRowsA = rowsTma && gatherB && a == AOperand::Mn;
  tmaRowsB = rowsTma && gatherA && b == BOperand::RowsMn;
  bulkStore = *c.store == moe_gpu::StorePath::BulkRows ||
              *c.store == moe_gpu::StorePath::TmaBoxes;
  tmaStore = *c.store == moe_gpu::StorePath::TmaBoxes &&
             epi == GemmEpilogue::StoreBf16W;
  tmaStoreRows = *c.store == moe_gpu::StorePath::TmaBoxes &&
                 epi == GemmEpilogue::StoreBf16;
  reduceStore = c.accumulate;
  stageCBytes = bulkStore && !tmaStore ? kBulkStageCBytes : kStageCBytes;
  stages = *c.stages;
  ringBytes = stages * kStageBytes;
  if (ws) // C's staging buffer follows the ring
    cumOffset = ringBytes + stageCBytes;
  else if (persistent) // over the last slot and past it
    cumOffset = std::max(ringBytes, ringBytes - kStageBytes + kStageCBytes);
  else // after the dS row sums of the dSwiGLU epilogue
    cumOffset = ringBytes + 1024;
  tmaB = moe_gpu::isTmaOperand(b);
  // full[s] at barOffset + 8 s; with warp specialisation empty[s] follows.
  if (tmaB || ws)
    barOffset = cumOffset + (varlenM ? kCumBytes : 0);
  dynamic = c.schedule == moe_gpu::TileSchedule::Dynamic;
  idleSkip = dynamic && *c.idleSkip;
  if (dynamic)
    schedOffset = barOffset + 16 * stages;
  groupM = c.groupM;
  dactUnroll = c.dactUnroll;
  producerRegisters = c.producerRegisters;
  consumerRegisters = c.consumerRegisters;
}

//===----------------------------------------------------------------------===//
// The Emitter
//===----------------------------------------------------------------------===//

GemmKernelBuilder::GemmKernelBuilder(OpBuilder &b, Location loc,
                                     const GemmConfig &config)
    : Emitter(b, loc), g(config), ctx(b.getContext()) {
  indexTy = b.getIndexType();
  i1 = b.getI1Type();
  i8 = b.getI8Type();
  i32Ty = b.getI32Type();
  i64Ty = b.getI64Type();
  f32 = b.getF32Type();
  bf16 = b.getBF16Type();
  ptr = LLVM::LLVMPointerType::get(ctx);
  ptr1 = LLVM::LLVMPointerType::get(ctx, 1);
  ptr3 = LLVM::LLVMPointerType::get(ctx, 3);
  ptr7 = LLVM::LLVMPointerType::get(ctx, 7);
  accTy =
      LLVM::LLVMStructType::getLiteral(ctx, SmallVector<Type>(kBN / 2, f32));
  auto workgroup = gpu::AddressSpaceAttr::get(
      ctx, gpu::GPUDialect::getWorkgroupAddressSpace());
  auto shared = [&](Type element) {
    return MemRefType::get({ShapedType::kDynamic}, element,
                           MemRefLayoutAttrInterface(), workgroup);
  };
  smemTy = shared(i8);
  sbf16Ty = shared(bf16);
  si32Ty = shared(i32Ty);
  sf32Ty = shared(f32);
}

Value GemmKernelBuilder::cF32(double value) {
  return constant(b.getF32FloatAttr(static_cast<float>(value)));
}
Value GemmKernelBuilder::getConstant(int64_t value, Type type) {
  return constant(value, type);
}

Value GemmKernelBuilder::rem(Value x, Value y) {
  return arith::RemUIOp::create(b, loc, x, y);
}
Value GemmKernelBuilder::xori(Value x, Value y) {
  return arith::XOrIOp::create(b, loc, x, y);
}
Value GemmKernelBuilder::andi(Value x, Value y) {
  return arith::AndIOp::create(b, loc, x, y);
}
Value GemmKernelBuilder::select(Value cond, Value x, Value y) {
  return arith::SelectOp::create(b, loc, cond, x, y);
}
Value GemmKernelBuilder::fadd(Value x, Value y) {
  return arith::AddFOp::create(b, loc, x, y);
}
Value GemmKernelBuilder::fmul(Value x, Value y) {
  return arith::MulFOp::create(b, loc, x, y);
}
Value GemmKernelBuilder::fsub(Value x, Value y) {
  return arith::SubFOp::create(b, loc, x, y);
}
Value GemmKernelBuilder::ffma(Value x, Value y, Value z) {
  // The LLVM intrinsic, not math.fma, which the NVVM lowering may turn into a
  // call of libdevice's __nv_fmaf.
  return LLVM::FMAOp::create(b, loc, x, y, z);
}
Value GemmKernelBuilder::i32(Value v) {
  return arith::IndexCastOp::create(b, loc, i32Ty, v);
}
Value GemmKernelBuilder::i64(Value v) {
  return arith::IndexCastOp::create(b, loc, i64Ty, v);
}
Value GemmKernelBuilder::indexCastUI(Value v) {
  return arith::IndexCastUIOp::create(b, loc, indexTy, v);
}
Value GemmKernelBuilder::zext(Value v) {
  return arith::ExtUIOp::create(b, loc, i64Ty, v);
}
Value GemmKernelBuilder::loadI32AsIndex(Value mem, Value idx) {
  Value v = memref::LoadOp::create(b, loc, mem, idx);
  return arith::IndexCastOp::create(b, loc, indexTy, v);
}
Value GemmKernelBuilder::loadSmemIndex(Value mem, Value idx) {
  return loadI32AsIndex(mem, idx);
}

SmallVector<Value> GemmKernelBuilder::bf16x8ToF32(Value vec) {
  // Lane 2i is the low half of 32-bit word i: two bit operations a pair.
  Value words =
      vector::BitCastOp::create(b, loc, VectorType::get({4}, i32Ty), vec);
  SmallVector<Value> out;
  for (int64_t i = 0; i < 4; ++i) {
    Value w = vector::ExtractOp::create(b, loc, words, ArrayRef<int64_t>{i});
    Value lo = arith::ShLIOp::create(b, loc, w, cI32(16));
    Value hi = arith::AndIOp::create(b, loc, w, cI32(-65536));
    for (Value x : {lo, hi})
      out.push_back(arith::BitcastOp::create(b, loc, f32, x));
  }
  return out;
}

void GemmKernelBuilder::ifBegin(Value cond) {
  auto op = scf::IfOp::create(b, loc, cond, /*withElseRegion=*/false);
  ifStack.push_back(b.saveInsertionPoint());
  b.setInsertionPoint(op.thenBlock()->getTerminator());
}

void GemmKernelBuilder::ifEnd() {
  b.restoreInsertionPoint(ifStack.pop_back_val());
}

void GemmKernelBuilder::ifElse(Value cond, function_ref<void()> thenBody,
                               function_ref<void()> elseBody) {
  auto op = scf::IfOp::create(b, loc, cond, /*withElseRegion=*/true);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPoint(op.thenBlock()->getTerminator());
  thenBody();
  b.setInsertionPoint(op.elseBlock()->getTerminator());
  elseBody();
}

SmallVector<Value>
GemmKernelBuilder::ifValues(Value cond, TypeRange types,
                            function_ref<SmallVector<Value>()> thenBody,
                            function_ref<SmallVector<Value>()> elseBody) {
  auto op = scf::IfOp::create(b, loc, types, cond, /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToEnd(op.thenBlock());
    SmallVector<Value> thenValues = thenBody();
    scf::YieldOp::create(b, loc, thenValues);
    b.setInsertionPointToEnd(op.elseBlock());
    SmallVector<Value> elseValues = elseBody();
    scf::YieldOp::create(b, loc, elseValues);
  }
  return SmallVector<Value>(op.getResults());
}

Operation *GemmKernelBuilder::forLoop(
    Value lb, Value ub, Value step, ValueRange inits,
    function_ref<SmallVector<Value>(Value, ValueRange)> body) {
  auto loop = scf::ForOp::create(b, loc, lb, ub, step, inits);
  OpBuilder::InsertionGuard guard(b);
  if (inits.empty())
    b.setInsertionPoint(loop.getBody()->getTerminator());
  else
    b.setInsertionPointToEnd(loop.getBody());
  SmallVector<Value> yielded =
      body(loop.getInductionVar(), loop.getRegionIterArgs());
  if (!inits.empty())
    scf::YieldOp::create(b, loc, yielded);
  return loop;
}

//===----------------------------------------------------------------------===//
// The kernel's small helpers
//===----------------------------------------------------------------------===//

void GemmKernelBuilder::consumerBarrier() {
  // bar.sync 1 over the 256 consumer threads: the producer warpgroup of a
  // warp-specialized kernel never takes part.
  Value id = cI32(1);
  Value count = cI32(kGemmThreads);
  NVVM::BarrierOp::create(b, loc, Type(), id, count,
                          NVVM::BarrierReductionAttr(), Value());
}

void GemmKernelBuilder::gpuBarrier() { gpu::BarrierOp::create(b, loc); }

void GemmKernelBuilder::fenceProxyAsync() {
  NVVM::FenceProxyOp::create(
      b, loc, NVVM::ProxyKind::async_shared,
      NVVM::SharedSpaceAttr::get(ctx, NVVM::SharedSpace::shared_cta));
}

Value GemmKernelBuilder::gptr(Value mem) {
  Value address = memref::ExtractAlignedPointerAsIndexOp::create(b, loc, mem);
  Value address64 = i64(address);
  Value generic = LLVM::IntToPtrOp::create(b, loc, ptr, address64);
  return LLVM::AddrSpaceCastOp::create(b, loc, ptr1, generic);
}

Value GemmKernelBuilder::gep1(Value p, Value off) {
  return LLVM::GEPOp::create(b, loc, ptr1, i8, p, ValueRange{off});
}

Value GemmKernelBuilder::gep3(Value p, Value off) {
  return LLVM::GEPOp::create(b, loc, ptr3, i8, p, ValueRange{off});
}

Value GemmKernelBuilder::gepConst(Value p, int32_t off) {
  return LLVM::GEPOp::create(b, loc, p.getType(), i8, p,
                             ArrayRef<LLVM::GEPArg>{off});
}

Value GemmKernelBuilder::wide(Value x, Value y) {
  // u32 x u32 -> u64 in one IMAD.WIDE.U32 (LLVM keeps a 64-bit multiply).
  return LLVM::InlineAsmOp::create(
             b, loc, i64Ty, ValueRange{x, y}, "mul.wide.u32 $0, $1, $2;",
             "=l,r,r", /*has_side_effects=*/false, /*is_align_stack=*/false,
             LLVM::tailcallkind::TailCallKind::None,
             /*asm_dialect=*/LLVM::AsmDialectAttr(),
             /*operand_attrs=*/ArrayAttr())
      .getResult(0);
}

void GemmKernelBuilder::cpAsync(Value dst, Value src, Value size) {
  NVVM::CpAsyncOp::create(b, loc, dst, src, 16, NVVM::LoadCacheModifierKind::CG,
                          size);
}

Value GemmKernelBuilder::guardedLoadI32(Value cond, Value p) {
  // *p if cond else 0, without touching p otherwise (the ids may be empty).
  return ifValues(
      cond, {i32Ty},
      [&]() -> SmallVector<Value> {
        return {LLVM::LoadOp::create(b, loc, i32Ty, p)};
      },
      [&]() -> SmallVector<Value> { return {cI32(0)}; })[0];
}

Value GemmKernelBuilder::fullBar(Value slot32) {
  Value off = mul(slot32, cI32(8));
  return gep3(bars, off);
}

Value GemmKernelBuilder::emptyBar(Value slot32) {
  Value slot = add(slot32, cI32(g.stages));
  Value off = mul(slot, cI32(8));
  return gep3(bars, off);
}

Value GemmKernelBuilder::schedWord(int64_t base, Value j) {
  // The i32 (base 0: ids, 8: next) or mbarrier (16: full, 32: empty) at entry
  // j of the tile ring.
  Value baseOff = cI32(base);
  Value entryOff = mul(j, cI32(base >= 16 ? 8 : 4));
  Value off = add(baseOff, entryOff);
  return gep3(sched, off);
}

void GemmKernelBuilder::tryWaitParity(Value bar, Value parity) {
  Value ticks = cI32(kWaitTicks);
  NVVM::MBarrierTryWaitParityOp::create(b, loc, bar, parity, ticks);
}

void GemmKernelBuilder::mbarrierArrive(Value bar) {
  NVVM::MBarrierArriveOp::create(b, loc, Type(), bar, Value());
}

Value GemmKernelBuilder::extractAcc(Value acc, int64_t v) {
  return LLVM::ExtractValueOp::create(b, loc, acc, ArrayRef<int64_t>{v});
}

//===----------------------------------------------------------------------===//
// The kernel
//===----------------------------------------------------------------------===//

void GemmKernelBuilder::build() {
  // gemm_signature.
  MemRefType i32Buf = flatBuffer(i32Ty), bf16Buf = flatBuffer(bf16),
             f32Buf = flatBuffer(f32);
  SmallVector<std::pair<Value *, Type>> args;
  args.push_back({&offsets, i32Buf});
  args.push_back({&numExperts, indexTy});
  if (g.a == AOperand::Gather || g.gatherA)
    args.push_back({&ids, i32Buf});
  args.push_back({&amat, bf16Buf});
  args.push_back({&lda, indexTy});
  if (g.b == BOperand::RowsMn && g.gatherB)
    args.push_back({&bids, i32Buf});
  if (g.tmaRowsA) // amat serves the partial k-steps
    args.push_back({&amap, ptr});
  if (g.tmaB) {
    args.push_back({&bmap, ptr});
  } else {
    args.push_back({&bmat, bf16Buf});
    args.push_back({&ldb, indexTy});
    if (g.tmaRowsB)
      args.push_back({&browmap, ptr});
  }
  args.push_back({&dimM, indexTy});
  args.push_back({&dimN, indexTy});
  args.push_back({&dimK, indexTy});
  switch (g.epi) {
  case GemmEpilogue::Swiglu:
    args.push_back({&hout, bf16Buf});
    if (g.storeA)
      args.push_back({&aout, bf16Buf});
    break;
  case GemmEpilogue::StoreF32:
    args.push_back({&cout, f32Buf});
    args.push_back({&ldc, indexTy});
    break;
  case GemmEpilogue::StoreBf16:
  case GemmEpilogue::StoreBf16W:
    args.push_back({&cout, bf16Buf});
    args.push_back({&ldc, indexTy});
    // The tensor map of C as [E][M][N] or [M][N].
    if (g.tmaStore || g.tmaStoreRows)
      args.push_back({&cmap, ptr});
    break;
  case GemmEpilogue::Dswiglu:
    args.push_back({&hsaved, bf16Buf});
    if (g.hasW)
      args.push_back({&wrow, f32Buf});
    args.push_back({&dh, bf16Buf});
    args.push_back({&wa, bf16Buf});
    if (g.hasDs) {
      args.push_back({&dspart, f32Buf});
      args.push_back({&numNtiles, indexTy});
    }
    break;
  }
  if (g.bias) // [E, N] ([E, 2N] for SwiGLU's gate and up columns)
    args.push_back({&biasRows, bf16Buf});
  if (g.dynamic) {
    // Word counter_slot of tile_counter, zero at the launch.
    args.push_back({&tileCounter, i32Buf});
    args.push_back({&counterSlot, indexTy});
  }
  SmallVector<Type> argTypes;
  for (auto &[value, type] : args)
    argTypes.push_back(type);
  gpu::GPUFuncOp kernel = createKernel(b, loc, g.name, argTypes, g.threads);
  setConstantEntry(kernel.getBody().front());
  for (auto [i, arg] : llvm::enumerate(args))
    *arg.first = kernel.getArgument(i);

  buildPrelude();

  // Warp specialisation: a gathered operand's token ids of a k-step are
  // loaded one a lane (16 lanes a warp) a k-step ahead and spread with
  // shuffles.
  if (g.ws && !g.varlenM && (g.gatherA || g.gatherB)) {
    Value pwarp = div(ctid, c(32));
    Value plane = lane;
    idLaneOk = cmp(Pred::ult, plane, c(16));
    if (g.gatherA) {
      // Warp w copies K-rows 2w + lane/16 + RS_A i; lane j loads row
      // 2w + j%2 + 8 (j/2).
      Value x = mul(pwarp, c(2));
      Value y = rem(plane, c(2));
      Value xy = add(x, y);
      Value z = div(plane, c(2));
      Value zr = mul(z, c(rsA));
      idRowA = i32(add(xy, zr));
    }
    if (g.gatherB) {
      // Warp w copies K-rows w + RS_B i; lane j loads row w + RS_B j.
      Value z = mul(plane, c(rsB));
      idRowB = i32(add(pwarp, z));
    }
  }

  // Accumulator value v of warpgroup wg sits at row 64 wg + 16 (warp % 4) +
  // lane / 4 + 8 ((v / 2) % 2) and column 8 (v / 4) + 2 (lane % 4) + v % 2.
  {
    Value x = mul(wg, c(64));
    Value w4 = rem(warp, c(4));
    Value y = mul(w4, c(16));
    warpRow0 = add(x, y);
    Value l4 = div(lane, c(4));
    qrow = add(warpRow0, l4);
    Value lm = rem(lane, c(4));
    qcol = mul(lm, c(2));
  }

  if (g.persistent) {
    // write_half's destinations.
    if (g.epi == GemmEpilogue::Swiglu) {
      houtPtr = gptr(hout);
      if (g.storeA)
        aoutPtr = gptr(aout);
    } else {
      coutPtr = gptr(cout);
    }
  }
  if (g.bias)
    biasPtr = gptr(biasRows);
  if (g.ws)
    buildWarpSpecialized();
  else if (g.persistent)
    buildPersistent();
  else
    buildOneTile();
  gpu::ReturnOp::create(b, loc);
}

void GemmKernelBuilder::buildPrelude() {
  tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  gridx = gpu::GridDimOp::create(b, loc, gpu::Dimension::x);
  warp = div(tid, c(32));
  lane = rem(tid, c(32));
  wg = div(tid, c(128));

  bnEff = g.b == BOperand::WMnSwiglu ? kBN / 2 : kBN;
  {
    Value n = add(dimN, c(bnEff - 1));
    ntiles = div(n, c(bnEff));
    // M-tiles as the host counts them: varlen_m adds one tile an expert for
    // the rounding.
    Value m = add(dimM, c(kBM - 1));
    mtiles = div(m, c(kBM));
    if (g.varlenM) {
      mtiles = add(mtiles, numExperts);
      total = mul(mtiles, ntiles);
    } else {
      Value mn = mul(mtiles, ntiles);
      total = mul(mn, numExperts);
    }
  }

  // The ring starts at the first 1024-aligned byte of the dynamic shared
  // memory (the launch asks for 1 KiB more): the 128B swizzle is relative to
  // the tile base and wgmma reads it by address.
  smem = gpu::DynamicSharedMemoryOp::create(b, loc, smemTy);
  Value rawIdx = memref::ExtractAlignedPointerAsIndexOp::create(b, loc, smem);
  {
    Value k1024 = c(1024);
    Value r = rem(rawIdx, c(1024));
    Value s = sub(k1024, r);
    pad = rem(s, c(1024));
  }
  Value ringElems = c(g.ringBytes / 2);
  Value sview =
      memref::ViewOp::create(b, loc, sbf16Ty, smem, pad, ValueRange{ringElems});
  Value sbaseIdx =
      memref::ExtractAlignedPointerAsIndexOp::create(b, loc, sview);
  sbase = i64(sbaseIdx);
  auto getC = [&](int64_t value, Type type) {
    return getConstant(value, type);
  };

  // The copies are made by all 256 threads, or with warp specialisation by
  // the producer warpgroup's 128 (ctid = tid - 256).
  ncopy = g.ws ? 128 : kGemmThreads;
  ctid = g.ws ? sub(tid, c(kGemmThreads)) : tid;
  rsK = ncopy / 8;
  rsA = ncopy / 16;
  rsB = ncopy / 32;
  // K-major tile x 8 chunks of 16 B: thread t copies chunk t%8 of rows
  // t/8 + RS_K i.
  kchunk = rem(ctid, c(8));
  krow = div(ctid, c(8));
  kSoff = hopper::buildKMajorElementOffset(b, loc, krow, kchunk, getC);
  // MN-major B tile (rows_mn): 64 K-rows x 4 boxes of 64 columns x 8 chunks.
  mchunk = rem(ctid, c(32));
  mbox = div(mchunk, c(8));
  mcc = rem(mchunk, c(8));
  mrow = div(ctid, c(32));
  // MN-major A tile (mn): 64 K-rows x 2 boxes of 64 columns x 8 chunks.
  achunk = rem(ctid, c(16));
  abox = div(achunk, c(8));
  acc8 = rem(ctid, c(8));
  arow = div(ctid, c(16));
  aSoffMn = hopper::buildMNMajorElementOffset(b, loc, abox, arow, acc8,
                                              hopper::SwizzleOrder::Last, getC);

  // Raw pointers with 32-bit K arithmetic: index math in the k-loop made the
  // weight-gradient k-step take twice the wgmma time.
  aptr = gptr(amat);
  if (!g.tmaB)
    bptr = gptr(bmat);
  if (g.a == AOperand::Gather || g.gatherA)
    idsptr = gptr(ids);
  if (g.b == BOperand::RowsMn && g.gatherB)
    bidsptr = gptr(bids);
  sptr = LLVM::IntToPtrOp::create(b, loc, ptr3, sbase);
  {
    Value l = i32(lda);
    lda2 = mul(l, cI32(2));
  }
  if (!g.tmaB) {
    Value l = i32(ldb);
    ldb2 = mul(l, cI32(2));
  }
  dimk32 = i32(dimK);
  {
    Value k8 = mul(kchunk, c(8));
    kchunk8 = i32(k8);
  }
  mrow32 = i32(mrow);
  // This thread's destinations in ring slot 0.
  {
    Value off = mul(g.a == AOperand::Mn ? aSoffMn : kSoff, c(2));
    Value off32 = i32(off);
    aDst0 = gep3(sptr, off32);
  }
  if (g.a == AOperand::Mn) {
    arow32 = i32(arow);
    Value rows = cI32(rsA);
    aStep = wide(rows, lda2); // K-rows RS_A apart
  }
  if (g.tmaB) {
    // The B tile of ring slot 0: the TMA boxes write the copies' image.
    bTile0 = gep3(sptr, cI32(kATileBytes));
  } else {
    // rows_mn: this thread's chunk of K-rows mrow + RS_B i (two swizzles if
    // RS_B = 4).
    int64_t count = rsB % 8 == 0 ? 1 : 8 / rsB;
    for (int64_t p = 0; p < count; ++p) {
      Value row = add(mrow, c(p * rsB));
      Value soff = hopper::buildMNMajorElementOffset(
          b, loc, mbox, row, mcc, hopper::SwizzleOrder::First, getC);
      Value bytes = mul(soff, c(2));
      Value bytes32 = i32(bytes);
      Value off = add(bytes32, cI32(kATileBytes));
      bDst0.push_back(gep3(sptr, off));
    }
  }

  if (g.tmaB || g.ws) {
    bars = gep3(sptr, cI32(g.barOffset)); // full[s] at 8 s, empty[s] after
    if (g.dynamic)
      sched = gep3(sptr, cI32(g.schedOffset));
    // The thread that arms full[s] and issues the TMA boxes.
    isT0 = cmp(Pred::eq, tid, c(g.ws ? kGemmThreads : 0));
    ifBegin(cmp(Pred::eq, tid, c(0)));
    // full[s]: the TMA thread's arrive.expect_tx, and with warp
    // specialisation one arrival of each producer thread when its copies
    // land; empty[s]: lane 0 of each consumer warp once its wgmma have read
    // the slot.
    bool rowMaps = g.tmaRowsA || g.tmaRowsB;
    int64_t fullCount = (g.ws ? ncopy : 0) + (g.tmaB || rowMaps ? 1 : 0);
    for (int64_t st = 0; st < g.stages; ++st) {
      Value bar = gepConst(bars, 8 * st);
      NVVM::MBarrierInitOp::create(b, loc, bar, cI32(fullCount), Value());
      if (g.ws) {
        bar = gepConst(bars, 8 * (g.stages + st));
        NVVM::MBarrierInitOp::create(b, loc, bar, cI32(kGemmThreads / 32),
                                     Value());
      }
    }
    if (g.dynamic) {
      // tile_full[j]: the TMA thread's arrival with tile id j; tile_empty[j]:
      // every consumer thread's once it has read it.
      for (int64_t j = 0; j < 2; ++j) {
        Value full = tileFull(cI32(j));
        NVVM::MBarrierInitOp::create(b, loc, full, cI32(1), Value());
        Value empty = tileEmpty(cI32(j));
        NVVM::MBarrierInitOp::create(b, loc, empty, cI32(kGemmThreads),
                                     Value());
      }
    }
    // The barriers' initial state, visible to the TMA unit (async proxy).
    NVVM::FenceMbarrierInitOp::create(b, loc);
    if (g.tmaB)
      NVVM::PrefetchOp::create(b, loc, NVVM::PrefetchCacheLevelAttr(),
                               NVVM::CacheEvictionPriorityAttr(), bmap, Value(),
                               /*tensormap=*/true);
    ifEnd();
    gpuBarrier();
  }

  // wgmma descriptors of ring slot 0, k-step 0: a slot or a k-step moves only
  // the start-address field. Warpgroup wg multiplies rows [64 wg, 64 wg + 64)
  // of the A tile: 64 K-major rows, or MN-major box wg.
  uint64_t bDescConst = hopper::wgmmaTileDescriptorConstant(
      g.b == BOperand::WK ? hopper::OperandMajor::KMajor
                          : hopper::OperandMajor::MNMajor);
  Value wg64 = i64(wg);
  uint64_t aDescConst = hopper::wgmmaTileDescriptorConstant(
      g.a == AOperand::Mn ? hopper::OperandMajor::MNMajor
                          : hopper::OperandMajor::KMajor);
  {
    Value off = mul(wg64, cI64(64 * 128));
    Value addr = add(sbase, off);
    descA0 = hopper::buildWgmmaDescriptor(b, loc, addr, aDescConst, getC);
    Value bAddr = add(sbase, cI64(kATileBytes));
    descB0 = hopper::buildWgmmaDescriptor(b, loc, bAddr, bDescConst, getC);
  }

  if (g.varlenM) {
    Value cumAt = add(pad, c(g.cumOffset));
    Value cumLen = c(kTableExperts + 9);
    cumv =
        memref::ViewOp::create(b, loc, si32Ty, smem, cumAt, ValueRange{cumLen});
    useTable = cmp(Pred::ule, numExperts, c(kTableExperts));
    ifBegin(useTable);
    if (g.ws) {
      // The consumer warpgroups build it and synchronise on barrier 1; the
      // gpu.barrier below publishes it to all.
      ifBegin(cmp(Pred::ult, tid, c(kGemmThreads)));
      buildTileTable([&] { consumerBarrier(); });
      ifEnd();
    } else {
      buildTileTable([&] { gpuBarrier(); });
    }
    ifEnd();
    if (g.ws)
      gpuBarrier();
  }
}

void GemmKernelBuilder::buildTileTable(function_ref<void()> barrier) {
  // cum[x] = M-tiles of experts [0, x) for x <= E by 256 threads: thread t
  // sums experts 4t..4t+3, warps scan with shuffles, warp totals go through
  // cum[TABLE_EXPERTS + 1 + warp].
  Value tlane = rem(tid, c(32));
  Value twarp = div(tid, c(32));
  SmallVector<Value> vals;
  for (int64_t i = 0; i < 4; ++i) {
    Value t4 = mul(tid, c(4));
    Value ex = add(t4, c(i));
    Value inb = cmp(Pred::ult, ex, numExperts);
    vals.push_back(ifValues(
        inb, {i32Ty},
        [&]() -> SmallVector<Value> {
          Value lo = memref::LoadOp::create(b, loc, offsets, ex);
          Value next = add(ex, c(1));
          Value hi = memref::LoadOp::create(b, loc, offsets, next);
          Value d = sub(hi, lo);
          Value d1 = add(d, cI32(kBM - 1));
          return {div(d1, cI32(kBM))};
        },
        [&]() -> SmallVector<Value> { return {cI32(0)}; })[0]);
  }
  Value v01 = add(vals[0], vals[1]);
  Value v23 = add(vals[2], vals[3]);
  Value own = add(v01, v23);
  Value s = own;
  for (int64_t d : {1, 2, 4, 8, 16}) {
    Value offset = cI32(d);
    Value width = cI32(32);
    Value y =
        gpu::ShuffleOp::create(b, loc, s, offset, width, gpu::ShuffleMode::UP)
            .getShuffleResult();
    Value inRange = cmp(Pred::uge, tlane, c(d));
    Value sum = add(s, y);
    s = select(inRange, sum, s);
  }
  ifBegin(cmp(Pred::eq, tlane, c(31)));
  {
    Value at = add(twarp, c(kTableExperts + 1));
    memref::StoreOp::create(b, loc, s, cumv, at);
  }
  ifEnd();
  barrier();
  Value lb = c(0), step = c(1), init = cI32(0);
  Operation *loop =
      forLoop(lb, twarp, step, {init},
              [&](Value w, ValueRange iter) -> SmallVector<Value> {
                Value at = add(w, c(kTableExperts + 1));
                Value ws = memref::LoadOp::create(b, loc, cumv, at);
                return {add(iter[0], ws)};
              });
  Value accSum = add(loop->getResult(0), s);
  Value run = sub(accSum, own);
  for (int64_t i = 0; i < 4; ++i) {
    run = add(run, vals[i]);
    Value t4 = mul(tid, c(4));
    Value at = add(t4, c(i + 1));
    memref::StoreOp::create(b, loc, run, cumv, at);
  }
  ifBegin(cmp(Pred::eq, tid, c(0)));
  {
    Value zero32 = cI32(0);
    Value zero = c(0);
    memref::StoreOp::create(b, loc, zero32, cumv, zero);
  }
  ifEnd();
  barrier();
}

//===----------------------------------------------------------------------===//
// The schedule and the copies
//===----------------------------------------------------------------------===//

GemmKernelBuilder::Tile GemmKernelBuilder::setup(Value t) {
  // Tile t of the schedule as straight-line code: every index is clamped, so
  // a tile past the end (or an M-tile no expert owns) is valid = false with
  // numk = 0. The raster is in i32: 64-bit divisions are calls.
  Tile s;
  Value t32 = i32(t);
  Value mt32 = i32(mtiles), nt32 = i32(ntiles);
  Value per, innerAll;
  if (g.varlenM) {
    innerAll = t32;
  } else {
    // (at least 1: with no tiles at all, the tile before the loop divides)
    Value mn = mul(mt32, nt32);
    per = maxu(mn, cI32(1));
    innerAll = rem(t32, per);
  }
  // Grouped raster: GROUP_M M-tiles by all N-tiles, the M-tile fastest
  // inside a group, so the CTAs running at once share A rows and B columns
  // in L2.
  Value span;
  {
    Value x = mul(nt32, cI32(g.groupM));
    span = maxu(x, cI32(g.groupM));
  }
  Value firstM;
  {
    Value x = div(innerAll, span);
    firstM = mul(x, cI32(g.groupM));
  }
  Value gsize;
  {
    Value gm = cI32(g.groupM);
    Value left = sub(mt32, firstM);
    Value x = minu(gm, left);
    gsize = maxu(x, cI32(1));
  }
  Value inner = rem(innerAll, span);
  Value bx;
  {
    Value x = rem(inner, gsize);
    bx = indexCastUI(add(firstM, x));
  }
  Value by = indexCastUI(div(inner, gsize));
  s.by = by;
  Value valid, expert, elo;
  if (g.varlenM) {
    // The expert whose tiles contain M-tile bx (-1 if none) and its first
    // tile: a binary search of the table, or a scan past TABLE_EXPERTS.
    SmallVector<Value> found = ifValues(
        useTable, {indexTy, indexTy},
        [&]() -> SmallVector<Value> {
          Value lo = c(0), hi = numExperts;
          for (int i = 0; i < 10; ++i) { // TABLE_EXPERTS = 2^10
            Value sum = add(lo, hi);
            Value mid = div(sum, c(2));
            Value cum = loadSmemIndex(cumv, mid);
            Value le = cmp(Pred::ule, cum, bx);
            Value nlo = select(le, mid, lo);
            Value nhi = select(le, hi, mid);
            lo = nlo;
            hi = nhi;
          }
          Value end = loadSmemIndex(cumv, numExperts);
          Value inside = cmp(Pred::ult, bx, end);
          Value fe = select(inside, lo, c(-1));
          Value fcum = loadSmemIndex(cumv, lo);
          return {fe, fcum};
        },
        [&]() -> SmallVector<Value> {
          Value lb = c(0), step = c(1);
          Value cum0 = c(0), fe0 = c(-1), fcum0 = c(0);
          Operation *loop =
              forLoop(lb, numExperts, step, {cum0, fe0, fcum0},
                      [&](Value ex, ValueRange iter) -> SmallVector<Value> {
                        Value cum = iter[0], fe = iter[1], fcum = iter[2];
                        Value lo = loadI32AsIndex(offsets, ex);
                        Value next = add(ex, c(1));
                        Value hi = loadI32AsIndex(offsets, next);
                        Value d = sub(hi, lo);
                        Value d1 = add(d, c(kBM - 1));
                        Value tiles = div(d1, c(kBM));
                        Value ncum = add(cum, tiles);
                        Value ge = cmp(Pred::uge, bx, cum);
                        Value lt = cmp(Pred::ult, bx, ncum);
                        Value hit = andi(ge, lt);
                        Value nfe = select(hit, ex, fe);
                        Value nfcum = select(hit, cum, fcum);
                        return {ncum, nfe, nfcum};
                      });
          return {loop->getResult(1), loop->getResult(2)};
        });
    valid = cmp(Pred::sge, found[0], c(0));
    expert = select(valid, found[0], c(0));
    elo = loadI32AsIndex(offsets, expert);
    Value next = add(expert, c(1));
    Value ehi = loadI32AsIndex(offsets, next);
    Value dx = sub(bx, found[1]);
    Value rows = mul(dx, c(kBM));
    s.m0 = add(elo, rows);
    s.mEnd = select(valid, ehi, c(0));
    s.n0 = mul(by, c(bnEff));
    Value k = add(dimK, c(kBK - 1));
    Value steps = div(k, c(kBK));
    s.numk = select(valid, steps, c(0));
  } else {
    valid = cmp(Pred::ult, t, total);
    Value e32 = div(t32, per);
    Value ex = indexCastUI(e32);
    expert = select(valid, ex, c(0));
    s.m0 = mul(bx, c(kBM));
    s.mEnd = dimM;
    s.n0 = mul(by, c(kBN));
    elo = loadI32AsIndex(offsets, expert);
    Value next = add(expert, c(1));
    Value ehi = loadI32AsIndex(offsets, next);
    s.kcount = sub(ehi, elo);
    Value k = add(s.kcount, c(kBK - 1));
    Value steps = div(k, c(kBK));
    s.numk = select(valid, steps, c(0));
  }
  s.valid = valid;
  s.expert = expert;
  s.elo = elo;
  Value m0 = s.m0, mEnd = s.mEnd;
  // A rows of this thread: a pointer to its first chunk, and validity.
  if (g.a == AOperand::Mn) {
    // Columns m0 + 64 box + 8 chunk of the expert's K-rows.
    s.kcnt = i32(select(valid, s.kcount, c(0)));
    Value x = mul(abox, c(64));
    Value y = mul(acc8, c(8));
    Value xy = add(x, y);
    Value acol = add(m0, xy);
    s.acolOk = cmp(Pred::ult, acol, dimM);
    acol = select(s.acolOk, acol, c(0));
    if (g.gatherA) {
      // The rows come per stage (loadRows).
      Value col64 = i64(acol);
      Value bytes = mul(col64, cI64(2));
      s.aPtr = gep1(aptr, bytes);
      Value elo64 = i64(elo);
      Value idBytes = mul(elo64, cI64(4));
      s.idsA = gep1(idsptr, idBytes); // the expert's first
    } else {
      Value r = add(elo, arow);
      Value rl = mul(r, lda);
      Value first = add(rl, acol);
      Value first64 = i64(first);
      Value bytes = mul(first64, cI64(2));
      s.aPtr = gep1(aptr, bytes);
    }
  } else {
    Value colBytes;
    {
      Value x = mul(kchunk8, cI32(2));
      colBytes = zext(x);
    }
    for (int64_t i = 0; i < kBM / rsK; ++i) {
      Value x = add(krow, c(rsK * i));
      Value r = add(m0, x);
      Value inRows = cmp(Pred::ult, r, mEnd);
      Value ok = andi(inRows, valid);
      Value src;
      if (g.a == AOperand::Gather) {
        Value r64 = i64(r);
        Value bytes = mul(r64, cI64(4));
        Value p = gep1(idsptr, bytes);
        src = guardedLoadI32(ok, p);
      } else {
        src = i32(select(ok, r, c(0)));
      }
      Value rowOff = wide(src, lda2);
      Value rowPtr = gep1(aptr, rowOff);
      s.aRows.push_back({gep1(rowPtr, colBytes), ok});
    }
  }
  Value n0 = s.n0;
  if (g.tmaB) {
    // TMA coordinates of the tile's boxes.
    s.n0I32 = i32(n0);
    s.expertI32 = i32(expert);
  }
  if (g.b == BOperand::RowsMn) {
    Value x = mul(mbox, c(64));
    Value y = mul(mcc, c(8));
    Value xy = add(x, y);
    Value bcol = add(n0, xy);
    s.bcolOk = cmp(Pred::ult, bcol, dimN);
    s.bcol = select(s.bcolOk, bcol, c(0));
    // Column bcol of the expert's rows; the rows come per stage.
    Value col64 = i64(s.bcol);
    Value bytes = mul(col64, cI64(2));
    s.bPtr = gep1(bptr, bytes);
    s.kcnt = i32(select(valid, s.kcount, c(0)));
    if (g.gatherB) {
      Value elo64 = i64(s.elo);
      Value idBytes = mul(elo64, cI64(4));
      s.idsB = gep1(bidsptr, idBytes); // the expert's first
    } else {
      Value elo32 = i32(s.elo);
      s.brow0 = add(elo32, mrow32);
    }
  }
  return s;
}

SmallVector<Value>
GemmKernelBuilder::laneIdsAt(function_ref<std::pair<Value, Value>(bool)> pick) {
  // The ids this lane loads, one a gathered operand (0 where none):
  // pick(ofA) gives (the expert's first id, ids left there) of the k-step.
  SmallVector<Value> out;
  for (bool ofA : {true, false}) {
    if (!(ofA ? g.gatherA : g.gatherB))
      continue;
    Value row = ofA ? idRowA : idRowB;
    auto [p, left] = pick(ofA);
    Value more = cmp(Pred::sgt, left, row);
    Value ok = andi(idLaneOk, more);
    Value bytes = mul(row, cI32(4));
    Value bytes64 = zext(bytes);
    Value at = gep1(p, bytes64);
    out.push_back(guardedLoadI32(ok, at));
  }
  return out;
}

GemmKernelBuilder::StageRows
GemmKernelBuilder::loadRows(const Tile &s, Value kt,
                            std::optional<ArrayRef<Value>> laneIds) {
  // The source rows of the gathered A and B tiles of k-tile kt: the token
  // ids loaded here, a stage early, or (warp specialisation) spread by
  // shuffles from the ids the lanes loaded a k-step before.
  StageRows rows;
  Value k0;
  {
    Value kt32 = i32(kt);
    k0 = mul(kt32, cI32(kBK));
  }
  Value heldA, heldB;
  if (laneIds) {
    size_t next = 0;
    if (g.gatherA)
      heldA = (*laneIds)[next++];
    if (g.gatherB)
      heldB = (*laneIds)[next++];
  }

  auto gatheredRows = [&](Value idsBase, Value held, Value row0, int64_t step,
                          Value kleft, function_ref<Value(int64_t)> laneOf) {
    SmallVector<RowRef> out;
    Value stageIds;
    if (!laneIds) {
      Value r = add(k0, row0);
      Value bytes = mul(r, cI32(4));
      Value bytes64 = zext(bytes);
      stageIds = gep1(idsBase, bytes64);
    }
    for (int64_t i = 0; i < 64 / step; ++i) {
      Value kok = cmp(Pred::sgt, kleft, cI32(step * i));
      if (!laneIds) {
        Value p = gepConst(stageIds, 4 * step * i);
        out.push_back({guardedLoadI32(kok, p), kok});
      } else {
        Value srcLane = laneOf(i);
        Value width = cI32(32);
        Value row = gpu::ShuffleOp::create(b, loc, held, srcLane, width,
                                           gpu::ShuffleMode::IDX)
                        .getShuffleResult();
        out.push_back({row, kok});
      }
    }
    return out;
  };

  if (g.gatherA) {
    // K-rows k0 + t/16 + RS_A i; past the expert's end there is no token id.
    Value left = sub(s.kcnt, k0);
    Value kleft = sub(left, arow32);
    Value half;
    if (laneIds)
      half = i32(div(lane, c(16)));
    rows.a = gatheredRows(s.idsA, heldA, arow32, rsA, kleft, [&](int64_t i) {
      Value base = cI32(2 * i);
      return add(base, half);
    });
  }
  if (g.b == BOperand::RowsMn) {
    Value left = sub(s.kcnt, k0);
    Value kleft = sub(left, mrow32);
    if (g.gatherB) {
      // Only rows of the expert: past its end there is no token id to read.
      rows.b = gatheredRows(s.idsB, heldB, mrow32, rsB, kleft,
                            [&](int64_t i) { return cI32(i); });
    } else {
      for (int64_t i = 0; i < 64 / rsB; ++i) {
        Value kok = cmp(Pred::sgt, kleft, cI32(rsB * i));
        Value r = add(s.brow0, k0);
        Value row = add(r, cI32(rsB * i));
        rows.b.push_back({row, kok});
      }
    }
  }
  return rows;
}

Value GemmKernelBuilder::rowsByTma(const Tile &s, Value k0, Value slot,
                                   Value slotBytes) {
  // The TMA thread loads the expert's rows [k0, k0 + 64) of the non-gathered
  // operand as 64x64 boxes when the k-step is whole, and only arrives when
  // it is not; returns the condition under which the caller copies the
  // operand by cp.async instead.
  Value full;
  {
    Value left = sub(s.kcnt, k0);
    full = cmp(Pred::sge, left, cI32(kBK));
  }
  ifBegin(isT0);
  Value bar = fullBar(i32(slot));
  ifElse(
      full,
      [&] {
        int64_t tx =
            (g.tmaRowsA ? kATileBytes : 0) + (g.tmaRowsB ? kBTileBytes : 0);
        // The slot may last have been written by cp.async (generic proxy).
        fenceProxyAsync();
        NVVM::MBarrierArriveExpectTxOp::create(b, loc, Type(), bar, cI32(tx),
                                               NVVM::MemScopeKind::CTA,
                                               /*relaxed=*/false, Value());
        Value elo32 = i32(s.elo);
        Value row = add(elo32, k0);
        struct Box {
          Value map, col;
          int64_t off;
        };
        SmallVector<Box> boxes;
        if (g.tmaRowsA) { // A: 128 columns m0 + 64 j, MN-major
          for (int64_t j = 0; j < 2; ++j) {
            Value m032 = i32(s.m0);
            boxes.push_back({amap, add(m032, cI32(64 * j)), j * 64 * 64 * 2});
          }
        }
        if (g.tmaRowsB) { // B: 256 columns n0 + 64 j
          for (int64_t j = 0; j < 4; ++j) {
            Value n032 = i32(s.n0);
            boxes.push_back({browmap, add(n032, cI32(64 * j)),
                             kATileBytes + j * 64 * 64 * 2});
          }
        }
        for (const Box &box : boxes) {
          Value off = add(slotBytes, cI32(box.off));
          Value dst = gep3(sptr, off);
          Value dst7 = LLVM::AddrSpaceCastOp::create(b, loc, ptr7, dst);
          NVVM::CpAsyncBulkTensorGlobalToSharedClusterOp::create(
              b, loc, dst7, box.map, ValueRange{box.col, row}, bar,
              ValueRange{}, Value(), Value(), NVVM::TMALoadMode::TILE,
              /*isCTAOnly=*/false, NVVM::CTAGroupKindAttr(), Value());
        }
      },
      [&] { mbarrierArrive(bar); });
  ifEnd();
  Value left = sub(s.kcnt, k0);
  return cmp(Pred::slt, left, cI32(kBK));
}

void GemmKernelBuilder::issueStage(const Tile &s, Value kt, Value slot,
                                   Value enabled,
                                   std::optional<StageRows> srcs) {
  // The loads of k-tile kt into ring slot `slot`: cp.async copies of A (and
  // of token-row B), TMA boxes of weight B.
  if (!srcs)
    srcs = loadRows(s, kt);
  Value k0;
  {
    Value kt32 = i32(kt);
    k0 = mul(kt32, cI32(kBK));
  }
  Value slotBytes;
  {
    Value slot32 = i32(slot);
    slotBytes = mul(slot32, cI32(kStageBytes));
  }
  Value koff;
  {
    Value x = mul(k0, cI32(2));
    koff = zext(x);
  }
  Value adst = gep3(aDst0, slotBytes);
  Value partial;
  if (g.tmaRowsA || g.tmaRowsB)
    partial = rowsByTma(s, k0, slot, slotBytes);
  if (g.tmaRowsA)
    ifBegin(partial);
  if (g.a == AOperand::Mn) {
    // K-rows k0 + t/16 + RS_A i of the expert; those past its end copy
    // nothing.
    Value left = sub(s.kcnt, k0);
    Value kleft = sub(left, arow32);
    Value on = andi(s.acolOk, enabled);
    Value sixteen = cI32(16);
    Value abytes = select(on, sixteen, cI32(0));
    Value src;
    if (!g.gatherA) {
      Value off = wide(k0, lda2);
      src = gep1(s.aPtr, off);
    }
    for (int64_t i = 0; i < 64 / rsA; ++i) {
      Value kok;
      if (g.gatherA) {
        const RowRef &row = srcs->a[i];
        kok = row.ok;
        Value off = wide(row.row, lda2);
        src = gep1(s.aPtr, off);
      } else {
        if (i)
          src = gep1(src, aStep);
        kok = cmp(Pred::sgt, kleft, cI32(rsA * i));
      }
      Value dst = gepConst(adst, i * rsA * 128);
      Value size = select(kok, abytes, cI32(0));
      cpAsync(dst, src, size);
    }
    if (g.tmaRowsA)
      ifEnd();
  } else {
    // The K columns left past this thread's chunk, as bytes to copy (0-16).
    Value left = sub(dimk32, k0);
    Value krem = sub(left, kchunk8);
    Value kv;
    {
      Value short_ = cmp(Pred::slt, krem, cI32(8));
      Value m = maxs(krem, cI32(0));
      kv = select(short_, m, cI32(8));
    }
    Value kbytes;
    {
      Value x = mul(kv, cI32(2));
      kbytes = select(enabled, x, cI32(0));
    }
    for (auto [i, row] : llvm::enumerate(s.aRows)) {
      Value dst = gepConst(adst, i * rsK * 128);
      Value src = gep1(row.first, koff);
      Value size = select(row.second, kbytes, cI32(0));
      cpAsync(dst, src, size);
    }
  }
  // B
  if (g.tmaB) {
    ifBegin(andi(isT0, enabled));
    Value bar = fullBar(i32(slot));
    NVVM::MBarrierArriveExpectTxOp::create(
        b, loc, Type(), bar, cI32(kBTileBytes), NVVM::MemScopeKind::CTA,
        /*relaxed=*/false, Value());
    Value btile = gep3(bTile0, slotBytes);
    Value n0 = s.n0I32, ex = s.expertI32;
    SmallVector<SmallVector<Value>> boxes;
    if (g.b == BOperand::WK) {
      boxes.push_back({k0, n0, ex}); // W [E][N][K]: 256 rows of 64 K
    } else if (g.b == BOperand::WMn) {
      // W [E][K][N]: columns n0 + 64 j of K-rows k0 + [0, 64).
      for (int64_t j = 0; j < 4; ++j)
        boxes.push_back({add(n0, cI32(64 * j)), k0, ex});
    } else {
      // W [E][K][2][h]: gate (0) and up (1) columns n0 + 64 j; columns past
      // h are zero-filled.
      for (int64_t j = 0; j < 4; ++j) {
        Value col = add(n0, cI32(64 * (j % 2)));
        boxes.push_back({col, cI32(j / 2), k0, ex});
      }
    }
    for (auto [j, coords] : llvm::enumerate(boxes)) {
      Value dst = j ? gepConst(btile, j * 64 * 64 * 2) : btile;
      // A CTA's shared memory is its own window of shared::cluster.
      Value dst7 = LLVM::AddrSpaceCastOp::create(b, loc, ptr7, dst);
      NVVM::CpAsyncBulkTensorGlobalToSharedClusterOp::create(
          b, loc, dst7, bmap, coords, bar, ValueRange{}, Value(), Value(),
          NVVM::TMALoadMode::TILE, /*isCTAOnly=*/false,
          NVVM::CTAGroupKindAttr(), Value());
    }
    ifEnd();
  } else {
    if (g.tmaRowsB)
      ifBegin(partial);
    SmallVector<Value> bdst;
    for (Value base : bDst0)
      bdst.push_back(gep3(base, slotBytes));
    Value on = andi(s.bcolOk, enabled);
    Value sixteen = cI32(16);
    Value bbytes = select(on, sixteen, cI32(0));
    for (int64_t i = 0; i < 64 / rsB; ++i) {
      const RowRef &row = srcs->b[i];
      Value off = wide(row.row, ldb2);
      Value src = gep1(s.bPtr, off);
      int64_t p = i % static_cast<int64_t>(bdst.size());
      Value dst = gepConst(bdst[p], (i - p) * rsB * 128);
      Value size = select(row.ok, bbytes, cI32(0));
      cpAsync(dst, src, size);
    }
    if (g.tmaRowsB)
      ifEnd();
  }
  if (g.ws) {
    // full[slot] gets this thread's arrival when its copies have landed.
    Value bar = fullBar(i32(slot));
    NVVM::CpAsyncMBarrierArriveOp::create(b, loc, bar, /*noinc=*/true);
  } else {
    NVVM::CpAsyncCommitGroupOp::create(b, loc);
  }
}

void GemmKernelBuilder::prologue(const Tile &s) {
  for (int64_t st = 0; st < g.stages - 1; ++st) {
    Value kt = c(st);
    Value slot = c(st);
    Value enabled = cmp(Pred::ult, c(st), s.numk);
    issueStage(s, kt, slot, enabled);
  }
}

//===----------------------------------------------------------------------===//
// The k-loops
//===----------------------------------------------------------------------===//

Value GemmKernelBuilder::wgmmaStage(Value acc, Value rs, int64_t count,
                                    int64_t pending) {
  // The first `count` of the 4 wgmma of ring slot rs (16 K-rows each) on
  // acc, committed; waits until only `pending` groups are in flight.
  auto aLayout =
      g.a == AOperand::Mn ? NVVM::MMALayout::col : NVVM::MMALayout::row;
  auto bLayout =
      g.b == BOperand::WK ? NVVM::MMALayout::col : NVVM::MMALayout::row;
  Value soff;
  {
    Value rs64 = i64(rs);
    soff = mul(rs64, cI64(kStageBytes / 16));
  }
  Value daS = add(descA0, soff);
  Value dbS = add(descB0, soff);
  NVVM::WgmmaFenceAlignedOp::create(b, loc);
  for (int64_t kk = 0; kk < count; ++kk) {
    // 16 K-rows of 128 B, or 32 B.
    int64_t aoff = g.a == AOperand::Mn ? kk * 128 : kk * 2;
    Value da = kk ? add(daS, cI64(aoff)) : daS;
    int64_t boff = g.b == BOperand::WK ? kk * 2 : kk * 128;
    Value db = kk ? add(dbS, cI64(boff)) : dbS;
    acc = NVVM::WgmmaMmaAsyncOp::create(
        b, loc, accTy, acc, da, db, NVVM::MMAShapeAttr::get(ctx, 64, kBN, 16),
        NVVM::WGMMATypes::bf16, NVVM::WGMMATypes::bf16, NVVM::WGMMATypes::f32,
        NVVM::WGMMAScaleOut::one, NVVM::WGMMAScaleIn::one,
        NVVM::WGMMAScaleIn::one, aLayout, bLayout,
        NVVM::MMAIntOverflowAttr::get(ctx, NVVM::MMAIntOverflow::wrapped));
  }
  NVVM::WgmmaGroupSyncAlignedOp::create(b, loc);
  NVVM::WgmmaWaitGroupSyncOp::create(b, loc, pending);
  return acc;
}

std::pair<Value, Value> GemmKernelBuilder::mainloop(const Tile &s,
                                                    Value phases) {
  // The k-loop over the ring; returns the accumulator (wgmma in flight) and
  // the mbarrier phases after it. Bit s of `phases` is the parity of the next
  // phase of full[s] to wait for.
  Value acc0 = LLVM::ZeroOp::create(b, loc, accTy);
  Value lb = c(0), step = c(1), rs0 = c(0);
  Operation *loop =
      forLoop(lb, s.numk, step, {acc0, rs0, phases},
              [&](Value kt, ValueRange iter) -> SmallVector<Value> {
                Value a0 = iter[0], rs = iter[1], ph = iter[2];
                Value nk = add(kt, c(g.stages - 1));
                // k-tile nk goes to the slot read last step: (kt - 1) % stages.
                Value ws;
                {
                  Value first = cmp(Pred::eq, rs, c(0));
                  Value last = c(g.stages - 1);
                  Value prev = sub(rs, c(1));
                  ws = select(first, last, prev);
                }
                StageRows nextSrcs = loadRows(s, nk);
                NVVM::CpAsyncWaitGroupOp::create(b, loc, g.stages - 2);
                fenceProxyAsync();
                Value phNext = ph;
                if (g.tmaB) {
                  Value rs32 = i32(rs);
                  Value shifted = arith::ShRUIOp::create(b, loc, ph, rs32);
                  Value parity = andi(shifted, cI32(1));
                  Value bar = fullBar(rs32);
                  tryWaitParity(bar, parity);
                  Value bit = arith::ShLIOp::create(b, loc, cI32(1), rs32);
                  phNext = xori(ph, bit);
                }
                gpuBarrier();
                Value cur = wgmmaStage(a0, rs);
                gpuBarrier();
                Value enabled = cmp(Pred::ult, nk, s.numk);
                issueStage(s, nk, ws, enabled, nextSrcs);
                Value rsNext;
                {
                  Value wrap = cmp(Pred::eq, rs, c(g.stages - 1));
                  Value zero = c(0);
                  Value inc = add(rs, c(1));
                  rsNext = select(wrap, zero, inc);
                }
                return {cur, rsNext, phNext};
              });
  NVVM::WgmmaWaitGroupSyncOp::create(b, loc, 0);
  NVVM::CpAsyncWaitGroupOp::create(b, loc, 0);
  return {loop->getResult(0), loop->getResult(2)};
}

//===----------------------------------------------------------------------===//
// Persistent and one-tile kernels
//===----------------------------------------------------------------------===//

void GemmKernelBuilder::buildPersistent() {
  Tile s0 = setup(bid);
  prologue(s0);
  Value ph0 = cI32(0);
  forLoop(bid, total, gridx, {ph0},
          [&](Value t, ValueRange iter) -> SmallVector<Value> {
            Tile s = setup(t);
            auto [acc, phNext] = mainloop(s, iter[0]);
            gpuBarrier();
            // C goes through a bf16 buffer over the last ring slot and past
            // it; the next tile's first loads take the other slots while C
            // is written out.
            Value stageOff = c((g.stages - 1) * kStageBytes);
            Value at = add(pad, stageOff);
            Value len = c(kStageCBytes / 2);
            Value view = memref::ViewOp::create(b, loc, sbf16Ty, smem, at,
                                                ValueRange{len});
            ifBegin(s.valid);
            Value out = g.bias ? addBias(s, acc) : acc;
            for (int64_t h : {0, 1})
              stageHalf(view, out, h);
            ifEnd();
            Value nextT = add(t, gridx);
            prologue(setup(nextT));
            gpuBarrier();
            ifBegin(s.valid);
            for (int64_t h : {0, 1})
              writeHalf(s, view, h);
            ifEnd();
            return {phNext};
          });
  // The last prefetch (of no tile) zero-fills; it lands before the CTA
  // exits.
  NVVM::CpAsyncWaitGroupOp::create(b, loc, 0);
}

void GemmKernelBuilder::buildOneTile() {
  Tile s = setup(bid);
  prologue(s);
  Value acc = mainloop(s, cI32(0)).first;
  ifBegin(s.valid);
  ringEpilogue(s, g.bias ? addBias(s, acc) : acc);
  ifEnd();
}

//===----------------------------------------------------------------------===//
// Entry point
//===----------------------------------------------------------------------===//

void mlir::moe::kernels::buildGemmKernel(OpBuilder &b, Location loc,
                                         const moe_gpu::GemmConfig &config) {
  GemmKernelBuilder(b, loc, config).build();
}

void mlir::moe::kernels::buildDefaultGemmKernel(OpBuilder &b, Location loc,
                                                unsigned index) {
  // The configs as plain data, made once in a context of their own: the
  // builder's context need not have the moe_gpu dialect loaded.
  static const SmallVector<GemmConfig> configs = [] {
    MLIRContext context(MLIRContext::Threading::DISABLED);
    context.loadDialect<moe_gpu::MoEGPUDialect>();
    SmallVector<GemmConfig> out;
    for (moe_gpu::GemmConfigAttr attr : moe_gpu::defaultGemmConfigs(&context))
      out.push_back(attr.getConfig());
    return out;
  }();
  assert(index < configs.size() && "no default GEMM of that index");
  buildGemmKernel(b, loc, configs[index]);
}
