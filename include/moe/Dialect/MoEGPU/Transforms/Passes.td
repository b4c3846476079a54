//===- Passes.td - moe_gpu passes ----------------------------*- tablegen -*-===//

#ifndef MOE_DIALECT_MOEGPU_TRANSFORMS_PASSES
#define MOE_DIALECT_MOEGPU_TRANSFORMS_PASSES

include "mlir/Pass/PassBase.td"

def MoEGPUSelectKernels
    : Pass<"moe-gpu-select-kernels", "::mlir::ModuleOp"> {
  let summary = "chooses the GEMM kernel config of each moe op for the GPU path";
  let description = [{
    Gives every moe op that runs GEMMs on the GPU path a `moe_gpu.kernels`
    dictionary: one `#moe_gpu.gemm` config per GEMM role of the op, chosen
    from the op's static shapes (tokens, hidden size, expert width, experts,
    top-k) and the chip. The roles:

    | op | roles |
    |---|---|
    | `moe.router` | `logits` |
    | `moe.router_grad` | `dx`, `dw` |
    | `moe.expert_ffn`, `moe.shared_expert` | `up`, `down` |
    | `moe.expert_combine_grad`, `moe.shared_expert_grad` | `dact`, `dx`, `dw_down`, `dw_gate_up` |

    A role already in an op's `moe_gpu.kernels` is kept (a user's or an
    earlier pass's choice overrides the selection); an unknown role name is an
    error at the op. `configs` sets parameters of the configs the pass
    chooses, each entry `[OP.]ROLE:KEY=VALUE[:KEY=VALUE...]` with the keys
    and values of `#moe_gpu.gemm` (for example `expert_ffn.down:stages=2`,
    or `dact:dact_unroll=8` for the dSwiGLU GEMM of every op that has one);
    a later entry wins over an earlier one for the same key, and an op's own
    entry over all of them. The choice is each role's default config (the kernels
    the GPU library builds today): the table of per-shape choices is empty
    until they are measured. `convert-moe-to-gpu` checks every op's configs
    against the library by symbol lookup of their kernel names and refuses a
    config the library does not build, with a diagnostic at the op.

    `chip` names the target; only `sm_90a` has kernels. The module gets
    `moe_gpu.num_sms`, the SM count the kernels are launched for (the
    persistent GEMMs run a CTA an SM): the chip's (132 for `sm_90a`, H100
    SXM and H200), or `num-sms` (an H100 PCIe has 114).
  }];
  let options = [
    Option<"chip", "chip", "std::string", /*default=*/"\"sm_90a\"",
           "The GPU the kernels are chosen for (sm_90a)">,
    Option<"numSMs", "num-sms", "int64_t", /*default=*/"0",
           "SMs of the GPU the kernels run on (0: the chip's, 132 for "
           "sm_90a: H100 SXM and H200)">,
    ListOption<"configs", "configs", "std::string",
               "Parameters of the chosen configs: [OP.]ROLE:KEY=VALUE[:...], "
               "e.g. expert_ffn.down:stages=2">,
  ];
  let dependentDialects = ["::mlir::moe_gpu::MoEGPUDialect"];
}

#endif // MOE_DIALECT_MOEGPU_TRANSFORMS_PASSES
