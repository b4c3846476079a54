//===- KernelBuilder.cpp - the GPU library's kernels, built in C++ --------===//

#include "moe/Conversion/MoEToGPU/KernelBuilder.h"
#include "Kernels.h"

#include "moe/Dialect/MoEGPU/Transforms/KernelRoles.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace mlir::moe;

namespace {

using KernelBuildFn = void (*)(OpBuilder &, Location);

struct KernelEntry {
  StringLiteral name;
  KernelBuildFn build;
};

/// The ported kernels, in the library's order.
constexpr KernelEntry kKernels[] = {
    {"moe_gemm_up_gather", kernels::buildDefaultGemm<0>},
    {"moe_gemm_up_rows", kernels::buildDefaultGemm<1>},
    {"moe_gemm_up_gather_h", kernels::buildDefaultGemm<2>},
    {"moe_gemm_up_rows_h", kernels::buildDefaultGemm<3>},
    {"moe_gemm_rows_mn_bf16", kernels::buildDefaultGemm<4>},
    {"moe_gemm_rows_mn_f32", kernels::buildDefaultGemm<5>},
    {"moe_gemm_rows_k_bf16", kernels::buildDefaultGemm<6>},
    {"moe_gemm_dact_gather", kernels::buildDefaultGemm<7>},
    {"moe_gemm_dact_rows", kernels::buildDefaultGemm<8>},
    {"moe_gemm_wgrad_gather", kernels::buildDefaultGemm<9>},
    {"moe_gemm_wgrad_gather_a", kernels::buildDefaultGemm<10>},
    {"moe_gemm_wgrad_rows", kernels::buildDefaultGemm<11>},
    {"moe_gemm_rows_k_bf16_acc", kernels::buildDefaultGemm<12>},
    {"moe_router_scores", kernels::buildRouterScoresKernel},
    {"moe_router_select", kernels::buildRouterSelectKernel},
    {"moe_dispatch_rank", kernels::buildDispatchRankKernel},
    {"moe_dispatch_scan", kernels::buildDispatchScanKernel},
    {"moe_dispatch_place", kernels::buildDispatchPlaceKernel},
    {"moe_gather_sum", kernels::buildGatherSumKernel},
    {"moe_gather_sum_acc", kernels::buildGatherSumAccKernel},
    {"moe_scatter_weights", kernels::buildScatterWeightsKernel},
    {"moe_single_offsets", kernels::buildSingleOffsetsKernel},
    {"moe_split_offsets", kernels::buildSplitOffsetsKernel},
    {"moe_sum_splits_bf16", kernels::buildSumSplitsBf16Kernel},
    {"moe_dweights", kernels::buildDWeightsKernel},
    {"moe_router_grad_logits", kernels::buildRouterGradLogitsKernel},
    {"moe_repack_bf16", kernels::buildRepackBf16Kernel},
    {"moe_repack_f32", kernels::buildRepackF32Kernel},
    {"moe_add", kernels::buildAddKernel},
    {"moe_selection_bias_count", kernels::buildSelectionBiasCountKernel},
    {"moe_selection_bias_update", kernels::buildSelectionBiasUpdateKernel},
    {"moe_gather_rows", kernels::buildGatherRowsKernel},
    {"moe_invert_rows", kernels::buildInvertRowsKernel},
    {"moe_ep_pack_rows", kernels::buildEPPackRowsKernel},
    {"moe_ep_unpack_rows", kernels::buildEPUnpackRowsKernel},
    {"moe_ep_unpack_sum", kernels::buildEPUnpackSumKernel},
    {"moe_ep_queue_plan", kernels::buildEPQueuePlanKernel},
    {"moe_ep_queue_fill", kernels::buildEPQueueFillKernel},
    {"moe_scale_rows", kernels::buildScaleRowsKernel},
    {"moe_row_dots", kernels::buildRowDotsKernel},
    {"moe_link_rows", kernels::buildLinkRowsKernel},
    {"moe_token_sum", kernels::buildTokenSumKernel},
    {"moe_aux_counts", kernels::buildAuxCountsKernel},
    {"moe_aux_partials", kernels::buildAuxPartialsKernel},
    {"moe_aux_columns", kernels::buildAuxColumnsKernel},
    {"moe_aux_finish", kernels::buildAuxFinishKernel},
    {"moe_aux_loss_grad", kernels::buildAuxLossGradKernel},
    {"moe_dispatch_scan_capacity", kernels::buildDispatchScanCapacityKernel},
    {"moe_dispatch_place_capacity", kernels::buildDispatchPlaceCapacityKernel},
    {"moe_router_scores_aux", kernels::buildRouterScoresAuxKernel},
    {"moe_router_select_counts", kernels::buildRouterSelectCountsKernel},
    {"moe_router_grad_logits_aux", kernels::buildRouterGradLogitsAuxKernel},
    {"moe_segment_colsum", kernels::buildSegmentColumnSumKernel},
    {"moe_sum_splits_f32", kernels::buildSumSplitsF32Kernel},
    {"moe_bias_dweights", kernels::buildBiasDWeightsKernel},
};

} // namespace

gpu::GPUFuncOp kernels::createKernel(OpBuilder &b, Location loc, StringRef name,
                                     TypeRange argTypes, int64_t threads) {
  auto kernel =
      gpu::GPUFuncOp::create(b, loc, name, b.getFunctionType(argTypes, {}));
  kernel->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
  kernel.setKnownBlockSizeAttr(
      b.getDenseI32ArrayAttr({static_cast<int32_t>(threads), 1, 1}));
  b.setInsertionPointToStart(&kernel.getBody().front());
  return kernel;
}

MemRefType kernels::flatBuffer(Type element) {
  return MemRefType::get({ShapedType::kDynamic}, element);
}

Value kernels::indexConstant(OpBuilder &b, Location loc, int64_t value) {
  return arith::ConstantIndexOp::create(b, loc, value);
}

Value kernels::i32Constant(OpBuilder &b, Location loc, int32_t value) {
  return arith::ConstantIntOp::create(b, loc, b.getI32Type(), value);
}

Value kernels::f32Constant(OpBuilder &b, Location loc, float value) {
  return arith::ConstantFloatOp::create(b, loc, b.getF32Type(),
                                        llvm::APFloat(value));
}

Value kernels::buildGlobalThreadId(OpBuilder &b, Location loc) {
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
  Value threads = indexConstant(b, loc, kSimpleThreads);
  Value first = arith::MulIOp::create(b, loc, bid, threads);
  return arith::AddIOp::create(b, loc, first, tid);
}

FailureOr<gpu::GPUFuncOp> mlir::moe::buildLibraryKernel(gpu::GPUModuleOp module,
                                                        StringRef name) {
  for (const KernelEntry &entry : kKernels) {
    if (entry.name != name)
      continue;
    OpBuilder b(module.getContext());
    b.setInsertionPoint(module.getBody(), module.getBody()->end());
    Location loc = module.getLoc();
    entry.build(b, loc);
    auto kernel = module.lookupSymbol<gpu::GPUFuncOp>(name);
    if (!kernel)
      return module.emitError("the kernel builder of @")
             << name << " made no kernel of that name";
    return kernel;
  }
  return module.emitError("the kernel builder has no kernel @") << name;
}

SmallVector<StringRef> mlir::moe::builtLibraryKernelNames() {
  SmallVector<StringRef> names;
  for (const KernelEntry &entry : kKernels)
    names.push_back(entry.name);
  return names;
}

OwningOpRef<ModuleOp> mlir::moe::buildGPULibrary(MLIRContext *context,
                                                 int64_t numSMs) {
  OpBuilder b(context);
  Location loc = UnknownLoc::get(context);
  OwningOpRef<ModuleOp> library = ModuleOp::create(loc);
  (*library)->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                      b.getUnitAttr());
  if (numSMs > 0)
    (*library)->setAttr(moe_gpu::kNumSMsAttrName, b.getI64IntegerAttr(numSMs));
  b.setInsertionPointToEnd(library->getBody());
  auto kernels = gpu::GPUModuleOp::create(b, loc, "moe_kernels");
  for (StringRef name : builtLibraryKernelNames())
    if (failed(buildLibraryKernel(kernels, name)))
      return nullptr;
  if (failed(buildLibraryDeviceFunctions(kernels)))
    return nullptr;
  for (StringRef name : libraryHostFunctionNames())
    if (failed(buildLibraryHostFunction(*library, name)))
      return nullptr;
  return library;
}
