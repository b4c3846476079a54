//===- SelectionBias.cpp - moe.update_selection_bias ----------------------===//
//
// The selection-bias update of auxiliary-loss-free balancing in two kernels:
// moe_selection_bias_count, an integer histogram of the routing slots by
// global atomics (a thread a slot; integer adds commute, so the loads do not
// depend on the order the atomics land), then moe_selection_bias_update, one
// block that sums the loads and moves each expert's bias. Every thread sums
// all E loads itself (E <= the contract's max_experts), which needs neither
// shared memory nor a barrier.
//
//===----------------------------------------------------------------------===//

#include "HostBuilder.h"
#include "Kernels.h"
#include "SimpleKernels.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::kernels;

void mlir::moe::kernels::buildSelectionBiasCountKernel(OpBuilder &b,
                                                       Location loc) {
  Type i32 = b.getI32Type(), index = b.getIndexType();
  MemRefType slots = flatBuffer(i32);
  gpu::GPUFuncOp kernel = createKernel(b, loc, "moe_selection_bias_count",
                                       {slots, index, index, slots});
  Value experts = kernel.getArgument(0), numSlots = kernel.getArgument(1),
        numExperts = kernel.getArgument(2), loads = kernel.getArgument(3);
  Value gid = buildGlobalThreadId(b, loc);
  Value zero = i32Constant(b, loc, 0);
  Value one = i32Constant(b, loc, 1);
  Value in =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, gid, numSlots);
  buildIf(b, loc, in, [&] {
    Value x = memref::LoadOp::create(b, loc, experts, gid);
    // Entries outside [0, E) (-1: no expert) are not counted.
    Value e = arith::IndexCastOp::create(b, loc, index, x);
    Value notNegative =
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sge, x, zero);
    Value below =
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::slt, e, numExperts);
    Value valid = arith::AndIOp::create(b, loc, notNegative, below);
    buildIf(b, loc, valid, [&] {
      memref::AtomicRMWOp::create(b, loc, arith::AtomicRMWKind::addi, one,
                                  loads, e);
    });
  });
  gpu::ReturnOp::create(b, loc);
}

void mlir::moe::kernels::buildSelectionBiasUpdateKernel(OpBuilder &b,
                                                        Location loc) {
  Type i32 = b.getI32Type(), i64 = b.getI64Type(), f32 = b.getF32Type(),
       index = b.getIndexType();
  MemRefType floats = flatBuffer(f32);
  gpu::GPUFuncOp kernel =
      createKernel(b, loc, "moe_selection_bias_update",
                   {floats, flatBuffer(i32), index, f32, i32, floats});
  Value bias = kernel.getArgument(0), loads = kernel.getArgument(1),
        numExperts = kernel.getArgument(2), rate = kernel.getArgument(3),
        rule = kernel.getArgument(4), result = kernel.getArgument(5);
  Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
  Value c0 = indexConstant(b, loc, 0);
  Value c1 = indexConstant(b, loc, 1);
  Value threads = indexConstant(b, loc, kSimpleThreads);
  Value zero32 = i32Constant(b, loc, 0);
  Value zero64 = arith::ConstantIntOp::create(b, loc, i64, 0);
  Value zeroF = f32Constant(b, loc, 0.0f);
  Value oneF = f32Constant(b, loc, 1.0f);
  Value minusOneF = f32Constant(b, loc, -1.0f);
  // The counted slots, in i64 like E * load_e below.
  Value total =
      buildFor(b, loc, c0, numExperts, c1, zero64, [&](Value e, Value acc) {
        Value n = memref::LoadOp::create(b, loc, loads, e);
        Value wide = arith::ExtSIOp::create(b, loc, i64, n);
        return arith::AddIOp::create(b, loc, acc, wide).getResult();
      });
  Value none =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, total, zero64);
  Value totalF = arith::SIToFPOp::create(b, loc, f32, total);
  Value signRule =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, rule, zero32);
  Value experts64 = arith::IndexCastOp::create(b, loc, i64, numExperts);
  buildFor(b, loc, tid, numExperts, threads, [&](Value e) {
    Value old = memref::LoadOp::create(b, loc, bias, e);
    Value n = memref::LoadOp::create(b, loc, loads, e);
    Value wide = arith::ExtSIOp::create(b, loc, i64, n);
    // E * (mean - load_e), exact.
    Value scaled = arith::MulIOp::create(b, loc, experts64, wide);
    Value diff = arith::SubIOp::create(b, loc, total, scaled);
    Value pos =
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::sgt, diff, zero64);
    Value neg =
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::slt, diff, zero64);
    Value up = arith::SelectOp::create(b, loc, pos, oneF, zeroF);
    Value sign = arith::SelectOp::create(b, loc, neg, minusOneF, up);
    Value diffF = arith::SIToFPOp::create(b, loc, f32, diff);
    Value ratio = arith::DivFOp::create(b, loc, diffF, totalF);
    Value step = arith::SelectOp::create(b, loc, signRule, sign, ratio);
    Value change = arith::MulFOp::create(b, loc, rate, step);
    Value moved = arith::AddFOp::create(b, loc, old, change);
    Value v = arith::SelectOp::create(b, loc, none, old, moved);
    memref::StoreOp::create(b, loc, v, result, e);
  });
  gpu::ReturnOp::create(b, loc);
}

void mlir::moe::host::buildUpdateSelectionBiasHost(OpBuilder &b,
                                                   ModuleOp module) {
  Type f32 = b.getF32Type(), i32 = b.getI32Type();
  HostFunctionBuilder h(b, module, "update_selection_bias",
                        {{"bias", buffer(f32)},
                         {"experts", buffer(i32, 2)},
                         {"rate", f32},
                         {"rule", i32},
                         {"result", buffer(f32)}});
  Value one = h.c(1);
  Value e = h.dim(h.arg("bias"), 0);
  Value t = h.dim(h.arg("experts"), 0);
  Value k = h.dim(h.arg("experts"), 1);
  Value slots = h.mul(t, k);
  Value experts = h.flat(h.arg("experts"));
  Value loads = h.alloc(h.grid(e), i32);
  Value zero = h.cI32(0);
  h.memset(loads, zero);
  Value blocks = h.grid(h.ceil(slots, kThreads));
  h.launch("moe_selection_bias_count", blocks, one, one,
           {experts, slots, e, loads});
  h.launch(
      "moe_selection_bias_update", one, one, one,
      {h.arg("bias"), loads, e, h.arg("rate"), h.arg("rule"), h.arg("result")});
  h.dealloc(loads);
  h.finish();
}
