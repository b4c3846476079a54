//===- Elementwise.cpp - moe_add ------------------------------------------===//
//
// out = a + b over N bf16 values in f32: 8 values a thread by 16-byte vector
// loads, and a scalar tail where the vector would run past N.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"

using namespace mlir;
using namespace mlir::moe::kernels;

void mlir::moe::kernels::buildAddKernel(OpBuilder &b, Location loc) {
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type();
  MemRefType buffer = flatBuffer(bf16);
  gpu::GPUFuncOp kernel = createKernel(
      b, loc, "moe_add", {buffer, buffer, buffer, b.getIndexType()});
  Value a = kernel.getArgument(0), bIn = kernel.getArgument(1),
        out = kernel.getArgument(2), n = kernel.getArgument(3);

  Value gid = buildGlobalThreadId(b, loc);
  Value one = indexConstant(b, loc, 1);
  Value eight = indexConstant(b, loc, 8);
  Value base = arith::MulIOp::create(b, loc, gid, eight);
  Value end = arith::AddIOp::create(b, loc, base, eight);
  Value full = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ule, end, n);
  auto ifFull = scf::IfOp::create(b, loc, full, /*withElseRegion=*/true);
  {
    OpBuilder::InsertionGuard guard(b);
    b.setInsertionPointToStart(ifFull.thenBlock());
    auto wide = [&](Type element) { return VectorType::get({8}, element); };
    llvm::MaybeAlign align(16);
    Value x = vector::LoadOp::create(b, loc, wide(bf16), a, base,
                                     /*nontemporal=*/false, align);
    Value y = vector::LoadOp::create(b, loc, wide(bf16), bIn, base,
                                     /*nontemporal=*/false, align);
    Value xf = arith::ExtFOp::create(b, loc, wide(f32), x);
    Value yf = arith::ExtFOp::create(b, loc, wide(f32), y);
    Value sum = arith::AddFOp::create(b, loc, xf, yf);
    Value rounded = arith::TruncFOp::create(b, loc, wide(bf16), sum);
    vector::StoreOp::create(b, loc, rounded, out, base, /*nontemporal=*/false,
                            align);

    b.setInsertionPointToStart(ifFull.elseBlock());
    Value last = arith::MinUIOp::create(b, loc, end, n);
    Value lo = arith::MinUIOp::create(b, loc, base, last);
    auto loop = scf::ForOp::create(b, loc, lo, last, one);
    b.setInsertionPointToStart(loop.getBody());
    Value i = loop.getInductionVar();
    Value xs = memref::LoadOp::create(b, loc, a, i);
    Value ys = memref::LoadOp::create(b, loc, bIn, i);
    Value xsf = arith::ExtFOp::create(b, loc, f32, xs);
    Value ysf = arith::ExtFOp::create(b, loc, f32, ys);
    Value s = arith::AddFOp::create(b, loc, xsf, ysf);
    Value sb = arith::TruncFOp::create(b, loc, bf16, s);
    memref::StoreOp::create(b, loc, sb, out, i);
  }
  gpu::ReturnOp::create(b, loc);
}
