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

def MoEGenerateBackward : Pass<"moe-generate-backward", "::mlir::ModuleOp"> {
  let summary = "generate the training forward and backward functions of a layer";
  let description = [{
    For every function `@f` that contains moe ops (after `moe-decompose`), adds
    two functions and leaves `@f` as it is:

    - `@f_forward`, with the arguments of `@f`, returns the results of `@f`
      followed by the tensors that backward needs (the saved set). Attribute
      `moe.num_saved` gives their number.
    - `@f_backward` takes the saved tensors, then one gradient per float
      result of `@f`, and returns the gradient of every float argument of
      `@f` that has one (the router selection bias has none). Attribute
      `moe.gradient_args` lists those argument indices, in order. Every saved
      argument carries `moe.saved` with the name of what it holds.

    Backward is ordinary IR of gradient ops (`moe.router_grad`,
    `moe.expert_combine_grad`, `moe.shared_expert_grad`, `moe.aux_loss_grad`,
    ...), so the memory planners can read it. When `moe.combine` reads the
    expert FFN's `y` directly, the pair's backward is one
    `moe.expert_combine_grad`, whose routing-weight gradient is
    `dS = <dA, A>`: the expert outputs `y` are not saved. The default saved
    set is then x, the weights, the dispatch queues, the routing weights, the
    chosen experts, the router logits and the pre-activations `h`.

    Ops inside a `moe.checkpoint` region are not saved but recomputed: the
    region is inlined in `@f_forward` and the ops backward needs are cloned
    into `@f_backward` from the region's inputs.

    ```mlir
    func.func @f(%x, %wr, %wgu, %wd) -> (tensor<37x48xf32>, tensor<37x5xf32>)
    // becomes @f plus
    func.func @f_forward(%x, %wr, %wgu, %wd)
        -> (out, logits, x, wr, wgu, wd, weights, experts, logits, ids,
            offsets, rows, h) attributes {moe.num_saved = 11 : i64}
    func.func @f_backward(saved..., %d_out, %d_logits) -> (dx, dwr, dwgu, dwd)
        attributes {moe.gradient_args = array<i64: 0, 1, 2, 3>}
    ```

    A function that still holds `moe.layer`, an op with no gradient rule on
    the gradient path, or a gradient into `h` gets an error.
  }];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::func::FuncDialect",
                           "::mlir::moe::MoEDialect",
                           "::mlir::tensor::TensorDialect"];
}

#endif // MOE_DIALECT_MOE_TRANSFORMS_PASSES_TD
