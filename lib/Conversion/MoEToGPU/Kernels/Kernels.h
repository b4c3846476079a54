//===- Kernels.h - the kernel builders, one a kernel ---------*- C++ -*-===//
//
// Internal to the kernel builder (KernelBuilder.h). Each builder makes one
// gpu.func at the builder's insertion point, its ops in a fixed order: the
// library's text is pinned (HopperDescriptors.h).
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_KERNELS_KERNELS_H
#define MOE_LIB_CONVERSION_MOETOGPU_KERNELS_KERNELS_H

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"

#include <functional>

namespace mlir::moe_gpu {
struct GemmConfig;
} // namespace mlir::moe_gpu

namespace mlir::moe::kernels {

/// Threads a block of the non-GEMM kernels.
constexpr int64_t kSimpleThreads = 128;

/// A kernel `name` with `argTypes` and known_block_size = [threads, 1, 1];
/// the builder's insertion point moves into its entry block.
gpu::GPUFuncOp createKernel(OpBuilder &b, Location loc, StringRef name,
                            TypeRange argTypes,
                            int64_t threads = kSimpleThreads);

/// memref<?xT>: the kernels' flat buffers.
MemRefType flatBuffer(Type element);

/// `%gid = block_id x * 128 + thread_id x`, the prelude of the non-GEMM
/// kernels, in the order thread id, block id, the constant 128, multiply,
/// add.
Value buildGlobalThreadId(OpBuilder &b, Location loc);

/// arith.constant of an index / i32 / f32 at the insertion point.
Value indexConstant(OpBuilder &b, Location loc, int64_t value);
Value i32Constant(OpBuilder &b, Location loc, int32_t value);
Value f32Constant(OpBuilder &b, Location loc, float value);

// One builder a kernel (Kernels/*.cpp).
void buildAddKernel(OpBuilder &b, Location loc);
// SelectionBias.cpp
void buildSelectionBiasCountKernel(OpBuilder &b, Location loc);
void buildSelectionBiasUpdateKernel(OpBuilder &b, Location loc);
void buildRouterScoresKernel(OpBuilder &b, Location loc);
void buildRouterSelectKernel(OpBuilder &b, Location loc);
void buildRouterSelectCountsKernel(OpBuilder &b, Location loc);
void buildRouterGradLogitsKernel(OpBuilder &b, Location loc);
// Dispatch.cpp
void buildDispatchRankKernel(OpBuilder &b, Location loc);
void buildDispatchScanKernel(OpBuilder &b, Location loc);
void buildDispatchPlaceKernel(OpBuilder &b, Location loc);
void buildDispatchScanCapacityKernel(OpBuilder &b, Location loc);
void buildDispatchPlaceCapacityKernel(OpBuilder &b, Location loc);
void buildSingleOffsetsKernel(OpBuilder &b, Location loc);
void buildSplitOffsetsKernel(OpBuilder &b, Location loc);
// Combine.cpp
void buildGatherSumKernel(OpBuilder &b, Location loc);
void buildGatherSumAccKernel(OpBuilder &b, Location loc);
void buildScatterWeightsKernel(OpBuilder &b, Location loc);
void buildSumSplitsBf16Kernel(OpBuilder &b, Location loc);
void buildSumSplitsF32Kernel(OpBuilder &b, Location loc);
void buildDWeightsKernel(OpBuilder &b, Location loc);
void buildRepackBf16Kernel(OpBuilder &b, Location loc);
void buildRepackF32Kernel(OpBuilder &b, Location loc);
// ExpertParallel.cpp
void buildGatherRowsKernel(OpBuilder &b, Location loc);
void buildInvertRowsKernel(OpBuilder &b, Location loc);
void buildEPPackRowsKernel(OpBuilder &b, Location loc);
void buildEPUnpackRowsKernel(OpBuilder &b, Location loc);
void buildEPUnpackSumKernel(OpBuilder &b, Location loc);
void buildEPQueuePlanKernel(OpBuilder &b, Location loc);
void buildEPQueueFillKernel(OpBuilder &b, Location loc);
// SplitBackward.cpp
void buildScaleRowsKernel(OpBuilder &b, Location loc);
void buildRowDotsKernel(OpBuilder &b, Location loc);
void buildLinkRowsKernel(OpBuilder &b, Location loc);
void buildTokenSumKernel(OpBuilder &b, Location loc);
// AuxLoss.cpp
void buildAuxCountsKernel(OpBuilder &b, Location loc);
void buildAuxPartialsKernel(OpBuilder &b, Location loc);
void buildAuxColumnsKernel(OpBuilder &b, Location loc);
void buildAuxFinishKernel(OpBuilder &b, Location loc);
void buildAuxLossGradKernel(OpBuilder &b, Location loc);
void buildRouterScoresAuxKernel(OpBuilder &b, Location loc);
void buildRouterGradLogitsAuxKernel(OpBuilder &b, Location loc);
// ExpertBias.cpp
void buildSegmentColumnSumKernel(OpBuilder &b, Location loc);
void buildBiasDWeightsKernel(OpBuilder &b, Location loc);

/// What moe_router_grad_logits_aux's warp knows of its token for the
/// auxiliary losses' d_logits: the logits, the selection counts, the
/// gradients of the losses (0-d), the sizes and scoring, the token's first
/// logit, the lane, and the softmax's max and sum over the token.
struct AuxGradInputs {
  Value logits, counts, dLoadBalance, dZLoss, numTokens, numExperts, numSlots,
      scoring, base, lane, max, sum;
};
/// Emits the token's part of moe_aux_loss_grad (its ops: the same bits) and
/// returns what emits d_logits[e] from expert e and its logit l.
std::function<Value(Value, Value)> buildAuxGradTerm(OpBuilder &b, Location loc,
                                                    const AuxGradInputs &in);
// Gemm.cpp, GemmWarpSpecialized.cpp, GemmEpilogue.cpp
/// The grouped GEMM of `config`, named gemmKernelName(config).
void buildGemmKernel(OpBuilder &b, Location loc,
                     const moe_gpu::GemmConfig &config);
/// The library's default GEMM `index` (defaultGemmConfigs' order).
void buildDefaultGemmKernel(OpBuilder &b, Location loc, unsigned index);
template <unsigned Index>
void buildDefaultGemm(OpBuilder &b, Location loc) {
  buildDefaultGemmKernel(b, loc, Index);
}

} // namespace mlir::moe::kernels

#endif // MOE_LIB_CONVERSION_MOETOGPU_KERNELS_KERNELS_H
