//===- MoEOps.h - MoE dialect operations --------------------*- C++ -*-===//

#ifndef MOE_DIALECT_MOE_IR_MOEOPS_H
#define MOE_DIALECT_MOE_IR_MOEOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "moe/Dialect/MoE/IR/MoEAttributes.h"
#include "moe/Dialect/MoE/IR/MoEDialect.h"
#include "moe/Dialect/MoE/IR/MoETypes.h"

#define GET_OP_CLASSES
#include "moe/Dialect/MoE/IR/MoEOps.h.inc"

namespace mlir::moe {

/// On a function whose layers have a dynamic token count: the bound T may
/// reach (moe.layer's max_tokens, recorded by moe-decompose and kept on
/// @f_forward and @f_backward); every plan is made at it.
constexpr llvm::StringLiteral kMaxTokensAttr = "moe.max_tokens";

/// On a function compiled for one chunk of an expert-parallel step (moe.layer's
/// ep_chunk_tokens): the bound of the step's token count, which the runtime
/// splits into chunks of at most moe.max_tokens tokens.
constexpr llvm::StringLiteral kEPStepTokensAttr = "moe.ep_step_tokens";

/// The bound of `func` (its moe.max_tokens), if it has one.
std::optional<int64_t> getMaxTokens(Operation *func);

/// The `accumulate` operand of a moe.combine, moe.router_grad or
/// moe.expert_combine_grad that has one; null for any other op.
OpOperand *getAccumulateOperand(Operation *op);

/// The result of such an op that `accumulate` is added to (the combine's
/// out, the gradients' dx); null for any other op.
Value getAccumulatedResult(Operation *op);

} // namespace mlir::moe

#endif // MOE_DIALECT_MOE_IR_MOEOPS_H
