//===- HostBackward.cpp - the library's backward host functions -----------===//
//
// The gradients of the expert and shared-expert FFNs with the combine, and of
// the router: dA with dSwiGLU (and dS), dX, and the weight gradients, GEMMs
// over each expert's tokens (varlen K).
//
//===----------------------------------------------------------------------===//

#include "HostBuilder.h"

using namespace mlir;
using namespace mlir::moe::host;
using mlir::moe::kernels::GemmTraits;

namespace {

/// A weight gradient (launch_wgrad) by `g`, with the dispatch queue as its
/// `queueArg` (the operand whose rows are tokens) where `g` gathers, else
/// the rows in order.
void launchWgrad(HostFunctionBuilder &h, const GemmTraits &g,
                 Value GemmValues::*queueArg, Value queue, GemmValues values) {
  if (queue)
    values.*queueArg = queue;
  Value mtiles = h.ceil(values.dimM, g.config.tileM);
  Value ntiles = h.ceil(values.dimN, g.config.tileN);
  SmallVector<Value> args = gemmArgs(h, g, values);
  h.launchGemm(g, mtiles, ntiles, values.numExperts, args);
}

/// The per-expert values of the routed experts' backward, absent for the
/// shared expert.
struct ExpertValues {
  Value ids, wrow, dspart, numNtiles;
};

/// The expert biases' gradients [E, cols] (d_b_gate_up, d_b_down) of a
/// routed FFN's backward, where it has biases: the column sums of dH and of
/// dout's rows over each expert's rows of the queue. dout's row of queue
/// row r is doutIds[r] where given (the combine's dout by token, doutRows
/// rows), else r; `doutScale` (the routing weight of each row) scales it
/// where given.
struct BiasGradValues {
  Value dbgu, dbd, doutRows, doutIds, doutScale;
};

/// Slices of an expert's rows a column sum splits into: about 128 rows a
/// slice for evenly routed rows, at most kBiasSlices.
constexpr int64_t kBiasRowsPerSlice = 128;
constexpr int64_t kBiasSlices = 64;

/// out[e, :] = bf16 of the sum over expert e's rows r of the queue
/// (offsets[e] <= r < offsets[e + 1]) of scale[r] * src[ids[r] or r, :], in
/// f32, in a fixed order: S slices of each expert's rows (moe_segment_colsum,
/// rows in order), then the slices in order (moe_sum_splits_f32). S depends
/// on the queue's size alone, so the same rows sum to the same bits.
void expertColumnSums(HostFunctionBuilder &h, Value src, Value srcRows,
                      Value cols, Value ids, Value scale, Value offs, Value e,
                      Value r, Value out) {
  Value one = h.c(1);
  Value perExpert = h.mul(e, h.c(kBiasRowsPerSlice));
  Value wanted = h.div(h.add(r, h.sub(perExpert, one)), perExpert);
  Value s = h.maxs(one, h.minu(wanted, h.c(kBiasSlices)));
  Value partialSize = h.mul(h.mul(s, e), cols);
  Value partial =
      h.alloc(h.grid(partialSize), Float32Type::get(out.getContext()));
  Value colBlocks = h.ceil(cols, 8 * kThreads);
  Value sliceBlocks = h.mul(s, e);
  Value hasIds = h.cI1(static_cast<bool>(ids));
  Value hasScale = h.cI1(static_cast<bool>(scale));
  // An absent operand's buffer is never read: offsets stand in for it.
  Value idsArg = ids ? ids : offs;
  Value scaleArg = scale ? scale : partial;
  h.launch("moe_segment_colsum", h.grid(colBlocks), sliceBlocks, one,
           {src, idsArg, hasIds, scaleArg, hasScale, offs, e, r, srcRows, cols,
            s, partial});
  Value sumSize = h.mul(e, cols);
  Value sumBlocks = h.ceil(sumSize, kThreads);
  h.launch("moe_sum_splits_f32", h.grid(sumBlocks), one, one,
           {partial, out, e, cols, cols, s});
  h.dealloc(partial);
}

/// dA (with dSwiGLU, and dS for routed experts), dX_e, dW_down and
/// dW_gate_up of one grouped FFN (ffn_backward). dout's rows are the queue's
/// (read by rows) unless `experts` gathers them by token; x's are gathered by
/// `xIds` where given (the routed experts' token ids), else in order.
void ffnBackward(HostFunctionBuilder &h, Value x, Value dout, Value offs,
                 Value e, Value wguf, Value wdf, Value hf, Value m, Value d,
                 Value n, Value dxe, Value dwguf, Value dwdf,
                 std::optional<ExpertValues> experts, Value xIds,
                 const HostGemms &gemms,
                 std::optional<BiasGradValues> biases = std::nullopt) {
  const GemmTraits &dact = gemms.get("dact", experts ? LibraryGemm::DactGather
                                                     : LibraryGemm::DactRows);
  Value one = h.c(1);
  Value two = h.c(2);
  // dH's width (and W_gate_up's): gate and up columns for SwiGLU, n for a
  // non-gated activation.
  Value hWidth =
      moe_gpu::isGatedActivation(dact.config) ? h.mul(n, two) : Value(n);
  Value dhSize = h.mul(m, hWidth);
  Value dh = h.alloc(dhSize, h.bf16());
  Value waSize = h.mul(m, n);
  Value wa = h.alloc(h.grid(waSize), h.bf16());

  GemmValues v;
  v.offsets = offs;
  v.numExperts = e;
  v.amat = dout;
  v.lda = d;
  v.bmat = wdf;
  v.ldb = d;
  v.dimM = m;
  v.dimN = n;
  v.dimK = d;
  v.hsaved = hf;
  v.dh = dh;
  v.wa = wa;
  if (experts) {
    v.ids = experts->ids;
    v.wrow = experts->wrow;
    v.dspart = experts->dspart;
    v.numNtiles = experts->numNtiles;
  }
  {
    auto [mtiles, ntiles] =
        h.varlenTiles(m, dact.config.tileM, e, n, dact.config.tileN);
    SmallVector<Value> args = gemmArgs(h, dact, v);
    h.launchGemm(dact, mtiles, ntiles, one, args);
  }

  const GemmTraits &dxGemm = gemms.get("dx", LibraryGemm::RowsKBf16);
  {
    auto [mtiles, ntiles] =
        h.varlenTiles(m, dxGemm.config.tileM, e, d, dxGemm.config.tileN);
    GemmValues dv;
    dv.offsets = offs;
    dv.numExperts = e;
    dv.amat = dh;
    dv.lda = hWidth;
    dv.bmat = wguf;
    dv.ldb = hWidth;
    dv.dimM = m;
    dv.dimN = d;
    dv.dimK = hWidth;
    dv.cout = dxe;
    dv.ldc = d;
    SmallVector<Value> args = gemmArgs(h, dxGemm, dv);
    h.launchGemm(dxGemm, mtiles, ntiles, one, args);
  }

  Value queue = experts ? experts->ids : Value();
  // dW_down = (w A)^T dOut[q]: the token rows are B; dW_gate_up = x[q]^T dH:
  // they are A (rows: of w A and dH, for the tensor maps of the rows).
  GemmValues down;
  down.offsets = offs;
  down.numExperts = e;
  down.amat = wa;
  down.lda = n;
  down.bmat = dout;
  down.ldb = d;
  down.dimM = n;
  down.dimN = d;
  down.dimK = h.c(0);
  down.cout = dwdf;
  down.ldc = d;
  down.rows = m;
  launchWgrad(h,
              gemms.get("dw_down", queue ? LibraryGemm::WgradGather
                                         : LibraryGemm::WgradRows),
              &GemmValues::bids, queue, down);
  GemmValues gateUp;
  gateUp.offsets = offs;
  gateUp.numExperts = e;
  gateUp.amat = x;
  gateUp.lda = d;
  gateUp.bmat = dh;
  gateUp.ldb = hWidth;
  gateUp.dimM = d;
  gateUp.dimN = hWidth;
  gateUp.dimK = h.c(0);
  gateUp.cout = dwguf;
  gateUp.ldc = hWidth;
  gateUp.rows = m;
  launchWgrad(h,
              gemms.get("dw_gate_up", xIds ? LibraryGemm::WgradGatherA
                                           : LibraryGemm::WgradRows),
              &GemmValues::ids, xIds, gateUp);
  if (biases) {
    expertColumnSums(h, dh, m, hWidth, Value(), Value(), offs, e, m,
                     biases->dbgu);
    expertColumnSums(h, dout, biases->doutRows, d, biases->doutIds,
                     biases->doutScale, offs, e, m, biases->dbd);
  }
  h.dealloc(dh);
  h.dealloc(wa);
}

} // namespace

void mlir::moe::host::buildExpertCombineGradHost(OpBuilder &b, ModuleOp module,
                                                 bool accumulate,
                                                 const HostGemms &gemms,
                                                 bool bias) {
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type(), i32 = b.getI32Type();
  // With `bias`, the experts' biases after dout (as moe.expert_combine_grad's
  // operands come) and their gradients after the weights'.
  SmallVector<std::pair<StringRef, Type>> params = {
      {"x", buffer(bf16, 2)},      {"token_ids", buffer(i32)},
      {"offsets", buffer(i32)},    {"rows", buffer(i32, 2)},
      {"weights", buffer(f32, 2)}, {"wgu", buffer(bf16, 3)},
      {"wd", buffer(bf16, 3)},     {"h", buffer(bf16, 2)},
      {"dout", buffer(bf16, 2)}};
  if (bias)
    params.append(
        {{"b_gate_up", buffer(bf16, 2)}, {"b_down", buffer(bf16, 2)}});
  params.append({{"act", i32},
                 {"dx", buffer(bf16, 2)},
                 {"d_weights", buffer(f32, 2)},
                 {"d_wgu", buffer(bf16, 3)},
                 {"d_wd", buffer(bf16, 3)}});
  if (bias)
    params.append(
        {{"d_b_gate_up", buffer(bf16, 2)}, {"d_b_down", buffer(bf16, 2)}});
  std::string name = "expert_combine_grad";
  if (bias)
    name += "_bias";
  if (accumulate)
    name += "_acc";
  HostFunctionBuilder h(b, module, name + gemms.suffix().str(), params);
  Value one = h.c(1);
  Value t = h.dim(h.arg("x"), 0);
  Value d = h.dim(h.arg("x"), 1);
  Value k = h.dim(h.arg("rows"), 1);
  Value tk = h.mul(t, k);
  Value r = h.dim(h.arg("token_ids"), 0);
  Value e = h.dim(h.arg("wd"), 0);
  Value n = h.dim(h.arg("wd"), 1);
  Value rowsf = h.flat(h.arg("rows"));
  Value wf = h.flat(h.arg("weights"));
  // The routing weight of each row of the dispatch queue.
  Value wrow = h.alloc(h.grid(r), f32);
  Value slotBlocks = h.ceil(tk, kThreads);
  h.launch("moe_scatter_weights", slotBlocks, one, one, {wf, rowsf, tk, wrow});
  // dS of each row, a partial sum per N-tile of the dSwiGLU GEMM.
  Value nt = h.ceil(n, gemms.get("dact", LibraryGemm::DactGather).config.tileN);
  Value dspartSize = h.mul(r, nt);
  Value dspart = h.alloc(h.grid(dspartSize), f32);
  Value dxeSize = h.mul(r, d);
  Value dxe = h.alloc(dxeSize, bf16);
  Value xf = h.flat(h.arg("x"));
  Value doutf = h.flat(h.arg("dout"));
  Value wguf = h.flat(h.arg("wgu"));
  Value wdf = h.flat(h.arg("wd"));
  Value hf = h.flat(h.arg("h"));
  Value dwguf = h.flat(h.arg("d_wgu"));
  Value dwdf = h.flat(h.arg("d_wd"));
  // d_b_down sums each row's dy = w dout[token].
  std::optional<BiasGradValues> biases;
  if (bias)
    biases =
        BiasGradValues{h.flat(h.arg("d_b_gate_up")), h.flat(h.arg("d_b_down")),
                       t, h.arg("token_ids"), wrow};
  ffnBackward(h, xf, doutf, h.arg("offsets"), e, wguf, wdf, hf, r, d, n, dxe,
              dwguf, dwdf, ExpertValues{h.arg("token_ids"), wrow, dspart, nt},
              h.arg("token_ids"), gemms, biases);
  Value dweightBlocks = h.ceil(tk, kThreads);
  Value dweightsf = h.flat(h.arg("d_weights"));
  h.launch("moe_dweights", dweightBlocks, one, one,
           {dspart, rowsf, tk, nt, dweightsf});
  // y = A W_down + b_down: dS gains <dout[t], b_down[e]>, a warp a slot.
  if (bias) {
    Value dotBlocks = h.ceil(tk, kTokenWarps);
    h.launch("moe_bias_dweights", h.grid(dotBlocks), one, one,
             {doutf, h.flat(h.arg("b_down")), rowsf, h.arg("offsets"), e, tk, k,
              r, d, dweightsf});
  }
  Value weighted = h.cI1(false);
  Value dxf = h.flat(h.arg("dx"));
  h.launch(accumulate ? "moe_gather_sum_acc" : "moe_gather_sum", t, one, one,
           {dxe, rowsf, wrow, weighted, t, k, d, dxf});
  h.dealloc(dxe);
  h.dealloc(dspart);
  h.dealloc(wrow);
  h.finish();
}

void mlir::moe::host::buildExpertFfnGradHost(OpBuilder &b, ModuleOp module,
                                             const HostGemms &gemms,
                                             bool bias) {
  Type bf16 = b.getBF16Type(), i32 = b.getI32Type();
  SmallVector<std::pair<StringRef, Type>> params = {
      {"x", buffer(bf16, 2)},   {"token_ids", buffer(i32)},
      {"offsets", buffer(i32)}, {"wgu", buffer(bf16, 3)},
      {"wd", buffer(bf16, 3)},  {"h", buffer(bf16, 2)},
      {"dy", buffer(bf16, 2)}};
  if (bias)
    params.append(
        {{"b_gate_up", buffer(bf16, 2)}, {"b_down", buffer(bf16, 2)}});
  params.append({{"act", i32},
                 {"dx", buffer(bf16, 2)},
                 {"d_wgu", buffer(bf16, 3)},
                 {"d_wd", buffer(bf16, 3)}});
  if (bias)
    params.append(
        {{"d_b_gate_up", buffer(bf16, 2)}, {"d_b_down", buffer(bf16, 2)}});
  HostFunctionBuilder h(
      b, module,
      ((bias ? "expert_ffn_grad_bias" : "expert_ffn_grad") + gemms.suffix())
          .str(),
      params);
  Value one = h.c(1);
  Value xRows = h.dim(h.arg("x"), 0);
  Value d = h.dim(h.arg("x"), 1);
  Value r = h.dim(h.arg("token_ids"), 0);
  Value e = h.dim(h.arg("wd"), 0);
  Value n = h.dim(h.arg("wd"), 1);
  Value dxeSize = h.mul(r, d);
  Value dxe = h.alloc(h.grid(dxeSize), bf16);
  Value xf = h.flat(h.arg("x"));
  Value dyf = h.flat(h.arg("dy"));
  Value wguf = h.flat(h.arg("wgu"));
  Value wdf = h.flat(h.arg("wd"));
  Value hf = h.flat(h.arg("h"));
  Value dwguf = h.flat(h.arg("d_wgu"));
  Value dwdf = h.flat(h.arg("d_wd"));
  // d_b_down sums dy's rows, in queue order.
  std::optional<BiasGradValues> biases;
  if (bias)
    biases = BiasGradValues{h.flat(h.arg("d_b_gate_up")),
                            h.flat(h.arg("d_b_down")), r, Value(), Value()};
  // The fused function's GEMMs with dy in queue order as dA's A (no gather,
  // no routing weight, no dS) and x gathered by the token ids.
  ffnBackward(h, xf, dyf, h.arg("offsets"), e, wguf, wdf, hf, r, d, n, dxe,
              dwguf, dwdf, std::nullopt, h.arg("token_ids"), gemms, biases);
  // dx[t]: the rows of token t in row order, from per-token lists.
  Value head = h.alloc(h.grid(xRows), i32);
  Value none = h.cI32(-1);
  h.memset(head, none);
  Value count = h.alloc(h.grid(xRows), i32);
  Value zero = h.cI32(0);
  h.memset(count, zero);
  Value next = h.alloc(h.grid(r), i32);
  Value numOffsets = h.dim(h.arg("offsets"), 0);
  Value rowBlocks = h.ceil(r, kThreads);
  h.launch("moe_link_rows", h.grid(rowBlocks), one, one,
           {h.arg("token_ids"), h.arg("offsets"), numOffsets, r, xRows, head,
            count, next});
  Value dxf = h.flat(h.arg("dx"));
  h.launch("moe_token_sum", h.grid(xRows), one, one,
           {dxe, head, count, next, r, xRows, d, dxf});
  h.dealloc(next);
  h.dealloc(count);
  h.dealloc(head);
  h.dealloc(dxe);
  h.finish();
}

void mlir::moe::host::buildCombineGradHost(OpBuilder &b, ModuleOp module) {
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type(), i32 = b.getI32Type();
  HostFunctionBuilder h(b, module, "combine_grad",
                        {{"dout", buffer(bf16, 2)},
                         {"weights", buffer(f32, 2)},
                         {"rows", buffer(i32, 2)},
                         {"y", buffer(bf16, 2)},
                         {"dy", buffer(bf16, 2)},
                         {"d_weights", buffer(f32, 2)}});
  Value one = h.c(1);
  Value t = h.dim(h.arg("dout"), 0);
  Value d = h.dim(h.arg("dout"), 1);
  Value k = h.dim(h.arg("rows"), 1);
  Value tk = h.mul(t, k);
  Value numY = h.dim(h.arg("y"), 0);
  Value numDy = h.dim(h.arg("dy"), 0);
  Value rowsf = h.flat(h.arg("rows"));
  Value wf = h.flat(h.arg("weights"));
  Value doutf = h.flat(h.arg("dout"));
  // The slot that owns each row of dy (the later of two), -1 for none.
  Value sources = h.alloc(h.grid(numDy), i32);
  Value none = h.cI32(-1);
  h.memset(sources, none);
  Value slotBlocks = h.ceil(tk, kThreads);
  h.launch("moe_invert_rows", h.grid(slotBlocks), one, one,
           {rowsf, tk, numDy, sources});
  Value dyf = h.flat(h.arg("dy"));
  h.launch("moe_scale_rows", h.grid(numDy), one, one,
           {doutf, wf, sources, tk, k, numDy, d, dyf});
  // A warp a slot.
  Value dotBlocks = h.ceil(tk, kThreads / 32);
  Value yf = h.flat(h.arg("y"));
  Value dwf = h.flat(h.arg("d_weights"));
  h.launch("moe_row_dots", h.grid(dotBlocks), one, one,
           {doutf, yf, rowsf, tk, k, numY, d, dwf});
  h.dealloc(sources);
  h.finish();
}

void mlir::moe::host::buildSharedExpertGradHost(OpBuilder &b, ModuleOp module,
                                                const HostGemms &gemms) {
  MemRefType bf16 = buffer(b.getBF16Type(), 2);
  HostFunctionBuilder h(b, module,
                        ("shared_expert_grad" + gemms.suffix()).str(),
                        {{"x", bf16},
                         {"wgu", bf16},
                         {"wd", bf16},
                         {"h", bf16},
                         {"dy", bf16},
                         {"act", b.getI32Type()},
                         {"dx", bf16},
                         {"d_wgu", bf16},
                         {"d_wd", bf16}});
  Value t = h.dim(h.arg("x"), 0);
  Value d = h.dim(h.arg("x"), 1);
  Value m = h.dim(h.arg("wd"), 0);
  Value offs = singleOffsets(h, t);
  Value xf = h.flat(h.arg("x"));
  Value dyf = h.flat(h.arg("dy"));
  Value one = h.c(1);
  Value wguf = h.flat(h.arg("wgu"));
  Value wdf = h.flat(h.arg("wd"));
  Value hf = h.flat(h.arg("h"));
  Value dxf = h.flat(h.arg("dx"));
  Value dwguf = h.flat(h.arg("d_wgu"));
  Value dwdf = h.flat(h.arg("d_wd"));
  ffnBackward(h, xf, dyf, offs, one, wguf, wdf, hf, t, d, m, dxf, dwguf, dwdf,
              std::nullopt, Value(), gemms);
  h.dealloc(offs);
  h.finish();
}

namespace {

/// The router's d_logits in bf16 into `dl` [T, E8], with d_logits' input
/// added.
void routerGradLogits(HostFunctionBuilder &h, Value dl, Value t, Value e,
                      Value k, Value e8) {
  Value one = h.c(1);
  // d_logits is an output only where the layer wants it.
  Value dlogitsRows = h.dim(h.arg("d_logits"), 0);
  Value zero = h.c(0);
  Value has = h.cmp(arith::CmpIPredicate::ugt, dlogitsRows, zero);
  Value blocks = h.ceil(t, kTokenWarps);
  Value logitsf = h.flat(h.arg("logits"));
  Value expertsf = h.flat(h.arg("experts"));
  Value dweightsf = h.flat(h.arg("d_weights"));
  Value dlogitsf = h.flat(h.arg("d_logits"));
  h.launch("moe_router_grad_logits", blocks, one, one,
           {logitsf, expertsf, dweightsf, dlogitsf, has, t, e, k,
            h.arg("scoring"), h.arg("renormalize"), h.arg("scaling"), dl, e8});
}

/// The same with the auxiliary losses' d_logits added in the same pass.
void routerGradAuxLogits(HostFunctionBuilder &h, Value dl, Value t, Value e,
                         Value k, Value e8) {
  Value one = h.c(1);
  Value slots = h.mul(t, k);
  Value counts = auxSelectionCounts(h, h.arg("experts"), slots, e);
  Value blocks = h.ceil(t, kTokenWarps);
  Value logitsf = h.flat(h.arg("logits"));
  Value expertsf = h.flat(h.arg("experts"));
  Value dweightsf = h.flat(h.arg("d_weights"));
  // No d_logits input: the kernel reads neither it nor its flag.
  Value none = h.cI1(false);
  h.launch("moe_router_grad_logits_aux", blocks, one, one,
           {logitsf, expertsf, dweightsf, logitsf, none, t, e, k,
            h.arg("scoring"), h.arg("renormalize"), h.arg("scaling"), dl, e8,
            counts, h.arg("d_load_balance"), h.arg("d_z_loss"), slots});
  h.dealloc(counts);
}

} // namespace

void mlir::moe::host::buildRouterGradHost(OpBuilder &b, ModuleOp module,
                                          bool accumulate,
                                          const HostGemms &gemms, bool aux) {
  Type bf16 = b.getBF16Type(), f32 = b.getF32Type(), i32 = b.getI32Type();
  SmallVector<std::pair<StringRef, Type>> params = {
      {"x", buffer(bf16, 2)},
      {"wr", buffer(bf16, 2)},
      {"logits", buffer(f32, 2)},
      {"experts", buffer(i32, 2)},
      {"d_weights", buffer(f32, 2)}};
  // With `aux`, the gradients of moe.aux_loss's losses where d_logits was.
  if (aux)
    params.append(
        {{"d_load_balance", buffer(f32, 0)}, {"d_z_loss", buffer(f32, 0)}});
  else
    params.push_back({"d_logits", buffer(f32, 2)});
  params.append({{"scoring", i32},
                 {"renormalize", b.getI1Type()},
                 {"scaling", f32},
                 {"dx", buffer(bf16, 2)},
                 {"d_wr", buffer(bf16, 2)}});
  std::string name = aux ? "router_grad_aux" : "router_grad";
  if (accumulate)
    name += "_acc";
  HostFunctionBuilder h(b, module, name + gemms.suffix().str(), params);
  Value one = h.c(1);
  Value t = h.dim(h.arg("x"), 0);
  Value d = h.dim(h.arg("x"), 1);
  Value e = h.dim(h.arg("wr"), 1);
  Value k = h.dim(h.arg("experts"), 1);
  Value e8 = round8(h, e);
  Value dlSize = h.mul(t, e8);
  Value dl = h.alloc(h.grid(dlSize), bf16);
  if (aux)
    routerGradAuxLogits(h, dl, t, e, k, e8);
  else
    routerGradLogits(h, dl, t, e, k, e8);
  Value offs = singleOffsets(h, t);
  Value xf = h.flat(h.arg("x"));
  Value wrf = h.flat(h.arg("wr"));
  Value wrp = paddedCopy(h, wrf, d, e, e8, bf16);

  // dx (+)= dlogits W_r^T, one problem of T rows.
  const GemmTraits &dxGemm =
      accumulate ? gemms.getAccumulating("dx", LibraryGemm::RowsKBf16Acc)
                 : gemms.get("dx", LibraryGemm::RowsKBf16);
  {
    auto [mtiles, ntiles] =
        h.varlenTiles(t, dxGemm.config.tileM, one, d, dxGemm.config.tileN);
    GemmValues v;
    v.offsets = offs;
    v.numExperts = one;
    v.amat = dl;
    v.lda = e8;
    v.bmat = wrp;
    v.ldb = e8;
    v.dimM = t;
    v.dimN = d;
    v.dimK = e;
    v.cout = h.flat(h.arg("dx"));
    v.ldc = d;
    SmallVector<Value> args = gemmArgs(h, dxGemm, v);
    h.launchGemm(dxGemm, mtiles, ntiles, one, args);
  }

  // dW_r = x^T dlogits, [d, E8]: K = T tokens, but only ceil(d / 128) output
  // tiles, so the tokens are split into S slices (S tiles a 128 rows of d, at
  // most numCtas() tiles in all, at least kRouterSplitTokens tokens a slice),
  // each slice's [d, E8] written in bf16 and the S summed in f32. A slice's
  // columns past E come from the padding of dlogits, which nothing writes;
  // the sum reads columns < E only.
  const GemmTraits &wgrad = gemms.get("dw", LibraryGemm::WgradRows);
  Value ctas = h.c(h.numCtas());
  Value dTiles = h.ceil(d, wgrad.config.tileM);
  Value slicesPerTile = h.div(ctas, dTiles);
  Value minTokens = h.c(kRouterSplitTokens);
  Value slicesOfTokens = h.div(t, minTokens);
  Value fewest = h.minu(slicesPerTile, slicesOfTokens);
  Value s = h.maxs(one, fewest);
  // A slice's tokens: ceil(T / S) rounded up to whole k-steps.
  Value sMinus1 = h.sub(s, one);
  Value tRounded = h.add(t, sMinus1);
  Value perSlice = h.div(tRounded, s);
  Value ksteps = h.ceil(perSlice, wgrad.config.tileK);
  Value kstep = h.c(wgrad.config.tileK);
  Value chunk = h.mul(ksteps, kstep);
  Value soffsSize = h.add(s, one);
  Value soffs = h.alloc(soffsSize, i32);
  Value sPlus1 = h.add(s, one);
  Value splitBlocks = h.ceil(sPlus1, kThreads);
  h.launch("moe_split_offsets", splitBlocks, one, one, {soffs, t, chunk, s});
  Value sliceSize = h.mul(d, e8);
  Value dwrpSize = h.mul(s, sliceSize);
  Value dwrp = h.alloc(dwrpSize, bf16);
  GemmValues v;
  v.offsets = soffs;
  v.numExperts = s;
  v.amat = xf;
  v.lda = d;
  v.bmat = dl;
  v.ldb = e8;
  v.dimM = d;
  v.dimN = e8;
  v.dimK = h.c(0);
  v.cout = dwrp;
  v.ldc = e8;
  launchWgrad(h, wgrad, nullptr, Value(), v);
  Value sumSize = h.mul(d, e);
  Value sumBlocks = h.ceil(sumSize, kThreads);
  Value dwrf = h.flat(h.arg("d_wr"));
  h.launch("moe_sum_splits_bf16", sumBlocks, one, one,
           {dwrp, dwrf, d, e8, e, s});
  h.dealloc(dl);
  h.dealloc(offs);
  h.dealloc(soffs);
  h.dealloc(wrp);
  h.dealloc(dwrp);
  h.finish();
}
