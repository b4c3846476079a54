//===- MoEGPUAttributes.h - moe_gpu attributes and enums ----*- C++ -*-===//
//
// #moe_gpu.gemm, the configuration of one grouped GEMM kernel, and what is
// derived from it: threads, launch shared memory, the kernel's name.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_DIALECT_MOEGPU_IR_MOEGPUATTRIBUTES_H
#define MOE_DIALECT_MOEGPU_IR_MOEGPUATTRIBUTES_H

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/Support/LLVM.h"
#include "llvm/ADT/SmallVector.h"

#include <cstdint>
#include <optional>
#include <string>

#include "moe/Dialect/MoEGPU/IR/MoEGPUEnums.h.inc"

namespace mlir::moe_gpu {

/// Constants of the kernels.
/// The two consumer warpgroups that run the wgmma.
constexpr int64_t kConsumerThreads = 256;
/// The producer warpgroup of a warp-specialized kernel.
constexpr int64_t kProducerThreads = 128;
/// Dynamic shared memory a CTA may ask for on sm_90a.
constexpr int64_t kMaxSharedMemoryBytes = 227 * 1024;
/// 32-bit registers of an SM, shared by the threads of the one CTA it holds.
constexpr int64_t kRegistersPerSM = 65536;
/// The only tile the kernel code builds today.
constexpr int64_t kTileM = 128, kTileN = 256, kTileK = 64;

/// The parameters of a #moe_gpu.gemm. A parameter left unset takes its
/// default given the others (resolved()); GemmConfigAttr stores
/// every one set.
struct GemmConfig {
  // What the kernel computes.
  AOperand a = AOperand::Rows;
  BOperand b = BOperand::WMn;
  GatheredOperand gathered = GatheredOperand::None;
  GemmEpilogue epilogue = GemmEpilogue::StoreBf16;
  bool storeA = false;
  bool withRouterWeight = false;
  bool withDs = false;
  bool accumulate = false;
  GemmProblem problem = GemmProblem::VarlenM;
  // How it is built.
  int64_t tileM = kTileM, tileN = kTileN, tileK = kTileK;
  std::optional<int64_t> stages;
  std::optional<bool> warpSpecialized;
  int64_t producerRegisters = 72, consumerRegisters = 216;
  TileSchedule schedule = TileSchedule::Static;
  std::optional<bool> idleSkip;
  int64_t groupM = 16;
  std::optional<bool> rowsTma;
  std::optional<StorePath> store;
  int64_t dactUnroll = 4;
  /// The swiglu and dswiglu epilogues' function; swiglu is the gated one.
  GemmActivation activation = GemmActivation::Swiglu;
  /// The epilogue adds a per-expert bias row to the accumulator (the expert
  /// biases: b_gate_up in the up GEMM, b_down in the down GEMM).
  bool bias = false;

  /// This config with every unset parameter at its default.
  GemmConfig resolved() const;
  /// Every parameter that has a default at its default given this config's
  /// others (a, b, epilogue and problem kept): what the printer and kernel
  /// names leave out.
  GemmConfig defaults() const;

  bool operator==(const GemmConfig &other) const;
  bool operator!=(const GemmConfig &other) const { return !(*this == other); }
};

/// Whether `config` runs the gated activation (SwiGLU): H holds gate and up.
inline bool isGatedActivation(const GemmConfig &config) {
  return config.activation == GemmActivation::Swiglu;
}

/// The bf16 epilogues run persistent kernels: CTAs walk the tiles.
bool isPersistentEpilogue(GemmEpilogue epilogue);
/// The expert weights come by TMA boxes.
bool isTmaOperand(BOperand b);
/// Whether a kernel of `config` can add its tile to what C holds
/// (accumulate): a store_bf16 epilogue stored by TMA boxes.
bool canAccumulate(const GemmConfig &config);

/// Checks the rules of the kernel code; reports the first broken one.
LogicalResult verifyGemmConfig(const GemmConfig &config,
                               function_ref<InFlightDiagnostic()> emitError);
/// Threads a CTA.
int64_t gemmThreads(const GemmConfig &config);
/// Registers a thread gets at launch: 65536 / threads in steps of 8.
int64_t gemmLaunchRegisters(const GemmConfig &config);
/// The dynamic shared memory a CTA is launched with: the ring, C's staging,
/// the experts' tile counts, the mbarriers and 1 KiB for alignment.
int64_t gemmLaunchSharedMemoryBytes(const GemmConfig &config);
/// The kernel's name: the name of its kind (moe_gemm_up_gather,
/// ...), then a suffix for each parameter that differs from its default
/// (_s4, _nows, _dyn, _u8, ...), so that different configs of valid kernels
/// get different names.
std::string gemmKernelName(const GemmConfig &config);

} // namespace mlir::moe_gpu

#define GET_ATTRDEF_CLASSES
#include "moe/Dialect/MoEGPU/IR/MoEGPUAttributes.h.inc"

namespace mlir::moe_gpu {

/// The GEMMs of the default library, in its order: what the op roles
/// (gemmRolesOf) and the host functions' roles name.
enum class LibraryGemm : unsigned {
  UpGather,     // x gathered by the dispatch queue, SwiGLU, a and h stored
  UpRows,       // the shared expert's: x's rows
  UpGatherH,    // UpGather storing h only (h recomputed)
  UpRowsH,      // UpRows storing h only
  RowsMnBf16,   // the down projection
  RowsMnF32,    // the router's logits
  RowsKBf16,    // dX = dA W^T
  DactGather,   // dA by dSwiGLU with the routing weight and dS
  DactRows,     // the shared expert's dA
  WgradGather,  // dW_down: B gathered by the queue
  WgradGatherA, // dW_gate_up: A gathered by the queue
  WgradRows,    // the weight gradients of plain rows
  RowsKBf16Acc, // RowsKBf16 adding to C (the accumulating router gradient)
};
constexpr unsigned kNumLibraryGemms =
    static_cast<unsigned>(LibraryGemm::RowsKBf16Acc) + 1;

/// The config of the library's GEMM `gemm` (the defaults for the rest).
GemmConfig libraryGemmConfig(LibraryGemm gemm);

/// The GEMMs of the default library, in the library's order; the
/// last is moe_gemm_rows_k_bf16_acc (getAccumulate()), the accumulating dX.
SmallVector<GemmConfigAttr> defaultGemmConfigs(MLIRContext *context);

} // namespace mlir::moe_gpu

#endif // MOE_DIALECT_MOEGPU_IR_MOEGPUATTRIBUTES_H
