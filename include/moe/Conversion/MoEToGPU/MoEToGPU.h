//===- MoEToGPU.h - moe to GPU host functions (sm_90a path) -*- C++ -*-===//
//
// The attributes convert-moe-to-gpu leaves on the functions it converts,
// which moe-compile reads to write the C entry points and the manifest.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CONVERSION_MOETOGPU_MOETOGPU_H
#define MOE_CONVERSION_MOETOGPU_MOETOGPU_H

#include "llvm/ADT/StringRef.h"

namespace mlir::moe {

/// "forward" (`@f_forward`), "backward" (`@f_backward`), "plain" (a
/// function without a training pair), or a stage of an expert-parallel
/// forward or backward (moe-ep-stages): "forward_stage0", "backward_stage1".
constexpr llvm::StringLiteral kGPUEntryAttr = "moe.gpu.entry";
/// The name of the layer function `@f`, the prefix of the C entry points.
constexpr llvm::StringLiteral kGPULayerNameAttr = "moe.gpu.layer_name";
/// One dictionary per parameter, in order: `name`, `role` (input, output,
/// saved, cotangent, gradient), `dtype` (bf16, f32, i32), `shape` (-1 for a
/// leading dimension that follows a dynamic token count, with
/// `rows_per_token`: 1 for T, k for T * k), and `forward_param` (saved
/// backward parameters) or `of` (cotangents and gradients).
constexpr llvm::StringLiteral kGPUParamsAttr = "moe.gpu.params";
/// The peak bytes of the function's own gpu.allocs live at once (i64; at
/// the bound with a dynamic token count).
constexpr llvm::StringLiteral kGPUWorkspaceBytesAttr =
    "moe.gpu.workspace_bytes";
/// With a dynamic token count: its bound (i64); the entry points then take
/// T and refuse one outside [1, bound].
constexpr llvm::StringLiteral kGPUMaxTokensAttr = "moe.gpu.max_tokens";
/// On the forward: the layer configuration (T, the bound with a dynamic
/// token count; d, n, E, k, activation,
/// scoring, renormalize, num_groups, topk_groups, scaling_factor, has_bias,
/// shared_n) and `inputs`, the argument holding each layer input.
constexpr llvm::StringLiteral kGPULayerAttr = "moe.gpu.layer";
/// On a stage of an expert-parallel function: the moe.ep_* attributes
/// moe-ep-stages gave it (what its parameters are, its collectives, where
/// the function's results come from), without their `moe.ep_` prefix.
constexpr llvm::StringLiteral kGPUEPStageAttr = "moe.gpu.ep_stage";

} // namespace mlir::moe

#endif // MOE_CONVERSION_MOETOGPU_MOETOGPU_H
