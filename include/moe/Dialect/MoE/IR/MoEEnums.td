//===- MoEEnums.td - MoE dialect enums -----------------------*- tablegen -*-===//

#ifndef MOE_DIALECT_MOE_IR_MOEENUMS_TD
#define MOE_DIALECT_MOE_IR_MOEENUMS_TD

include "mlir/IR/EnumAttr.td"

def MoE_ScoringFunc : I32EnumAttr<"ScoringFunc",
    "how router logits become expert scores", [
      I32EnumAttrCase<"softmax", 0>,
      I32EnumAttrCase<"sigmoid", 1>
    ]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def MoE_Activation : I32EnumAttr<"Activation",
    "activation of the expert FFN", [
      I32EnumAttrCase<"swiglu", 0>,
      I32EnumAttrCase<"gelu", 1>,
      I32EnumAttrCase<"silu", 2>,
      I32EnumAttrCase<"gelu_tanh", 3>
    ]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def MoE_EPOverflow : I32EnumAttr<"EPOverflow",
    "what an expert-parallel dispatch does with rows past its capacity", [
      I32EnumAttrCase<"error", 0>,
      I32EnumAttrCase<"drop", 1>
    ]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

def MoE_BiasUpdate : I32EnumAttr<"BiasUpdate",
    "how moe.update_selection_bias moves an expert's selection bias", [
      I32EnumAttrCase<"sign", 0>,
      I32EnumAttrCase<"proportional", 1>
    ]> {
  let cppNamespace = "::mlir::moe";
  let genSpecializedAttr = 0;
}

#endif // MOE_DIALECT_MOE_IR_MOEENUMS_TD
