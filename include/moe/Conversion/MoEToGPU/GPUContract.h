//===- GPUContract.h - the GPU path's contract ------------------*- C++ -*-===//
//
// The contract of the GPU path, declared once in
// python/moe_mlir/gpu_contract.json (which ships with the Python package): the
// chip, the limits of a layer the path runs, each with its reason, and the host
// functions of the GPU library that convert-moe-to-gpu calls, with their
// parameters. The build generates GPUContract.h.inc from that file
// (lib/Conversion/MoEToGPU/gen_gpu_contract.py); convert-moe-to-gpu checks a
// layer against the limits, moe-compile writes them into the manifest, and
// GPUContractTest holds the library's host functions to the table.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CONVERSION_MOETOGPU_GPUCONTRACT_H
#define MOE_CONVERSION_MOETOGPU_GPUCONTRACT_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <cstdint>

namespace mlir::moe {

/// One limit of the contract, as the JSON gives it: a value of one of four
/// kinds, the sizes it applies to (d, n, m; may be empty) and its reason.
struct GPULimit {
  enum class Kind { Integer, String, Boolean, StringList };
  llvm::StringLiteral name;
  Kind kind;
  int64_t integer;
  llvm::StringLiteral string;
  bool boolean;
  llvm::ArrayRef<llvm::StringLiteral> strings;
  llvm::ArrayRef<llvm::StringLiteral> appliesTo;
  llvm::StringLiteral reason;
};

/// One parameter of a host function: its name in docs/gpu-path.md's table and
/// its MLIR type as printed (`memref<?x?xbf16>`, `!gpu.async.token`, `i32`).
struct HostFunctionParam {
  llvm::StringLiteral name;
  llvm::StringLiteral type;
};

/// One host function of the GPU library: its name, the op whose conversion
/// calls it, a one-line summary, its parameters in order (the async token
/// first) and its result types. The variants `<name>__<kernel>` that run
/// other GEMM configs share their base's signature and are not listed.
struct HostFunctionContract {
  llvm::StringLiteral name;
  llvm::StringLiteral opName;
  llvm::StringLiteral summary;
  llvm::ArrayRef<HostFunctionParam> params;
  llvm::ArrayRef<llvm::StringLiteral> results;
};

} // namespace mlir::moe

// Defines, in mlir::moe::gpu_contract: kChip; one constant a limit named after
// it (max_experts: kMaxExperts, int64_t; data_dtype: kDataDtype, a
// StringLiteral; activations: kActivations, an array; a Boolean limit a bool),
// with k<Name>Reason and, where given, k<Name>AppliesTo; kLimits (every
// GPULimit, in the JSON's order) and kHostFunctions.
#include "moe/Conversion/MoEToGPU/GPUContract.h.inc"

namespace mlir::moe {

/// The limits of the contract, in the JSON's order.
inline llvm::ArrayRef<GPULimit> gpuLimits() { return gpu_contract::kLimits; }

/// The host functions of the contract, in the library's order.
inline llvm::ArrayRef<HostFunctionContract> gpuHostFunctionContracts() {
  return gpu_contract::kHostFunctions;
}

/// The contract of the host function `name`, or null if it has none.
inline const HostFunctionContract *
lookupHostFunctionContract(llvm::StringRef name) {
  for (const HostFunctionContract &function : gpuHostFunctionContracts())
    if (function.name == name)
      return &function;
  return nullptr;
}

} // namespace mlir::moe

#endif // MOE_CONVERSION_MOETOGPU_GPUCONTRACT_H
