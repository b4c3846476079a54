//===- InitAll.h - Register everything moe-mlir defines -----*- C++ -*-===//

#ifndef MOE_INITALL_H
#define MOE_INITALL_H

#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Dialect/MoEGPU/IR/MoEGPUDialect.h"
#include "moe/Dialect/MoEGPU/Transforms/Passes.h"
#include "moe/Pipelines/Pipelines.h"

#include "mlir/Conversion/ArithToLLVM/ArithToLLVM.h"
#include "mlir/Conversion/ControlFlowToLLVM/ControlFlowToLLVM.h"
#include "mlir/Conversion/FuncToLLVM/ConvertFuncToLLVM.h"
#include "mlir/Conversion/GPUCommon/GPUToLLVM.h"
#include "mlir/Conversion/IndexToLLVM/IndexToLLVM.h"
#include "mlir/Conversion/MathToLLVM/MathToLLVM.h"
#include "mlir/Conversion/MemRefToLLVM/MemRefToLLVM.h"
#include "mlir/Conversion/NVVMToLLVM/NVVMToLLVM.h"
#include "mlir/Conversion/UBToLLVM/UBToLLVM.h"
#include "mlir/Conversion/VectorToLLVM/ConvertVectorToLLVM.h"
#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Arith/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/Bufferization/IR/Bufferization.h"
#include "mlir/Dialect/Bufferization/Transforms/FuncBufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/ControlFlow/IR/ControlFlow.h"
#include "mlir/Dialect/ControlFlow/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/Func/Extensions/InlinerExtension.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/Index/IR/IndexDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Linalg/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/MemRef/Transforms/AllocationOpInterfaceImpl.h"
#include "mlir/Dialect/NVGPU/IR/NVGPUDialect.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/SCF/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/Dialect/Tensor/Transforms/BufferizableOpInterfaceImpl.h"
#include "mlir/Dialect/UB/IR/UBOps.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Target/LLVM/NVVM/Target.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/GPU/GPUToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/NVVM/NVVMToLLVMIRTranslation.h"

namespace mlir::moe {

/// The moe dialect and moe_gpu, which configures the GPU path's kernels.
inline void registerAllMoEDialects(DialectRegistry &registry) {
  registry.insert<MoEDialect, moe_gpu::MoEGPUDialect>();
}

/// What moe-lower-to-cpu-pipeline needs beyond the moe dialect: the dialects
/// it goes through, the bufferization models of the ops it bufferizes and the
/// convert-to-llvm interfaces of the dialects it lowers.
inline void registerMoECPUPathDialects(DialectRegistry &registry) {
  registry.insert<arith::ArithDialect, bufferization::BufferizationDialect,
                  cf::ControlFlowDialect, func::FuncDialect,
                  index::IndexDialect, linalg::LinalgDialect, LLVM::LLVMDialect,
                  math::MathDialect, memref::MemRefDialect, scf::SCFDialect,
                  tensor::TensorDialect, ub::UBDialect>();
  arith::registerBufferizableOpInterfaceExternalModels(registry);
  bufferization::func_ext::registerBufferizableOpInterfaceExternalModels(
      registry);
  cf::registerBufferizableOpInterfaceExternalModels(registry);
  func::registerInlinerExtension(registry);
  linalg::registerBufferizableOpInterfaceExternalModels(registry);
  memref::registerAllocationOpInterfaceExternalModels(registry);
  scf::registerBufferizableOpInterfaceExternalModels(registry);
  tensor::registerBufferizableOpInterfaceExternalModels(registry);
  arith::registerConvertArithToLLVMInterface(registry);
  cf::registerConvertControlFlowToLLVMInterface(registry);
  index::registerConvertIndexToLLVMInterface(registry);
  registerConvertFuncToLLVMInterface(registry);
  registerConvertMathToLLVMInterface(registry);
  registerConvertMemRefToLLVMInterface(registry);
  ub::registerConvertUBToLLVMInterface(registry);
}

/// What moe-lower-to-nvvm-pipeline needs: the GPU dialects, the NVVM target
/// (gpu-module-to-binary) and the LLVM IR translations of what a kernel
/// holds once lowered.
inline void registerMoEGPUPathDialects(DialectRegistry &registry) {
  registry.insert<gpu::GPUDialect, LLVM::LLVMDialect, nvgpu::NVGPUDialect,
                  NVVM::NVVMDialect, vector::VectorDialect>();
  NVVM::registerNVVMTargetInterfaceExternalModels(registry);
  registerBuiltinDialectTranslation(registry);
  registerGPUDialectTranslation(registry);
  registerLLVMDialectTranslation(registry);
  registerNVVMDialectTranslation(registry);
  registerConvertNVVMToLLVMInterface(registry);
  gpu::registerConvertGpuToLLVMInterface(registry);
  // The kernels' vector loads and stores must lower inside convert-gpu-to-nvvm,
  // which knows the GPU address spaces; the host's convert-to-llvm does not.
  vector::registerConvertVectorToLLVMInterface(registry);
}

/// Everything the moe-mlir tools (moe-opt, moe-reduce) parse or produce.
inline void registerAllMoEToolDialects(DialectRegistry &registry) {
  registerAllMoEDialects(registry);
  registerMoECPUPathDialects(registry);
  registerMoEGPUPathDialects(registry);
}

/// moe-* passes and pipelines.
inline void registerAllMoEPasses() {
  registerMoEPasses();
  moe_gpu::registerMoEGPUPasses();
  registerMoEConversionPasses();
  registerMoEPipelines();
}

} // namespace mlir::moe

#endif // MOE_INITALL_H
