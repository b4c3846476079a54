//===- MoEGPUAttributes.cpp - moe_gpu dialect attributes ----*- C++ -*-===//
//
// The defaults, rules and shared-memory layout below are those of the kernel
// builder (lib/Conversion/MoEToGPU/Kernels/, GemmTraits in Gemm.cpp); the two
// must change together.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoEGPU/IR/MoEGPUAttributes.h"
#include "moe/Dialect/MoEGPU/IR/MoEGPUDialect.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/TypeSwitch.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <bitset>
#include <limits>
#include <tuple>

using namespace mlir;
using namespace mlir::moe_gpu;

#include "moe/Dialect/MoEGPU/IR/MoEGPUEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "moe/Dialect/MoEGPU/IR/MoEGPUAttributes.cpp.inc"

namespace {
/// varlen_m: each CTA keeps the experts' cumulative M-tile counts in shared
/// memory (TABLE_EXPERTS + 9 words and 28 bytes: CUM_BYTES).
constexpr int64_t kTableExperts = 4 * kConsumerThreads;
constexpr int64_t kCumBytes = 4 * (kTableExperts + 1 + 8) + 28;
/// The dynamic schedule's ring of tile ids and its mbarriers (SCHED_BYTES).
constexpr int64_t kSchedBytes = 48;
/// The launch asks for 1 KiB more so the ring can start 1024-aligned.
constexpr int64_t kAlignBytes = 1024;
/// The dS row sums of the one-tile kernels, after the ring.
constexpr int64_t kRowSumBytes = 1024;
/// A row of C staged for bulk copies is padded by 16 bytes (BULK_ROW).
constexpr int64_t kBulkRowPad = 8;
/// The default `stages` of the persistent kernels and of the others.
constexpr int64_t kPersistentStages = 3, kOneTileStages = 4;
} // namespace

//===----------------------------------------------------------------------===//
// GemmConfig
//===----------------------------------------------------------------------===//

bool mlir::moe_gpu::isPersistentEpilogue(GemmEpilogue epilogue) {
  return epilogue == GemmEpilogue::StoreBf16 ||
         epilogue == GemmEpilogue::StoreBf16W ||
         epilogue == GemmEpilogue::Swiglu;
}

bool mlir::moe_gpu::isTmaOperand(BOperand b) { return b != BOperand::RowsMn; }

bool mlir::moe_gpu::canAccumulate(const GemmConfig &config) {
  GemmConfig resolved = config.resolved();
  return resolved.epilogue == GemmEpilogue::StoreBf16 &&
         resolved.store == StorePath::TmaBoxes;
}

static int64_t defaultStages(GemmEpilogue epilogue) {
  return isPersistentEpilogue(epilogue) ? kPersistentStages : kOneTileStages;
}

// `rows_tma` is on by default for the warp-specialized gathered weight
// gradients.
static bool defaultRowsTma(bool warpSpecialized, GemmProblem problem,
                           GatheredOperand gathered) {
  return warpSpecialized && problem == GemmProblem::VarlenK &&
         gathered != GatheredOperand::None;
}

// The default `store`: the ring for the one-tile kernels, TMA boxes or bulk
// rows for the warp-specialized store_bf16 and store_bf16_w kernels, the
// threads' stores for the other persistent ones.
static StorePath defaultStorePath(GemmEpilogue epilogue, bool warpSpecialized,
                                  GatheredOperand gathered) {
  if (!isPersistentEpilogue(epilogue))
    return StorePath::Ring;
  if (!warpSpecialized || epilogue == GemmEpilogue::Swiglu)
    return StorePath::Threads;
  if (epilogue == GemmEpilogue::StoreBf16)
    return StorePath::TmaBoxes;
  return gathered != GatheredOperand::None ? StorePath::TmaBoxes
                                           : StorePath::BulkRows;
}

GemmConfig GemmConfig::defaults() const {
  GemmConfig d;
  // a, b, epilogue and problem have no default.
  d.a = a;
  d.b = b;
  d.epilogue = epilogue;
  d.problem = problem;
  d.stages = defaultStages(epilogue);
  d.warpSpecialized = isPersistentEpilogue(epilogue);
  d.idleSkip = schedule == TileSchedule::Dynamic;
  bool ws = warpSpecialized.value_or(*d.warpSpecialized);
  d.rowsTma = defaultRowsTma(ws, problem, gathered);
  d.store = defaultStorePath(epilogue, ws, gathered);
  return d;
}

GemmConfig GemmConfig::resolved() const {
  GemmConfig d = defaults();
  GemmConfig r = *this;
  r.stages = r.stages.value_or(*d.stages);
  r.warpSpecialized = r.warpSpecialized.value_or(*d.warpSpecialized);
  r.idleSkip = r.idleSkip.value_or(*d.idleSkip);
  r.rowsTma = r.rowsTma.value_or(*d.rowsTma);
  r.store = r.store.value_or(*d.store);
  return r;
}

static auto asTuple(const GemmConfig &c) {
  return std::tie(c.a, c.b, c.gathered, c.epilogue, c.storeA,
                  c.withRouterWeight, c.withDs, c.accumulate, c.problem,
                  c.tileM, c.tileN, c.tileK, c.stages, c.warpSpecialized,
                  c.producerRegisters, c.consumerRegisters, c.schedule,
                  c.idleSkip, c.groupM, c.rowsTma, c.store, c.dactUnroll,
                  c.activation, c.bias);
}

bool GemmConfig::operator==(const GemmConfig &other) const {
  return asTuple(*this) == asTuple(other);
}

//===----------------------------------------------------------------------===//
// Derived properties
//===----------------------------------------------------------------------===//

int64_t mlir::moe_gpu::gemmThreads(const GemmConfig &config) {
  return *config.resolved().warpSpecialized
             ? kConsumerThreads + kProducerThreads
             : kConsumerThreads;
}

int64_t mlir::moe_gpu::gemmLaunchRegisters(const GemmConfig &config) {
  return kRegistersPerSM / gemmThreads(config) / 8 * 8;
}

/// Bytes of one ring stage: a bf16 A tile and a bf16 B tile.
static int64_t stageBytes(const GemmConfig &c) {
  return (c.tileM * c.tileK + c.tileK * c.tileN) * 2;
}

int64_t mlir::moe_gpu::gemmLaunchSharedMemoryBytes(const GemmConfig &config) {
  GemmConfig c = config.resolved();
  bool ws = *c.warpSpecialized;
  int64_t stage = stageBytes(c);
  int64_t stageC = c.tileM * c.tileN * 2;
  int64_t paddedStageC = c.tileM * (c.tileN + kBulkRowPad) * 2;
  bool bulkStore =
      *c.store == StorePath::BulkRows || *c.store == StorePath::TmaBoxes;
  // A weight gradient's boxes cover every tile; the varlen-M GEMMs keep the
  // padded rows for an expert's partial last tile.
  bool boxesOnly =
      *c.store == StorePath::TmaBoxes && c.epilogue == GemmEpilogue::StoreBf16W;
  int64_t stageCBytes = bulkStore && !boxesOnly ? paddedStageC : stageC;
  int64_t ring = *c.stages * stage;
  int64_t cumOffset;
  if (ws) // C's staging buffer follows the ring
    cumOffset = ring + stageCBytes;
  else if (isPersistentEpilogue(c.epilogue)) // over the last slot and past it
    cumOffset = std::max(ring, ring - stage + stageC);
  else
    cumOffset = ring + kRowSumBytes;
  int64_t bytes = cumOffset + kAlignBytes +
                  (c.problem == GemmProblem::VarlenM ? kCumBytes : 0);
  // full[s], and with warp specialisation empty[s]: 8-byte mbarriers.
  if (isTmaOperand(c.b) || ws)
    bytes += 8 * *c.stages * (ws ? 2 : 1);
  if (c.schedule == TileSchedule::Dynamic)
    bytes += kSchedBytes;
  return bytes;
}

std::string mlir::moe_gpu::gemmKernelName(const GemmConfig &config) {
  GemmConfig c = config.resolved();
  GemmConfig d = c.defaults();
  std::string name;
  llvm::raw_string_ostream os(name);
  os << "moe_gemm_";
  StringRef a = stringifyEnum(c.a);
  if (c.problem == GemmProblem::VarlenK) {
    // a = mn, b = rows_mn and store_bf16_w, the only varlen-K kernel.
    os << "wgrad_";
    if (c.gathered == GatheredOperand::B)
      os << "gather";
    else if (c.gathered == GatheredOperand::A)
      os << "gather_a";
    else
      os << "rows";
  } else if (c.epilogue == GemmEpilogue::Swiglu) {
    os << "up_" << a;
    if (!c.storeA) // H alone, for its recomputation in backward
      os << "_h";
    if (!isGatedActivation(c))
      os << "_" << stringifyEnum(c.activation);
    if (c.bias)
      os << "_bias";
  } else if (c.epilogue == GemmEpilogue::Dswiglu) {
    os << "dact_" << a;
    if (!isGatedActivation(c))
      os << "_" << stringifyEnum(c.activation);
    if (c.b == BOperand::WMn)
      os << "_bmn";
    // The routed experts' kernel (gather) scales by w and writes dS; the
    // shared expert's (rows) does neither.
    bool routed = c.a == AOperand::Gather;
    if (c.withRouterWeight != routed)
      os << (c.withRouterWeight ? "_w" : "_now");
    if (c.withDs != routed)
      os << (c.withDs ? "_ds" : "_nods");
  } else {
    os << a << (c.b == BOperand::WK ? "_k" : "_mn");
    if (c.epilogue == GemmEpilogue::StoreF32)
      os << "_f32";
    else if (c.epilogue == GemmEpilogue::StoreBf16W)
      os << "_bf16w";
    else
      os << "_bf16";
    if (c.bias)
      os << "_bias";
  }
  if (c.accumulate)
    os << "_acc";

  // The build parameters that differ from their defaults, in a fixed order.
  if (c.tileM != d.tileM || c.tileN != d.tileN || c.tileK != d.tileK)
    os << "_t" << c.tileM << "x" << c.tileN << "x" << c.tileK;
  if (*c.stages != *d.stages)
    os << "_s" << *c.stages;
  if (*c.warpSpecialized != *d.warpSpecialized)
    os << (*c.warpSpecialized ? "_ws" : "_nows");
  if (c.producerRegisters != d.producerRegisters ||
      c.consumerRegisters != d.consumerRegisters)
    os << "_regs" << c.producerRegisters << "x" << c.consumerRegisters;
  if (c.schedule != d.schedule)
    os << (c.schedule == TileSchedule::Dynamic ? "_dyn" : "_static");
  if (*c.idleSkip != *d.idleSkip)
    os << (*c.idleSkip ? "_skip" : "_noskip");
  if (c.groupM != d.groupM)
    os << "_g" << c.groupM;
  if (*c.rowsTma != *d.rowsTma)
    os << (*c.rowsTma ? "_rowstma" : "_norowstma");
  if (*c.store != *d.store) {
    os << "_store";
    switch (*c.store) {
    case StorePath::Ring:
      os << "ring";
      break;
    case StorePath::Threads:
      os << "threads";
      break;
    case StorePath::BulkRows:
      os << "bulk";
      break;
    case StorePath::TmaBoxes:
      os << "tma";
      break;
    }
  }
  if (c.dactUnroll != d.dactUnroll)
    os << "_u" << c.dactUnroll;
  return name;
}

//===----------------------------------------------------------------------===//
// Verification
//===----------------------------------------------------------------------===//

LogicalResult
mlir::moe_gpu::verifyGemmConfig(const GemmConfig &config,
                                function_ref<InFlightDiagnostic()> emitError) {
  GemmConfig c = config.resolved();
  GemmConfig d = c.defaults();
  bool persistent = isPersistentEpilogue(c.epilogue);
  bool ws = *c.warpSpecialized;
  bool varlenK = c.problem == GemmProblem::VarlenK;
  bool dynamic = c.schedule == TileSchedule::Dynamic;
  StorePath store = *c.store;

  // Numbers.
  if (c.tileM != kTileM || c.tileN != kTileN || c.tileK != kTileK)
    return emitError() << "tile " << c.tileM << "x" << c.tileN << "x" << c.tileK
                       << " is not built yet: the kernels build " << kTileM
                       << "x" << kTileN << "x" << kTileK << " tiles only";
  if (*c.stages < 2)
    return emitError() << "stages must be at least 2 (one slot is read while "
                          "the next loads), got "
                       << *c.stages;
  if (c.groupM < 1 || c.groupM > std::numeric_limits<int32_t>::max())
    return emitError() << "group_m must be in [1, 2147483647] (the raster is "
                          "computed in i32), got "
                       << c.groupM;
  if (!llvm::is_contained({1, 2, 4, 8}, c.dactUnroll))
    return emitError() << "dact_unroll must be 1, 2, 4 or 8, got "
                       << c.dactUnroll;

  // Operands, problem and epilogue.
  if (c.a == AOperand::Mn && !varlenK)
    return emitError()
           << "a = mn (an expert's rows along K) needs problem = varlen_k";
  if (varlenK && c.a != AOperand::Mn)
    return emitError() << "problem = varlen_k needs a = mn (an expert's rows "
                          "along K), got a = "
                       << stringifyEnum(c.a);
  if (isTmaOperand(c.b) && varlenK)
    return emitError() << "b = " << stringifyEnum(c.b)
                       << " comes by TMA boxes of the expert weights, which "
                          "only problem = varlen_m builds";
  if (c.b == BOperand::RowsMn && !varlenK)
    return emitError()
           << "b = rows_mn (token rows along K) needs problem = varlen_k";
  if (c.gathered != GatheredOperand::None && !varlenK)
    return emitError() << "gathered = " << stringifyEnum(c.gathered)
                       << " needs problem = varlen_k (varlen_m gathers by "
                          "a = gather)";
  if (c.bias &&
      !(c.epilogue == GemmEpilogue::Swiglu ||
        (c.epilogue == GemmEpilogue::StoreBf16 && !varlenK && !c.accumulate)))
    return emitError() << "bias = true needs epilogue = swiglu, or store_bf16 "
                          "with problem = varlen_m and no accumulate, got "
                       << stringifyEnum(c.epilogue);
  bool gated = isGatedActivation(c);
  if (!gated && c.epilogue != GemmEpilogue::Swiglu &&
      c.epilogue != GemmEpilogue::Dswiglu)
    return emitError() << "activation = " << stringifyEnum(c.activation)
                       << " needs epilogue = swiglu or dswiglu, got "
                       << stringifyEnum(c.epilogue);
  if (c.epilogue == GemmEpilogue::Swiglu && gated && c.b != BOperand::WMnSwiglu)
    return emitError() << "epilogue = swiglu needs b = w_mn_swiglu (gate and "
                          "up columns in one tile), got b = "
                       << stringifyEnum(c.b);
  if (c.epilogue == GemmEpilogue::Swiglu && !gated && c.b != BOperand::WMn)
    return emitError() << "epilogue = swiglu with activation = "
                       << stringifyEnum(c.activation)
                       << " (not gated) needs b = w_mn, got b = "
                       << stringifyEnum(c.b);
  if (c.b == BOperand::WMnSwiglu && c.epilogue != GemmEpilogue::Swiglu)
    return emitError() << "b = w_mn_swiglu (gate and up columns in one tile) "
                          "needs epilogue = swiglu, got "
                       << stringifyEnum(c.epilogue);
  if (c.epilogue == GemmEpilogue::StoreBf16W && !varlenK)
    return emitError() << "epilogue = store_bf16_w writes an expert's [M, N] "
                          "block of a weight gradient: it needs problem = "
                          "varlen_k";
  if (varlenK && c.epilogue != GemmEpilogue::StoreBf16W)
    return emitError() << "problem = varlen_k computes a weight gradient: it "
                          "needs epilogue = store_bf16_w, got "
                       << stringifyEnum(c.epilogue);

  // Epilogue flags and options.
  if (c.storeA && c.epilogue != GemmEpilogue::Swiglu)
    return emitError() << "store_a (A = silu(gate) * up) needs epilogue = "
                          "swiglu, got "
                       << stringifyEnum(c.epilogue);
  if (c.withRouterWeight && c.epilogue != GemmEpilogue::Dswiglu)
    return emitError() << "with_router_weight needs epilogue = dswiglu, got "
                       << stringifyEnum(c.epilogue);
  if (c.withDs && c.epilogue != GemmEpilogue::Dswiglu)
    return emitError() << "with_ds needs epilogue = dswiglu, got "
                       << stringifyEnum(c.epilogue);
  if (c.epilogue != GemmEpilogue::Dswiglu && c.dactUnroll != d.dactUnroll)
    return emitError() << "dact_unroll configures the dSwiGLU epilogue: it "
                          "needs epilogue = dswiglu, got "
                       << stringifyEnum(c.epilogue);

  // Warp specialisation and setmaxnreg (ws_register_split).
  if (ws && !persistent)
    return emitError() << "warp_specialized needs a persistent epilogue "
                          "(store_bf16, store_bf16_w or swiglu), got "
                       << stringifyEnum(c.epilogue);
  int64_t p = c.producerRegisters, q = c.consumerRegisters;
  if (!ws && (p != d.producerRegisters || q != d.consumerRegisters))
    return emitError() << "registers apply to warp-specialized kernels only";
  if (ws) {
    int64_t launch = gemmLaunchRegisters(c);
    auto diag = [&]() {
      return emitError() << "registers [" << p << ", " << q << "]: ";
    };
    for (int64_t n : {p, q})
      if (n % 8 != 0 || n < 24 || n > 256)
        return diag() << "setmaxnreg takes multiples of 8 from 24 to 256";
    if (p > launch || launch > q)
      return diag() << "the producer gives registers away and the consumers "
                       "take them (P <= "
                    << launch << " <= C)";
    if (kProducerThreads * (launch - p) < kConsumerThreads * (q - launch))
      return diag() << "the consumers would wait for registers the producer "
                       "never frees ("
                    << kProducerThreads << " (" << launch
                    << " - P) must be >= " << kConsumerThreads << " (C - "
                    << launch << "))";
  }

  // Schedule.
  if (dynamic && !ws)
    return emitError() << "schedule = dynamic needs warp_specialized = true "
                          "(the producer claims the tiles)";
  if (dynamic && varlenK)
    return emitError() << "schedule = dynamic needs problem = varlen_m";
  if (*c.idleSkip && !dynamic)
    return emitError() << "idle_skip needs schedule = dynamic";

  // Rows by TMA.
  if (*c.rowsTma && !ws)
    return emitError() << "rows_tma needs warp_specialized = true";
  if (*c.rowsTma && c.gathered == GatheredOperand::None)
    return emitError() << "rows_tma loads the operand that a gathered "
                          "varlen_k GEMM does not gather: it needs gathered = "
                          "a or b";

  // Store path.
  if (store == StorePath::Ring && persistent)
    return emitError() << "store = ring stages C in the ring after the "
                          "k-loop, which only the one-tile epilogues "
                          "(store_f32, dswiglu) do; got epilogue = "
                       << stringifyEnum(c.epilogue);
  if (store != StorePath::Ring && !persistent)
    return emitError() << "epilogue = " << stringifyEnum(c.epilogue)
                       << " computes one tile a CTA and stages C in the "
                          "ring: it needs store = ring, got "
                       << stringifyEnum(store);
  bool bulkStore = store == StorePath::BulkRows || store == StorePath::TmaBoxes;
  if (bulkStore && !ws)
    return emitError() << "store = " << stringifyEnum(store)
                       << " needs warp_specialized = true (a staging buffer "
                          "of its own)";
  if (bulkStore && c.epilogue != GemmEpilogue::StoreBf16 &&
      c.epilogue != GemmEpilogue::StoreBf16W)
    return emitError() << "store = " << stringifyEnum(store)
                       << " needs epilogue = store_bf16 or store_bf16_w, got "
                       << stringifyEnum(c.epilogue);
  if (store == StorePath::TmaBoxes && c.epilogue == GemmEpilogue::StoreBf16W &&
      c.gathered == GatheredOperand::None)
    return emitError() << "store = tma_boxes of a weight gradient without a "
                          "gathered operand is not built yet";
  if (c.accumulate &&
      (c.epilogue != GemmEpilogue::StoreBf16 || store != StorePath::TmaBoxes))
    return emitError() << "accumulate adds the tile by TMA reduce-add boxes: "
                          "it needs epilogue = store_bf16 and store = "
                          "tma_boxes, got epilogue = "
                       << stringifyEnum(c.epilogue)
                       << ", store = " << stringifyEnum(store);

  // Shared memory.
  if (store == StorePath::Ring) {
    // The dSwiGLU stages dA in bf16 rows padded as for bulk copies.
    bool bf16 = c.epilogue == GemmEpilogue::Dswiglu;
    int64_t staged =
        bf16 ? c.tileM * (c.tileN + kBulkRowPad) * 2 : c.tileM * c.tileN * 4;
    int64_t ring = *c.stages * stageBytes(c);
    if (staged > ring)
      return emitError() << "C staged in " << (bf16 ? "bf16" : "f32") << " ("
                         << staged << " bytes) does not fit the ring of "
                         << *c.stages << " stages (" << ring << " bytes)";
  }
  int64_t bytes = gemmLaunchSharedMemoryBytes(c);
  if (bytes > kMaxSharedMemoryBytes)
    return emitError() << "needs " << bytes
                       << " bytes of shared memory, over the "
                       << kMaxSharedMemoryBytes
                       << " (227 KiB) a CTA gets on sm_90a";
  return success();
}

//===----------------------------------------------------------------------===//
// GemmConfigAttr
//===----------------------------------------------------------------------===//

LogicalResult GemmConfigAttr::verify(
    function_ref<InFlightDiagnostic()> emitError, AOperand a, BOperand b,
    GatheredOperand gathered, GemmEpilogue epilogue, bool storeA,
    bool withRouterWeight, bool withDs, bool accumulate, GemmProblem problem,
    int64_t tileM, int64_t tileN, int64_t tileK, int64_t stages,
    bool warpSpecialized, int64_t producerRegisters, int64_t consumerRegisters,
    TileSchedule schedule, bool idleSkip, int64_t groupM, bool rowsTma,
    StorePath store, int64_t dactUnroll, GemmActivation activation, bool bias) {
  GemmConfig c;
  c.a = a;
  c.b = b;
  c.gathered = gathered;
  c.epilogue = epilogue;
  c.storeA = storeA;
  c.withRouterWeight = withRouterWeight;
  c.withDs = withDs;
  c.accumulate = accumulate;
  c.problem = problem;
  c.tileM = tileM;
  c.tileN = tileN;
  c.tileK = tileK;
  c.stages = stages;
  c.warpSpecialized = warpSpecialized;
  c.producerRegisters = producerRegisters;
  c.consumerRegisters = consumerRegisters;
  c.schedule = schedule;
  c.idleSkip = idleSkip;
  c.groupM = groupM;
  c.rowsTma = rowsTma;
  c.store = store;
  c.dactUnroll = dactUnroll;
  c.activation = activation;
  c.bias = bias;
  return verifyGemmConfig(c, emitError);
}

GemmConfig GemmConfigAttr::getConfig() const {
  GemmConfig c;
  c.a = getA();
  c.b = getB();
  c.gathered = getGathered();
  c.epilogue = getEpilogue();
  c.storeA = getStoreA();
  c.withRouterWeight = getWithRouterWeight();
  c.withDs = getWithDs();
  c.accumulate = getAccumulate();
  c.problem = getProblem();
  c.tileM = getTileM();
  c.tileN = getTileN();
  c.tileK = getTileK();
  c.stages = getStages();
  c.warpSpecialized = getWarpSpecialized();
  c.producerRegisters = getProducerRegisters();
  c.consumerRegisters = getConsumerRegisters();
  c.schedule = getSchedule();
  c.idleSkip = getIdleSkip();
  c.groupM = getGroupM();
  c.rowsTma = getRowsTma();
  c.store = getStore();
  c.dactUnroll = getDactUnroll();
  c.activation = getActivation();
  c.bias = getBias();
  return c;
}

int64_t GemmConfigAttr::threads() const { return gemmThreads(getConfig()); }

bool GemmConfigAttr::persistent() const {
  return isPersistentEpilogue(getEpilogue());
}

int64_t GemmConfigAttr::launchSharedMemoryBytes() const {
  return gemmLaunchSharedMemoryBytes(getConfig());
}

std::string GemmConfigAttr::kernelName() const {
  return gemmKernelName(getConfig());
}

//===----------------------------------------------------------------------===//
// Assembly format: `<` key = value, ... `>`, keys in any order; a, b,
// epilogue and problem are required, the others default as in GemmConfig.
//===----------------------------------------------------------------------===//

namespace {
enum class Key {
  A,
  B,
  Gathered,
  Epilogue,
  StoreA,
  WithRouterWeight,
  WithDs,
  Accumulate,
  Problem,
  Tile,
  Stages,
  WarpSpecialized,
  Registers,
  Schedule,
  IdleSkip,
  GroupM,
  RowsTma,
  Store,
  DactUnroll,
  Activation,
  Bias,
  Count
};

constexpr StringLiteral kKeyNames[] = {
    "a",           "b",          "gathered",
    "epilogue",    "store_a",    "with_router_weight",
    "with_ds",     "accumulate", "problem",
    "tile",        "stages",     "warp_specialized",
    "registers",   "schedule",   "idle_skip",
    "group_m",     "rows_tma",   "store",
    "dact_unroll", "activation", "bias",
};
static_assert(std::size(kKeyNames) == static_cast<size_t>(Key::Count),
              "one name a key");
} // namespace

template <typename EnumT>
static ParseResult parseEnumValue(AsmParser &parser, EnumT &value) {
  FailureOr<EnumT> parsed = FieldParser<EnumT>::parse(parser);
  if (failed(parsed))
    return failure();
  value = *parsed;
  return success();
}

template <typename T>
static ParseResult parseOptionalValue(AsmParser &parser,
                                      std::optional<T> &value) {
  T parsed;
  if constexpr (std::is_enum_v<T>) {
    if (parseEnumValue(parser, parsed))
      return failure();
  } else {
    if (parser.parseInteger(parsed))
      return failure();
  }
  value = parsed;
  return success();
}

static ParseResult parseBool(AsmParser &parser, bool &value) {
  SMLoc loc = parser.getCurrentLocation();
  StringRef keyword;
  if (failed(parser.parseOptionalKeyword(&keyword, {"true", "false"})))
    return parser.emitError(loc, "expected 'true' or 'false'");
  value = keyword == "true";
  return success();
}

static ParseResult parseOptionalBool(AsmParser &parser,
                                     std::optional<bool> &value) {
  bool parsed;
  if (parseBool(parser, parsed))
    return failure();
  value = parsed;
  return success();
}

/// `[v0, v1, ...]` with exactly values.size() integers.
static ParseResult parseIntegerList(AsmParser &parser,
                                    ArrayRef<int64_t *> values) {
  if (parser.parseLSquare())
    return failure();
  for (auto [i, value] : llvm::enumerate(values))
    if ((i && parser.parseComma()) || parser.parseInteger(*value))
      return failure();
  return parser.parseRSquare();
}

Attribute GemmConfigAttr::parse(AsmParser &parser, Type) {
  SMLoc loc = parser.getCurrentLocation();
  GemmConfig c;
  std::bitset<static_cast<size_t>(Key::Count)> seen;

  auto parseParameter = [&]() -> ParseResult {
    SMLoc keyLoc = parser.getCurrentLocation();
    StringRef name;
    if (parser.parseKeyword(&name))
      return failure();
    const auto *it = llvm::find(kKeyNames, name);
    if (it == std::end(kKeyNames))
      return parser.emitError(keyLoc)
             << "unknown #moe_gpu.gemm parameter '" << name << "'";
    auto key = static_cast<Key>(it - std::begin(kKeyNames));
    if (seen.test(static_cast<size_t>(key)))
      return parser.emitError(keyLoc)
             << "#moe_gpu.gemm parameter '" << name << "' given twice";
    seen.set(static_cast<size_t>(key));
    if (parser.parseEqual())
      return failure();
    switch (key) {
    case Key::A:
      return parseEnumValue(parser, c.a);
    case Key::B:
      return parseEnumValue(parser, c.b);
    case Key::Gathered:
      return parseEnumValue(parser, c.gathered);
    case Key::Epilogue:
      return parseEnumValue(parser, c.epilogue);
    case Key::StoreA:
      return parseBool(parser, c.storeA);
    case Key::WithRouterWeight:
      return parseBool(parser, c.withRouterWeight);
    case Key::WithDs:
      return parseBool(parser, c.withDs);
    case Key::Accumulate:
      return parseBool(parser, c.accumulate);
    case Key::Problem:
      return parseEnumValue(parser, c.problem);
    case Key::Tile:
      return parseIntegerList(parser, {&c.tileM, &c.tileN, &c.tileK});
    case Key::Stages:
      return parseOptionalValue(parser, c.stages);
    case Key::WarpSpecialized:
      return parseOptionalBool(parser, c.warpSpecialized);
    case Key::Registers:
      return parseIntegerList(parser,
                              {&c.producerRegisters, &c.consumerRegisters});
    case Key::Schedule:
      return parseEnumValue(parser, c.schedule);
    case Key::IdleSkip:
      return parseOptionalBool(parser, c.idleSkip);
    case Key::GroupM:
      return parser.parseInteger(c.groupM);
    case Key::RowsTma:
      return parseOptionalBool(parser, c.rowsTma);
    case Key::Store:
      return parseOptionalValue(parser, c.store);
    case Key::DactUnroll:
      return parser.parseInteger(c.dactUnroll);
    case Key::Activation:
      return parseEnumValue(parser, c.activation);
    case Key::Bias:
      return parseBool(parser, c.bias);
    case Key::Count:
      break;
    }
    llvm_unreachable("a key for every name");
  };

  if (parser.parseLess() || parser.parseCommaSeparatedList(parseParameter) ||
      parser.parseGreater())
    return {};
  for (Key key : {Key::A, Key::B, Key::Epilogue, Key::Problem}) {
    if (!seen.test(static_cast<size_t>(key))) {
      parser.emitError(loc) << "#moe_gpu.gemm needs parameter '"
                            << kKeyNames[static_cast<size_t>(key)] << "'";
      return {};
    }
  }
  return parser.getChecked<GemmConfigAttr>(loc, parser.getContext(), c);
}

void GemmConfigAttr::print(AsmPrinter &printer) const {
  GemmConfig c = getConfig();
  GemmConfig d = c.defaults();
  raw_ostream &os = printer.getStream();
  auto flag = [&](StringRef key, bool value, bool byDefault) {
    if (value != byDefault)
      os << ", " << key << " = " << (value ? "true" : "false");
  };
  auto integer = [&](StringRef key, int64_t value, int64_t byDefault) {
    if (value != byDefault)
      os << ", " << key << " = " << value;
  };
  os << "<a = " << stringifyEnum(c.a) << ", b = " << stringifyEnum(c.b);
  if (c.gathered != d.gathered)
    os << ", gathered = " << stringifyEnum(c.gathered);
  os << ", epilogue = " << stringifyEnum(c.epilogue);
  flag("store_a", c.storeA, d.storeA);
  flag("with_router_weight", c.withRouterWeight, d.withRouterWeight);
  flag("with_ds", c.withDs, d.withDs);
  flag("accumulate", c.accumulate, d.accumulate);
  os << ", problem = " << stringifyEnum(c.problem);
  if (c.tileM != d.tileM || c.tileN != d.tileN || c.tileK != d.tileK)
    os << ", tile = [" << c.tileM << ", " << c.tileN << ", " << c.tileK << "]";
  integer("stages", *c.stages, *d.stages);
  flag("warp_specialized", *c.warpSpecialized, *d.warpSpecialized);
  if (c.producerRegisters != d.producerRegisters ||
      c.consumerRegisters != d.consumerRegisters)
    os << ", registers = [" << c.producerRegisters << ", "
       << c.consumerRegisters << "]";
  if (c.schedule != d.schedule)
    os << ", schedule = " << stringifyEnum(c.schedule);
  flag("idle_skip", *c.idleSkip, *d.idleSkip);
  integer("group_m", c.groupM, d.groupM);
  flag("rows_tma", *c.rowsTma, *d.rowsTma);
  if (*c.store != *d.store)
    os << ", store = " << stringifyEnum(*c.store);
  integer("dact_unroll", c.dactUnroll, d.dactUnroll);
  if (c.activation != d.activation)
    os << ", activation = " << stringifyEnum(c.activation);
  if (c.bias)
    os << ", bias = true";
  os << ">";
}

//===----------------------------------------------------------------------===//
// The default library
//===----------------------------------------------------------------------===//

GemmConfig mlir::moe_gpu::libraryGemmConfig(LibraryGemm gemm) {
  auto kind = [](AOperand a, BOperand b, GemmEpilogue epilogue,
                 GemmProblem problem = GemmProblem::VarlenM) {
    GemmConfig c;
    c.a = a;
    c.b = b;
    c.epilogue = epilogue;
    c.problem = problem;
    return c;
  };
  using A = AOperand;
  using B = BOperand;
  using E = GemmEpilogue;
  auto up = [&](AOperand a, bool storeA) {
    GemmConfig c = kind(a, B::WMnSwiglu, E::Swiglu);
    c.storeA = storeA;
    return c;
  };
  auto dact = [&](AOperand a, bool routed) {
    GemmConfig c = kind(a, B::WK, E::Dswiglu);
    c.withRouterWeight = routed;
    c.withDs = routed;
    return c;
  };
  auto wgrad = [&](GatheredOperand gathered) {
    GemmConfig c = kind(A::Mn, B::RowsMn, E::StoreBf16W, GemmProblem::VarlenK);
    c.gathered = gathered;
    return c;
  };
  switch (gemm) {
  case LibraryGemm::UpGather:
    return up(A::Gather, /*storeA=*/true);
  case LibraryGemm::UpRows:
    return up(A::Rows, /*storeA=*/true);
  case LibraryGemm::UpGatherH:
    return up(A::Gather, /*storeA=*/false);
  case LibraryGemm::UpRowsH:
    return up(A::Rows, /*storeA=*/false);
  case LibraryGemm::RowsMnBf16:
    return kind(A::Rows, B::WMn, E::StoreBf16);
  case LibraryGemm::RowsMnF32:
    return kind(A::Rows, B::WMn, E::StoreF32);
  case LibraryGemm::RowsKBf16:
    return kind(A::Rows, B::WK, E::StoreBf16);
  case LibraryGemm::DactGather:
    return dact(A::Gather, /*routed=*/true);
  case LibraryGemm::DactRows:
    return dact(A::Rows, /*routed=*/false);
  case LibraryGemm::WgradGather:
    return wgrad(GatheredOperand::B);
  case LibraryGemm::WgradGatherA:
    return wgrad(GatheredOperand::A);
  case LibraryGemm::WgradRows:
    return wgrad(GatheredOperand::None);
  case LibraryGemm::RowsKBf16Acc: {
    GemmConfig c = kind(A::Rows, B::WK, E::StoreBf16);
    c.accumulate = true;
    return c;
  }
  }
  llvm_unreachable("unknown library GEMM");
}

SmallVector<GemmConfigAttr>
mlir::moe_gpu::defaultGemmConfigs(MLIRContext *context) {
  SmallVector<GemmConfigAttr> attrs;
  for (unsigned index = 0; index < kNumLibraryGemms; ++index)
    attrs.push_back(GemmConfigAttr::get(
        context, libraryGemmConfig(static_cast<LibraryGemm>(index))));
  return attrs;
}

void MoEGPUDialect::registerAttributes() {
  addAttributes<
#define GET_ATTRDEF_LIST
#include "moe/Dialect/MoEGPU/IR/MoEGPUAttributes.cpp.inc"
      >();
}
