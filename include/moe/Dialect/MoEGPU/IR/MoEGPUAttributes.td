//===- MoEGPUAttributes.td - moe_gpu dialect attributes ------*- tablegen -*-===//

#ifndef MOE_DIALECT_MOEGPU_IR_MOEGPUATTRIBUTES_TD
#define MOE_DIALECT_MOEGPU_IR_MOEGPUATTRIBUTES_TD

include "moe/Dialect/MoEGPU/IR/MoEGPUBase.td"
include "moe/Dialect/MoEGPU/IR/MoEGPUEnums.td"

// An enum parameter documented by its values (the attribute's assembly is
// hand-written, so EnumParameter's parser and printer go unused).
class MoEGPU_EnumParameter<EnumAttrInfo info, string values>
    : EnumParameter<info> {
  let summary = info.summary # ": " # values;
}

def MoEGPU_GemmConfigAttr : MoEGPU_Attr<"GemmConfig", "gemm"> {
  let summary = "configuration of one grouped GEMM kernel";
  let description = [{
    Everything that tells one grouped GEMM kernel of the GPU path from
    another: the kernel builder builds the kernel from it alone
    (docs/gpu-kernels.md). Two kernels differ exactly when their
    configurations do, and `kernelName()` names them apart.

    What the kernel computes:
    - `a`: `gather` (row r is row `ids[r]`, a dispatch queue), `rows` (an
      expert's contiguous rows, K-major) or `mn` (an expert's rows along K,
      MN-major: the weight gradients).
    - `b`: the expert weights by TMA, `w_mn` (`[K, N]`, N contiguous),
      `w_mn_swiglu` (the same, a tile taking gate and up columns) or `w_k`
      (`[N, K]`); or `rows_mn`, token rows along K by cp.async.
    - `gathered` (`none`): the operand a varlen-K GEMM gathers, `a` or `b`.
    - `epilogue`: `store_bf16`, `store_bf16_w` (an expert's block of a weight
      gradient), `store_f32`, `swiglu` or `dswiglu`; `store_a` (false):
      `swiglu` also writes A = silu(gate) * up; `with_router_weight` and
      `with_ds` (false): `dswiglu` scales by the routing weight and writes the
      dS partials; `accumulate` (false): C += the tile by TMA reduce-add.
    - `problem`: `varlen_m` (experts' rows along M) or `varlen_k` (along K).

    How it is built; left out, a parameter takes its default for the kernel
    above, and it is printed only when it differs:
    - `tile` ([128, 256, 64]): M, N, K of a CTA's tile.
    - `stages` (3 for the persistent epilogues, else 4): ring stages.
    - `warp_specialized` (true for the persistent epilogues) and
      `registers` ([72, 216]): the producer's and consumers' setmaxnreg.
    - `schedule` (`static`) or `dynamic`; `idle_skip` (true when dynamic).
    - `group_m` (16): M-tiles a raster group.
    - `rows_tma` (true when warp-specialized with a gathered operand): the
      other operand's rows by TMA boxes.
    - `store`: `ring` (one-tile kernels), `threads`, `bulk_rows` or
      `tma_boxes` (the default for warp-specialized store_bf16 and gathered
      store_bf16_w); `threads` for the other persistent ones.
    - `dact_unroll` (4): the dSwiGLU epilogue's rows a warp loads ahead.
    - `activation` (`swiglu`): the function of the `swiglu` and `dswiglu`
      epilogues. `swiglu` is gated (H holds gate and up, A = silu(gate) *
      up; the up GEMM's b = w_mn_swiglu); `silu`, `gelu_tanh` and `gelu_erf`
      are not (A = act(H) element-wise, H as wide as A; b = w_mn).
    - `bias` (false): the `swiglu` and the varlen-M `store_bf16` epilogues add
      the tile's expert's bias row (an extra `[E, N]` bf16 argument; for a
      gated `swiglu`, `[E, 2N]` in H's gate-then-up layout) to the
      accumulator before the activation or the store: the expert biases.

    The persistent kernels' CTA count is not a parameter: it is the chip's
    SM count, a launch decision.

    ```mlir
    #moe_gpu.gemm<a = gather, b = w_mn_swiglu, epilogue = swiglu,
                  store_a = true, problem = varlen_m>
    #moe_gpu.gemm<a = rows, b = w_k, epilogue = store_bf16, problem = varlen_m,
                  stages = 2, schedule = dynamic>
    ```
  }];
  let parameters = (ins
    MoEGPU_EnumParameter<MoEGPU_AOperand, "gather, rows, mn">:$a,
    MoEGPU_EnumParameter<MoEGPU_BOperand,
        "w_mn, w_mn_swiglu, w_k, rows_mn">:$b,
    MoEGPU_EnumParameter<MoEGPU_GatheredOperand, "none, a, b">:$gathered,
    MoEGPU_EnumParameter<MoEGPU_GemmEpilogue,
        "store_bf16, store_bf16_w, store_f32, swiglu, dswiglu">:$epilogue,
    AttrParameter<"bool", "swiglu also writes A">:$store_a,
    AttrParameter<"bool", "dswiglu scales by the routing weight">
        :$with_router_weight,
    AttrParameter<"bool", "dswiglu writes the dS partials">:$with_ds,
    AttrParameter<"bool", "C += the tile (TMA reduce-add)">:$accumulate,
    MoEGPU_EnumParameter<MoEGPU_GemmProblem, "varlen_m, varlen_k">:$problem,
    AttrParameter<"int64_t", "tile rows (M)">:$tile_m,
    AttrParameter<"int64_t", "tile columns (N)">:$tile_n,
    AttrParameter<"int64_t", "tile depth (K)">:$tile_k,
    AttrParameter<"int64_t", "ring stages">:$stages,
    AttrParameter<"bool", "a producer warpgroup issues the copies">
        :$warp_specialized,
    AttrParameter<"int64_t", "producer registers (setmaxnreg)">
        :$producer_registers,
    AttrParameter<"int64_t", "consumer registers (setmaxnreg)">
        :$consumer_registers,
    MoEGPU_EnumParameter<MoEGPU_TileSchedule, "static, dynamic">:$schedule,
    AttrParameter<"bool", "idle warpgroups skip their wgmma">:$idle_skip,
    AttrParameter<"int64_t", "M-tiles a raster group">:$group_m,
    AttrParameter<"bool", "the non-gathered rows by TMA">:$rows_tma,
    MoEGPU_EnumParameter<MoEGPU_StorePath,
        "ring, threads, bulk_rows, tma_boxes">:$store,
    AttrParameter<"int64_t", "dSwiGLU rows loaded ahead">:$dact_unroll,
    MoEGPU_EnumParameter<MoEGPU_GemmActivation,
        "swiglu, silu, gelu_tanh, gelu_erf">:$activation,
    AttrParameter<"bool", "the epilogue adds the expert's bias row">:$bias
  );
  let builders = [
    AttrBuilder<(ins "const GemmConfig &":$config), [{
      GemmConfig c = config.resolved();
      return $_get($_ctxt, c.a, c.b, c.gathered, c.epilogue, c.storeA,
                   c.withRouterWeight, c.withDs, c.accumulate, c.problem,
                   c.tileM, c.tileN, c.tileK, *c.stages, *c.warpSpecialized,
                   c.producerRegisters, c.consumerRegisters, c.schedule,
                   *c.idleSkip, c.groupM, *c.rowsTma, *c.store, c.dactUnroll,
                   c.activation, c.bias);
    }]>
  ];
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// The parameters, every one set.
    GemmConfig getConfig() const;
    /// Threads a CTA: 256 consumers, plus a producer warpgroup when
    /// warp-specialized.
    int64_t threads() const;
    /// Whether CTAs walk the tiles (the bf16 epilogues) rather than compute
    /// one each.
    bool persistent() const;
    /// The dynamic shared memory a CTA is launched with (see
    /// gemmLaunchSharedMemoryBytes).
    int64_t launchSharedMemoryBytes() const;
    /// The kernel's symbol name (see gemmKernelName).
    std::string kernelName() const;
  }];
}

#endif // MOE_DIALECT_MOEGPU_IR_MOEGPUATTRIBUTES_TD
