//===- KernelRoles.cpp - the GEMMs each moe op runs on the GPU ------------===//

#include "moe/Dialect/MoEGPU/Transforms/KernelRoles.h"

#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/IR/BuiltinTypes.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::moe_gpu;

namespace {

GemmConfig gemm(AOperand a, BOperand b, GemmEpilogue epilogue,
                GemmProblem problem = GemmProblem::VarlenM) {
  GemmConfig config;
  config.a = a;
  config.b = b;
  config.epilogue = epilogue;
  config.problem = problem;
  return config;
}

GemmConfig upProjection(AOperand a, bool storeA) {
  GemmConfig config =
      gemm(a, BOperand::WMnSwiglu, GemmEpilogue::Swiglu, GemmProblem::VarlenM);
  config.storeA = storeA;
  return config;
}

GemmConfig weightGradient(GatheredOperand gathered) {
  GemmConfig config = gemm(AOperand::Mn, BOperand::RowsMn,
                           GemmEpilogue::StoreBf16W, GemmProblem::VarlenK);
  config.gathered = gathered;
  return config;
}

// dX = dA W_gate_up^T, and the router's dx = dlogits W_r^T.
GemmConfig inputGradient() {
  return gemm(AOperand::Rows, BOperand::WK, GemmEpilogue::StoreBf16);
}

GemmConfig dSwiGLU(AOperand a, bool routed) {
  GemmConfig config = gemm(a, BOperand::WK, GemmEpilogue::Dswiglu);
  config.withRouterWeight = routed;
  config.withDs = routed;
  return config;
}

int64_t dimOf(Value value, unsigned dim) {
  auto type = dyn_cast<RankedTensorType>(value.getType());
  if (!type || type.getRank() <= dim || type.isDynamicDim(dim))
    return -1;
  return type.getDimSize(dim);
}

} // namespace

SmallVector<GemmRole> mlir::moe_gpu::gemmRolesOf(Operation *op) {
  using moe::ExpertCombineGradOp, moe::ExpertFFNOp, moe::RouterGradOp,
      moe::RouterOp, moe::SharedExpertGradOp, moe::SharedExpertOp;
  // The H-only host functions run when nothing reads y (H recomputed).
  auto readsY = [](Operation *ffn) { return !ffn->getResult(0).use_empty(); };
  return TypeSwitch<Operation *, SmallVector<GemmRole>>(op)
      .Case([](RouterOp) -> SmallVector<GemmRole> {
        return {{"logits",
                 gemm(AOperand::Rows, BOperand::WMn, GemmEpilogue::StoreF32)}};
      })
      .Case([](RouterGradOp) -> SmallVector<GemmRole> {
        return {{"dx", inputGradient()},
                {"dw", weightGradient(GatheredOperand::None)}};
      })
      .Case([&](ExpertFFNOp ffn) -> SmallVector<GemmRole> {
        return {{"up", upProjection(AOperand::Gather, readsY(ffn))},
                {"down",
                 gemm(AOperand::Rows, BOperand::WMn, GemmEpilogue::StoreBf16)}};
      })
      .Case([&](SharedExpertOp ffn) -> SmallVector<GemmRole> {
        return {{"up", upProjection(AOperand::Rows, readsY(ffn))},
                {"down",
                 gemm(AOperand::Rows, BOperand::WMn, GemmEpilogue::StoreBf16)}};
      })
      .Case([](ExpertCombineGradOp) -> SmallVector<GemmRole> {
        return {{"dact", dSwiGLU(AOperand::Gather, /*routed=*/true)},
                {"dx", inputGradient()},
                {"dw_down", weightGradient(GatheredOperand::B)},
                {"dw_gate_up", weightGradient(GatheredOperand::A)}};
      })
      .Case([](SharedExpertGradOp) -> SmallVector<GemmRole> {
        return {{"dact", dSwiGLU(AOperand::Rows, /*routed=*/false)},
                {"dx", inputGradient()},
                {"dw_down", weightGradient(GatheredOperand::None)},
                {"dw_gate_up", weightGradient(GatheredOperand::None)}};
      })
      .Default([](Operation *) { return SmallVector<GemmRole>(); });
}

GemmShape mlir::moe_gpu::gemmShapeOf(Operation *op) {
  GemmShape shape;
  if (op->getNumOperands() == 0)
    return shape;
  Value x = op->getOperand(0);
  shape.tokens = dimOf(x, 0);
  shape.hidden = dimOf(x, 1);
  TypeSwitch<Operation *>(op)
      .Case([&](moe::RouterOp router) {
        shape.experts = dimOf(router.getRouterWeight(), 1);
        shape.topK = dimOf(router.getExperts(), 1);
      })
      .Case([&](moe::RouterGradOp grad) {
        shape.experts = dimOf(grad.getRouterWeight(), 1);
        shape.topK = dimOf(grad.getExperts(), 1);
      })
      .Case<moe::ExpertFFNOp, moe::ExpertCombineGradOp>([&](auto ffn) {
        shape.experts = dimOf(ffn.getWDown(), 0);
        shape.expertWidth = dimOf(ffn.getWDown(), 1);
        int64_t rows = dimOf(ffn.getTokenIds(), 0);
        if (rows > 0 && shape.tokens > 0)
          shape.topK = rows / shape.tokens;
      })
      .Case<moe::SharedExpertOp, moe::SharedExpertGradOp>([&](auto ffn) {
        shape.experts = 1;
        shape.expertWidth = dimOf(ffn.getWDown(), 0);
        shape.topK = 1;
      });
  return shape;
}

std::optional<GemmConfig>
mlir::moe_gpu::selectGemmConfig(const GemmRole &role, const GemmShape &shape,
                                StringRef chip) {
  if (chip != "sm_90a")
    return std::nullopt;
  // The per-shape table: empty until its entries are measured against the
  // library's configs on the GPU (docs/gpu-kernels.md); every shape gets the
  // library's config meanwhile.
  (void)shape;
  return role.libraryConfig;
}
