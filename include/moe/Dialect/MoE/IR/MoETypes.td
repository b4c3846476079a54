//===- MoETypes.td - MoE dialect types -----------------------*- tablegen -*-===//

#ifndef MOE_DIALECT_MOE_IR_MOETYPES_TD
#define MOE_DIALECT_MOE_IR_MOETYPES_TD

include "moe/Dialect/MoE/IR/MoEBase.td"
include "mlir/IR/BuiltinTypeInterfaces.td"

def MoE_HostTensorType : MoE_Type<"HostTensor", "host_tensor"> {
  let summary = "a tensor that lives in pinned host memory";
  let description = [{
    The value of a saved activation while it is offloaded to pinned host
    memory between its last forward use and its first backward use. Only
    `moe.offload` produces it and only `moe.prefetch` consumes it. Its shape
    and element type are those of the device tensor it holds.

    ```mlir
    !moe.host_tensor<32768x28672xbf16>
    !moe.host_tensor<?x1536xbf16>
    ```
  }];
  let parameters = (ins
    ArrayRefParameter<"int64_t">:$shape,
    "::mlir::Type":$elementType
  );
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// The device tensor type with the same shape and element type.
    ::mlir::RankedTensorType getDeviceType() const {
      return ::mlir::RankedTensorType::get(getShape(), getElementType());
    }
  }];
}

#endif // MOE_DIALECT_MOE_IR_MOETYPES_TD
