//===- MoEOps.td - MoE dialect operations -------------------*- tablegen -*-===//
//
// Forward ops (layer, router, dispatch, expert_ffn, shared_expert, combine,
// aux_loss, update_selection_bias), memory-placement ops (checkpoint, offload, prefetch) and the
// gradient op of each differentiable forward op.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_DIALECT_MOE_IR_MOEOPS_TD
#define MOE_DIALECT_MOE_IR_MOEOPS_TD

include "moe/Dialect/MoE/IR/MoEBase.td"
include "moe/Dialect/MoE/IR/MoEAttributes.td"
include "moe/Dialect/MoE/IR/MoETypes.td"
include "mlir/IR/OpAsmInterface.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

//===----------------------------------------------------------------------===//
// Type constraints
//===----------------------------------------------------------------------===//

def MoE_Float : AnyTypeOf<[BF16, F16, F32]>;
def MoE_Activations : TensorRankOf<[BF16, F16, F32], [2]>;
def MoE_Weights2D : TensorRankOf<[BF16, F16, F32], [2]>;
def MoE_Weights3D : TensorRankOf<[BF16, F16, F32], [3]>;
def MoE_F32Matrix : TensorRankOf<[F32], [2]>;
def MoE_F32Vector : TensorRankOf<[F32], [1]>;
def MoE_F32Scalar : TensorRankOf<[F32], [0]>;
def MoE_I32Matrix : TensorRankOf<[I32], [2]>;
def MoE_I32Vector : TensorRankOf<[I32], [1]>;

def MoE_PositiveF64Attr : ConfinedAttr<F64Attr, [
    AttrConstraint<CPred<
      "::std::isfinite(::llvm::cast<::mlir::FloatAttr>($_self)"
      ".getValueAsDouble()) && "
      "::llvm::cast<::mlir::FloatAttr>($_self).getValueAsDouble() > 0.0">,
      "whose value is positive and finite">]>;

//===----------------------------------------------------------------------===//
// Forward ops
//===----------------------------------------------------------------------===//

def MoE_LayerOp : MoE_Op<"layer", [Pure, AttrSizedOperandSegments]> {
  let summary = "a whole MoE layer: router, routed experts and shared experts";
  let description = [{
    The entry point of the dialect: one Mixture-of-Experts layer as a
    framework sees it. `moe-decompose` expands it into `moe.router`,
    `moe.dispatch`, `moe.expert_ffn`, `moe.combine` and, with shared experts,
    `moe.shared_expert` plus an add.

    Operands: `x [T, d]`, router weight `W_r [d, E]`, optional selection bias
    `[E]` (f32, changes only which experts are chosen), expert weights
    `W_gate_up [E, d, 2n]` (`[E, d, n]` for plain `gelu`/`gelu_tanh`/`silu`
    experts) and
    `W_down [E, n, d]`, and optional shared-expert weights `[d, 2m]` and
    `[m, d]` (several shared experts are one wider shared expert).
    With `expert_bias(%b_gate_up, %b_down : ...)` the routed experts add
    biases `b_gate_up [E, G]` before the activation and `b_down [E, d]` after
    the down projection (gpt-oss); the shared expert has none.

    Results: the layer output `[T, d]` and the router logits `[T, E]` (f32),
    which auxiliary losses read.

    `capacity_factor` turns on token dropping: each expert keeps at most
    `ceil(capacity_factor * T * k / E)` (token, slot) pairs, first come in
    token order. Without it the layer is dropless.

    The token count may be dynamic (`tensor<?xdxbf16>`): one compiled layer
    then serves every T from 1 to `max_tokens`, the bound it is planned and
    compiled for (a dynamic T needs it; with a static T it may only repeat
    T). `moe-decompose` records it on the enclosing function as
    `moe.max_tokens`.

    `ep_size` (S) makes the layer expert-parallel over S ranks
    (docs/distributed.md): the router weight holds all E experts, while
    `w_gate_up` and `w_down` hold this rank's E / S, and `ep_capacity` (C,
    needed with `ep_size`) bounds the rows one rank sends to one rank a step;
    `ep_overflow` says what happens past it (`#moe.ep_overflow<error>`, the
    default, or `drop`). An expert-parallel layer takes no `capacity_factor`:
    its capacity is `ep_capacity`. `moe-decompose` then emits `moe.ep_dispatch` and
    `moe.ep_combine` around the local experts.

    `ep_chunk_tokens` (c, with `ep_size` and a dynamic T) splits a step of up
    to `max_tokens` tokens into `ceil(max_tokens / c)` chunks of at most c
    tokens, each with its own dispatch and combine, so the runtime can move one
    chunk's rows while another's experts run, and every buffer is a chunk's:
    `ep_capacity` is then the rows one rank sends to one rank a chunk.
    `moe-decompose` compiles the layer for one chunk: the function's
    `moe.max_tokens` is c and `moe.ep_step_tokens` the step's bound.

    ```mlir
    %out, %logits = moe.layer %x, %w_router, %w_gate_up, %w_down
        {activation = #moe.activation<swiglu>,
         routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
        : tensor<16384x4096xbf16>, tensor<4096x8xbf16>, tensor<8x4096x28672xbf16>,
          tensor<8x14336x4096xbf16> -> tensor<16384x4096xbf16>, tensor<16384x8xf32>
    ```
  }];
  let arguments = (ins
    MoE_Activations:$x,
    MoE_Weights2D:$router_weight,
    Optional<MoE_F32Vector>:$router_bias,
    MoE_Weights3D:$w_gate_up,
    MoE_Weights3D:$w_down,
    Optional<MoE_Weights2D>:$shared_gate_up,
    Optional<MoE_Weights2D>:$shared_down,
    Optional<MoE_Weights2D>:$b_gate_up,
    Optional<MoE_Weights2D>:$b_down,
    MoE_RoutingAttr:$routing,
    MoE_ActivationAttr:$activation,
    OptionalAttr<MoE_PositiveF64Attr>:$capacity_factor,
    OptionalAttr<ConfinedAttr<I64Attr, [IntMinValue<1>]>>:$max_tokens,
    OptionalAttr<ConfinedAttr<I64Attr, [IntMinValue<1>, IntMaxValue<65536>]>>:$ep_size,
    OptionalAttr<ConfinedAttr<I64Attr, [IntMinValue<1>, IntMaxValue<2147483646>]>>:$ep_capacity,
    OptionalAttr<MoE_EPOverflowAttr>:$ep_overflow,
    OptionalAttr<ConfinedAttr<I64Attr, [IntMinValue<1>]>>:$ep_chunk_tokens
  );
  let results = (outs MoE_Activations:$out, MoE_F32Matrix:$router_logits);
  let assemblyFormat = [{
    $x `,` $router_weight `,` $w_gate_up `,` $w_down
    (`bias` `(` $router_bias^ `:` type($router_bias) `)`)?
    (`shared` `(` $shared_gate_up^ `,` $shared_down `:` type($shared_gate_up) `,` type($shared_down) `)`)?
    (`expert_bias` `(` $b_gate_up^ `,` $b_down `:` type($b_gate_up) `,` type($b_down) `)`)?
    attr-dict `:` type($x) `,` type($router_weight) `,` type($w_gate_up) `,`
    type($w_down) `->` type($out) `,` type($router_logits)
  }];
  let hasVerifier = 1;
}

def MoE_RouterOp : MoE_Op<"router", [Pure]> {
  let summary = "router: logits, scoring, (grouped) top-k selection and weights";
  let description = [{
    `logits = x · W_r` accumulated in f32; scores are `softmax(logits)` or
    `sigmoid(logits)`. The selection score is the score plus the optional
    `bias`; with `num_groups > 1` only experts of the `topk_groups` best groups
    are candidates. The `k` best candidates are chosen (ties go to the lower
    expert index); their weights are their scores (without bias), divided by
    their sum when `renormalize`, times `scaling_factor`.

    Results: `weights [T, k]` (f32), `experts [T, k]` (i32, in descending
    selection score) and `logits [T, E]` (f32).

    ```mlir
    %w, %e, %logits = moe.router %x, %w_router bias(%b : tensor<256xf32>)
        {routing = #moe.routing<scoring = sigmoid, top_k = 8, renormalize = true,
                                num_groups = 8, topk_groups = 4, scaling_factor = 2.5>}
        : tensor<8192x7168xbf16>, tensor<7168x256xbf16>
        -> tensor<8192x8xf32>, tensor<8192x8xi32>, tensor<8192x256xf32>
    ```
  }];
  let arguments = (ins
    MoE_Activations:$x,
    MoE_Weights2D:$router_weight,
    Optional<MoE_F32Vector>:$bias,
    MoE_RoutingAttr:$routing
  );
  let results = (outs MoE_F32Matrix:$weights, MoE_I32Matrix:$experts,
                      MoE_F32Matrix:$logits);
  let assemblyFormat = [{
    $x `,` $router_weight (`bias` `(` $bias^ `:` type($bias) `)`)? attr-dict
    `:` type($x) `,` type($router_weight) `->` type($weights) `,`
    type($experts) `,` type($logits)
  }];
  let hasVerifier = 1;
}

def MoE_DispatchOp : MoE_Op<"dispatch", [Pure]> {
  let summary = "build the dispatch queues from the chosen experts";
  let description = [{
    Sorts the `T * k` (token, slot) pairs by expert, stable in token order,
    without copying any activation. Results:
    - `token_ids [T * k]`: the token of each row, rows in expert order;
    - `offsets [E + 1]`: expert `e` owns rows `[offsets[e], offsets[e+1])`;
    - `rows [T, k]`: the row of each (token, slot) pair, or -1 when dropped.

    With `capacity_factor` each expert keeps at most
    `ceil(capacity_factor * T * k / E)` pairs (first in token order); rows
    past `offsets[E]` are unused. The result is deterministic. An expert index
    outside `[0, E)` is a runtime error of the lowered code.

    ```mlir
    %token_ids, %offsets, %rows = moe.dispatch %experts {num_experts = 8 : i64}
        : tensor<16384x2xi32> -> tensor<32768xi32>, tensor<9xi32>, tensor<16384x2xi32>
    ```
  }];
  let arguments = (ins
    MoE_I32Matrix:$experts,
    ConfinedAttr<I64Attr, [IntMinValue<1>, IntMaxValue<2147483646>]>:$num_experts,
    OptionalAttr<MoE_PositiveF64Attr>:$capacity_factor
  );
  let results = (outs MoE_I32Vector:$token_ids, MoE_I32Vector:$offsets,
                      MoE_I32Matrix:$rows);
  let assemblyFormat = [{
    $experts attr-dict `:` type($experts) `->` type($token_ids) `,`
    type($offsets) `,` type($rows)
  }];
  let hasVerifier = 1;
}

def MoE_ExpertFFNOp : MoE_Op<"expert_ffn", [Pure, AttrSizedOperandSegments]> {
  let summary = "every expert's FFN on its queue of gathered tokens";
  let description = [{
    For each expert `e` and each row `r` in `[offsets[e], offsets[e+1])`:
    `h[r] = x[token_ids[r]] · W_gate_up[e]` (f32 accumulate), `a[r] = act(h[r])`
    and `y[r] = a[r] · W_down[e]`. For `swiglu`, `act(h) = silu(h[:, :n]) *
    h[:, n:]`; `gelu` (erf), `gelu_tanh` (`h / 2 * (1 + tanh(sqrt(2 / pi) *
    (h + 0.044715 h^3)))`, torch's `gelu(approximate="tanh")`) and `silu`
    apply to `h` of width `n`.

    With `bias(%b_gate_up, %b_down : ...)` (`[E, G]` and `[E, d]`, both or
    neither): `h[r] = x[token_ids[r]] · W_gate_up[e] + b_gate_up[e]` and
    `y[r] = a[r] · W_down[e] + b_down[e]`.

    Results, both in expert order: `y [T * k, d]` and the pre-activations
    `h [T * k, 2n]` (`[T * k, n]` for plain activations), which backward may
    keep. Rows without an expert (dropped pairs) are zero.

    ```mlir
    %y, %h = moe.expert_ffn %x, %token_ids, %offsets, %w_gate_up, %w_down
        {activation = #moe.activation<swiglu>}
        : tensor<16384x4096xbf16>, tensor<32768xi32>, tensor<9xi32>,
          tensor<8x4096x28672xbf16>, tensor<8x14336x4096xbf16>
        -> tensor<32768x4096xbf16>, tensor<32768x28672xbf16>
    ```
  }];
  let arguments = (ins
    MoE_Activations:$x,
    MoE_I32Vector:$token_ids,
    MoE_I32Vector:$offsets,
    MoE_Weights3D:$w_gate_up,
    MoE_Weights3D:$w_down,
    Optional<MoE_Weights2D>:$b_gate_up,
    Optional<MoE_Weights2D>:$b_down,
    MoE_ActivationAttr:$activation
  );
  let results = (outs MoE_Activations:$y, MoE_Activations:$h);
  let assemblyFormat = [{
    $x `,` $token_ids `,` $offsets `,` $w_gate_up `,` $w_down
    (`bias` `(` $b_gate_up^ `,` $b_down `:` type($b_gate_up) `,` type($b_down) `)`)?
    attr-dict `:`
    type($x) `,` type($token_ids) `,` type($offsets) `,` type($w_gate_up) `,`
    type($w_down) `->` type($y) `,` type($h)
  }];
  let hasVerifier = 1;
}

def MoE_SharedExpertOp : MoE_Op<"shared_expert", [Pure]> {
  let summary = "a dense FFN applied to every token (DeepSeek-V3, Qwen2-MoE)";
  let description = [{
    `h = x · W_gate_up` (`[T, 2m]`, or `[T, m]` for plain activations),
    `y = act(h) · W_down`. Results: `y [T, d]` and `h`.

    ```mlir
    %y, %h = moe.shared_expert %x, %w_gate_up, %w_down
        {activation = #moe.activation<swiglu>}
        : tensor<8192x7168xbf16>, tensor<7168x4096xbf16>, tensor<2048x7168xbf16>
        -> tensor<8192x7168xbf16>, tensor<8192x4096xbf16>
    ```
  }];
  let arguments = (ins
    MoE_Activations:$x,
    MoE_Weights2D:$w_gate_up,
    MoE_Weights2D:$w_down,
    MoE_ActivationAttr:$activation
  );
  let results = (outs MoE_Activations:$y, MoE_Activations:$h);
  let assemblyFormat = [{
    $x `,` $w_gate_up `,` $w_down attr-dict `:` type($x) `,` type($w_gate_up)
    `,` type($w_down) `->` type($y) `,` type($h)
  }];
  let hasVerifier = 1;
}

def MoE_CombineOp : MoE_Op<"combine", [Pure]> {
  let summary = "deterministic weighted gather-sum of expert outputs per token";
  let description = [{
    `out[t] = sum_j weights[t, j] * y[rows[t, j]]` accumulated in f32 in
    slot order `j = 0..k-1`; slots with `rows[t, j] == -1` (dropped) add
    nothing.

    ```mlir
    %out = moe.combine %y, %weights, %rows
        : tensor<32768x4096xbf16>, tensor<16384x2xf32>, tensor<16384x2xi32>
        -> tensor<16384x4096xbf16>
    ```

    With `accumulate`, `out` is that sum plus `accumulate` (a tensor of the
    type of `out`): `moe-fold-adds` folds an add of the combine's output into
    it. Where the sum is computed in f32, the result may be rounded once.

    ```mlir
    %out = moe.combine %y, %weights, %rows accumulate(%x : tensor<16384x4096xbf16>)
        : tensor<32768x4096xbf16>, tensor<16384x2xf32>, tensor<16384x2xi32>
        -> tensor<16384x4096xbf16>
    ```
  }];
  let arguments = (ins MoE_Activations:$y, MoE_F32Matrix:$weights,
                       MoE_I32Matrix:$rows,
                       Optional<MoE_Activations>:$accumulate);
  let results = (outs MoE_Activations:$out);
  let assemblyFormat = [{
    $y `,` $weights `,` $rows
    (`accumulate` `(` $accumulate^ `:` type($accumulate) `)`)? attr-dict `:`
    type($y) `,` type($weights) `,` type($rows) `->` type($out)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Expert parallelism
//===----------------------------------------------------------------------===//

// The attributes of every expert-parallel op: S ranks of one group, each
// owning E / S consecutive experts (rank s: experts [s * E / S,
// (s + 1) * E / S)), and at most C rows sent from one rank to one rank a step.
defvar MoE_EPAttrs = (ins
  ConfinedAttr<I64Attr, [IntMinValue<1>, IntMaxValue<65536>]>:$ep_size,
  ConfinedAttr<I64Attr, [IntMinValue<1>, IntMaxValue<2147483646>]>:$capacity
);

def MoE_EPDispatchOp : MoE_Op<"ep_dispatch", [Pure]> {
  let summary = "send each row to the rank that owns its expert (a collective)";
  let description = [{
    The rows of this rank in expert order (those of `moe.dispatch`), whose
    block for rank `s` is rows `[offsets[s * El], offsets[(s + 1) * El])`
    with `El = E / ep_size` local experts, go to their rank: at most
    `capacity` (C) rows to each. Without `gather` the rows are `source`
    itself (`[R, d]`, expert order); with `gather(token_ids)` row `i` is
    `source[token_ids[i]]` (`source` is x `[T, d]`, `token_ids [R]`).

    Results, on every rank:
    - `received [S * C, d]`: rank `s`'s rows at `[s * C, s * C + n_s)`,
      in the order they were sent (by local expert, then token); other rows
      are zero;
    - `received_counts [S, El]` (i32): rows of each local expert from each
      rank;
    - `dropped [S]` (i32): rows of this rank past the capacity of each
      destination. With `overflow = error` (the default) a row past the
      capacity is a runtime error and nothing is dropped; with `drop` the
      rows of a block past C (the last of its last experts) are not sent,
      and their results come back as zero rows.

    Every buffer has a size known when compiling; the layer is split at this
    op into stages (`moe-ep-stages`) and the caller's engine moves the rows.
    Its gradient is `moe.ep_combine`, and the reverse.

    ```mlir
    %recv, %counts, %dropped = moe.ep_dispatch %x, %offsets gather(%token_ids : tensor<8192xi32>)
        {capacity = 4096 : i64, ep_size = 2 : i64}
        : tensor<4096x1024xbf16>, tensor<9xi32>
        -> tensor<8192x1024xbf16>, tensor<2x4xi32>, tensor<2xi32>
    ```
  }];
  let arguments = !con((ins
    MoE_Activations:$source,
    MoE_I32Vector:$offsets,
    Optional<MoE_I32Vector>:$token_ids,
    DefaultValuedAttr<MoE_EPOverflowAttr, "::mlir::moe::EPOverflow::error">:$overflow
  ), MoE_EPAttrs);
  let results = (outs MoE_Activations:$received, MoE_I32Matrix:$received_counts,
                      MoE_I32Vector:$dropped);
  let assemblyFormat = [{
    $source `,` $offsets (`gather` `(` $token_ids^ `:` type($token_ids) `)`)?
    attr-dict `:` type($source) `,` type($offsets) `->` type($received) `,`
    type($received_counts) `,` type($dropped)
  }];
  let hasVerifier = 1;
}

def MoE_EPCombineOp : MoE_Op<"ep_combine", [Pure]> {
  let summary = "return each received row to the rank it came from (a collective)";
  let description = [{
    The reverse of `moe.ep_dispatch`: `rows [S * C, d]`, laid out as
    `received` (rank `s`'s rows at `[s * C, ...)`), go back to their rank,
    which places them at the expert-order positions they were sent from:
    `result [R, d]` with `R = offsets[E]` (`T * k` after a dropless
    `moe.dispatch`), with zero rows for rows that were dropped. With
    `reduce(rows_of)` (the `rows [T, k]` of `moe.dispatch`) the result is
    summed per token instead, `result[t] = sum_j returned[rows_of[t, j]]` in
    slot order (f32 accumulate, `-1` adds nothing): `[T, d]`, the gradient
    of a dispatch with `gather`.

    ```mlir
    %y = moe.ep_combine %y_recv, %offsets {capacity = 4096 : i64, ep_size = 2 : i64}
        : tensor<8192x1024xbf16>, tensor<9xi32> -> tensor<8192x1024xbf16>
    ```
  }];
  let arguments = !con((ins
    MoE_Activations:$rows,
    MoE_I32Vector:$offsets,
    Optional<MoE_I32Matrix>:$rows_of
  ), MoE_EPAttrs);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $rows `,` $offsets (`reduce` `(` $rows_of^ `:` type($rows_of) `)`)?
    attr-dict `:` type($rows) `,` type($offsets) `->` type($result)
  }];
  let hasVerifier = 1;
}

def MoE_EPPackOp : MoE_Op<"ep_pack", [Pure]> {
  let summary = "the sending half of moe.ep_dispatch: rows into per-rank blocks";
  let description = [{
    What this rank sends in `moe.ep_dispatch`, on this rank alone: `send
    [S * C, d]` with the block for rank `s` at `[s * C, s * C + n_s)`,
    `send_counts [S, El]` (rows of each of rank `s`'s experts) and `dropped
    [S]`, with the operands, attributes and overflow rule of
    `moe.ep_dispatch`. An all-to-all of `send` (C rows a rank) and of
    `send_counts` (El a rank) gives `moe.ep_dispatch`'s `received` and
    `received_counts`. `moe-ep-stages` makes it.

    ```mlir
    %send, %counts, %dropped = moe.ep_pack %x, %offsets gather(%token_ids : tensor<8192xi32>)
        {capacity = 4096 : i64, ep_size = 2 : i64}
        : tensor<4096x1024xbf16>, tensor<9xi32>
        -> tensor<8192x1024xbf16>, tensor<2x4xi32>, tensor<2xi32>
    ```
  }];
  let arguments = !con((ins
    MoE_Activations:$source,
    MoE_I32Vector:$offsets,
    Optional<MoE_I32Vector>:$token_ids,
    DefaultValuedAttr<MoE_EPOverflowAttr, "::mlir::moe::EPOverflow::error">:$overflow
  ), MoE_EPAttrs);
  let results = (outs MoE_Activations:$send, MoE_I32Matrix:$send_counts,
                      MoE_I32Vector:$dropped);
  let assemblyFormat = [{
    $source `,` $offsets (`gather` `(` $token_ids^ `:` type($token_ids) `)`)?
    attr-dict `:` type($source) `,` type($offsets) `->` type($send) `,`
    type($send_counts) `,` type($dropped)
  }];
  let hasVerifier = 1;
}

def MoE_EPUnpackOp : MoE_Op<"ep_unpack", [Pure]> {
  let summary = "the receiving half of moe.ep_combine: blocks back to expert order";
  let description = [{
    What this rank does with the rows `moe.ep_combine` returns to it, on
    this rank alone: `returned [S * C, d]` (rank `s`'s results at `[s * C,
    ...)`, in the order this rank sent the rows) placed at their expert-order
    positions, zero for dropped rows, or summed per token with `reduce`; the
    operands, attributes and result of `moe.ep_combine`. `moe-ep-stages`
    makes it.

    ```mlir
    %y = moe.ep_unpack %returned, %offsets {capacity = 4096 : i64, ep_size = 2 : i64}
        : tensor<8192x1024xbf16>, tensor<9xi32> -> tensor<8192x1024xbf16>
    ```
  }];
  let arguments = !con((ins
    MoE_Activations:$returned,
    MoE_I32Vector:$offsets,
    Optional<MoE_I32Matrix>:$rows_of
  ), MoE_EPAttrs);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $returned `,` $offsets (`reduce` `(` $rows_of^ `:` type($rows_of) `)`)?
    attr-dict `:` type($returned) `,` type($offsets) `->` type($result)
  }];
  let hasVerifier = 1;
}

def MoE_EPQueuesOp : MoE_Op<"ep_queues", [Pure]> {
  let summary = "the dispatch queues of the rows a rank received";
  let description = [{
    From `received_counts [S, El]` (of `moe.ep_dispatch`): the queues of the
    local experts over the received rows, as `moe.dispatch` gives them for
    tokens. `token_ids [S * C]`: local expert `e`'s rows, from rank 0 first,
    are `s * C + sum(received_counts[s, :e]) + j` for `j <
    received_counts[s, e]`; entries past `offsets[El]` are -1. `offsets [El +
    1]`: expert `e` owns `[offsets[e], offsets[e + 1])`.

    ```mlir
    %ids, %offsets = moe.ep_queues %counts {capacity = 4096 : i64}
        : tensor<2x4xi32> -> tensor<8192xi32>, tensor<5xi32>
    ```
  }];
  let arguments = (ins
    MoE_I32Matrix:$received_counts,
    ConfinedAttr<I64Attr, [IntMinValue<1>, IntMaxValue<2147483646>]>:$capacity
  );
  let results = (outs MoE_I32Vector:$token_ids, MoE_I32Vector:$offsets);
  let assemblyFormat = [{
    $received_counts attr-dict `:` type($received_counts) `->`
    type($token_ids) `,` type($offsets)
  }];
  let hasVerifier = 1;
}

def MoE_GatherRowsOp : MoE_Op<"gather_rows", [Pure]> {
  let summary = "rows picked by index";
  let description = [{
    `result[i] = source[indices[i]]`, a zero row where `indices[i]` is -1:
    `source [N, d]`, `indices [M]` (i32, each in `[-1, N)`), `result [M, d]`.
    The gradient of `moe.scatter_rows` with the same indices.

    ```mlir
    %dyq = moe.gather_rows %dy, %ids : tensor<8192x1024xbf16>, tensor<8192xi32>
        -> tensor<8192x1024xbf16>
    ```
  }];
  let arguments = (ins MoE_Activations:$source, MoE_I32Vector:$indices);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $source `,` $indices attr-dict `:` type($source) `,` type($indices) `->`
    type($result)
  }];
  let hasVerifier = 1;
}

def MoE_ScatterRowsOp : MoE_Op<"scatter_rows", [Pure]> {
  let summary = "rows put at indices, the other rows zero";
  let description = [{
    `result[indices[i]] = source[i]` for every `indices[i] != -1`, every
    other row zero: `source [M, d]`, `indices [M]` (i32, distinct but for
    -1, each in `[-1, N)`), `result [N, d]`. The gradient of
    `moe.gather_rows` with the same indices.

    ```mlir
    %y_recv = moe.scatter_rows %yq, %ids : tensor<8192x1024xbf16>, tensor<8192xi32>
        -> tensor<8192x1024xbf16>
    ```
  }];
  let arguments = (ins MoE_Activations:$source, MoE_I32Vector:$indices);
  let results = (outs MoE_Activations:$result);
  let assemblyFormat = [{
    $source `,` $indices attr-dict `:` type($source) `,` type($indices) `->`
    type($result)
  }];
  let hasVerifier = 1;
}

def MoE_AuxLossOp : MoE_Op<"aux_loss", [Pure]> {
  let summary = "switch-style load-balancing loss and router z-loss";
  let description = [{
    With `p = score(logits)` (`softmax`, or `sigmoid` normalised per token),
    `f_e` the fraction of the `T * k` selections that went to expert `e` and
    `P_e` the mean of `p[:, e]` over tokens:
    - `load_balance = E * sum_e f_e * P_e` (1.0 when perfectly balanced);
    - `z_loss = mean_t(logsumexp(logits[t])^2)`.
    Both are unscaled f32 scalars; the training loop chooses coefficients.
    With no tokens (`T = 0`) both are 0.

    ```mlir
    %lb, %z = moe.aux_loss %logits, %experts {scoring = #moe.scoring<softmax>}
        : tensor<16384x8xf32>, tensor<16384x2xi32> -> tensor<f32>, tensor<f32>
    ```
  }];
  let arguments = (ins MoE_F32Matrix:$logits, MoE_I32Matrix:$experts,
                       MoE_ScoringFuncAttr:$scoring);
  let results = (outs MoE_F32Scalar:$load_balance, MoE_F32Scalar:$z_loss);
  let assemblyFormat = [{
    $logits `,` $experts attr-dict `:` type($logits) `,` type($experts) `->`
    type($load_balance) `,` type($z_loss)
  }];
  let hasVerifier = 1;
}

def MoE_UpdateSelectionBiasOp : MoE_Op<"update_selection_bias", [Pure]> {
  let summary = "auxiliary-loss-free balancing: the selection bias after a step";
  let description = [{
    The router's selection `bias [E]` (moe.router's `bias`, DeepSeek-V3's
    `e_score_correction_bias`) moved toward balance by the expert loads of
    one step: `load_e` is the number of entries of `experts [T, k]` (the
    router's output) equal to `e`; entries outside `[0, E)`, such as -1 for
    no expert, are not counted. With `mean = sum_e load_e / E`:
    - `sign` (DeepSeek-V3): `result_e = bias_e + rate * sign(mean - load_e)`;
    - `proportional`: `result_e = bias_e + rate * (mean - load_e) / mean`.

    `rate` is positive and finite. With no counted entry (`T = 0`, or every
    entry -1) the bias is returned unchanged. Loads are integers, so the
    update is deterministic; f32 arithmetic, `rate` rounded to f32.

    Not part of moe.layer: the training loop calls it after the optimizer
    step, on the experts the step's forward chose.

    ```mlir
    %b2 = moe.update_selection_bias %b, %experts
        {rate = 1.0e-3 : f64, rule = #moe.bias_update<sign>}
        : tensor<256xf32>, tensor<8192x8xi32> -> tensor<256xf32>
    ```
  }];
  let arguments = (ins MoE_F32Vector:$bias, MoE_I32Matrix:$experts,
                       MoE_PositiveF64Attr:$rate, MoE_BiasUpdateAttr:$rule);
  let results = (outs MoE_F32Vector:$result);
  let assemblyFormat = [{
    $bias `,` $experts attr-dict `:` type($bias) `,` type($experts) `->`
    type($result)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Memory placement
//===----------------------------------------------------------------------===//

def MoE_CheckpointOp : MoE_Op<"checkpoint", [
    IsolatedFromAbove, RecursiveMemoryEffects,
    SingleBlockImplicitTerminator<"YieldOp">]> {
  let summary = "a region recomputed in backward instead of saved";
  let description = [{
    Values defined inside the region are not saved for backward: backward
    re-runs the region from its `inputs`. The region is isolated from above,
    so its inputs are exactly what must be kept; its block arguments take the
    inputs' types and `moe.yield` gives the results.

    ```mlir
    %y, %h = moe.checkpoint (%x, %ids, %offs, %wgu, %wd)
        : (tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>,
           tensor<5x40x48xf32>) -> (tensor<74x48xf32>, tensor<74x80xf32>) {
    ^bb0(%a: tensor<37x48xf32>, %b: tensor<74xi32>, %c: tensor<6xi32>,
         %d: tensor<5x48x80xf32>, %e: tensor<5x40x48xf32>):
      %0, %1 = moe.expert_ffn %a, %b, %c, %d, %e {activation = #moe.activation<swiglu>}
          : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<5x48x80xf32>,
            tensor<5x40x48xf32> -> tensor<74x48xf32>, tensor<74x80xf32>
      moe.yield %0, %1 : tensor<74x48xf32>, tensor<74x80xf32>
    }
    ```
  }];
  let arguments = (ins Variadic<AnyType>:$inputs);
  let results = (outs Variadic<AnyType>:$outputs);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = [{
    `(` $inputs `)` attr-dict `:` functional-type($inputs, $outputs) $body
  }];
  let hasRegionVerifier = 1;
}

def MoE_YieldOp : MoE_Op<"yield", [
    Pure, ReturnLike, Terminator, HasParent<"CheckpointOp">]> {
  let summary = "the results of a moe.checkpoint region";
  let description = [{
    ```mlir
    moe.yield %0, %1 : tensor<74x48xf32>, tensor<74x80xf32>
    ```
  }];
  let arguments = (ins Variadic<AnyType>:$values);
  let builders = [OpBuilder<(ins), [{ /* nothing to yield */ }]>];
  let assemblyFormat = "attr-dict ($values^ `:` type($values))?";
}

def MoE_OffloadOp : MoE_Op<"offload"> {
  let summary = "move a saved tensor to pinned host memory";
  let description = [{
    Starts an asynchronous device-to-host copy on the copy stream after the
    tensor's last forward use; the device buffer is free once the copy is
    done. Shape and element type are kept.

    ```mlir
    %host = moe.offload %h : tensor<32768x28672xbf16> -> !moe.host_tensor<32768x28672xbf16>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$source);
  let results = (outs MoE_HostTensorType:$host);
  let assemblyFormat = "$source attr-dict `:` type($source) `->` qualified(type($host))";
  let hasVerifier = 1;
}

def MoE_PrefetchOp : MoE_Op<"prefetch"> {
  let summary = "bring an offloaded tensor back to device memory";
  let description = [{
    Starts the host-to-device copy on the copy stream before the tensor's
    first backward use; users wait on its event.

    ```mlir
    %h = moe.prefetch %host : !moe.host_tensor<32768x28672xbf16> -> tensor<32768x28672xbf16>
    ```
  }];
  let arguments = (ins MoE_HostTensorType:$host);
  let results = (outs AnyRankedTensor:$device);
  let assemblyFormat = "$host attr-dict `:` qualified(type($host)) `->` type($device)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Gradient ops
//===----------------------------------------------------------------------===//

def MoE_RouterGradOp : MoE_Op<"router_grad", [Pure, AttrSizedOperandSegments]> {
  let summary = "backward of moe.router";
  let description = [{
    Given the gradient of the routing weights `d_weights [T, k]` (and,
    optionally, an extra gradient into the logits `d_logits [T, E]`, e.g. from
    `moe.aux_loss_grad`), recomputes the scores from `logits`, backpropagates
    through renormalisation, scaling and scoring, and returns
    `dx = dlogits · W_r^T [T, d]` and `d_router_weight = x^T · dlogits [d, E]`.
    The selection itself (top-k, groups, bias) is not differentiated.

    ```mlir
    %dx, %dwr = moe.router_grad %x, %w_router, %logits, %experts, %dw
        {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
        : tensor<16384x4096xbf16>, tensor<4096x8xbf16>, tensor<16384x8xf32>,
          tensor<16384x2xi32>, tensor<16384x2xf32>
        -> tensor<16384x4096xbf16>, tensor<4096x8xbf16>
    ```

    With `accumulate` (a tensor of the type of `dx`), `dx` is the gradient
    plus `accumulate`: `moe-fold-adds` folds an add of the router's dx into
    it. Where the gradient is computed in f32, the sum may be rounded once.

    ```mlir
    %dx, %dwr = moe.router_grad %x, %w_router, %logits, %experts, %dw
        accumulate(%dx_experts : tensor<16384x4096xbf16>)
        {routing = #moe.routing<scoring = softmax, top_k = 2, renormalize = true>}
        : tensor<16384x4096xbf16>, tensor<4096x8xbf16>, tensor<16384x8xf32>,
          tensor<16384x2xi32>, tensor<16384x2xf32>
        -> tensor<16384x4096xbf16>, tensor<4096x8xbf16>
    ```
  }];
  let arguments = (ins
    MoE_Activations:$x,
    MoE_Weights2D:$router_weight,
    MoE_F32Matrix:$logits,
    MoE_I32Matrix:$experts,
    MoE_F32Matrix:$d_weights,
    Optional<MoE_F32Matrix>:$d_logits,
    Optional<MoE_Activations>:$accumulate,
    MoE_RoutingAttr:$routing
  );
  let results = (outs MoE_Activations:$dx, MoE_Weights2D:$d_router_weight);
  let assemblyFormat = [{
    $x `,` $router_weight `,` $logits `,` $experts `,` $d_weights
    (`logits_grad` `(` $d_logits^ `:` type($d_logits) `)`)?
    (`accumulate` `(` $accumulate^ `:` type($accumulate) `)`)? attr-dict `:`
    type($x) `,` type($router_weight) `,` type($logits) `,` type($experts) `,`
    type($d_weights) `->` type($dx) `,` type($d_router_weight)
  }];
  let hasVerifier = 1;
}

def MoE_ExpertFFNGradOp : MoE_Op<"expert_ffn_grad",
    [Pure, AttrSizedOperandSegments, AttrSizedResultSegments]> {
  let summary = "backward of moe.expert_ffn";
  let description = [{
    From the gradient of the expert outputs `dy [T * k, d]` (expert order) and
    the pre-activations `h` (saved or recomputed): `a = act(h)`,
    `da = dy · W_down[e]^T`, `dh = act'(h, da)`, and returns
    `dx [T, d]` (`dx[t] = sum of dh[r] · W_gate_up[e]^T over the rows r of
    token t`, in row order), `d_w_gate_up[e] = x[q]^T · dh` and
    `d_w_down[e] = a^T · dy`. With `bias(%b_gate_up, %b_down : ...)` it
    also returns `d_b_gate_up [E, G]` (`d_b_gate_up[e]` the sum of the
    expert's rows of `dh`) and `d_b_down [E, d]` (the sum of its rows of `dy`).

    ```mlir
    %dx, %dwgu, %dwd = moe.expert_ffn_grad %x, %token_ids, %offsets, %w_gate_up,
        %w_down, %h, %dy {activation = #moe.activation<swiglu>}
        : tensor<16384x4096xbf16>, tensor<32768xi32>, tensor<9xi32>,
          tensor<8x4096x28672xbf16>, tensor<8x14336x4096xbf16>,
          tensor<32768x28672xbf16>, tensor<32768x4096xbf16>
        -> tensor<16384x4096xbf16>, tensor<8x4096x28672xbf16>, tensor<8x14336x4096xbf16>
    ```
  }];
  let arguments = (ins
    MoE_Activations:$x,
    MoE_I32Vector:$token_ids,
    MoE_I32Vector:$offsets,
    MoE_Weights3D:$w_gate_up,
    MoE_Weights3D:$w_down,
    MoE_Activations:$h,
    MoE_Activations:$dy,
    Optional<MoE_Weights2D>:$b_gate_up,
    Optional<MoE_Weights2D>:$b_down,
    MoE_ActivationAttr:$activation
  );
  let results = (outs MoE_Activations:$dx, MoE_Weights3D:$d_w_gate_up,
                      MoE_Weights3D:$d_w_down,
                      Optional<MoE_Weights2D>:$d_b_gate_up,
                      Optional<MoE_Weights2D>:$d_b_down);
  let assemblyFormat = [{
    $x `,` $token_ids `,` $offsets `,` $w_gate_up `,` $w_down `,` $h `,` $dy
    (`bias` `(` $b_gate_up^ `,` $b_down `:` type($b_gate_up) `,` type($b_down) `)`)?
    attr-dict `:` type($x) `,` type($token_ids) `,` type($offsets) `,`
    type($w_gate_up) `,` type($w_down) `,` type($h) `,` type($dy) `->`
    type($dx) `,` type($d_w_gate_up) `,` type($d_w_down)
    (`,` type($d_b_gate_up)^ `,` type($d_b_down))?
  }];
  let hasVerifier = 1;
}

def MoE_ExpertCombineGradOp : MoE_Op<"expert_combine_grad",
    [Pure, AttrSizedOperandSegments, AttrSizedResultSegments]> {
  let summary = "backward of moe.expert_ffn followed by moe.combine, without y";
  let description = [{
    The backward of `out = combine(expert_ffn(x, ...).y, weights, rows)` that
    needs neither `y` nor a separate `dy` tensor. For each kept (token, slot)
    pair `(t, j)` with row `r = rows[t, j]` of expert `e`:
    `ga = dout[t] · W_down[e]^T`, `a = act(h[r])`,
    `d_weights[t, j] = <ga, a>` (the routing-weight gradient `dS = <dA, A>`,
    so `y` need not be saved), `da = weights[t, j] * ga`, and from there as
    `moe.expert_ffn_grad` with `dy[r] = weights[t, j] * dout[t]`. Dropped
    slots (`rows[t, j] == -1`) get a zero `d_weights`.

    `moe-generate-backward` emits it in place of `moe.combine_grad` +
    `moe.expert_ffn_grad` when the combine reads the expert FFN's `y`.

    ```mlir
    %dx, %dw, %dwgu, %dwd = moe.expert_combine_grad %x, %token_ids, %offsets,
        %rows, %weights, %w_gate_up, %w_down, %h, %dout
        {activation = #moe.activation<swiglu>}
        : tensor<37x48xf32>, tensor<74xi32>, tensor<6xi32>, tensor<37x2xi32>,
          tensor<37x2xf32>, tensor<5x48x80xf32>, tensor<5x40x48xf32>,
          tensor<74x80xf32>, tensor<37x48xf32>
        -> tensor<37x48xf32>, tensor<37x2xf32>, tensor<5x48x80xf32>,
           tensor<5x40x48xf32>
    ```

    With `accumulate` (a tensor of the type of `dx`), `dx` is the gradient
    plus `accumulate`, written `moe.expert_combine_grad ... %dout
    accumulate(%a : type)`: `moe-fold-adds` folds an add of the experts' dx
    into it. Where the gradient is computed in f32, the sum may be rounded
    once.

    With `bias(%b_gate_up, %b_down : ...)` the experts have biases (as in
    `moe.expert_ffn`): `d_weights[t, j]` gains `<dout[t], b_down[e]>` and
    `d_b_gate_up`, `d_b_down` are returned as by `moe.expert_ffn_grad`.
  }];
  let arguments = (ins
    MoE_Activations:$x,
    MoE_I32Vector:$token_ids,
    MoE_I32Vector:$offsets,
    MoE_I32Matrix:$rows,
    MoE_F32Matrix:$weights,
    MoE_Weights3D:$w_gate_up,
    MoE_Weights3D:$w_down,
    MoE_Activations:$h,
    MoE_Activations:$dout,
    Optional<MoE_Activations>:$accumulate,
    Optional<MoE_Weights2D>:$b_gate_up,
    Optional<MoE_Weights2D>:$b_down,
    MoE_ActivationAttr:$activation
  );
  let results = (outs MoE_Activations:$dx, MoE_F32Matrix:$d_weights,
                      MoE_Weights3D:$d_w_gate_up, MoE_Weights3D:$d_w_down,
                      Optional<MoE_Weights2D>:$d_b_gate_up,
                      Optional<MoE_Weights2D>:$d_b_down);
  let assemblyFormat = [{
    $x `,` $token_ids `,` $offsets `,` $rows `,` $weights `,` $w_gate_up `,`
    $w_down `,` $h `,` $dout
    (`accumulate` `(` $accumulate^ `:` type($accumulate) `)`)?
    (`bias` `(` $b_gate_up^ `,` $b_down `:` type($b_gate_up) `,` type($b_down) `)`)?
    attr-dict `:`
    type($x) `,` type($token_ids) `,`
    type($offsets) `,` type($rows) `,` type($weights) `,` type($w_gate_up) `,`
    type($w_down) `,` type($h) `,` type($dout) `->` type($dx) `,`
    type($d_weights) `,` type($d_w_gate_up) `,` type($d_w_down)
    (`,` type($d_b_gate_up)^ `,` type($d_b_down))?
  }];
  let hasVerifier = 1;
}

def MoE_SharedExpertGradOp : MoE_Op<"shared_expert_grad", [Pure]> {
  let summary = "backward of moe.shared_expert";
  let description = [{
    From `dy [T, d]` and the pre-activations `h`: returns `dx [T, d]`,
    `d_w_gate_up` and `d_w_down`.

    ```mlir
    %dx, %dwgu, %dwd = moe.shared_expert_grad %x, %w_gate_up, %w_down, %h, %dy
        {activation = #moe.activation<swiglu>}
        : tensor<8192x7168xbf16>, tensor<7168x4096xbf16>, tensor<2048x7168xbf16>,
          tensor<8192x4096xbf16>, tensor<8192x7168xbf16>
        -> tensor<8192x7168xbf16>, tensor<7168x4096xbf16>, tensor<2048x7168xbf16>
    ```
  }];
  let arguments = (ins
    MoE_Activations:$x,
    MoE_Weights2D:$w_gate_up,
    MoE_Weights2D:$w_down,
    MoE_Activations:$h,
    MoE_Activations:$dy,
    MoE_ActivationAttr:$activation
  );
  let results = (outs MoE_Activations:$dx, MoE_Weights2D:$d_w_gate_up,
                      MoE_Weights2D:$d_w_down);
  let assemblyFormat = [{
    $x `,` $w_gate_up `,` $w_down `,` $h `,` $dy attr-dict `:` type($x) `,`
    type($w_gate_up) `,` type($w_down) `,` type($h) `,` type($dy) `->`
    type($dx) `,` type($d_w_gate_up) `,` type($d_w_down)
  }];
  let hasVerifier = 1;
}

def MoE_CombineGradOp : MoE_Op<"combine_grad", [Pure]> {
  let summary = "backward of moe.combine";
  let description = [{
    `dy[rows[t, j]] = weights[t, j] * dout[t]` (expert order; rows nobody
    owns are zero) and `d_weights[t, j] = <dout[t], y[rows[t, j]]>` in f32
    (zero for dropped slots).

    ```mlir
    %dy, %dw = moe.combine_grad %dout, %weights, %rows, %y
        : tensor<16384x4096xbf16>, tensor<16384x2xf32>, tensor<16384x2xi32>,
          tensor<32768x4096xbf16> -> tensor<32768x4096xbf16>, tensor<16384x2xf32>
    ```
  }];
  let arguments = (ins MoE_Activations:$dout, MoE_F32Matrix:$weights,
                       MoE_I32Matrix:$rows, MoE_Activations:$y);
  let results = (outs MoE_Activations:$dy, MoE_F32Matrix:$d_weights);
  let assemblyFormat = [{
    $dout `,` $weights `,` $rows `,` $y attr-dict `:` type($dout) `,`
    type($weights) `,` type($rows) `,` type($y) `->` type($dy) `,`
    type($d_weights)
  }];
  let hasVerifier = 1;
}

def MoE_AuxLossGradOp : MoE_Op<"aux_loss_grad", [Pure]> {
  let summary = "backward of moe.aux_loss";
  let description = [{
    The gradient of `d_load_balance * load_balance + d_z_loss * z_loss` with
    respect to the logits (the selection counts `f_e` are constants).

    ```mlir
    %dlogits = moe.aux_loss_grad %logits, %experts, %dlb, %dz
        {scoring = #moe.scoring<softmax>}
        : tensor<16384x8xf32>, tensor<16384x2xi32>, tensor<f32>, tensor<f32>
        -> tensor<16384x8xf32>
    ```
  }];
  let arguments = (ins MoE_F32Matrix:$logits, MoE_I32Matrix:$experts,
                       MoE_F32Scalar:$d_load_balance, MoE_F32Scalar:$d_z_loss,
                       MoE_ScoringFuncAttr:$scoring);
  let results = (outs MoE_F32Matrix:$d_logits);
  let assemblyFormat = [{
    $logits `,` $experts `,` $d_load_balance `,` $d_z_loss attr-dict `:`
    type($logits) `,` type($experts) `,` type($d_load_balance) `,`
    type($d_z_loss) `->` type($d_logits)
  }];
  let hasVerifier = 1;
}

#endif // MOE_DIALECT_MOE_IR_MOEOPS_TD
