//===- HostFunctions.cpp - the library's host functions -------------------===//
//
// The host functions of the GPU library (func.func @__moe_gpu_*, outside the
// gpu.module): each launches the kernels of one MoE op on one async token
// (docs/gpu-path.md §1). This file holds HostFunctionBuilder, the helpers of
// several host functions, the forward ones (router, dispatch, expert and
// shared-expert FFN, combine, add) and the registry; HostBackward.cpp holds
// the backward ones.
//
//===----------------------------------------------------------------------===//

#include "HostBuilder.h"
#include "moe/Conversion/MoEToGPU/KernelBuilder.h"
#include "moe/Dialect/MoEGPU/IR/MoEGPUDialect.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"

#include <vector>

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::host;
using kernels::GemmTraits;
using moe_gpu::BOperand;
using moe_gpu::GemmEpilogue;
using Pred = arith::CmpIPredicate;

namespace {

constexpr StringLiteral kHostPrefix = "__moe_gpu_";

Type llvmPointer(MLIRContext *context) {
  return LLVM::LLVMPointerType::get(context);
}

/// (!llvm.ptr, i64 x 12) -> !llvm.ptr: the map's address, its rank, then
/// four dimensions, three strides and four box sizes.
FunctionType tensorMapFunctionType(MLIRContext *context) {
  Type ptr = llvmPointer(context);
  SmallVector<Type> inputs = {ptr};
  inputs.append(12, IntegerType::get(context, 64));
  return FunctionType::get(context, inputs, {ptr});
}

} // namespace

MemRefType mlir::moe::host::buffer(Type element, int64_t rank) {
  return MemRefType::get(SmallVector<int64_t>(rank, ShapedType::kDynamic),
                         element);
}

//===----------------------------------------------------------------------===//
// The library's GEMMs
//===----------------------------------------------------------------------===//

const GemmTraits &mlir::moe::host::libraryGemm(LibraryGemm gemm) {
  // Made once in a context of their own: the builder's context need not have
  // the moe_gpu dialect loaded.
  static const std::vector<GemmTraits> gemms = [] {
    MLIRContext context(MLIRContext::Threading::DISABLED);
    context.loadDialect<moe_gpu::MoEGPUDialect>();
    std::vector<GemmTraits> out;
    for (moe_gpu::GemmConfigAttr attr : moe_gpu::defaultGemmConfigs(&context))
      out.emplace_back(attr.getConfig());
    return out;
  }();
  auto index = static_cast<unsigned>(gemm);
  assert(index < gemms.size() && "no default GEMM of that index");
  return gemms[index];
}

HostGemms::HostGemms(
    ArrayRef<std::pair<StringRef, moe_gpu::GemmConfig>> chosenConfigs,
    std::string suffix)
    : nameSuffix(std::move(suffix)) {
  for (const auto &[role, config] : chosenConfigs) {
    std::optional<GemmTraits> accumulating;
    if (moe_gpu::canAccumulate(config)) {
      moe_gpu::GemmConfig acc = config;
      acc.accumulate = true;
      accumulating.emplace(acc);
    }
    chosen.push_back({role.str(), GemmTraits(config), std::move(accumulating)});
  }
}

const GemmTraits &HostGemms::get(StringRef role, LibraryGemm library) const {
  for (const Chosen &gemm : chosen)
    if (gemm.role == role)
      return gemm.traits;
  return libraryGemm(library);
}

const GemmTraits &HostGemms::getAccumulating(StringRef role,
                                             LibraryGemm library) const {
  for (const Chosen &gemm : chosen)
    if (gemm.role == role) {
      assert(gemm.accumulating && "the chosen config cannot accumulate");
      return *gemm.accumulating;
    }
  return libraryGemm(library);
}

//===----------------------------------------------------------------------===//
// HostFunctionBuilder
//===----------------------------------------------------------------------===//

HostFunctionBuilder::HostFunctionBuilder(
    OpBuilder &b, ModuleOp module, StringRef name,
    ArrayRef<std::pair<StringRef, Type>> argList)
    : Emitter(b, module.getLoc()), module(module), ctas(kDefaultNumCtas) {
  if (auto sms = module->getAttrOfType<IntegerAttr>(moe_gpu::kNumSMsAttrName);
      sms && sms.getInt() > 0)
    ctas = sms.getInt();
  Type tokenType = b.getType<gpu::AsyncTokenType>();
  SmallVector<Type> types = {tokenType};
  for (const auto &[argName, type] : argList)
    types.push_back(type);
  function = func::FuncOp::create(b, loc, (kHostPrefix + name).str(),
                                  b.getFunctionType(types, {tokenType}));
  function.setPrivate();
  Block *entry = function.addEntryBlock();
  b.setInsertionPointToStart(entry);
  setConstantEntry(*entry);
  token = entry->getArgument(0);
  for (auto [i, arg] : llvm::enumerate(argList))
    args[arg.first] = entry->getArgument(i + 1);
}

Value HostFunctionBuilder::arg(StringRef name) const {
  auto it = args.find(name);
  assert(it != args.end() && "the host function has no argument of that name");
  return it->second;
}

func::FuncOp HostFunctionBuilder::finish() {
  for (Value buf : counters)
    dealloc(buf);
  counters.clear();
  func::ReturnOp::create(b, loc, token);
  return function;
}

Value HostFunctionBuilder::dim(Value mem, int64_t i) {
  Value index = c(i);
  return memref::DimOp::create(b, loc, mem, index);
}

Value HostFunctionBuilder::flat(Value mem) {
  auto type = cast<MemRefType>(mem.getType());
  if (type.getRank() == 1)
    return mem;
  SmallVector<ReassociationIndices, 1> all(1);
  for (int64_t i = 0; i < type.getRank(); ++i)
    all.front().push_back(i);
  return memref::CollapseShapeOp::create(b, loc, buffer(type.getElementType()),
                                         mem, all);
}

Value HostFunctionBuilder::ceil(Value a, int64_t divisor) {
  Value bias = c(divisor - 1);
  Value sum = add(a, bias);
  Value d = c(divisor);
  return div(sum, d);
}

Value HostFunctionBuilder::grid(Value v) {
  Value one = c(1);
  return maxu(v, one);
}

std::pair<Value, Value>
HostFunctionBuilder::varlenTiles(Value rows, int64_t tileM, Value problems,
                                 Value cols, int64_t tileN) {
  Value mt = ceil(rows, tileM);
  Value mtiles = add(mt, problems);
  Value ntiles = ceil(cols, tileN);
  return {mtiles, ntiles};
}

Value HostFunctionBuilder::alloc(Value size, Type element) {
  auto op = gpu::AllocOp::create(
      b, loc, buffer(element), b.getType<gpu::AsyncTokenType>(),
      ValueRange{token}, ValueRange{size}, ValueRange{}, /*hostShared=*/false);
  token = op.getAsyncToken();
  return op.getMemref();
}

std::pair<Value, Value> HostFunctionBuilder::tileCounter() {
  if (counterWordsUsed == kCounterWords) {
    Value words = c(kCounterWords);
    Value buf = alloc(words, i32());
    Value zero = cI32(0);
    token = gpu::MemsetOp::create(b, loc, b.getType<gpu::AsyncTokenType>(),
                                  ValueRange{token}, buf, zero)
                .getAsyncToken();
    counters.push_back(buf);
    counterWordsUsed = 0;
  }
  ++counterWordsUsed;
  Value word = c(counterWordsUsed - 1);
  return {counters.back(), word};
}

void HostFunctionBuilder::dealloc(Value buf) {
  token = gpu::DeallocOp::create(b, loc, b.getType<gpu::AsyncTokenType>(),
                                 ValueRange{token}, buf)
              .getAsyncToken();
}

void HostFunctionBuilder::memset(Value buf, Value value) {
  token = gpu::MemsetOp::create(b, loc, b.getType<gpu::AsyncTokenType>(),
                                ValueRange{token}, buf, value)
              .getAsyncToken();
}

// The tensor maps' boxes: 64 columns (128 bytes, the span of the 128B
// swizzle) by the rows of a tile.
static constexpr int64_t kBoxColumns = hopper::kSwizzleRowElements;

Value HostFunctionBuilder::weightMap(const GemmTraits &g, const GemmValues &v) {
  Value n = v.dimN, k = v.dimK, e = v.numExperts;
  Value two = c(2);
  Value row = mul(v.ldb, two); // bytes
  switch (g.b) {
  case BOperand::WMn: { // [E][K][N]
    Value expert = mul(k, row);
    return tensorMap(v.bmat, {n, k, e}, {row, expert},
                     {kBoxColumns, g.config.tileK, 1});
  }
  case BOperand::WK: { // [E][N][K]
    Value expert = mul(n, row);
    return tensorMap(v.bmat, {k, n, e}, {row, expert},
                     {kBoxColumns, g.config.tileN, 1});
  }
  case BOperand::WMnSwiglu: { // [E][K][2][h]: gate and up halves of each row
    Value halves = c(2);
    Value two2 = c(2);
    Value half = mul(n, two2);
    Value expert = mul(k, row);
    return tensorMap(v.bmat, {n, halves, k, e}, {half, row, expert},
                     {kBoxColumns, 1, g.config.tileK, 1});
  }
  case BOperand::RowsMn:
    break;
  }
  llvm_unreachable("a weight map of a GEMM whose B is no weight");
}

Value HostFunctionBuilder::outMap(const GemmValues &v) {
  Value two = c(2);
  Value row = mul(v.ldc, two);
  Value mn = mul(v.dimM, v.dimN);
  Value two2 = c(2);
  Value expert = mul(mn, two2);
  return tensorMap(v.cout, {v.dimN, v.dimM, v.numExperts}, {row, expert},
                   {kBoxColumns, moe_gpu::kTileM, 1});
}

Value HostFunctionBuilder::rowsMap(Value mat, Value rows, Value cols, Value ld,
                                   int64_t boxRows) {
  Value zero = c(0);
  Value any = cmp(Pred::ugt, rows, zero);
  Type ptr = llvmPointer(b.getContext());
  auto ifOp = scf::IfOp::create(b, loc, TypeRange{ptr}, any,
                                /*withElseRegion=*/true);
  OpBuilder::InsertionGuard guard(b);
  b.setInsertionPointToStart(ifOp.thenBlock());
  Value two = c(2);
  Value row = mul(ld, two);
  Value map = tensorMap(mat, {cols, rows}, {row}, {kBoxColumns, boxRows});
  scf::YieldOp::create(b, loc, map);
  b.setInsertionPointToStart(ifOp.elseBlock());
  Value null = LLVM::ZeroOp::create(b, loc, ptr);
  scf::YieldOp::create(b, loc, null);
  return ifOp.getResult(0);
}

void HostFunctionBuilder::declareTensorMap() {
  if (module.lookupSymbol(kTensorMapFunctionName))
    return;
  OpBuilder moduleBuilder(b.getContext());
  moduleBuilder.setInsertionPoint(function);
  auto declaration =
      func::FuncOp::create(moduleBuilder, loc, kTensorMapFunctionName,
                           tensorMapFunctionType(b.getContext()));
  declaration.setPrivate();
}

Value HostFunctionBuilder::tensorMap(Value mat, ArrayRef<Value> dims,
                                     ArrayRef<Value> strides,
                                     ArrayRef<int64_t> box) {
  declareTensorMap();
  Type i64 = b.getI64Type();
  auto toI64 = [&](Value x) -> Value {
    return arith::IndexCastOp::create(b, loc, i64, x);
  };
  Value zero = cI64(0);
  SmallVector<Value> dimArgs, strideArgs, boxArgs;
  for (Value x : dims)
    dimArgs.push_back(toI64(x));
  dimArgs.resize(4, zero);
  for (Value x : strides)
    strideArgs.push_back(toI64(x));
  strideArgs.resize(3, zero);
  for (int64_t size : box)
    boxArgs.push_back(cI64(size));
  boxArgs.resize(4, zero);
  Value addr = memref::ExtractAlignedPointerAsIndexOp::create(b, loc, mat);
  Value addr64 = toI64(addr);
  Type ptrType = llvmPointer(b.getContext());
  Value ptr = LLVM::IntToPtrOp::create(b, loc, ptrType, addr64);
  // The map's rank: the box sizes given (none is 0).
  Value rank = cI64(box.size());
  SmallVector<Value> operands = {ptr, rank};
  llvm::append_range(operands, dimArgs);
  llvm::append_range(operands, strideArgs);
  llvm::append_range(operands, boxArgs);
  return func::CallOp::create(b, loc, kTensorMapFunctionName,
                              TypeRange{ptrType}, operands)
      .getResult(0);
}

void HostFunctionBuilder::launchGemm(const GemmTraits &g, Value mtiles,
                                     Value ntiles, Value gz, ValueRange args) {
  Value m = grid(mtiles);
  Value tiles = mul(m, ntiles);
  if (g.persistent) {
    Value all = mul(tiles, gz);
    Value gridCap = c(ctas);
    tiles = minu(all, gridCap);
    gz = c(1);
  }
  Value one = c(1);
  launch(g.name, tiles, one, gz, args,
         moe_gpu::gemmLaunchSharedMemoryBytes(g.config),
         moe_gpu::gemmThreads(g.config));
}

void HostFunctionBuilder::launch(StringRef kernel, Value gx, Value gy, Value gz,
                                 ValueRange args, int64_t sharedMemoryBytes,
                                 int64_t threads) {
  Value one = c(1);
  Value blockX = c(threads);
  Value smem = sharedMemoryBytes ? cI32(sharedMemoryBytes) : Value();
  Value x = grid(gx);
  Value y = grid(gy);
  Value z = grid(gz);
  MLIRContext *context = b.getContext();
  auto symbol = SymbolRefAttr::get(context, kKernelModuleName,
                                   {FlatSymbolRefAttr::get(context, kernel)});
  token = gpu::LaunchFuncOp::create(
              b, loc, symbol, {x, y, z}, {blockX, one, one}, smem, args,
              b.getType<gpu::AsyncTokenType>(), ValueRange{token})
              .getAsyncToken();
}

//===----------------------------------------------------------------------===//
// Helpers of several host functions
//===----------------------------------------------------------------------===//

SmallVector<Value> mlir::moe::host::gemmArgs(HostFunctionBuilder &h,
                                             const GemmTraits &g,
                                             GemmValues v) {
  if (g.tmaB)
    v.bmap = h.weightMap(g, v);
  if (g.tmaRowsA)
    v.amap = h.rowsMap(v.amat, v.rows, v.dimM, v.lda);
  if (g.tmaRowsB)
    v.browmap = h.rowsMap(v.bmat, v.rows, v.dimN, v.ldb);
  if (g.tmaStore)
    v.cmap = h.outMap(v);
  if (g.tmaStoreRows)
    v.cmap = h.rowsMap(v.cout, v.dimM, v.dimN, v.ldc, g.config.tileM);
  if (g.dynamic)
    std::tie(v.tileCounter, v.counterSlot) = h.tileCounter();

  // The kernel's arguments in order (gemm_signature).
  SmallVector<Value> out = {v.offsets, v.numExperts};
  if (g.a == moe_gpu::AOperand::Gather || g.gatherA)
    out.push_back(v.ids);
  out.append({v.amat, v.lda});
  if (g.b == BOperand::RowsMn && g.gatherB)
    out.push_back(v.bids);
  if (g.tmaRowsA)
    out.push_back(v.amap);
  if (g.tmaB) {
    out.push_back(v.bmap);
  } else {
    out.append({v.bmat, v.ldb});
    if (g.tmaRowsB)
      out.push_back(v.browmap);
  }
  out.append({v.dimM, v.dimN, v.dimK});
  switch (g.epi) {
  case GemmEpilogue::Swiglu:
    out.push_back(v.hout);
    if (g.storeA)
      out.push_back(v.aout);
    break;
  case GemmEpilogue::StoreF32:
    out.append({v.cout, v.ldc});
    break;
  case GemmEpilogue::StoreBf16:
  case GemmEpilogue::StoreBf16W:
    out.append({v.cout, v.ldc});
    if (g.tmaStore || g.tmaStoreRows)
      out.push_back(v.cmap);
    break;
  case GemmEpilogue::Dswiglu:
    out.push_back(v.hsaved);
    if (g.hasW)
      out.push_back(v.wrow);
    out.append({v.dh, v.wa});
    if (g.hasDs)
      out.append({v.dspart, v.numNtiles});
    break;
  }
  if (g.bias)
    out.push_back(v.bias);
  if (g.dynamic)
    out.append({v.tileCounter, v.counterSlot});
  assert(llvm::all_of(out, [](Value x) { return x; }) &&
         "a GEMM launch without a value of one of its arguments");
  return out;
}

void mlir::moe::host::repack(HostFunctionBuilder &h, Value src, Value dst,
                             Value rows, Value csrc, Value cdst, Value ncopy) {
  Type element = cast<MemRefType>(src.getType()).getElementType();
  Value one = h.c(1);
  Value size = h.mul(rows, cdst);
  Value blocks = h.ceil(size, kThreads);
  h.launch(element.isF32() ? "moe_repack_f32" : "moe_repack_bf16", blocks, one,
           one, {src, dst, rows, csrc, cdst, ncopy});
}

Value mlir::moe::host::paddedCopy(HostFunctionBuilder &h, Value src, Value rows,
                                  Value cols, Value cols8, Type element) {
  Value size = h.mul(rows, cols8);
  Value dst = h.alloc(size, element);
  repack(h, src, dst, rows, cols, cols8, cols);
  return dst;
}

Value mlir::moe::host::singleOffsets(HostFunctionBuilder &h, Value t) {
  Value two = h.c(2);
  Value offs = h.alloc(two, h.i32());
  Value gx = h.c(1), gy = h.c(1), gz = h.c(1);
  h.launch("moe_single_offsets", gx, gy, gz, {offs, t});
  return offs;
}

Value mlir::moe::host::round8(HostFunctionBuilder &h, Value v) {
  Value groups = h.ceil(v, 8);
  Value eight = h.c(8);
  return h.mul(groups, eight);
}

//===----------------------------------------------------------------------===//
// The forward host functions
//===----------------------------------------------------------------------===//

void mlir::moe::host::buildRouterHost(OpBuilder &b, ModuleOp module,
                                      const HostGemms &gemms, bool aux) {
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type(), i32 = b.getI32Type(),
       i1 = b.getI1Type(), index = b.getIndexType();
  SmallVector<std::pair<StringRef, Type>> params = {
      {"x", buffer(bf16, 2)},      {"wr", buffer(bf16, 2)},
      {"bias", buffer(f32)},       {"scoring", i32},
      {"renormalize", i1},         {"num_groups", index},
      {"topk_groups", index},      {"scaling", f32},
      {"round_logits", i1},        {"weights", buffer(f32, 2)},
      {"experts", buffer(i32, 2)}, {"logits", buffer(f32, 2)}};
  if (aux)
    params.append(
        {{"load_balance", buffer(f32, 0)}, {"z_loss", buffer(f32, 0)}});
  HostFunctionBuilder h(
      b, module, ((aux ? "router_aux" : "router") + gemms.suffix()).str(),
      params);
  Value t = h.dim(h.arg("x"), 0);
  Value d = h.dim(h.arg("x"), 1);
  Value e = h.dim(h.arg("wr"), 1);
  Value k = h.dim(h.arg("weights"), 1);
  Value xf = h.flat(h.arg("x"));
  Value wrf = h.flat(h.arg("wr"));
  Value lf = h.flat(h.arg("logits"));
  Value wf = h.flat(h.arg("weights"));
  Value ef = h.flat(h.arg("experts"));
  Value offs = singleOffsets(h, t);
  Value one = h.c(1);
  Value e8 = round8(h, e);
  Value wrp = paddedCopy(h, wrf, d, e, e8, bf16);
  Value logitsSize = h.mul(t, e8);
  Value lp = h.alloc(h.grid(logitsSize), f32);

  // The logits, [T, E8] in f32: x W_r over one problem of T rows.
  const GemmTraits &gemm = gemms.get("logits", LibraryGemm::RowsMnF32);
  auto [mtiles, ntiles] =
      h.varlenTiles(t, gemm.config.tileM, one, e8, gemm.config.tileN);
  GemmValues v;
  v.offsets = offs;
  v.numExperts = one;
  v.amat = xf;
  v.lda = d;
  v.bmat = wrp;
  v.ldb = e8;
  v.dimM = t;
  v.dimN = e8;
  v.dimK = d;
  v.cout = lp;
  v.ldc = e8;
  SmallVector<Value> args = gemmArgs(h, gemm, v);
  h.launchGemm(gemm, mtiles, ntiles, one, args);
  repack(h, lp, lf, t, e8, e, e);
  h.dealloc(lp);
  h.dealloc(wrp);

  if (aux) {
    routerAuxScoresAndSelect(h, lf, t, e, k, wf, ef, h.arg("load_balance"),
                             h.arg("z_loss"));
    h.dealloc(offs);
    h.finish();
    return;
  }
  Value scoresSize = h.mul(t, e);
  Value scores = h.alloc(scoresSize, f32);
  Value blocks = h.ceil(t, kTokenWarps);
  h.launch("moe_router_scores", blocks, one, one,
           {lf, scores, t, e, h.arg("scoring"), h.arg("round_logits")});
  Value nb = h.dim(h.arg("bias"), 0);
  Value selectBlocks = h.ceil(t, kTokenWarps);
  h.launch("moe_router_select", selectBlocks, one, one,
           {scores, h.arg("bias"), nb, t, e, k, h.arg("num_groups"),
            h.arg("topk_groups"), h.arg("renormalize"), h.arg("scaling"), wf,
            ef});
  h.dealloc(scores);
  h.dealloc(offs);
  h.finish();
}

/// `__moe_gpu_dispatch`, and with `capacity` `__moe_gpu_dispatch_capacity`,
/// which takes the pairs an expert keeps (an index after the experts) and
/// launches the capped scan and placement.
void mlir::moe::host::buildDispatchHost(OpBuilder &b, ModuleOp module,
                                        bool capacity) {
  Type i32 = b.getI32Type();
  SmallVector<std::pair<StringRef, Type>> params = {
      {"experts", buffer(i32, 2)}};
  if (capacity)
    params.push_back({"capacity", b.getIndexType()});
  params.append({{"token_ids", buffer(i32)},
                 {"offsets", buffer(i32)},
                 {"rows", buffer(i32, 2)}});
  HostFunctionBuilder h(b, module, capacity ? "dispatch_capacity" : "dispatch",
                        params);
  Value one = h.c(1);
  Value t = h.dim(h.arg("experts"), 0);
  Value k = h.dim(h.arg("experts"), 1);
  Value tk = h.mul(t, k);
  Value offsetCount = h.dim(h.arg("offsets"), 0);
  Value e = h.sub(offsetCount, one);
  Value r = h.dim(h.arg("token_ids"), 0);
  Value ef = h.flat(h.arg("experts"));
  Value rf = h.flat(h.arg("rows"));
  Value nchunks = h.ceil(tk, kDispatchChunk);
  Value rank = h.alloc(tk, i32);
  Value chunks = h.grid(nchunks);
  Value countsSize = h.mul(chunks, e);
  Value cnt = h.alloc(countsSize, i32);
  h.launch("moe_dispatch_rank", nchunks, one, one, {ef, tk, e, rank, cnt});
  if (capacity)
    h.launch("moe_dispatch_scan_capacity", one, one, one,
             {cnt, nchunks, e, h.arg("capacity"), h.arg("offsets")});
  else
    h.launch("moe_dispatch_scan", one, one, one,
             {cnt, nchunks, e, h.arg("offsets")});
  Value work = h.maxu(tk, r);
  Value blocks = h.ceil(work, kThreads);
  if (capacity)
    h.launch("moe_dispatch_place_capacity", blocks, one, one,
             {ef, rank, cnt, h.arg("offsets"), tk, k, e, r, h.arg("capacity"),
              h.arg("token_ids"), rf});
  else
    h.launch(
        "moe_dispatch_place", blocks, one, one,
        {ef, rank, cnt, h.arg("offsets"), tk, k, e, r, h.arg("token_ids"), rf});
  h.dealloc(rank);
  h.dealloc(cnt);
  h.finish();
}

namespace {

/// The up projection (gathered or row-wise) with SwiGLU, then the down
/// projection (ffn_forward); without y only H is wanted, from the up
/// kernel's variant that writes no A. A lives only between the two.
void ffnForward(HostFunctionBuilder &h, Value x, Value ids, Value offs, Value e,
                Value wguf, Value wdf, Value yf, Value hf, Value m, Value d,
                Value n, bool gathered, const HostGemms &gemms,
                Value bguf = Value(), Value bdf = Value()) {
  Value one = h.c(1);
  Value two = h.c(2);
  // A non-gated activation's up GEMM (its H-only form too) reads W [E, d, n]
  // and writes H and A of n columns each.
  const GemmTraits &upA =
      gemms.get("up", gathered ? LibraryGemm::UpGather : LibraryGemm::UpRows);
  const GemmTraits &upH =
      gemms.get("up", gathered ? LibraryGemm::UpGatherH : LibraryGemm::UpRowsH);
  bool gated = moe_gpu::isGatedActivation(yf ? upA.config : upH.config);
  GemmValues v;
  v.offsets = offs;
  v.numExperts = e;
  v.amat = x;
  v.lda = d;
  v.bmat = wguf;
  v.ldb = gated ? h.mul(n, two) : n;
  v.dimM = m;
  v.dimN = n;
  v.dimK = d;
  v.hout = hf;
  v.ids = ids;
  v.bias = bguf;
  // A gated up tile covers half a tile of gate and up columns each.
  auto upTiles = [&](const GemmTraits &up) {
    return h.varlenTiles(m, up.config.tileM, e, n,
                         gated ? up.config.tileN / 2 : up.config.tileN);
  };
  if (!yf) {
    const GemmTraits &up = upH;
    auto [mtiles, ntiles] = upTiles(up);
    SmallVector<Value> args = gemmArgs(h, up, v);
    h.launchGemm(up, mtiles, ntiles, one, args);
    return;
  }
  Value size = h.mul(m, n);
  Value a = h.alloc(h.grid(size), h.bf16());
  v.aout = a;
  const GemmTraits &up = upA;
  {
    auto [mtiles, ntiles] = upTiles(up);
    SmallVector<Value> args = gemmArgs(h, up, v);
    h.launchGemm(up, mtiles, ntiles, one, args);
  }

  const GemmTraits &down = gemms.get("down", LibraryGemm::RowsMnBf16);
  auto [mtiles, ntiles] =
      h.varlenTiles(m, down.config.tileM, e, d, down.config.tileN);
  GemmValues dv;
  dv.offsets = offs;
  dv.numExperts = e;
  dv.amat = a;
  dv.lda = n;
  dv.bmat = wdf;
  dv.ldb = d;
  dv.dimM = m;
  dv.dimN = d;
  dv.dimK = n;
  dv.cout = yf;
  dv.ldc = d;
  dv.bias = bdf;
  SmallVector<Value> args = gemmArgs(h, down, dv);
  h.launchGemm(down, mtiles, ntiles, one, args);
  h.dealloc(a);
}

} // namespace

void mlir::moe::host::buildExpertFfnHost(OpBuilder &b, ModuleOp module,
                                         bool withY, const HostGemms &gemms) {
  Type bf16 = b.getBF16Type(), i32 = b.getI32Type();
  SmallVector<std::pair<StringRef, Type>> args = {{"x", buffer(bf16, 2)},
                                                  {"token_ids", buffer(i32)},
                                                  {"offsets", buffer(i32)},
                                                  {"wgu", buffer(bf16, 3)},
                                                  {"wd", buffer(bf16, 3)}};
  // A variant whose GEMMs add the expert biases (b_gate_up to H, b_down to
  // y) takes both after the weights, as moe.expert_ffn's operands come; the
  // H-only form takes b_down alike and leaves it unread.
  bool bias =
      gemms.get("up", withY ? LibraryGemm::UpGather : LibraryGemm::UpGatherH)
          .bias ||
      (withY && gemms.get("down", LibraryGemm::RowsMnBf16).bias);
  if (bias) {
    args.push_back({"b_gate_up", buffer(bf16, 2)});
    args.push_back({"b_down", buffer(bf16, 2)});
  }
  args.push_back({"act", i32});
  if (withY)
    args.push_back({"y", buffer(bf16, 2)});
  args.push_back({"h", buffer(bf16, 2)});
  HostFunctionBuilder h(
      b, module,
      ((withY ? "expert_ffn" : "expert_ffn_h") + gemms.suffix()).str(), args);
  Value d = h.dim(h.arg("x"), 1);
  Value r = h.dim(h.arg("token_ids"), 0);
  Value e = h.dim(h.arg("wd"), 0);
  Value n = h.dim(h.arg("wd"), 1);
  Value xf = h.flat(h.arg("x"));
  Value wguf = h.flat(h.arg("wgu"));
  Value wdf = h.flat(h.arg("wd"));
  Value yf = withY ? h.flat(h.arg("y")) : Value();
  Value hf = h.flat(h.arg("h"));
  Value bguf = bias ? h.flat(h.arg("b_gate_up")) : Value();
  Value bdf = bias ? h.flat(h.arg("b_down")) : Value();
  ffnForward(h, xf, h.arg("token_ids"), h.arg("offsets"), e, wguf, wdf, yf, hf,
             r, d, n, /*gathered=*/true, gemms, bguf, bdf);
  h.finish();
}

void mlir::moe::host::buildSharedExpertHost(OpBuilder &b, ModuleOp module,
                                            bool withY,
                                            const HostGemms &gemms) {
  Type bf16 = b.getBF16Type();
  SmallVector<std::pair<StringRef, Type>> args = {{"x", buffer(bf16, 2)},
                                                  {"wgu", buffer(bf16, 2)},
                                                  {"wd", buffer(bf16, 2)},
                                                  {"act", b.getI32Type()}};
  if (withY)
    args.push_back({"y", buffer(bf16, 2)});
  args.push_back({"h", buffer(bf16, 2)});
  HostFunctionBuilder h(
      b, module,
      ((withY ? "shared_expert" : "shared_expert_h") + gemms.suffix()).str(),
      args);
  Value t = h.dim(h.arg("x"), 0);
  Value d = h.dim(h.arg("x"), 1);
  Value m = h.dim(h.arg("wd"), 0);
  Value offs = singleOffsets(h, t);
  Value xf = h.flat(h.arg("x"));
  Value one = h.c(1);
  Value wguf = h.flat(h.arg("wgu"));
  Value wdf = h.flat(h.arg("wd"));
  Value yf = withY ? h.flat(h.arg("y")) : Value();
  Value hf = h.flat(h.arg("h"));
  ffnForward(h, xf, /*ids=*/Value(), offs, one, wguf, wdf, yf, hf, t, d, m,
             /*gathered=*/false, gemms);
  h.dealloc(offs);
  h.finish();
}

void mlir::moe::host::buildCombineHost(OpBuilder &b, ModuleOp module,
                                       bool accumulate) {
  Type bf16 = b.getBF16Type();
  HostFunctionBuilder h(b, module, accumulate ? "combine_acc" : "combine",
                        {{"y", buffer(bf16, 2)},
                         {"weights", buffer(b.getF32Type(), 2)},
                         {"rows", buffer(b.getI32Type(), 2)},
                         {"out", buffer(bf16, 2)}});
  Value one = h.c(1);
  Value t = h.dim(h.arg("weights"), 0);
  Value k = h.dim(h.arg("weights"), 1);
  Value d = h.dim(h.arg("y"), 1);
  Value yf = h.flat(h.arg("y"));
  Value rowsf = h.flat(h.arg("rows"));
  Value wf = h.flat(h.arg("weights"));
  Value weighted = h.cI1(true);
  Value outf = h.flat(h.arg("out"));
  h.launch(accumulate ? "moe_gather_sum_acc" : "moe_gather_sum", t, one, one,
           {yf, rowsf, wf, weighted, t, k, d, outf});
  h.finish();
}

void mlir::moe::host::buildAddHost(OpBuilder &b, ModuleOp module) {
  MemRefType bf16 = buffer(b.getBF16Type());
  HostFunctionBuilder h(b, module, "add",
                        {{"a", bf16}, {"b", bf16}, {"out", bf16}});
  Value one = h.c(1);
  Value n = h.dim(h.arg("a"), 0);
  // A thread adds 8 values.
  Value vectors = h.ceil(n, 8);
  Value blocks = h.ceil(vectors, kThreads);
  h.launch("moe_add", blocks, one, one,
           {h.arg("a"), h.arg("b"), h.arg("out"), n});
  h.finish();
}

//===----------------------------------------------------------------------===//
// The registry
//===----------------------------------------------------------------------===//

namespace {

using HostBuildFn = void (*)(OpBuilder &, ModuleOp, const HostGemms &);

/// A GEMM role of a host function and the library's GEMM in it; an
/// accumulating role adds its tile to what C holds, in every variant.
struct VariantRole {
  StringLiteral role;
  LibraryGemm gemm;
  bool accumulating = false;
};

/// A host function of the library: its builder, and its GEMM roles in the
/// order it runs them. The functions with roles have variants (another
/// config for a role); the others (dispatch, combine, add, the
/// expert-parallel ones) have none.
struct HostEntry {
  StringLiteral name;
  HostBuildFn build;
  SmallVector<VariantRole, 4> roles;
};

/// The host functions in the library's order: the forward and backward ones,
/// then the accumulating ones (the calls of the ops that moe-fold-adds gave
/// an accumulate operand), then those of the expert-parallel ops and of the
/// unfused combine and expert FFN backward (the expert-parallel layer's),
/// then the dispatch with a capacity, then the auxiliary losses, then the
/// expert FFN backward of experts with biases.
const std::vector<HostEntry> &hostEntries() {
  static const SmallVector<VariantRole, 4> kExpertGradRoles = {
      {"dact", LibraryGemm::DactGather},
      {"dx", LibraryGemm::RowsKBf16},
      {"dw_down", LibraryGemm::WgradGather},
      {"dw_gate_up", LibraryGemm::WgradGatherA}};
  static const SmallVector<VariantRole, 4> kExpertFfnGradRoles = {
      {"dact", LibraryGemm::DactRows},
      {"dx", LibraryGemm::RowsKBf16},
      {"dw_down", LibraryGemm::WgradRows},
      {"dw_gate_up", LibraryGemm::WgradGatherA}};
  static const std::vector<HostEntry> entries = {
      {"__moe_gpu_router",
       [](OpBuilder &b, ModuleOp m, const HostGemms &g) {
         host::buildRouterHost(b, m, g);
       },
       {{"logits", LibraryGemm::RowsMnF32}}},
      {"__moe_gpu_dispatch",
       [](OpBuilder &b, ModuleOp m, const HostGemms &) {
         host::buildDispatchHost(b, m);
       },
       {}},
      {"__moe_gpu_expert_ffn",
       [](OpBuilder &b, ModuleOp m, const HostGemms &g) {
         host::buildExpertFfnHost(b, m, true, g);
       },
       {{"up", LibraryGemm::UpGather}, {"down", LibraryGemm::RowsMnBf16}}},
      {"__moe_gpu_expert_ffn_h",
       [](OpBuilder &b, ModuleOp m, const HostGemms &g) {
         host::buildExpertFfnHost(b, m, false, g);
       },
       {{"up", LibraryGemm::UpGatherH}}},
      {"__moe_gpu_combine",
       [](OpBuilder &b, ModuleOp m, const HostGemms &) {
         host::buildCombineHost(b, m, false);
       },
       {}},
      {"__moe_gpu_shared_expert",
       [](OpBuilder &b, ModuleOp m, const HostGemms &g) {
         host::buildSharedExpertHost(b, m, true, g);
       },
       {{"up", LibraryGemm::UpRows}, {"down", LibraryGemm::RowsMnBf16}}},
      {"__moe_gpu_shared_expert_h",
       [](OpBuilder &b, ModuleOp m, const HostGemms &g) {
         host::buildSharedExpertHost(b, m, false, g);
       },
       {{"up", LibraryGemm::UpRowsH}}},
      {"__moe_gpu_expert_combine_grad",
       [](OpBuilder &b, ModuleOp m, const HostGemms &g) {
         host::buildExpertCombineGradHost(b, m, false, g);
       },
       kExpertGradRoles},
      {"__moe_gpu_shared_expert_grad",
       [](OpBuilder &b, ModuleOp m, const HostGemms &g) {
         host::buildSharedExpertGradHost(b, m, g);
       },
       {{"dact", LibraryGemm::DactRows},
        {"dx", LibraryGemm::RowsKBf16},
        {"dw_down", LibraryGemm::WgradRows},
        {"dw_gate_up", LibraryGemm::WgradRows}}},
      {"__moe_gpu_router_grad",
       [](OpBuilder &b, ModuleOp m, const HostGemms &g) {
         host::buildRouterGradHost(b, m, false, g);
       },
       {{"dx", LibraryGemm::RowsKBf16}, {"dw", LibraryGemm::WgradRows}}},
      {"__moe_gpu_add",
       [](OpBuilder &b, ModuleOp m, const HostGemms &) {
         host::buildAddHost(b, m);
       },
       {}},
      {"__moe_gpu_update_selection_bias",
       [](OpBuilder &b, ModuleOp m, const HostGemms &) {
         host::buildUpdateSelectionBiasHost(b, m);
       },
       {}},
      {"__moe_gpu_combine_acc",
       [](OpBuilder &b, ModuleOp m, const HostGemms &) {
         host::buildCombineHost(b, m, true);
       },
       {}},
      {"__moe_gpu_expert_combine_grad_acc",
       [](OpBuilder &b, ModuleOp m, const HostGemms &g) {
         host::buildExpertCombineGradHost(b, m, true, g);
       },
       kExpertGradRoles},
      {"__moe_gpu_router_grad_acc",
       [](OpBuilder &b, ModuleOp m, const HostGemms &g) {
         host::buildRouterGradHost(b, m, true, g);
       },
       {{"dx", LibraryGemm::RowsKBf16, /*accumulating=*/true},
        {"dw", LibraryGemm::WgradRows}}},
      {"__moe_gpu_ep_pack",
       [](OpBuilder &b, ModuleOp m, const HostGemms &) {
         host::buildEPPackHost(b, m, /*gather=*/false);
       },
       {}},
      {"__moe_gpu_ep_pack_gather",
       [](OpBuilder &b, ModuleOp m, const HostGemms &) {
         host::buildEPPackHost(b, m, /*gather=*/true);
       },
       {}},
      {"__moe_gpu_ep_unpack",
       [](OpBuilder &b, ModuleOp m, const HostGemms &) {
         host::buildEPUnpackHost(b, m, /*reduce=*/false);
       },
       {}},
      {"__moe_gpu_ep_unpack_reduce",
       [](OpBuilder &b, ModuleOp m, const HostGemms &) {
         host::buildEPUnpackHost(b, m, /*reduce=*/true);
       },
       {}},
      {"__moe_gpu_ep_queues",
       [](OpBuilder &b, ModuleOp m, const HostGemms &) {
         host::buildEPQueuesHost(b, m);
       },
       {}},
      {"__moe_gpu_gather_rows",
       [](OpBuilder &b, ModuleOp m, const HostGemms &) {
         host::buildGatherRowsHost(b, m);
       },
       {}},
      {"__moe_gpu_scatter_rows",
       [](OpBuilder &b, ModuleOp m, const HostGemms &) {
         host::buildScatterRowsHost(b, m);
       },
       {}},
      {"__moe_gpu_combine_grad",
       [](OpBuilder &b, ModuleOp m, const HostGemms &) {
         host::buildCombineGradHost(b, m);
       },
       {}},
      {"__moe_gpu_expert_ffn_grad",
       [](OpBuilder &b, ModuleOp m, const HostGemms &g) {
         host::buildExpertFfnGradHost(b, m, g);
       },
       kExpertFfnGradRoles},
      {"__moe_gpu_dispatch_capacity",
       [](OpBuilder &b, ModuleOp m, const HostGemms &) {
         host::buildDispatchHost(b, m, /*capacity=*/true);
       },
       {}},
      {"__moe_gpu_aux_loss",
       [](OpBuilder &b, ModuleOp m, const HostGemms &) {
         host::buildAuxLossHost(b, m);
       },
       {}},
      {"__moe_gpu_aux_loss_grad",
       [](OpBuilder &b, ModuleOp m, const HostGemms &) {
         host::buildAuxLossGradHost(b, m);
       },
       {}},
      {"__moe_gpu_router_aux",
       [](OpBuilder &b, ModuleOp m, const HostGemms &g) {
         host::buildRouterHost(b, m, g, /*aux=*/true);
       },
       {{"logits", LibraryGemm::RowsMnF32}}},
      {"__moe_gpu_router_grad_aux",
       [](OpBuilder &b, ModuleOp m, const HostGemms &g) {
         host::buildRouterGradHost(b, m, false, g, /*aux=*/true);
       },
       {{"dx", LibraryGemm::RowsKBf16}, {"dw", LibraryGemm::WgradRows}}},
      {"__moe_gpu_router_grad_aux_acc",
       [](OpBuilder &b, ModuleOp m, const HostGemms &g) {
         host::buildRouterGradHost(b, m, true, g, /*aux=*/true);
       },
       {{"dx", LibraryGemm::RowsKBf16, /*accumulating=*/true},
        {"dw", LibraryGemm::WgradRows}}},
      {"__moe_gpu_expert_combine_grad_bias",
       [](OpBuilder &b, ModuleOp m, const HostGemms &g) {
         host::buildExpertCombineGradHost(b, m, false, g, /*bias=*/true);
       },
       kExpertGradRoles},
      {"__moe_gpu_expert_combine_grad_bias_acc",
       [](OpBuilder &b, ModuleOp m, const HostGemms &g) {
         host::buildExpertCombineGradHost(b, m, true, g, /*bias=*/true);
       },
       kExpertGradRoles},
      {"__moe_gpu_expert_ffn_grad_bias",
       [](OpBuilder &b, ModuleOp m, const HostGemms &g) {
         host::buildExpertFfnGradHost(b, m, g, /*bias=*/true);
       },
       kExpertFfnGradRoles},
  };
  return entries;
}

const HostEntry *findEntry(StringRef name) {
  for (const HostEntry &entry : hostEntries())
    if (entry.name == name)
      return &entry;
  return nullptr;
}

/// The accumulating router gradient reduces into dx by TMA boxes: the library
/// has it where the row-wise GEMMs store C by TMA boxes.
bool hasRouterGradAcc() {
  return libraryGemm(LibraryGemm::RowsKBf16).tmaStoreRows;
}

bool isBuilt(const HostEntry &entry) {
  return (entry.name != "__moe_gpu_router_grad_acc" &&
          entry.name != "__moe_gpu_router_grad_aux_acc") ||
         hasRouterGradAcc();
}

/// Fails (with an error at `module`) where `module` cannot take the host
/// function `symbol`: a symbol of that name, or a tensor map function that is
/// not the host functions' declaration of it.
LogicalResult checkTarget(ModuleOp module, StringRef symbol) {
  if (module.lookupSymbol(symbol))
    return module.emitError("the module already has a symbol @") << symbol;
  if (Operation *existing = module.lookupSymbol(kTensorMapFunctionName)) {
    auto declaration = dyn_cast<func::FuncOp>(existing);
    if (!declaration || declaration.getFunctionType() !=
                            tensorMapFunctionType(module.getContext()))
      return module.emitError("the module's @")
             << kTensorMapFunctionName
             << " is not the host functions' declaration of it";
  }
  return success();
}

/// Builds `entry` with `gemms` at the end of `module` as the function
/// `symbol`.
FailureOr<func::FuncOp> buildEntry(ModuleOp module, const HostEntry &entry,
                                   const HostGemms &gemms, StringRef symbol) {
  // gpu.launch_func verifies only in a gpu.container_module.
  module->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                  UnitAttr::get(module.getContext()));
  OpBuilder b(module.getContext());
  b.setInsertionPointToEnd(module.getBody());
  entry.build(b, module, gemms);
  auto function = module.lookupSymbol<func::FuncOp>(symbol);
  if (!function)
    return module.emitError("the host function builder of @")
           << symbol << " made no function of that name";
  return function;
}

} // namespace

FailureOr<func::FuncOp> mlir::moe::buildLibraryHostFunction(ModuleOp module,
                                                            StringRef name) {
  const HostEntry *entry = findEntry(name);
  if (!entry || !isBuilt(*entry))
    return module.emitError("the host function builder has no function @")
           << name;
  if (failed(checkTarget(module, name)))
    return failure();
  return buildEntry(module, *entry, HostGemms(), name);
}

SmallVector<StringRef> mlir::moe::libraryHostFunctionNames() {
  SmallVector<StringRef> names;
  for (const HostEntry &entry : hostEntries())
    if (isBuilt(entry))
      names.push_back(entry.name);
  return names;
}

//===----------------------------------------------------------------------===//
// Variants
//===----------------------------------------------------------------------===//

namespace {

/// `config` as a variant compares it: resolved, not accumulating.
moe_gpu::GemmConfig normalized(const moe_gpu::GemmConfig &config) {
  moe_gpu::GemmConfig out = config.resolved();
  out.accumulate = false;
  return out;
}

/// The configs of `entry`'s roles that differ from the library's (normalized),
/// in the entry's order; configs of roles it does not have are ignored.
SmallVector<std::pair<StringRef, moe_gpu::GemmConfig>>
differingConfigs(const HostEntry &entry, ArrayRef<HostGemmConfig> configs) {
  SmallVector<std::pair<StringRef, moe_gpu::GemmConfig>> chosen;
  for (const VariantRole &role : entry.roles) {
    moe_gpu::GemmConfig library = normalized(libraryGemm(role.gemm).config);
    for (const HostGemmConfig &config : configs) {
      if (config.role != role.role)
        continue;
      moe_gpu::GemmConfig wanted = normalized(config.config);
      if (wanted != library)
        chosen.emplace_back(role.role, wanted);
    }
  }
  return chosen;
}

/// differingConfigs, failure (with an error at `module`) for a config of a
/// role the function does not have.
FailureOr<SmallVector<std::pair<StringRef, moe_gpu::GemmConfig>>>
chosenConfigs(const HostEntry &entry, ArrayRef<HostGemmConfig> configs,
              ModuleOp module) {
  for (const HostGemmConfig &config : configs)
    if (llvm::none_of(entry.roles, [&](const VariantRole &role) {
          return role.role == config.role;
        }))
      return module.emitError("the host function @")
             << entry.name << " has no GEMM role '" << config.role << "'";
  return differingConfigs(entry, configs);
}

std::string
variantSuffix(ArrayRef<std::pair<StringRef, moe_gpu::GemmConfig>> chosen) {
  std::string suffix;
  for (const auto &[role, config] : chosen)
    suffix += "__" + moe_gpu::gemmKernelName(config);
  return suffix;
}

} // namespace

bool mlir::moe::canBuildLibraryHostFunction(StringRef name,
                                            ArrayRef<HostGemmConfig> configs) {
  const HostEntry *entry = findEntry(name);
  if (!entry || entry->roles.empty())
    return configs.empty() &&
           llvm::is_contained(libraryHostFunctionNames(), name);
  for (const HostGemmConfig &config : configs) {
    const VariantRole *role =
        llvm::find_if(entry->roles, [&](const VariantRole &r) {
          return r.role == config.role;
        });
    if (role == entry->roles.end())
      return false;
    if (role->accumulating &&
        normalized(config.config) !=
            normalized(libraryGemm(role->gemm).config) &&
        !moe_gpu::canAccumulate(config.config))
      return false;
  }
  return true;
}

SmallVector<HostGemmConfig> mlir::moe::libraryHostGemmConfigs(StringRef name) {
  SmallVector<HostGemmConfig> out;
  if (const HostEntry *entry = findEntry(name))
    for (const VariantRole &role : entry->roles)
      out.push_back({role.role.str(), libraryGemm(role.gemm).config});
  return out;
}

std::string
mlir::moe::libraryHostFunctionVariantName(StringRef name,
                                          ArrayRef<HostGemmConfig> configs) {
  const HostEntry *entry = findEntry(name);
  if (!entry)
    return name.str();
  return name.str() + variantSuffix(differingConfigs(*entry, configs));
}

FailureOr<func::FuncOp>
mlir::moe::buildLibraryHostFunction(ModuleOp module, StringRef name,
                                    ArrayRef<HostGemmConfig> configs) {
  const HostEntry *entry = findEntry(name);
  if (!entry || entry->roles.empty()) {
    if (configs.empty())
      return buildLibraryHostFunction(module, name);
    return module.emitError("the host function builder has no variants of @")
           << name;
  }
  FailureOr<SmallVector<std::pair<StringRef, moe_gpu::GemmConfig>>> chosen =
      chosenConfigs(*entry, configs, module);
  if (failed(chosen))
    return failure();
  if (chosen->empty())
    return buildLibraryHostFunction(module, name);
  // The kernels to build: an accumulating role's config accumulates.
  SmallVector<moe_gpu::GemmConfig> kernelConfigs;
  for (const auto &[role, config] : *chosen) {
    if (failed(moe_gpu::verifyGemmConfig(config,
                                         [&] { return module.emitError(); })))
      return failure();
    moe_gpu::GemmConfig kernel = config;
    StringRef roleName = role;
    if (llvm::any_of(entry->roles, [&](const VariantRole &r) {
          return r.role == roleName && r.accumulating;
        })) {
      if (!moe_gpu::canAccumulate(config))
        return module.emitError("the host function @")
               << name << " adds its '" << role
               << "' GEMM to what C holds, which @"
               << moe_gpu::gemmKernelName(config)
               << " cannot (accumulate needs epilogue = store_bf16 and store "
                  "= tma_boxes)";
      kernel.accumulate = true;
    }
    kernelConfigs.push_back(kernel);
  }
  std::string variant = name.str() + variantSuffix(*chosen);
  if (failed(checkTarget(module, variant)))
    return failure();

  OpBuilder b(module.getContext());
  Location loc = module.getLoc();
  // The chosen kernels, into @moe_kernels (made where missing).
  auto kernels = module.lookupSymbol<gpu::GPUModuleOp>(kKernelModuleName);
  if (!kernels) {
    if (module.lookupSymbol(kKernelModuleName))
      return module.emitError("the module's @")
             << kKernelModuleName << " is not a gpu.module";
    b.setInsertionPointToEnd(module.getBody());
    kernels = gpu::GPUModuleOp::create(b, loc, kKernelModuleName);
  }
  for (const moe_gpu::GemmConfig &config : kernelConfigs) {
    std::string kernel = moe_gpu::gemmKernelName(config);
    if (Operation *existing = kernels.lookupSymbol(kernel)) {
      if (!isa<gpu::GPUFuncOp>(existing))
        return module.emitError("the module's @")
               << kKernelModuleName << "::@" << kernel << " is not a kernel";
      continue;
    }
    b.setInsertionPoint(kernels.getBody(), kernels.getBody()->end());
    kernels::buildGemmKernel(b, loc, config);
    if (!kernels.lookupSymbol<gpu::GPUFuncOp>(kernel))
      return module.emitError("the kernel builder made no kernel @") << kernel;
  }

  return buildEntry(module, *entry, HostGemms(*chosen, variantSuffix(*chosen)),
                    variant);
}
