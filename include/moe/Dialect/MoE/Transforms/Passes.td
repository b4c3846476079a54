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
    An expert-parallel layer (`ep_size`) gets `moe.ep_dispatch` of the
    dispatched rows to their experts' ranks, `moe.ep_queues` and the expert
    FFN of the local experts on the rows received, `moe.scatter_rows` of its
    results back to where the rows arrived, and `moe.ep_combine` before the
    combine.
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

def MoEPlanActivations : Pass<"moe-plan-activations", "::mlir::func::FuncOp"> {
  let summary = "decide, under a memory budget, which expert activations are kept, recomputed or offloaded";
  let description = [{
    Runs on the forward function of a layer after `moe-decompose` and before
    `moe-generate-backward`. Every `moe.expert_ffn` and `moe.shared_expert`
    outside a `moe.checkpoint` is a candidate: its pre-activations `h` are
    either kept (saved for backward on the device), recomputed (the op is
    wrapped in a `moe.checkpoint` region with `moe.plan = "recompute"`, and
    `moe-generate-backward` re-runs it in backward from its inputs) or
    offloaded (the op gets `moe.plan = "offload"`; after backward generation
    `moe-offload` moves `h` to host memory and back).

    The cost model counts the activations backward keeps on the device, the
    weights aside: x, the router's weights, experts and logits, the dispatch
    queues and the `h` of every kept op (static shapes, element sizes of
    their types). A recomputation adds `2 * rows * d * width(h)` FLOPs
    (`4 R d n` for SwiGLU) at `gpu-tflops`. An offload copies `h` to the
    host and back at `host-gbps`, one copy after the other on one copy
    stream; the device-to-host copy hides behind the forward compute after
    h's last forward use, the host-to-device copy behind the backward compute
    before its first backward use (the gradients of the same ops, twice their
    forward GEMM FLOPs, plus the recomputations); what does not hide is time.

    - `policy=keep`: keep every `h`; `recompute`: recompute every one;
      `offload`: offload every one; `auto`: without a budget keep, with one
      the fastest mix of keep, recompute and (with `auto-offload`) offload
      per op that fits (exhaustive up to 10 candidates, greedy above).
    - `memory-budget` (B, kB, MB, GB, TB, KiB, MiB, GiB, TiB): the plan must
      fit, or the pass fails with an error on the function naming the
      smallest budget that can be met and what each plan needs. A budget needs
      static shapes.

    The function gets `moe.activation_plan` ("keep", "recompute", "offload"
    or "partial") and, with static shapes, `moe.saved_bytes` (device) and,
    when something is offloaded, `moe.offloaded_bytes` (host); with `report`
    (the default) a remark gives the bytes and time of each plan:

    ```
    remark: activation plan 'partial' (policy auto, memory-budget 700 B
        (6.52e-07 GiB)): keep saves 852 B (7.93e-07 GiB), recompute saves
        340 B (3.17e-07 GiB) and adds 8192 FLOPs (1.05e-05 us at 780
        TFLOP/s), offload saves 340 B (3.17e-07 GiB) and adds 0.0186 us of
        copies compute does not hide (at 55 GB/s); planned 596 B (5.55e-07
        GiB) on the device, 1 recomputed and 0 offloaded of 2 expert FFNs,
        4096 extra FLOPs, 5.25e-06 us added
    ```

    The pass runs before backward exists so that its choice is an ordinary
    `moe.checkpoint` or an attribute (docs/memory.md).
  }];
  let options = [
    Option<"memoryBudget", "memory-budget", "std::string", /*default=*/"\"\"",
           "Activation bytes the layer may keep on the device for backward, "
           "e.g. 4GiB (empty: no limit)">,
    Option<"policy", "policy", "std::string", /*default=*/"\"auto\"",
           "keep, recompute, offload or auto">,
    Option<"autoOffload", "auto-offload", "bool", /*default=*/"true",
           "Whether policy=auto may offload">,
    Option<"gpuTflops", "gpu-tflops", "double", /*default=*/"780.0",
           "GPU rate that turns recompute FLOPs into time (TFLOP/s; "
           "the bf16 ceiling measured on the H200, docs/benchmarks.md)">,
    Option<"hostGbps", "host-gbps", "double", /*default=*/"55.0",
           "Host-link bandwidth of each copy direction (GB/s; measured on "
           "the H200, PCIe 5.0 x16, pinned 1 GiB copies: 55.4 GB/s)">,
    Option<"report", "report", "bool", /*default=*/"true",
           "Emit a remark with the saved bytes of each plan">,
  ];
  let dependentDialects = ["::mlir::moe::MoEDialect"];
}

def MoEOffload : Pass<"moe-offload", "::mlir::ModuleOp"> {
  let summary = "move the saved tensors an activation plan offloads to host memory and back";
  let description = [{
    Runs after `moe-generate-backward`, on the pairs `@f_forward` /
    `@f_backward` it makes: forward returns its saved tensors after its
    results (`moe.num_saved` of them), backward takes them in the same order
    as its first arguments. For every `moe.expert_ffn` and
    `moe.shared_expert` of `@f_forward` that `moe-plan-activations` marked
    `moe.plan = "offload"`, its `h`

    - goes through `moe.offload` right after its last forward use, and the
      training forward returns the `!moe.host_tensor`;
    - is taken by `@f_backward` as that `!moe.host_tensor` (argument
      attribute `moe.offloaded`) and brought back by `moe.prefetch`, which
      every use then reads. With `prefetch=early` (the default) the
      prefetches come first in backward, in the order of first use, so that
      the copies overlap the backward compute before each first use, as the
      cost model of `moe-plan-activations` assumes; with `prefetch=late`
      each comes right before its first use (the least device memory,
      nothing overlapped). Either way backward's work that needs no
      prefetched tensor then moves ahead of the work that does (a stable
      partition; nothing moves where an op has side effects), so that the
      copies overlap it.

    ```mlir
    %y, %h = moe.expert_ffn ... {moe.plan = "offload"} ...
    %host = moe.offload %h : tensor<8x16xbf16> -> !moe.host_tensor<8x16xbf16>
    return %out, ..., %host : ..., !moe.host_tensor<8x16xbf16>
    // @f_backward(..., %arg7: !moe.host_tensor<8x16xbf16> {moe.offloaded}, ...)
    %h = moe.prefetch %arg7 : !moe.host_tensor<8x16xbf16> -> tensor<8x16xbf16>
    ```

    Errors: a mark on another op or inside a region, a mark in a function
    that has no training pair (moe-generate-backward did not run) or in a
    backward function, an `h` that backward does not save, a training
    forward without its backward, saved types that differ between the two.
    Running the pass twice changes nothing the second time.
  }];
  let options = [
    Option<"prefetch", "prefetch", "std::string", /*default=*/"\"early\"",
           "Where moe.prefetch goes in backward: early (first, in the order "
           "of first use) or late (right before the first use)">,
  ];
  let dependentDialects = ["::mlir::func::FuncDialect",
                           "::mlir::moe::MoEDialect"];
}

def MoEPlanMemory : Pass<"moe-plan-memory", "::mlir::ModuleOp"> {
  let summary = "each function's workspace arena at static offsets for a training step, and a memory report";
  let description = [{
    Plans device memory at the moe level, where every tensor value is one
    buffer whose static type gives its size (the `moe` ops and the few
    `arith`/`tensor` ops between them; bufferization on the CPU path comes
    later and adds its own copies). A step is the training forward
    `@f_forward` followed by `@f_backward` (the pair `moe-generate-backward`
    makes), numbered op by op as one sequence; a function with moe ops that
    belongs to no pair is a step of its own. The plan is the one the GPU path
    executes: `convert-moe-to-gpu` allocates each function's temporaries at
    these offsets and places nothing itself.

    - A buffer lives from the op that defines it to its last use. Arguments
      (x, weights, result gradients) belong to the caller. What a function
      returns is the caller's too (an out-parameter): a saved tensor lives
      from its definition in forward to its last use in backward.
    - Every other tensor is a temporary in the workspace of its function:
      one arena per function, placed largest buffer first, each at the
      best-fitting gap (the smallest that holds it) among the buffers live at
      the same time, at multiples of `alignment`. The pass checks that no two
      buffers of an arena live at the same op overlap.
    - An op with `accumulate` (`moe-fold-adds`) writes its result over that
      operand: one buffer for both. An expert FFN's y that nothing reads
      (h recomputed in backward) has none.
    - An offloaded tensor leaves the device at its `moe.offload`; its host
      copy is listed apart, and `moe.prefetch` makes a new device buffer. Both
      device buffers are allocated apart (their copies run on another stream,
      which the arena's op order cannot see).

    Every op gets `moe.arena_offsets` (one offset per result, -1 for results
    outside the arena) and each function `moe.arena_size`, the size of its
    own arena. With `memory-report` (`-` for stdout, or a file) it prints each
    op, each buffer with its size, place (its offset in its function's arena,
    `returned` or `apart`) and `[first, last]` op, the peak (the most device
    bytes live at one op, wherever they are), each arena's size and the
    saved-for-backward total:

    ```
    moe-plan-memory: forward @f_forward ops [0, 6], backward @f_backward ops [7, 12], alignment 256 B
    op 0 moe.router
    ...
    buffer 0 moe.router.weights: 32 B returned, live [0, 8], saved
    buffer 6 moe.expert_ffn.y: 256 B at offset 0 in @f_forward, live [2, 3]
    buffer 7 moe.expert_ffn.h: 256 B apart, live [2, 3]
    host 8 moe.offload: 256 B, live [3, 10]
    peak: 5364 B (5e-06 GiB) at op 12
    arena @f_forward: 384 B (3.58e-07 GiB)
    arena @f_backward: 416 B (3.87e-07 GiB)
    saved for backward: 212 B (1.97e-07 GiB) in 6 buffers, and 4864 B (4.53e-06 GiB) of saved arguments
    offloaded to the host: 512 B (4.77e-07 GiB)
    ```

    `python/moe_mlir/memory_plot.py` turns the report into a PNG timeline.
    Dynamic shapes are an error on the value.
  }];
  let options = [
    Option<"alignment", "alignment", "int64_t", /*default=*/"256",
           "Offsets are multiples of this many bytes (a power of two)">,
    Option<"memoryReport", "memory-report", "std::string", /*default=*/"\"\"",
           "Where to print the memory report: - for stdout, or a file "
           "(empty: no report)">,
  ];
  let dependentDialects = ["::mlir::moe::MoEDialect"];
}

def MoEFoldAdds : Pass<"moe-fold-adds", "::mlir::ModuleOp"> {
  let summary = "folds a layer's adds into the op that makes one of their parts";
  let description = [{
    Replaces `sum = arith.addf X, P` on tensors, where P is the `dx` of
    `moe.router_grad`, the `dx` of `moe.expert_combine_grad` or the `out` of
    `moe.combine`, by P's op with `accumulate(X)`: on the GPU, X is written
    straight into the sum's buffer and P's op adds into it (its `_acc` host
    function), so the add runs no kernel. An add folds only where

    - the sum has a buffer of its own: the function returns it, or it is the
      X of a later fold (the adds are visited last first);
    - P and X are used by the add alone, and X is made by an op (not a
      `moe.prefetch`) in the same block;
    - X is computed before P's op, or P's op can move to right before the
      add: nothing reads its results before, and it would not move past work
      that waits for a prefetch;
    - the `dx` config that `moe_gpu.kernels` chooses for a `moe.router_grad`
      can accumulate (a store_bf16 epilogue stored by TMA boxes).

    Either order of the add's operands folds; an order that needs no move
    is tried first. It runs in the GPU pipeline right after
    `moe-gpu-select-kernels`. Before:

    ```mlir
    %dx_r, %dwr = moe.router_grad %x, %wr, %logits, %experts, %dw {...} : ...
    %sum = arith.addf %dx_e, %dx_r : tensor<37x128xbf16>
    return %sum, ...
    ```

    After:

    ```mlir
    %dx_r, %dwr = moe.router_grad %x, %wr, %logits, %experts, %dw
        accumulate(%dx_e : tensor<37x128xbf16>) {...} : ...
    return %dx_r, ...
    ```
  }];
  let options = [];
  let dependentDialects = ["::mlir::arith::ArithDialect",
                           "::mlir::moe::MoEDialect"];
}

def MoEEPStages : Pass<"moe-ep-stages", "::mlir::ModuleOp"> {
  let summary = "splits each function at its expert-parallel collectives into stages";
  let description = [{
    A function with `moe.ep_dispatch` or `moe.ep_combine` cannot run on one
    rank alone: between the halves of each, the caller's engine moves rows
    between ranks (an all-to-all). This pass replaces such a function `@f`
    by `@f_stage0` ... `@f_stageN` (N collectives), each running on this rank
    alone, in program order:

    - stage `i` ends with the sending half of collective `i`: a dispatch
      becomes `moe.ep_pack`, whose `send` (C rows for each rank),
      `send_counts` (E / S for each rank) and `dropped` the stage returns; a
      combine returns the rows it sends back as they are;
    - stage `i + 1` begins with the receiving half: a dispatch's `received`
      and `received_counts` are arguments, a combine's returned rows are an
      argument that `moe.ep_unpack` places;
    - a value one stage makes and a later one reads is returned by the first
      and taken by the other (a carry); an argument of `@f` is taken by each
      stage that reads it.

    Each stage says what its arguments and results are, so that the caller
    can run them (docs/distributed.md): `moe.ep_inputs` (`argJ`, `carryJ`,
    `receivedC`, `received_countsC`, `returnedC`), `moe.ep_outputs`
    (`sendC`, `send_countsC`, `droppedC`, `carryJ`, `resultK`), and on every
    stage `moe.ep_stage_of`, `moe.ep_stage`, `moe.ep_stages`,
    `moe.ep_collectives` (`dispatch`/`combine`, with `moe.ep_size`,
    `moe.ep_capacity` and `moe.ep_overflows`: a dispatch's `error` or `drop`,
    `none` for a combine) and `moe.ep_results`: where each result of `@f` comes
    from (`argJ`, or `stageI`: that stage's `resultK`). A training pair's
    `moe.num_saved` and `moe.gradient_args` become `moe.ep_num_saved` and
    `moe.ep_gradient_args` on its stages. Recomputation never reaches a
    collective: the values a stage needs are carried.

    The collectives of one function must share `ep_size` and `capacity`.
  }];
  let dependentDialects = ["::mlir::func::FuncDialect",
                           "::mlir::moe::MoEDialect"];
}

#endif // MOE_DIALECT_MOE_TRANSFORMS_PASSES_TD
