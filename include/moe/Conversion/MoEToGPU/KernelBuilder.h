//===- KernelBuilder.h - the GPU library's kernels, built in C++ -*- C++
//-*-===//
//
// The sm_90a kernels of the GPU path built with OpBuilder, one function a
// kernel, from #moe_gpu.gemm configs for the GEMMs. Each builds its ops in a
// fixed order: the library's text is pinned (the digest in
// test/Conversion/MoEToGPU/emit-library.mlir), because the kernel cache keys
// on it and its kernels' outputs and speed were checked on the GPU.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_CONVERSION_MOETOGPU_KERNELBUILDER_H
#define MOE_CONVERSION_MOETOGPU_KERNELBUILDER_H

#include "moe/Dialect/MoEGPU/IR/MoEGPUAttributes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "mlir/Support/LLVM.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"

#include <string>

namespace mlir::moe {

/// Builds the library kernel `name` at the end of `module`; failure (with an
/// error at the module) for a kernel the builder does not make.
FailureOr<gpu::GPUFuncOp> buildLibraryKernel(gpu::GPUModuleOp module,
                                             StringRef name);

/// The kernels buildLibraryKernel makes, in the library's order.
SmallVector<StringRef> builtLibraryKernelNames();

/// Builds the library's device functions (the private func.func helpers its
/// kernels call, e.g. @__moe_gpu_exp) at the end of `module`, all of them
/// and in the library's order, since they call one another; failure (with an
/// error at the module, nothing built) if `module` already has a symbol of
/// one of their names.
LogicalResult buildLibraryDeviceFunctions(gpu::GPUModuleOp module);

/// The device functions buildLibraryDeviceFunctions makes, in its order.
SmallVector<StringRef> libraryDeviceFunctionNames();

/// Builds the library's host function `name` (a func.func @__moe_gpu_* of
/// the module, which launches @moe_kernels::@<kernel>s on an async token) at
/// the end of `module`. A function that calls @moeTensorMapDeviceBf16 (the
/// runtime's tensor maps) declares it first, before itself, where `module`
/// has no symbol of that name. `module` becomes a gpu.container_module
/// (where gpu.launch_func verifies). The context must have the func, gpu,
/// arith, memref, scf and llvm dialects loaded; the kernels need not be in
/// `module`. Failure (with an error at the module, nothing built) for a name
/// the builder does not make, if `module` already has a symbol `name`, or if
/// its @moeTensorMapDeviceBf16 is not that declaration.
FailureOr<func::FuncOp> buildLibraryHostFunction(ModuleOp module,
                                                 StringRef name);

/// One GEMM role of a host function (KernelRoles.h's role names: logits, up,
/// down) and its config.
struct HostGemmConfig {
  std::string role;
  moe_gpu::GemmConfig config;
};

/// The GEMM roles of the host function `name` that can take other configs,
/// with the library's configs, in the order it runs them: those of every host
/// function that launches GEMMs; empty for any other function.
SmallVector<HostGemmConfig> libraryHostGemmConfigs(StringRef name);

/// The name of the variant of the host function `name` that runs `configs`
/// (roles not given keep the library's config; a config is compared resolved
/// and not accumulating): `name` itself where every role has the library's
/// config, else `name` followed by "__" and the kernel name (gemmKernelName)
/// of each role that differs, in the function's role order, e.g.
/// __moe_gpu_expert_ffn__moe_gemm_rows_mn_bf16_s2.
std::string libraryHostFunctionVariantName(StringRef name,
                                           ArrayRef<HostGemmConfig> configs);

/// Builds the variant of the host function `name` that launches the kernels
/// of `configs` (libraryHostFunctionVariantName names it) at the end of
/// `module`, as the overload without configs builds the library's: the same
/// launches with the threads, dynamic shared memory, grid, tensor maps and
/// tile counters of the chosen kernels' configs. Builds each chosen kernel
/// (buildGemmKernel) into `module`'s gpu.module @moe_kernels, made where
/// missing, unless it has a kernel of that name; the library's kernels and
/// device functions are not built. With every config the library's, the
/// overload without configs. Failure (with an error at the module) for a
/// function without variants given another config, a role it lacks, an
/// invalid config, or as the overload without configs fails.
FailureOr<func::FuncOp>
buildLibraryHostFunction(ModuleOp module, StringRef name,
                         ArrayRef<HostGemmConfig> configs);

/// Whether buildLibraryHostFunction can build the variant of `name` that
/// runs `configs` (valid configs, as a #moe_gpu.gemm holds): every config of
/// a role of `name`, and where the
/// function adds a GEMM's tile to what C holds (the dx of
/// __moe_gpu_router_grad_acc), one that can accumulate.
bool canBuildLibraryHostFunction(StringRef name,
                                 ArrayRef<HostGemmConfig> configs);

/// The host functions buildLibraryHostFunction makes, in the library's
/// order.
SmallVector<StringRef> libraryHostFunctionNames();

/// The whole GPU library, as the compiler uses it: a gpu.container_module
/// with gpu.module @moe_kernels (every kernel, then the device functions) and
/// the host functions, in the library's order. Null (with an error at an
/// unknown location) if a part cannot be built. The context must have the
/// dialects buildLibraryHostFunction names, and nvvm and vector loaded.
/// The host functions launch the persistent GEMMs on at most `numSMs` CTAs
/// (0: the default, 132), as they do in a module whose moe_gpu.num_sms says
/// so.
OwningOpRef<ModuleOp> buildGPULibrary(MLIRContext *context, int64_t numSMs = 0);

} // namespace mlir::moe

#endif // MOE_CONVERSION_MOETOGPU_KERNELBUILDER_H
