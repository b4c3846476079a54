//===- MoEGPUBase.td - moe_gpu dialect definition -----------*- tablegen -*-===//
//
// The `moe_gpu` dialect holds what the GPU path of moe-mlir decides about its
// kernels, kept apart from the target-independent `moe` dialect.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_DIALECT_MOEGPU_IR_MOEGPUBASE_TD
#define MOE_DIALECT_MOEGPU_IR_MOEGPUBASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def MoEGPU_Dialect : Dialect {
  let name = "moe_gpu";
  let cppNamespace = "::mlir::moe_gpu";
  let summary = "Configuration of the Hopper (sm_90a) kernels of the GPU path";
  let description = [{
    The `moe_gpu` dialect describes the kernels that the GPU path of moe-mlir
    builds for NVIDIA Hopper (sm_90a). It is kept apart from the `moe`
    dialect, which says nothing about any target.

    Today it holds one attribute, `#moe_gpu.gemm`: the configuration of one
    grouped GEMM kernel (operands, epilogue, tiling, pipeline, warp
    specialisation, schedule, store path). Its verifier holds the rules that
    decide which configurations the kernel code can build.
  }];
  let useDefaultAttributePrinterParser = 1;
  let extraClassDeclaration = [{
    void registerAttributes();
  }];
}

class MoEGPU_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<MoEGPU_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

#endif // MOE_DIALECT_MOEGPU_IR_MOEGPUBASE_TD
