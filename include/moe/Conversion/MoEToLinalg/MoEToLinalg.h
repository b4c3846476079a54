//===- MoEToLinalg.h - moe to linalg/tensor/scf (CPU path) --*- C++ -*-===//

#ifndef MOE_CONVERSION_MOETOLINALG_MOETOLINALG_H
#define MOE_CONVERSION_MOETOLINALG_MOETOLINALG_H

namespace mlir {
class RewritePatternSet;
class TypeConverter;
} // namespace mlir

namespace mlir::moe {

/// `!moe.host_tensor<shape x type>` becomes `tensor<shape x type>`; every
/// other type is kept.
void populateMoEToLinalgTypeConversions(TypeConverter &typeConverter);

/// Patterns that turn every moe op except moe.layer, moe.checkpoint and
/// moe.yield (which `convert-moe-to-linalg` decomposes and inlines first)
/// into calls of the CPU kernels, moe.offload and moe.prefetch into tensor
/// copies, and convert host tensors in func signatures, calls and returns.
/// The kernels themselves are added by the pass.
void populateMoEToLinalgConversionPatterns(const TypeConverter &typeConverter,
                                           RewritePatternSet &patterns);

} // namespace mlir::moe

#endif // MOE_CONVERSION_MOETOLINALG_MOETOLINALG_H
