//===- MoEAttributes.td - MoE dialect attributes ------------*- tablegen -*-===//

#ifndef MOE_DIALECT_MOE_IR_MOEATTRIBUTES_TD
#define MOE_DIALECT_MOE_IR_MOEATTRIBUTES_TD

include "moe/Dialect/MoE/IR/MoEBase.td"
include "moe/Dialect/MoE/IR/MoEEnums.td"

def MoE_ScoringFuncAttr : EnumAttr<MoE_Dialect, MoE_ScoringFunc, "scoring"> {
  let assemblyFormat = "`<` $value `>`";
}

def MoE_ActivationAttr : EnumAttr<MoE_Dialect, MoE_Activation, "activation"> {
  let assemblyFormat = "`<` $value `>`";
}

def MoE_EPOverflowAttr : EnumAttr<MoE_Dialect, MoE_EPOverflow, "ep_overflow"> {
  let assemblyFormat = "`<` $value `>`";
}

def MoE_BiasUpdateAttr : EnumAttr<MoE_Dialect, MoE_BiasUpdate, "bias_update"> {
  let assemblyFormat = "`<` $value `>`";
}

// An f64 stored as APFloat (hashable); printed in shortest round-trip form.
class MoE_F64Parameter<string desc> : APFloatParameter<desc> {
  let parser = "::mlir::moe::parseF64Parameter($_parser)";
  let printer = "$_printer.printFloat($_self)";
}

// A bool spelled `true` or `false` (MLIR's default field parser reads 0/1).
def MoE_RenormalizeParameter
    : AttrOrTypeParameter<"bool", "renormalise the selected weights"> {
  let parser = "::mlir::moe::parseBoolParameter($_parser)";
  let printer = "$_printer << ($_self ? \"true\" : \"false\")";
  let defaultValue = "false";
}

def MoE_RoundLogitsParameter
    : AttrOrTypeParameter<"bool", "round the logits to the activations' type"> {
  let parser = "::mlir::moe::parseBoolParameter($_parser)";
  let printer = "$_printer << ($_self ? \"true\" : \"false\")";
  let defaultValue = "false";
}

def MoE_ScalingFactorParameter : MoE_F64Parameter<"weight multiplier"> {
  let defaultValue = "::llvm::APFloat(1.0)";
}

def MoE_RoutingAttr : MoE_Attr<"Routing", "routing"> {
  let summary = "router configuration: scoring, top-k and its refinements";
  let description = [{
    How a router turns logits `x · W_r` into `k` experts and weights per token.

    - `scoring`: `softmax` over all experts, or `sigmoid` per expert.
    - `top_k`: experts per token (`1 <= top_k <= E`).
    - `renormalize`: divide the selected scores by their sum.
    - `num_groups`, `topk_groups`: group-limited selection (DeepSeek-V3). The
      E experts form `num_groups` equal groups; a group's score is the sum of
      its two best selection scores (its best score when a group has one
      expert); only the experts of the `topk_groups` best groups can be chosen.
    - `scaling_factor`: multiplies the final weights (DeepSeek-V3: 2.5).
    - `round_logits`: the logits, accumulated in f32, are rounded to the
      element type of `x` before scoring, as a router that is an `nn.Linear`
      in bf16 computes them (Mixtral, Qwen3-MoE, OLMoE in Hugging Face
      transformers; DeepSeek-V3's router computes in f32). The logits result
      holds the rounded values. A no-op for f32 activations.

    A selection bias (aux-loss-free balancing) is an operand of the op, not
    part of this attribute: it changes which experts are chosen, never the
    weights. Defaults (`renormalize = false`, one group, scaling 1.0,
    `round_logits = false`) are elided when printed.

    ```mlir
    #moe.routing<scoring = softmax, top_k = 2, renormalize = true>
    #moe.routing<scoring = sigmoid, top_k = 8, renormalize = true,
                 num_groups = 8, topk_groups = 4, scaling_factor = 2.5>
    ```
  }];
  let parameters = (ins
    EnumParameter<MoE_ScoringFunc>:$scoring,
    "int64_t":$top_k,
    MoE_RenormalizeParameter:$renormalize,
    DefaultValuedParameter<"int64_t", "1">:$num_groups,
    DefaultValuedParameter<"int64_t", "1">:$topk_groups,
    MoE_ScalingFactorParameter:$scaling_factor,
    MoE_RoundLogitsParameter:$round_logits
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    double getScalingFactorValue() const {
      return getScalingFactor().convertToDouble();
    }
  }];
}

#endif // MOE_DIALECT_MOE_IR_MOEATTRIBUTES_TD
