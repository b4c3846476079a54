//===- Passes.td - MoE dialect passes -----------------------*- tablegen -*-===//

#ifndef MOE_DIALECT_MOE_TRANSFORMS_PASSES_TD
#define MOE_DIALECT_MOE_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def MoEDecompose : Pass<"moe-decompose"> {
  let summary = "expand moe.layer into router, dispatch, expert FFN and combine";
  let description = [{
    Replaces every `moe.layer` by the ops that make it up, so that later
    passes (backward generation, activation planning, dispatch fusion) see
    each step and its intermediate tensors:

    ```mlir
    %out, %logits = moe.layer %x, %wr, %wgu, %wd
        {activation = #moe.activation<swiglu>,
         routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
        : tensor<37x48xf32>, tensor<48x5xf32>, tensor<5x48x80xf32>,
          tensor<5x40x48xf32> -> tensor<37x48xf32>, tensor<37x5xf32>
    ```

    becomes

    ```mlir
    %w, %e, %logits = moe.router %x, %wr {routing = #moe.routing<...>} ...
    %ids, %offsets, %rows = moe.dispatch %e {num_experts = 5 : i64} ...
    %y, %h = moe.expert_ffn %x, %ids, %offsets, %wgu, %wd {activation = ...} ...
    %out = moe.combine %y, %w, %rows ...
    ```

    A layer with shared experts also gets `moe.shared_expert` and an
    `arith.addf` of its output; a capacity factor moves to `moe.dispatch`.
    The number of experts must be static; a layer with a dynamic number of
    experts gets an error.
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::moe::MoEDialect"];
}

#endif // MOE_DIALECT_MOE_TRANSFORMS_PASSES_TD
