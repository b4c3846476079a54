//===- KernelRoles.cpp - the GEMMs each moe op runs on the GPU ------------===//

#include "moe/Dialect/MoEGPU/Transforms/KernelRoles.h"

#include "moe/Dialect/MoE/IR/MoEOps.h"

#include "mlir/AsmParser/AsmParser.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/Diagnostics.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace mlir::moe_gpu;

namespace {

int64_t dimOf(Value value, unsigned dim) {
  auto type = dyn_cast<RankedTensorType>(value.getType());
  if (!type || type.getRank() <= dim || type.isDynamicDim(dim))
    return -1;
  return type.getDimSize(dim);
}

/// The GEMM activation of an expert FFN op's `activation` (gelu is the erf
/// form, gelu_tanh the tanh one): the up and dact roles of a non-gated one run
/// it.
GemmActivation gemmActivationOf(moe::Activation activation) {
  switch (activation) {
  case moe::Activation::swiglu:
    return GemmActivation::Swiglu;
  case moe::Activation::silu:
    return GemmActivation::Silu;
  case moe::Activation::gelu:
    return GemmActivation::GeluErf;
  case moe::Activation::gelu_tanh:
    return GemmActivation::GeluTanh;
  }
  llvm_unreachable("an activation");
}

/// `config` (an up or dact GEMM) for `op`'s activation.
GemmConfig withActivation(GemmConfig config, Operation *op) {
  auto attr = op->getAttrOfType<moe::ActivationAttr>("activation");
  if (!attr)
    return config;
  config.activation = gemmActivationOf(attr.getValue());
  if (config.epilogue == GemmEpilogue::Swiglu && !isGatedActivation(config))
    config.b = BOperand::WMn;
  return config;
}

} // namespace

SmallVector<GemmRole> mlir::moe_gpu::gemmRolesOf(Operation *op) {
  using moe::ExpertCombineGradOp, moe::ExpertFFNOp, moe::RouterGradOp,
      moe::RouterOp, moe::SharedExpertGradOp, moe::SharedExpertOp;
  using G = LibraryGemm;
  auto role = [&](StringLiteral name, LibraryGemm gemm) {
    GemmConfig config = libraryGemmConfig(gemm);
    if (name == "up" || name == "dact")
      config = withActivation(config, op);
    return GemmRole{name, config};
  };
  // The H-only host functions run when nothing reads y (H recomputed).
  auto readsY = [](Operation *ffn) { return !ffn->getResult(0).use_empty(); };
  return TypeSwitch<Operation *, SmallVector<GemmRole>>(op)
      .Case([&](RouterOp) -> SmallVector<GemmRole> {
        return {role("logits", G::RowsMnF32)};
      })
      .Case([&](RouterGradOp) -> SmallVector<GemmRole> {
        return {role("dx", G::RowsKBf16), role("dw", G::WgradRows)};
      })
      .Case([&](ExpertFFNOp ffn) -> SmallVector<GemmRole> {
        SmallVector<GemmRole> roles = {
            role("up", readsY(ffn) ? G::UpGather : G::UpGatherH),
            role("down", G::RowsMnBf16)};
        // The expert biases: the up GEMM adds b_gate_up, the down GEMM
        // b_down, each in its epilogue (variants; a layer without them runs
        // the library's).
        if (ffn.getBGateUp())
          for (GemmRole &biased : roles)
            biased.libraryConfig.bias = true;
        return roles;
      })
      .Case([&](SharedExpertOp ffn) -> SmallVector<GemmRole> {
        return {role("up", readsY(ffn) ? G::UpRows : G::UpRowsH),
                role("down", G::RowsMnBf16)};
      })
      .Case([&](ExpertCombineGradOp) -> SmallVector<GemmRole> {
        return {role("dact", G::DactGather), role("dx", G::RowsKBf16),
                role("dw_down", G::WgradGather),
                role("dw_gate_up", G::WgradGatherA)};
      })
      .Case([&](SharedExpertGradOp) -> SmallVector<GemmRole> {
        return {role("dact", G::DactRows), role("dx", G::RowsKBf16),
                role("dw_down", G::WgradRows),
                role("dw_gate_up", G::WgradRows)};
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

const ChipInfo *mlir::moe_gpu::lookupChip(StringRef name) {
  static constexpr ChipInfo kChips[] = {{"sm_90a", 132}};
  for (const ChipInfo &chip : kChips)
    if (chip.name == name)
      return &chip;
  return nullptr;
}

std::optional<GemmConfig>
mlir::moe_gpu::selectGemmConfig(const GemmRole &role, const GemmShape &shape,
                                StringRef chip, int64_t numSMs) {
  if (!lookupChip(chip))
    return std::nullopt;
  (void)numSMs;
  // The per-shape table: empty until its entries are measured against the
  // library's configs on the GPU (docs/gpu-kernels.md); every shape gets the
  // library's config meanwhile.
  (void)shape;
  return role.libraryConfig;
}

bool GemmOverride::matches(Operation *op, StringRef roleName) const {
  StringRef name = op->getName().getStringRef();
  return name.consume_front("moe.") && matches(name, roleName);
}

bool GemmOverride::matches(StringRef opName, StringRef roleName) const {
  return role == roleName && (op.empty() || op == opName);
}

FailureOr<GemmOverride>
mlir::moe_gpu::parseGemmOverride(StringRef text,
                                 function_ref<InFlightDiagnostic()> emitError) {
  auto fail = [&](const Twine &why) {
    emitError() << "kernel config '" << text << "': " << why
                << " (expected [OP.]ROLE:KEY=VALUE[:KEY=VALUE...], e.g. "
                   "expert_ffn.down:stages=2)";
    return failure();
  };
  GemmOverride override;
  auto [target, rest] = text.trim().split(':');
  if (rest.empty())
    return fail("no parameters");
  auto [op, role] = target.rsplit('.');
  if (role.empty())
    std::swap(op, role);
  if (role.empty())
    return fail("no GEMM role");
  // The ops with GEMMs and their roles (gemmRolesOf).
  static constexpr StringLiteral kOps[] = {
      "router",        "router_grad",         "expert_ffn",
      "shared_expert", "expert_combine_grad", "shared_expert_grad"};
  static constexpr StringLiteral kRoles[] = {
      "logits", "dx", "dw", "up", "down", "dact", "dw_down", "dw_gate_up"};
  if (!op.empty() && !llvm::is_contained(kOps, op))
    return fail("'" + op + "' is no moe op with GEMMs (" +
                llvm::join(ArrayRef(kOps), ", ") + ")");
  if (!llvm::is_contained(kRoles, role))
    return fail("'" + role + "' is no GEMM role (" +
                llvm::join(ArrayRef(kRoles), ", ") + ")");
  override.op = op.str();
  override.role = role.str();
  SmallVector<StringRef> params;
  rest.split(params, ':');
  for (StringRef param : params) {
    auto [key, value] = param.split('=');
    key = key.trim();
    value = value.trim();
    if (key.empty() || value.empty())
      return fail("'" + param + "' is not KEY=VALUE");
    override.params.emplace_back(key.str(), value.str());
  }
  return override;
}

FailureOr<GemmConfigAttr>
mlir::moe_gpu::applyGemmOverride(GemmConfigAttr base,
                                 const GemmOverride &override,
                                 function_ref<InFlightDiagnostic()> emitError) {
  // The base's parameters as its syntax prints them, those the override sets
  // replaced; values hold no ", " (they are words, numbers and NxM sizes).
  std::string printed;
  llvm::raw_string_ostream os(printed);
  Attribute(base).print(os);
  StringRef body = StringRef(printed).split('<').second.rsplit('>').first;
  SmallVector<StringRef> entries;
  body.split(entries, ", ", -1, /*KeepEmpty=*/false);
  std::string text = "#moe_gpu.gemm<";
  llvm::ListSeparator separator(", ");
  for (StringRef entry : entries) {
    StringRef key = entry.split('=').first.trim();
    if (llvm::any_of(override.params,
                     [&](const auto &param) { return param.first == key; }))
      continue;
    text += separator;
    text += entry;
  }
  for (const auto &[key, value] : override.params) {
    text += separator;
    text += key + " = " + value;
  }
  text += ">";
  MLIRContext *context = base.getContext();
  // The parser reports into the context; the caller's location is better.
  std::string problem;
  Attribute parsed;
  {
    ScopedDiagnosticHandler handler(context, [&](Diagnostic &diagnostic) {
      if (problem.empty())
        problem = diagnostic.str();
      return success();
    });
    parsed = parseAttribute(text, context);
  }
  auto config = dyn_cast_or_null<GemmConfigAttr>(parsed);
  if (!config) {
    emitError() << "kernel config '" << override.role << "' gives " << text
                << ": " << problem;
    return failure();
  }
  return config;
}
