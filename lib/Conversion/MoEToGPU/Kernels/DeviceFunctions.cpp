//===- DeviceFunctions.cpp - the library's device functions ---------------===//
//
// The private func.func helpers of the library's gpu.module that its kernels
// call: exp and sigmoid on the SFU by inline PTX (no libdevice, so the PTX of
// every format is self-contained), and the router's score and weight
// gradient of one expert.
//
//===----------------------------------------------------------------------===//

#include "Kernels.h"
#include "SimpleKernels.h"
#include "moe/Conversion/MoEToGPU/KernelBuilder.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/IR/Builders.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::kernels;

namespace {

constexpr StringLiteral kExp = "__moe_gpu_exp";

/// A private func.func `name` of `argTypes` returning f32; the builder's
/// insertion point moves into its entry block.
func::FuncOp createDeviceFunction(OpBuilder &b, Location loc, StringRef name,
                                  TypeRange argTypes) {
  auto function = func::FuncOp::create(
      b, loc, name, b.getFunctionType(argTypes, {b.getF32Type()}));
  function.setPrivate();
  b.setInsertionPointToStart(function.addEntryBlock());
  return function;
}

/// One f32 through a one-instruction PTX function ("op $0, $1;").
Value inlinePtx(OpBuilder &b, Location loc, StringRef ptx, Value x) {
  return NVVM::InlinePtxOp::create(b, loc, TypeRange{b.getF32Type()},
                                   ValueRange{x}, ValueRange{}, ptx,
                                   /*predicate=*/Value())
      ->getResult(0);
}

Value callExp(OpBuilder &b, Location loc, Value x) {
  return func::CallOp::create(b, loc, StringRef(kExp),
                              TypeRange{b.getF32Type()}, ValueRange{x})
      .getResult(0);
}

/// exp(x) = 2^(x log2 e) by ex2.approx (~2 ulp).
void buildExp(OpBuilder &b, Location loc) {
  func::FuncOp function = createDeviceFunction(b, loc, kExp, {b.getF32Type()});
  Value log2e = f32Constant(b, loc, 1.44269504f);
  Value y = arith::MulFOp::create(b, loc, function.getArgument(0), log2e);
  Value r = inlinePtx(b, loc, "ex2.approx.ftz.f32 $0, $1;", y);
  func::ReturnOp::create(b, loc, r);
}

/// sigmoid(x) = 1 / (1 + exp(-x)) by rcp.approx (1 ulp): an IEEE division
/// branches to a slow path per element.
void buildSigmoid(OpBuilder &b, Location loc) {
  func::FuncOp function =
      createDeviceFunction(b, loc, "__moe_gpu_sigmoid", {b.getF32Type()});
  Value one = f32Constant(b, loc, 1.0f);
  Value n = arith::NegFOp::create(b, loc, function.getArgument(0));
  Value e = callExp(b, loc, n);
  Value d = arith::AddFOp::create(b, loc, e, one);
  Value r = inlinePtx(b, loc, "rcp.approx.ftz.f32 $0, $1;", d);
  func::ReturnOp::create(b, loc, r);
}

/// A router score from its logit l: softmax with the row's max and sum when
/// `soft`, else sigmoid.
void buildScore(OpBuilder &b, Location loc) {
  Type f32 = b.getF32Type();
  func::FuncOp function = createDeviceFunction(b, loc, "__moe_gpu_score",
                                               {f32, f32, f32, b.getI1Type()});
  Value l = function.getArgument(0), max = function.getArgument(1),
        sum = function.getArgument(2), soft = function.getArgument(3);
  Value one = f32Constant(b, loc, 1.0f);
  Value r = buildIfElse(
      b, loc, f32, soft,
      [&] {
        Value d = arith::SubFOp::create(b, loc, l, max);
        Value x = callExp(b, loc, d);
        return arith::DivFOp::create(b, loc, x, sum).getResult();
      },
      [&] {
        Value nl = arith::NegFOp::create(b, loc, l);
        Value x = callExp(b, loc, nl);
        Value den = arith::AddFOp::create(b, loc, x, one);
        return arith::DivFOp::create(b, loc, one, den).getResult();
      });
  func::ReturnOp::create(b, loc, r);
}

/// The gradient of a pick's score from its weight's gradient dw: through the
/// renormalisation (dw / S - W / S^2, 0 for S = 0) when `renorm`, times the
/// routing scale.
void buildDWeight(OpBuilder &b, Location loc) {
  Type f32 = b.getF32Type(), i1 = b.getI1Type();
  func::FuncOp function = createDeviceFunction(
      b, loc, "__moe_gpu_dweight", {f32, f32, f32, f32, i1, i1, f32});
  Value dw = function.getArgument(0), s = function.getArgument(1),
        w = function.getArgument(2), s2 = function.getArgument(3),
        nonZero = function.getArgument(4), renorm = function.getArgument(5),
        scaling = function.getArgument(6);
  Value zero = f32Constant(b, loc, 0.0f);
  Value a = arith::DivFOp::create(b, loc, dw, s);
  Value bTerm = arith::DivFOp::create(b, loc, w, s2);
  Value c = arith::SubFOp::create(b, loc, a, bTerm);
  Value r = arith::SelectOp::create(b, loc, nonZero, c, zero);
  Value q = arith::SelectOp::create(b, loc, renorm, r, dw);
  Value out = arith::MulFOp::create(b, loc, q, scaling);
  func::ReturnOp::create(b, loc, out);
}

struct DeviceFunctionEntry {
  StringLiteral name;
  void (*build)(OpBuilder &, Location);
};

/// The device functions, in the library's order.
constexpr DeviceFunctionEntry kDeviceFunctions[] = {
    {kExp, buildExp},
    {"__moe_gpu_sigmoid", buildSigmoid},
    {"__moe_gpu_score", buildScore},
    {"__moe_gpu_dweight", buildDWeight},
};

} // namespace

LogicalResult mlir::moe::buildLibraryDeviceFunctions(gpu::GPUModuleOp module) {
  for (const DeviceFunctionEntry &entry : kDeviceFunctions)
    if (module.lookupSymbol(entry.name))
      return module.emitError("the gpu.module already has a symbol @")
             << entry.name << " of the library's device functions";
  OpBuilder b(module.getContext());
  Location loc = module.getLoc();
  for (const DeviceFunctionEntry &entry : kDeviceFunctions) {
    b.setInsertionPoint(module.getBody(), module.getBody()->end());
    entry.build(b, loc);
  }
  return success();
}

SmallVector<StringRef> mlir::moe::libraryDeviceFunctionNames() {
  SmallVector<StringRef> names;
  for (const DeviceFunctionEntry &entry : kDeviceFunctions)
    names.push_back(entry.name);
  return names;
}
