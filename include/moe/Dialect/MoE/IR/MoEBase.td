//===- MoEBase.td - MoE dialect definition and base classes -*- tablegen -*-===//
//
// The `moe` dialect describes a Mixture-of-Experts training layer at tensor
// level: routing, dispatch queues, expert FFNs, combine, auxiliary losses,
// checkpoint/offload regions and the gradient op of each forward op.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_DIALECT_MOE_IR_MOEBASE_TD
#define MOE_DIALECT_MOE_IR_MOEBASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def MoE_Dialect : Dialect {
  let name = "moe";
  let cppNamespace = "::mlir::moe";
  let summary = "Mixture-of-Experts training layers";
  let description = [{
    The `moe` dialect describes one Mixture-of-Experts layer, forward and
    backward, at tensor level. Notation used throughout the op docs: `T`
    tokens, `d` hidden size, `n` expert FFN size, `E` experts, `k` experts per
    token (top-k), `m` shared-expert FFN size.

    Conventions:
    - Activations and weights are floating point (bf16, f16 or f32) with one
      element type per layer; routing weights, logits and scores are f32;
      expert indices, token ids and offsets are i32.
    - Weights are stored `[K, N]` with N contiguous: `x[T,d] · W_r[d,E]`,
      `x[q] · W_gate_up[e][d, 2n]`, `A · W_down[e][n, d]`.
    - A gated (SwiGLU) expert stores the gate projection in columns `[0, n)`
      and the up projection in columns `[n, 2n)` of `W_gate_up`.
    - Dispatch is described by queues, never by dense `[T, E, C]` tensors:
      `token_ids` lists the token of each row in expert order, `offsets`
      delimits each expert's rows and `rows[t, j]` is the row of the
      (token, slot) pair, or -1 when a capacity factor dropped it.
  }];
  let useDefaultTypePrinterParser = 1;
  let useDefaultAttributePrinterParser = 1;
  let dependentDialects = ["::mlir::tensor::TensorDialect"];
  // moe.max_tokens on a function (the others are checked by the passes that
  // read them).
  let hasOperationAttrVerify = 1;
  let extraClassDeclaration = [{
    void registerAttributes();
    void registerTypes();
  }];
}

class MoE_Op<string mnemonic, list<Trait> traits = []>
    : Op<MoE_Dialect, mnemonic, traits>;

class MoE_Type<string name, string typeMnemonic, list<Trait> traits = []>
    : TypeDef<MoE_Dialect, name, traits> {
  let mnemonic = typeMnemonic;
}

class MoE_Attr<string name, string attrMnemonic, list<Trait> traits = []>
    : AttrDef<MoE_Dialect, name, traits> {
  let mnemonic = attrMnemonic;
}

#endif // MOE_DIALECT_MOE_IR_MOEBASE_TD
