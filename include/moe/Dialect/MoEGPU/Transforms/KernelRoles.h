//===- KernelRoles.h - the GEMMs each moe op runs on the GPU --*- C++ -*-===//
//
// The contract between the kernel selection (moe-gpu-select-kernels) and the
// GPU library: which GEMM roles a moe op has, and the config of the kernel the
// library builds for each.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_DIALECT_MOEGPU_TRANSFORMS_KERNELROLES_H
#define MOE_DIALECT_MOEGPU_TRANSFORMS_KERNELROLES_H

#include "moe/Dialect/MoEGPU/IR/MoEGPUAttributes.h"

#include "mlir/IR/Operation.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"

#include <cstdint>
#include <optional>

namespace mlir::moe_gpu {

/// The attribute that holds an op's configs: {role = #moe_gpu.gemm<...>}.
constexpr llvm::StringLiteral kKernelsAttrName = "moe_gpu.kernels";
/// The module attribute that holds the SM count the kernels are launched for
/// (an i64): the persistent GEMMs' grid, and the router's weight-gradient
/// split. moe-gpu-select-kernels sets it from the chip.
constexpr llvm::StringLiteral kNumSMsAttrName = "moe_gpu.num_sms";

/// What the selection knows of a chip.
struct ChipInfo {
  llvm::StringRef name;
  /// Streaming multiprocessors: one persistent CTA each.
  int64_t numSMs;
};

/// The chips with kernels: sm_90a (H100 SXM and H200: 132 SMs); null for
/// another name.
const ChipInfo *lookupChip(llvm::StringRef name);

/// One GEMM of an op: its role name and the config the library builds.
struct GemmRole {
  llvm::StringLiteral name;
  GemmConfig libraryConfig;
};

/// The GEMM roles of `op` on the GPU path, in the order the op runs them;
/// empty for an op without GEMMs. The up projection's config depends on
/// whether anything reads the op's output (the H-only kernel otherwise).
llvm::SmallVector<GemmRole> gemmRolesOf(Operation *op);

/// The sizes a config is chosen by, from the op's static types (-1 where the
/// op has no such size).
struct GemmShape {
  int64_t tokens = -1, hidden = -1, expertWidth = -1, experts = -1, topK = -1;
};
GemmShape gemmShapeOf(Operation *op);

/// The config of `role` for `shape` on `chip` with `numSMs` SMs: the tuned
/// table's entry, else the library's config. std::nullopt for a chip without
/// kernels.
std::optional<GemmConfig> selectGemmConfig(const GemmRole &role,
                                           const GemmShape &shape,
                                           llvm::StringRef chip,
                                           int64_t numSMs);

/// Parameters of the kernels of one GEMM role, given by a pass option
/// (moe-gpu-select-kernels' `configs`, moe-compile's --kernel-config) as
/// "[OP.]ROLE:KEY=VALUE[:KEY=VALUE...]", e.g. "expert_ffn.down:stages=2" or
/// "dx:schedule=dynamic": the keys and values of #moe_gpu.gemm's syntax,
/// set on the config the role would get. OP is the moe op's name without
/// "moe." (every op with the role where absent).
struct GemmOverride {
  std::string op;
  std::string role;
  llvm::SmallVector<std::pair<std::string, std::string>> params;

  /// Whether this override applies to `role` of `op`.
  bool matches(Operation *op, llvm::StringRef role) const;
  /// Whether it applies to `role` of the ops named `opName` (without
  /// "moe.").
  bool matches(llvm::StringRef opName, llvm::StringRef role) const;
};

/// Parses one override; failure (reported through `emitError`) for a text
/// without a role or parameters, or a parameter without "KEY=VALUE".
FailureOr<GemmOverride>
parseGemmOverride(llvm::StringRef text,
                  function_ref<InFlightDiagnostic()> emitError);

/// `base` with the override's parameters set (a parameter of `base` that the
/// override sets is replaced); failure (reported through `emitError`) where
/// the result is no valid #moe_gpu.gemm.
FailureOr<GemmConfigAttr>
applyGemmOverride(GemmConfigAttr base, const GemmOverride &override,
                  function_ref<InFlightDiagnostic()> emitError);

} // namespace mlir::moe_gpu

#endif // MOE_DIALECT_MOEGPU_TRANSFORMS_KERNELROLES_H
