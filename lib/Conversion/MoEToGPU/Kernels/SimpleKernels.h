//===- SimpleKernels.h - helpers of the non-GEMM kernels -----*- C++ -*-===//
//
// Internal to the kernel builder. Structured control flow with the bodies
// given as callbacks, so that a builder reads in the order of the kernel's
// text: each callback builds its block's ops at the builder's
// insertion point, and the helper adds the scf.yield after them.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_LIB_CONVERSION_MOETOGPU_KERNELS_SIMPLEKERNELS_H
#define MOE_LIB_CONVERSION_MOETOGPU_KERNELS_SIMPLEKERNELS_H

#include "mlir/IR/Builders.h"
#include "llvm/ADT/STLFunctionalExtras.h"

namespace mlir::moe::kernels {

/// scf.if without results and without an else block.
void buildIf(OpBuilder &b, Location loc, Value cond,
             llvm::function_ref<void()> thenBody);

/// scf.if without results, with an else block.
void buildIfElse(OpBuilder &b, Location loc, Value cond,
                 llvm::function_ref<void()> thenBody,
                 llvm::function_ref<void()> elseBody);

/// scf.if yielding one value of `type`: each body returns the value its
/// block yields. Returns the if's result.
Value buildIfElse(OpBuilder &b, Location loc, Type type, Value cond,
                  llvm::function_ref<Value()> thenBody,
                  llvm::function_ref<Value()> elseBody);

/// scf.for without iter_args; `body` gets the induction variable.
void buildFor(OpBuilder &b, Location loc, Value lower, Value upper, Value step,
              llvm::function_ref<void(Value iv)> body);

/// scf.for with one iter_arg starting at `init`; `body` gets the induction
/// variable and the iter_arg and returns the value to yield. Returns the
/// loop's result.
Value buildFor(OpBuilder &b, Location loc, Value lower, Value upper, Value step,
               Value init, llvm::function_ref<Value(Value iv, Value acc)> body);

/// The warp's dot product of two bf16 rows in f32: the sum over columns c in
/// [col0, end) by `stride` of lhs[lhsBase + c .. + 8] * rhs[rhsBase + c ..
/// + 8] (16-byte loads; the lane's columns from col0 = 8 lane, stride 256),
/// its columns in order, then its 8 values in order, then the lanes by xor
/// shuffles, so every lane gets the same bits. `zeros` is a vector<8xf32> of
/// 0, `zero` an f32 0. Call it where the whole warp is converged.
Value buildWarpRowDot(OpBuilder &b, Location loc, Value lhs, Value lhsBase,
                      Value rhs, Value rhsBase, Value col0, Value end,
                      Value stride, Value zeros, Value zero);

/// Columns a thread moves at once: one 16-byte vector of bf16.
constexpr int64_t kColumns = 8;
constexpr int64_t kWarp = 32;

/// An i32 read from memory as an index (sign-extended), and whether it lies
/// in [0, n): one unsigned compare, since a negative value extends to more
/// than any size.
struct CheckedIndex {
  Value index;
  Value valid;
};
CheckedIndex checkIndex(OpBuilder &b, Location loc, Value value, Value n);

/// x / y and x % y of indices below 2^31, in 32 bits: ptxas's 64-bit division
/// takes a stack frame.
Value divU32(OpBuilder &b, Location loc, Value x, Value y);
Value remU32(OpBuilder &b, Location loc, Value x, Value y);

/// A warp a slot of a 128-thread block's warps (slot s = block * 4 + warp): its
/// lane, s, whether s < numSlots, and rows[s] as i32 (-1 past numSlots). The
/// load sits outside every branch, so that the warp's later shuffles see it
/// converged.
struct WarpSlot {
  Value lane, slot, inSlots, row;
};
WarpSlot buildWarpSlot(OpBuilder &b, Location loc, Value rows, Value numSlots);

/// arith.constant `value` of a float type, or a splat of it for a vector of
/// floats (arith.constant dense<value>), rounded to the element type.
Value floatConstant(OpBuilder &b, Location loc, Type type, double value);

} // namespace mlir::moe::kernels

#endif // MOE_LIB_CONVERSION_MOETOGPU_KERNELS_SIMPLEKERNELS_H
