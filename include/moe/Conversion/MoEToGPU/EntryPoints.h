//===- EntryPoints.h - the C entry points of a compiled layer --*- C++ -*-===//
//
// moe-gpu-build-entry-points gives a layer's forward and backward host
// functions (convert-moe-to-gpu's, lowered to the LLVM dialect) C entry
// points that take a stream and one pointer a tensor, check them and report
// a moeStatus. The entry points carry the moe.gpu.* attributes (MoEToGPU.h),
// from which moe-compile writes the header and the manifest.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CONVERSION_MOETOGPU_ENTRYPOINTS_H
#define MOE_CONVERSION_MOETOGPU_ENTRYPOINTS_H

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Support/LLVM.h"
#include "llvm/ADT/SmallVector.h"

#include <string>

namespace mlir::moe {

/// A parameter of an entry point: one dictionary of moe.gpu.params.
struct EntryParam {
  std::string name;
  std::string role;
  std::string dtype;
  SmallVector<int64_t> shape;
  std::string forwardParam;
  std::string of;
  /// "host" for a tensor in pinned host memory (an offloaded saved tensor);
  /// empty for device memory.
  std::string memory;
  /// With a dynamic token count: the rows a token of a leading dimension
  /// that follows it (shape[0] is -1), 0 otherwise.
  int64_t rowsPerToken = 0;
};

/// What a function's moe.gpu.* attributes record.
struct EntryPointInfo {
  LLVM::LLVMFuncOp func;
  /// "forward" or "backward", or a stage of either ("forward_stage0").
  std::string kind;
  std::string layerName;
  SmallVector<EntryParam, 8> params;
  int64_t workspaceBytes = 0;
  /// The bound of a dynamic token count; 0 for a static one. The entry point
  /// then takes T after the stream.
  int64_t maxTokens = 0;
  /// The forward's layer configuration (moe.gpu.layer); null otherwise.
  DictionaryAttr layer;
  /// A stage's moe.gpu.ep_stage; null otherwise.
  DictionaryAttr stage;
};

/// The moe.gpu.* attributes of `func`; failure (reported at `func`) where
/// one is missing or malformed.
FailureOr<EntryPointInfo> readEntryPoint(LLVM::LLVMFuncOp func);

/// `name` as a C identifier: other characters become '_', and a leading
/// digit (or nothing) gets a '_' before it.
std::string cIdentifier(StringRef name);

/// `param` for a message or a comment: its role, what it is of, its dtype
/// and shape, and where it lives.
std::string describeEntryParam(const EntryParam &param);

/// The entry points moe-gpu-build-entry-points made in `module`, forward
/// first (forward, backward; or the forward's stages, then the backward's);
/// empty where it made none.
SmallVector<EntryPointInfo, 2> getEntryPoints(ModuleOp module);

/// The moeStatus codes an entry point returns for a bad pointer
/// (runtime/include/moe/Runtime/Runtime.h).
constexpr int32_t kEntryInvalidArgument = 3;
constexpr int32_t kEntryMisaligned = 4;
/// Device pointers must be 16-byte aligned (vector loads, TMA).
constexpr int64_t kEntryPointerAlignment = 16;

} // namespace mlir::moe

#endif // MOE_CONVERSION_MOETOGPU_ENTRYPOINTS_H
