//===- MoEGPUEnums.td - moe_gpu dialect enums ----------------*- tablegen -*-===//

#ifndef MOE_DIALECT_MOEGPU_IR_MOEGPUENUMS_TD
#define MOE_DIALECT_MOEGPU_IR_MOEGPUENUMS_TD

include "mlir/IR/EnumAttr.td"

// The symbols are CamelCase (`static` is a C++ keyword); the keywords in the
// IR are snake_case.
class MoEGPU_I32Enum<string name, string summary,
                     list<I32EnumAttrCase> cases>
    : I32EnumAttr<name, summary, cases> {
  let cppNamespace = "::mlir::moe_gpu";
  let genSpecializedAttr = 0;
}

def MoEGPU_AOperand : MoEGPU_I32Enum<"AOperand",
    "where a GEMM's A operand comes from", [
      I32EnumAttrCase<"Gather", 0, "gather">,
      I32EnumAttrCase<"Rows", 1, "rows">,
      I32EnumAttrCase<"Mn", 2, "mn">
    ]>;

def MoEGPU_BOperand : MoEGPU_I32Enum<"BOperand",
    "where a GEMM's B operand comes from", [
      I32EnumAttrCase<"WMn", 0, "w_mn">,
      I32EnumAttrCase<"WMnSwiglu", 1, "w_mn_swiglu">,
      I32EnumAttrCase<"WK", 2, "w_k">,
      I32EnumAttrCase<"RowsMn", 3, "rows_mn">
    ]>;

def MoEGPU_GatheredOperand : MoEGPU_I32Enum<"GatheredOperand",
    "the operand a varlen-K GEMM gathers by token ids", [
      I32EnumAttrCase<"None", 0, "none">,
      I32EnumAttrCase<"A", 1, "a">,
      I32EnumAttrCase<"B", 2, "b">
    ]>;

def MoEGPU_GemmEpilogue : MoEGPU_I32Enum<"GemmEpilogue",
    "what a GEMM does with its accumulator", [
      I32EnumAttrCase<"StoreBf16", 0, "store_bf16">,
      I32EnumAttrCase<"StoreBf16W", 1, "store_bf16_w">,
      I32EnumAttrCase<"StoreF32", 2, "store_f32">,
      I32EnumAttrCase<"Swiglu", 3, "swiglu">,
      I32EnumAttrCase<"Dswiglu", 4, "dswiglu">
    ]>;

def MoEGPU_GemmActivation : MoEGPU_I32Enum<"GemmActivation",
    "the expert FFN's activation in the swiglu and dswiglu epilogues", [
      I32EnumAttrCase<"Swiglu", 0, "swiglu">,
      I32EnumAttrCase<"Silu", 1, "silu">,
      I32EnumAttrCase<"GeluTanh", 2, "gelu_tanh">,
      I32EnumAttrCase<"GeluErf", 3, "gelu_erf">
    ]>;

def MoEGPU_GemmProblem : MoEGPU_I32Enum<"GemmProblem",
    "which dimension varies from expert to expert", [
      I32EnumAttrCase<"VarlenM", 0, "varlen_m">,
      I32EnumAttrCase<"VarlenK", 1, "varlen_k">
    ]>;

def MoEGPU_TileSchedule : MoEGPU_I32Enum<"TileSchedule",
    "how the CTAs of a persistent GEMM get their tiles", [
      I32EnumAttrCase<"Static", 0, "static">,
      I32EnumAttrCase<"Dynamic", 1, "dynamic">
    ]>;

def MoEGPU_StorePath : MoEGPU_I32Enum<"StorePath",
    "how a GEMM's C tile leaves shared memory", [
      I32EnumAttrCase<"Ring", 0, "ring">,
      I32EnumAttrCase<"Threads", 1, "threads">,
      I32EnumAttrCase<"BulkRows", 2, "bulk_rows">,
      I32EnumAttrCase<"TmaBoxes", 3, "tma_boxes">
    ]>;

#endif // MOE_DIALECT_MOEGPU_IR_MOEGPUENUMS_TD
