//===- GemmKernelBuilder.h - the grouped GEMM kernels ---------*- C++ -*-===//
//
// Internal to the kernel builder: GemmKernelBuilder builds the gpu.func of one
// #moe_gpu.gemm config. Its members build the kernel's parts (setup,
// issueStage, mainloop, ...); Gemm.cpp holds the prelude, the copies and the
// k-loop without warp specialisation, GemmWarpSpecialized.cpp the producer
// and consumer warpgroups, GemmEpilogue.cpp the epilogues.
//
// The order of ops and of constant requests is fixed, since the library's
// text is pinned (HopperDescriptors.h), and C++ does not order the evaluation
// of a call's arguments: every value that emits an op or requests a constant
// is computed in a statement of its own before the call that uses it.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_KERNELS_GEMMKERNELBUILDER_H
#define MOE_LIB_CONVERSION_MOETOGPU_KERNELS_GEMMKERNELBUILDER_H

#include "Emitter.h"

#include "moe/Dialect/MoEGPU/IR/MoEGPUAttributes.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/SmallVector.h"

#include <functional>
#include <optional>
#include <string>
#include <utility>

namespace mlir::moe::kernels {

/// What a config implies for the kernel and its launch: the resolved config,
/// the kernel's name, its flags and its shared-memory layout.
struct GemmTraits {
  explicit GemmTraits(const moe_gpu::GemmConfig &unresolved);

  moe_gpu::GemmConfig config; // resolved
  std::string name;
  moe_gpu::AOperand a;
  moe_gpu::BOperand b;
  moe_gpu::GemmEpilogue epi;
  bool varlenM, gatherA, gatherB, hasW, hasDs, storeA;
  /// The activation is SwiGLU (H holds gate and up columns). A config's
  /// activation defaults to SwiGLU, so this holds for the store GEMMs too:
  /// only swigluTile() says a tile's columns are gate and up halves.
  bool gated;
  /// The tile's outputs are SwiGLU's gate and up columns: the up GEMM's
  /// SwiGLU epilogue.
  bool swigluTile() const {
    return epi == moe_gpu::GemmEpilogue::Swiglu && gated;
  }
  /// The epilogue adds the tile's expert's bias row (bias).
  bool bias;
  bool persistent, ws, tmaB, tmaRowsA, tmaRowsB;
  bool bulkStore, tmaStore, tmaStoreRows, reduceStore, dynamic, idleSkip;
  int64_t threads, stages, ringBytes, stageCBytes, cumOffset;
  int64_t barOffset = 0, schedOffset = 0;
  int64_t groupM, dactUnroll, producerRegisters, consumerRegisters;
};

/// Builds the kernel of one config.
class GemmKernelBuilder : public Emitter {
public:
  GemmKernelBuilder(OpBuilder &b, Location loc,
                    const moe_gpu::GemmConfig &config);
  /// Builds the kernel at the builder's insertion point.
  void build();

private:
  /// A row of a gathered or row-wise operand: its source and whether it is
  /// copied.
  struct RowRef {
    Value row, ok;
  };
  /// load_rows' result: the rows of the A and B tiles of a k-step.
  struct StageRows {
    SmallVector<RowRef> a, b;
  };
  /// setup's S: one tile of the schedule.
  struct Tile {
    Value by, m0, mEnd, n0, numk, kcount, valid, expert, elo;
    Value kcnt, acolOk, aPtr, idsA;
    SmallVector<std::pair<Value, Value>> aRows;
    Value n0I32, expertI32;
    Value bcolOk, bcol, bPtr, idsB, brow0;
  };
  /// A ring position: (slot, phase parity).
  struct RingPos {
    Value slot, phase;
  };
  /// An accumulator and the ring position after its tile.
  struct LoopResult {
    Value acc, slot, phase;
  };

  //===--------------------------------------------------------------------===//
  // The Emitter
  //===--------------------------------------------------------------------===//

  Value cIndex(int64_t value) { return c(value); }
  Value cF32(double value);
  /// For the HopperDescriptors builders.
  Value getConstant(int64_t value, Type type);

  Value rem(Value x, Value y);
  Value xori(Value x, Value y);
  Value andi(Value x, Value y);
  Value select(Value cond, Value x, Value y);
  Value fadd(Value x, Value y);
  Value fmul(Value x, Value y);
  Value fsub(Value x, Value y);
  Value ffma(Value x, Value y, Value z);
  Value i32(Value v);
  Value i64(Value v);
  Value indexCastUI(Value v);
  Value zext(Value v);
  Value loadI32AsIndex(Value mem, Value idx);
  Value loadSmemIndex(Value mem, Value idx);
  SmallVector<Value> bf16x8ToF32(Value vec);

  /// scf.if without results; ifEnd closes it (if_begin, if_end).
  void ifBegin(Value cond);
  void ifEnd();
  /// scf.if with an else branch and no results.
  void ifElse(Value cond, function_ref<void()> thenBody,
              function_ref<void()> elseBody);
  /// scf.if with results (if_values).
  SmallVector<Value> ifValues(Value cond, TypeRange types,
                              function_ref<SmallVector<Value>()> thenBody,
                              function_ref<SmallVector<Value>()> elseBody);
  /// scf.for whose body is built by `body` (given the induction variable and
  /// the iteration arguments; returns the yielded values). Returns the loop.
  Operation *forLoop(Value lb, Value ub, Value step, ValueRange inits,
                     function_ref<SmallVector<Value>(Value, ValueRange)> body);

  //===--------------------------------------------------------------------===//
  // The kernel's helpers
  //===--------------------------------------------------------------------===//

  void consumerBarrier();
  void gpuBarrier();
  void fenceProxyAsync();
  Value gptr(Value mem);
  Value gep1(Value p, Value off);
  Value gep3(Value p, Value off);
  Value gepConst(Value p, int32_t off);
  Value wide(Value x, Value y);
  void cpAsync(Value dst, Value src, Value size);
  Value guardedLoadI32(Value cond, Value ptr);
  Value fullBar(Value slot32);
  Value emptyBar(Value slot32);
  Value schedWord(int64_t base, Value j);
  Value tileFull(Value j) { return schedWord(16, j); }
  Value tileEmpty(Value j) { return schedWord(32, j); }
  void tryWaitParity(Value bar, Value parity);
  void mbarrierArrive(Value bar);
  Value extractAcc(Value acc, int64_t v);

  void buildPrelude();
  void buildTileTable(function_ref<void()> barrier);
  Tile setup(Value t);
  SmallVector<Value>
  laneIdsAt(function_ref<std::pair<Value, Value>(bool)> pick);
  StageRows loadRows(const Tile &s, Value kt,
                     std::optional<ArrayRef<Value>> laneIds = std::nullopt);
  Value rowsByTma(const Tile &s, Value k0, Value slot, Value slotBytes);
  void issueStage(const Tile &s, Value kt, Value slot, Value enabled,
                  std::optional<StageRows> srcs = std::nullopt);
  void prologue(const Tile &s);
  Value wgmmaStage(Value acc, Value rs, int64_t count = 4, int64_t pending = 1);
  std::pair<Value, Value> mainloop(const Tile &s, Value phases);
  RingPos advance(Value slot, Value ph);
  Value wgBusy(const Tile &s);
  LoopResult mainloopWs(const Tile &s, Value slot0, Value ph0);
  LoopResult idleKloopWs(const Tile &s, Value slot0, Value ph0);
  LoopResult kloopWs(const Tile &s, Value slot0, Value ph0);

  // Warp specialisation.
  void buildWarpSpecialized();
  void tileLoop(function_ref<RingPos(Value, Value, Value)> tile);
  RingPos
  producerTile(Value t, Value sl, Value ph,
               function_ref<void(const Tile &, Value)> afterStep = nullptr,
               function_ref<void(const Tile &)> afterLoop = nullptr);
  RingPos consumerTile(Value t, Value sl, Value ph);
  RingPos produceStep(const Tile &s, Value kt, Value slot, Value parity,
                      function_ref<StageRows()> srcs);
  /// ids_of: k0 of k-tile kt, then per gathered operand (the expert's ids
  /// at k0, ids left there).
  Value idsK0(Value kt);
  std::pair<Value, Value> idsAt(const Tile &s, Value k0, bool ofA);
  void producerTilesPipelined();
  void producerTilesDynamic();
  void consumerTilesDynamic();
  void tileWhile(ValueRange inits,
                 function_ref<SmallVector<Value>(ValueRange)> body);
  std::pair<Value, Value> advanceTileRing(Value j, Value q);
  Value uniformTile(Value ptr);

  void buildPersistent();
  void buildOneTile();

  // Epilogues (GemmEpilogue.cpp).
  Value outBase(const Tile &s);
  void writeHalf(const Tile &s, Value stage, int64_t h);
  void stageHalf(Value stage, Value acc, int64_t h);
  Value packedBf16x2(Value acc, int64_t v);
  void stmatrixTile(Value acc,
                    function_ref<std::function<Value(int64_t)>(Value)> place);
  void stageRowsStmatrix(Value stagePtr, Value acc);
  void stageBoxesStmatrix(Value stagePtr, Value acc);
  void tmaStoreBoxes(const Tile &s, Value stagePtr);
  void bulkStoreRows(const Tile &s, Value stagePtr);
  std::pair<Value, Value> siluParts(Value g32);
  std::pair<Value, Value> activationParts(Value x, bool withGrad);
  Value addBias(const Tile &s, Value acc);
  SmallVector<Value> dswigluLoads(Value r, Value col);
  SmallVector<Type> dswigluLoadTypes();
  struct DswigluRow {
    Value hrow, w;
    SmallVector<Value> gs, us;
  };
  DswigluRow dswigluWiden(Value r, ValueRange raw);
  Value dswigluGroup(Value r, Value col, ArrayRef<Value> aAccs,
                     const DswigluRow &loaded, Value ok);
  void ringEpilogue(const Tile &s, Value acc);

  //===--------------------------------------------------------------------===//
  // State
  //===--------------------------------------------------------------------===//

  GemmTraits g;
  MLIRContext *ctx;

  // Types.
  Type indexTy, i1, i8, i32Ty, i64Ty, f32, bf16, ptr, ptr1, ptr3, ptr7, accTy;
  MemRefType smemTy, sbf16Ty, si32Ty, sf32Ty;

  /// Where ifEnd returns to.
  SmallVector<OpBuilder::InsertPoint> ifStack;

  // The kernel's arguments (gemm_signature), null where it has none.
  Value offsets, numExperts, ids, amat, lda, bids, amap, bmap, bmat, ldb,
      browmap, dimM, dimN, dimK, hout, aout, cout, ldc, cmap, hsaved, wrow, dh,
      wa, dspart, numNtiles, tileCounter, counterSlot, biasRows;

  // Values the kernel's parts share.
  int64_t bnEff = 0, ncopy = 0, rsK = 0, rsA = 0, rsB = 0;
  Value tid, bid, gridx, warp, lane, wg, ntiles, mtiles, total;
  Value smem, pad, sbase;
  Value ctid, kchunk, krow, kSoff, mchunk, mbox, mcc, mrow, achunk, abox, acc8,
      arow, aSoffMn;
  Value aptr, bptr, idsptr, bidsptr, sptr, lda2, ldb2, dimk32, kchunk8, mrow32;
  Value aDst0, arow32, aStep, bTile0;
  SmallVector<Value> bDst0;
  Value bars, sched, isT0, descA0, descB0, cumv, useTable;
  Value idLaneOk, idRowA, idRowB;
  Value warpRow0, qrow, qcol;
  Value houtPtr, aoutPtr, coutPtr, biasPtr, stage, stagePtr;
};

} // namespace mlir::moe::kernels

#endif // MOE_LIB_CONVERSION_MOETOGPU_KERNELS_GEMMKERNELBUILDER_H
