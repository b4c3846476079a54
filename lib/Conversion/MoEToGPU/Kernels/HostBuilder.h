//===- HostBuilder.h - the library's host functions ----------*- C++ -*-===//
//
// Internal to the kernel builder. HostFunctionBuilder builds one host
// function of the GPU library (func.func @__moe_gpu_*: the launches of one
// MoE op on one async token, docs/gpu-path.md §1).
//
// The order of ops and of constant requests is fixed, since the library's
// text is pinned (HopperDescriptors.h), and C++ does not order the evaluation
// of a call's arguments: every value that emits an op or requests a constant
// is computed in a statement of its own before the call that uses it.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_KERNELS_HOSTBUILDER_H
#define MOE_LIB_CONVERSION_MOETOGPU_KERNELS_HOSTBUILDER_H

#include "Emitter.h"
#include "GemmKernelBuilder.h"
#include "Kernels.h"

#include "moe/Conversion/MoEToGPU/HopperDescriptors.h"
#include "moe/Dialect/MoEGPU/Transforms/KernelRoles.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringMap.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mlir::moe::host {

/// The gpu.module whose kernels the host functions launch.
constexpr StringLiteral kKernelModuleName = "moe_kernels";
/// libmoe_runtime's tensor map of a bf16 matrix, cached by its arguments
/// (runtime/include/moe/Runtime/Runtime.h).
constexpr StringLiteral kTensorMapFunctionName = "moeTensorMapDeviceBf16";
/// Threads a block of the non-GEMM kernels.
constexpr int64_t kThreads = kernels::kSimpleThreads;
/// Tokens a block of the kernels that run a warp a token.
constexpr int64_t kTokenWarps = kThreads / 32;
/// Routing slots a block of moe_dispatch_rank.
constexpr int64_t kDispatchChunk = 1024;
/// The router's weight gradient splits its tokens into slices of at least
/// this many.
constexpr int64_t kRouterSplitTokens = 1024;
/// The persistent GEMMs' grid where the module does not say
/// (moe_gpu.num_sms): one CTA an SM of an H100 SXM or H200. Any count is
/// correct; the GPU's own is the fastest.
constexpr int64_t kDefaultNumCtas = 132;
/// Words of a buffer of tile counters of the dynamically scheduled GEMMs: one
/// a launch.
constexpr int64_t kCounterWords = 8;

/// memref<?x...xelement> of `rank` dynamic dimensions: the host functions'
/// arguments and buffers.
MemRefType buffer(Type element, int64_t rank = 1);

/// The GEMMs the host functions launch: the library's default configs.
using moe_gpu::LibraryGemm;

/// What a launch of the library's GEMM `gemm` needs to know of it.
const kernels::GemmTraits &libraryGemm(LibraryGemm gemm);

/// The GEMMs one host function launches, by role: the library's, except
/// where a variant of the function chooses another config for a role.
class HostGemms {
public:
  HostGemms() = default;
  /// The configs `chosen` by role (resolved, not accumulating); `suffix` is
  /// what the variant's name adds to the function's.
  HostGemms(ArrayRef<std::pair<StringRef, moe_gpu::GemmConfig>> chosen,
            std::string suffix);

  /// The GEMM of `role`: its chosen config's, else the library's `library`.
  const kernels::GemmTraits &get(StringRef role, LibraryGemm library) const;
  /// The accumulating form of the GEMM of `role` (its chosen config's, which
  /// must be able to accumulate, else the library's `library`).
  const kernels::GemmTraits &getAccumulating(StringRef role,
                                             LibraryGemm library) const;
  /// What the variant's name adds to the function's: empty for the
  /// library's configs.
  StringRef suffix() const { return nameSuffix; }

private:
  struct Chosen {
    std::string role;
    kernels::GemmTraits traits;
    /// The config with accumulate set, where it can accumulate.
    std::optional<kernels::GemmTraits> accumulating;
  };
  std::vector<Chosen> chosen;
  std::string nameSuffix;
};

/// The operands of a GEMM launch by the names of the kernel's arguments
/// (gemm_signature), null where not given; `rows` is no argument but the
/// token rows of a weight gradient, for the tensor maps of its row operands.
struct GemmValues {
  Value offsets, numExperts, ids, amat, lda, bids, amap, bmap, bmat, ldb,
      browmap, dimM, dimN, dimK, hout, aout, cout, ldc, cmap, hsaved, wrow, dh,
      wa, dspart, numNtiles, tileCounter, counterSlot, bias;
  Value rows;
};

/// Builds one host function.
class HostFunctionBuilder : public kernels::Emitter {
public:
  /// Starts func.func private @__moe_gpu_<name>(%token, args...) ->
  /// !gpu.async.token at `b`'s insertion point, an op of `module`; `b`'s
  /// insertion point moves into it.
  HostFunctionBuilder(OpBuilder &b, ModuleOp module, StringRef name,
                      ArrayRef<std::pair<StringRef, Type>> args);

  /// The argument `name`.
  Value arg(StringRef name) const;

  /// CTAs of a persistent GEMM's grid at most: the module's moe_gpu.num_sms,
  /// else kDefaultNumCtas.
  int64_t numCtas() const { return ctas; }

  /// Frees the tile counters and returns the token (Host.text).
  func::FuncOp finish();

  // Types.
  Type index() const { return b.getIndexType(); }
  Type i32() const { return b.getI32Type(); }
  Type bf16() const { return b.getBF16Type(); }

  //===--------------------------------------------------------------------===//
  // Host
  //===--------------------------------------------------------------------===//

  /// memref.dim `i` of `mem`.
  Value dim(Value mem, int64_t i);
  /// `mem` collapsed to one dimension (itself if it has one).
  Value flat(Value mem);
  /// ceil(a / b), as (a + b - 1) / b.
  Value ceil(Value a, int64_t b);
  /// max(v, 1): a launch needs at least one block; kernels bound-check.
  Value grid(Value v);
  /// The (M-tiles, N-tiles) of a varlen-M GEMM over `rows` rows in
  /// `problems` problems and `cols` columns: ceil(rows / tileM) + problems
  /// (each problem's last M-tile may be partial), and ceil(cols / tileN).
  std::pair<Value, Value> varlenTiles(Value rows, int64_t tileM, Value problems,
                                      Value cols, int64_t tileN);
  /// A memref<?xelement> of `size` elements, on the token.
  Value alloc(Value size, Type element);
  /// (buffer, word) of a zeroed tile counter for one launch of a dynamically
  /// scheduled GEMM.
  std::pair<Value, Value> tileCounter();
  void dealloc(Value buf);
  /// Fills `buf` with `value` (of its element type), on the token.
  void memset(Value buf, Value value);

  /// The tensor map of B = W for `g`'s TMA boxes.
  Value weightMap(const kernels::GemmTraits &g, const GemmValues &v);
  /// The tensor map of a weight gradient's C, [E][M][N] in 128x64 boxes.
  Value outMap(const GemmValues &v);
  /// The tensor map of a [rows, cols] bf16 matrix with rows `ld` elements
  /// apart, in boxes of 64 columns by `boxRows`; a null pointer when there
  /// are no rows (a map cannot have an empty dimension).
  Value rowsMap(Value mat, Value rows, Value cols, Value ld,
                int64_t boxRows = 64);
  /// moeTensorMapDeviceBf16 of `mat`: dims innermost first, strides in
  /// bytes. Declares the function in the module on first use.
  Value tensorMap(Value mat, ArrayRef<Value> dims, ArrayRef<Value> strides,
                  ArrayRef<int64_t> box);

  /// A GEMM launch over (M-tiles, N-tiles) x gz, which the kernel rasters
  /// itself; a persistent GEMM gets a CTA an SM (at most one a tile) and
  /// walks all tiles.
  void launchGemm(const kernels::GemmTraits &g, Value mtiles, Value ntiles,
                  Value gz, ValueRange args);
  /// gpu.launch_func of @moe_kernels::@<kernel> on the token.
  void launch(StringRef kernel, Value gx, Value gy, Value gz, ValueRange args,
              int64_t sharedMemoryBytes = 0, int64_t threads = kThreads);

private:
  /// The tensor map function's declaration, made before this function if
  /// the module has none.
  void declareTensorMap();

  ModuleOp module;
  int64_t ctas;
  func::FuncOp function;
  llvm::StringMap<Value> args;
  /// The async token the next op waits for.
  Value token;
  /// The tile counters' buffers, freed at the end; the words of the last
  /// one that are taken.
  SmallVector<Value> counters;
  int64_t counterWordsUsed = kCounterWords;
};

//===----------------------------------------------------------------------===//
// Helpers of several host functions
//===----------------------------------------------------------------------===//

/// The arguments of a launch of `g` in the kernel's order, with the tensor
/// maps and tile counter it takes made from `values` (gemm_args).
SmallVector<Value> gemmArgs(HostFunctionBuilder &h,
                            const kernels::GemmTraits &g, GemmValues values);

/// moe_repack_<bf16|f32>: `ncopy` of the `csrc` columns of `rows` rows of
/// src into the first columns of dst's rows of `cdst`, zero past them.
void repack(HostFunctionBuilder &h, Value src, Value dst, Value rows,
            Value csrc, Value cdst, Value ncopy);

/// [rows, cols] -> a new [rows, cols8] buffer, zero in the padding columns.
Value paddedCopy(HostFunctionBuilder &h, Value src, Value rows, Value cols,
                 Value cols8, Type element);

/// The offsets [0, T] of one problem of T rows, in a new buffer.
Value singleOffsets(HostFunctionBuilder &h, Value t);

/// v rounded up to a multiple of 8.
Value round8(HostFunctionBuilder &h, Value v);

// One builder a host function (HostFunctions.cpp, HostBackward.cpp); each
// builds at `b`'s insertion point in `module`.
// Those with GEMMs take `gemms` (a variant's configs).
// With `aux`, `__moe_gpu_router_aux`: the auxiliary losses too
// (routerAuxScoresAndSelect).
void buildRouterHost(OpBuilder &b, ModuleOp module, const HostGemms &gemms = {},
                     bool aux = false);
void buildDispatchHost(OpBuilder &b, ModuleOp module, bool capacity = false);
void buildExpertFfnHost(OpBuilder &b, ModuleOp module, bool withY,
                        const HostGemms &gemms = {});
void buildSharedExpertHost(OpBuilder &b, ModuleOp module, bool withY,
                           const HostGemms &gemms = {});
void buildCombineHost(OpBuilder &b, ModuleOp module, bool accumulate);
void buildAddHost(OpBuilder &b, ModuleOp module);
// SelectionBias.cpp
void buildUpdateSelectionBiasHost(OpBuilder &b, ModuleOp module);
void buildExpertCombineGradHost(OpBuilder &b, ModuleOp module, bool accumulate,
                                const HostGemms &gemms = {}, bool bias = false);
void buildSharedExpertGradHost(OpBuilder &b, ModuleOp module,
                               const HostGemms &gemms = {});
void buildExpertFfnGradHost(OpBuilder &b, ModuleOp module,
                            const HostGemms &gemms = {}, bool bias = false);
void buildCombineGradHost(OpBuilder &b, ModuleOp module);
// With `aux`, `__moe_gpu_router_grad_aux` (`_acc`): moe.aux_loss_grad's
// d_logits added in the router's d_logits pass.
void buildRouterGradHost(OpBuilder &b, ModuleOp module, bool accumulate,
                         const HostGemms &gemms = {}, bool aux = false);
// HostExpertParallel.cpp
void buildEPPackHost(OpBuilder &b, ModuleOp module, bool gather);
void buildEPUnpackHost(OpBuilder &b, ModuleOp module, bool reduce);
void buildEPQueuesHost(OpBuilder &b, ModuleOp module);
void buildGatherRowsHost(OpBuilder &b, ModuleOp module);
void buildScatterRowsHost(OpBuilder &b, ModuleOp module);
// HostAuxLoss.cpp
void buildAuxLossHost(OpBuilder &b, ModuleOp module);
void buildAuxLossGradHost(OpBuilder &b, ModuleOp module);
/// `__moe_gpu_router_aux`'s scores and selection from the logits `lf`
/// [T, E]: its kernels also write the auxiliary losses' partial sums and
/// selection counts, then the losses into `loadBalance` and `zLoss`.
/// A new buffer of the E experts' selection counts among the T * k slots of
/// `experts` (moe_aux_counts).
Value auxSelectionCounts(HostFunctionBuilder &h, Value experts, Value slots,
                         Value e);
void routerAuxScoresAndSelect(HostFunctionBuilder &h, Value lf, Value t,
                              Value e, Value k, Value wf, Value ef,
                              Value loadBalance, Value zLoss);

} // namespace mlir::moe::host

#endif // MOE_LIB_CONVERSION_MOETOGPU_KERNELS_HOSTBUILDER_H
