//===- SelectKernels.cpp - moe-gpu-select-kernels -------------------------===//
//
// Chooses each moe op's GEMM kernel configs (KernelRoles.h) and records them in
// the IR, where a later pass, the conversion and the user see them.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoEGPU/Transforms/KernelRoles.h"
#include "moe/Dialect/MoEGPU/Transforms/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/ADT/STLExtras.h"

namespace mlir::moe_gpu {
#define GEN_PASS_DEF_MOEGPUSELECTKERNELS
#include "moe/Dialect/MoEGPU/Transforms/Passes.h.inc"
} // namespace mlir::moe_gpu

using namespace mlir;
using namespace mlir::moe_gpu;

namespace {

/// The op's configs: what it already holds, then a selection for each role it
/// lacks; failure (reported) for a role the op does not have or a value that is
/// not a #moe_gpu.gemm.
FailureOr<DictionaryAttr> selectKernels(Operation *op, ArrayRef<GemmRole> roles,
                                        StringRef chip, int64_t numSMs,
                                        ArrayRef<GemmOverride> overrides) {
  MLIRContext *context = op->getContext();
  Attribute held = op->getAttr(kKernelsAttrName);
  auto given = dyn_cast_or_null<DictionaryAttr>(held);
  if (held && !given)
    return op->emitError() << "'" << kKernelsAttrName
                           << "' must be a dictionary of role = "
                              "#moe_gpu.gemm<...>, got "
                           << held;
  auto roleNames = [&]() {
    std::string names;
    llvm::raw_string_ostream os(names);
    llvm::interleaveComma(roles, os,
                          [&](const GemmRole &role) { os << role.name; });
    return names;
  };
  if (given) {
    for (NamedAttribute entry : given) {
      if (!llvm::any_of(roles, [&](const GemmRole &role) {
            return role.name == entry.getName().getValue();
          }))
        return op->emitError()
               << "'" << kKernelsAttrName << "' has a config for '"
               << entry.getName().getValue() << "', which " << op->getName()
               << " does not run (its GEMMs: " << roleNames() << ")";
      if (!isa<GemmConfigAttr>(entry.getValue()))
        return op->emitError()
               << "'" << kKernelsAttrName << "' entry '"
               << entry.getName().getValue()
               << "' must be a #moe_gpu.gemm<...>, got " << entry.getValue();
    }
  }
  GemmShape shape = gemmShapeOf(op);
  SmallVector<NamedAttribute> chosen;
  for (const GemmRole &role : roles) {
    if (Attribute kept = given ? given.get(role.name) : Attribute()) {
      chosen.emplace_back(StringAttr::get(context, role.name), kept);
      continue;
    }
    std::optional<GemmConfig> config =
        selectGemmConfig(role, shape, chip, numSMs);
    if (!config)
      return op->emitError() << "no GEMM kernels for chip '" << chip
                             << "' (the GPU path builds sm_90a kernels)";
    GemmConfigAttr attr = GemmConfigAttr::getChecked(
        [&]() { return op->emitError(); }, context, *config);
    if (!attr)
      return failure();
    for (const GemmOverride &override : overrides) {
      if (!override.matches(op, role.name))
        continue;
      FailureOr<GemmConfigAttr> overridden =
          applyGemmOverride(attr, override, [&]() { return op->emitError(); });
      if (failed(overridden))
        return failure();
      attr = *overridden;
    }
    chosen.emplace_back(StringAttr::get(context, role.name), attr);
  }
  return DictionaryAttr::get(context, chosen);
}

struct MoEGPUSelectKernelsPass
    : public mlir::moe_gpu::impl::MoEGPUSelectKernelsBase<
          MoEGPUSelectKernelsPass> {
  using MoEGPUSelectKernelsBase::MoEGPUSelectKernelsBase;

  void runOnOperation() override {
    const ChipInfo *target = lookupChip(chip);
    if (!target) {
      getOperation().emitError()
          << "moe-gpu-select-kernels: no GEMM kernels for chip '" << chip
          << "' (the GPU path builds sm_90a kernels)";
      return signalPassFailure();
    }
    int64_t requested = numSMs;
    if (requested < 0 || requested > 1024) {
      getOperation().emitError()
          << "moe-gpu-select-kernels: num-sms must be 1 to 1024 (0: the "
             "chip's), got "
          << requested;
      return signalPassFailure();
    }
    int64_t sms = requested ? requested : target->numSMs;
    getOperation()->setAttr(
        kNumSMsAttrName,
        IntegerAttr::get(IntegerType::get(&getContext(), 64), sms));
    SmallVector<GemmOverride> overrides;
    for (const std::string &text : configs) {
      FailureOr<GemmOverride> override =
          parseGemmOverride(text, [&]() { return getOperation().emitError(); });
      if (failed(override))
        return signalPassFailure();
      overrides.push_back(std::move(*override));
    }
    WalkResult result = getOperation().walk([&](Operation *op) {
      SmallVector<GemmRole> roles = gemmRolesOf(op);
      if (roles.empty()) {
        if (op->hasAttr(kKernelsAttrName)) {
          op->emitError() << "'" << kKernelsAttrName << "' on " << op->getName()
                          << ", which runs no GEMM kernel";
          return WalkResult::interrupt();
        }
        return WalkResult::advance();
      }
      FailureOr<DictionaryAttr> kernels =
          selectKernels(op, roles, chip, sms, overrides);
      if (failed(kernels))
        return WalkResult::interrupt();
      op->setAttr(kKernelsAttrName, *kernels);
      return WalkResult::advance();
    });
    if (result.wasInterrupted())
      signalPassFailure();
  }
};

} // namespace
