//===- MoEToLinalg.h - moe to linalg/tensor/scf (CPU path) --*- C++ -*-===//

#ifndef MOE_CONVERSION_MOETOLINALG_MOETOLINALG_H
#define MOE_CONVERSION_MOETOLINALG_MOETOLINALG_H

namespace mlir {
class RewritePatternSet;
class TypeConverter;
} // namespace mlir

namespace mlir::moe {} // namespace mlir::moe

#endif // MOE_CONVERSION_MOETOLINALG_MOETOLINALG_H
