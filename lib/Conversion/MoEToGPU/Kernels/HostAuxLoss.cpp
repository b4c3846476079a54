//===- HostAuxLoss.cpp - host functions of the auxiliary losses -----------===//
//
// `__moe_gpu_aux_loss` and `__moe_gpu_aux_loss_grad` (docs/gpu-path.md
// section 1): the selection counts of each expert (moe_aux_counts), then the
// losses from per-chunk partial sums reduced in a fixed order
// (moe_aux_partials, moe_aux_columns, moe_aux_finish), or d_logits a warp a
// token (AuxLoss.cpp). Deterministic: the same bits run to run.
//
//===----------------------------------------------------------------------===//

#include "HostBuilder.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::host;

namespace {

/// Routing slots a block of moe_aux_counts counts (AuxLoss.cpp).
constexpr int64_t kCountChunk = 1024;
/// moe_aux_partials' chunks: at least this many tokens each, and at most
/// kMaxChunks of them, so that moe_aux_columns' lanes sum few rows.
constexpr int64_t kMinChunkTokens = 64;
constexpr int64_t kMaxChunks = 1024;

/// A new buffer of the E experts' selection counts among the T * k slots of
/// `experts`.
Value countSelections(HostFunctionBuilder &h, Value experts, Value slots,
                      Value e) {
  Value one = h.c(1);
  Value size = h.grid(e);
  Value counts = h.alloc(size, h.i32());
  Value zero = h.cI32(0);
  h.memset(counts, zero);
  Value blocks = h.ceil(slots, kCountChunk);
  Value flat = h.flat(experts);
  h.launch("moe_aux_counts", blocks, one, one, {flat, slots, e, counts});
  return counts;
}

/// moe_aux_partials' chunks of T tokens: (tokens a chunk, chunks). They
/// depend on T alone: the sums' order is fixed by the sizes.
std::pair<Value, Value> auxChunks(HostFunctionBuilder &h, Value t) {
  Value one = h.c(1);
  Value perChunk = h.ceil(t, kMaxChunks);
  Value minTokens = h.c(kMinChunkTokens);
  Value chunkTokens = h.maxu(perChunk, minTokens);
  Value last = h.sub(chunkTokens, one);
  Value spanned = h.add(t, last);
  Value chunks = h.div(spanned, chunkTokens);
  return {chunkTokens, chunks};
}

/// The losses from the chunks' partial sums and the counts.
void finishLosses(HostFunctionBuilder &h, Value partials, Value chunks,
                  Value counts, Value t, Value e, Value slots,
                  Value loadBalance, Value zLoss) {
  Type f32 = Float32Type::get(t.getContext());
  Value one = h.c(1);
  Value columns = h.add(e, one);
  Value sums = h.alloc(columns, f32);
  Value columnBlocks = h.ceil(columns, kTokenWarps);
  h.launch("moe_aux_columns", columnBlocks, one, one,
           {partials, chunks, e, sums});
  h.launch("moe_aux_finish", one, one, one,
           {sums, counts, t, e, slots, loadBalance, zLoss});
  h.dealloc(sums);
}

} // namespace

Value mlir::moe::host::auxSelectionCounts(HostFunctionBuilder &h, Value experts,
                                          Value slots, Value e) {
  return countSelections(h, experts, slots, e);
}

void mlir::moe::host::routerAuxScoresAndSelect(HostFunctionBuilder &h, Value lf,
                                               Value t, Value e, Value k,
                                               Value wf, Value ef,
                                               Value loadBalance, Value zLoss) {
  Type f32 = Float32Type::get(t.getContext());
  Value one = h.c(1);
  Value slots = h.mul(t, k);
  Value size = h.grid(e);
  Value counts = h.alloc(size, h.i32());
  h.memset(counts, h.cI32(0));
  auto [chunkTokens, chunks] = auxChunks(h, t);
  Value columns = h.add(e, one);
  Value rows = h.grid(chunks);
  Value partialsSize = h.mul(rows, columns);
  Value partials = h.alloc(partialsSize, f32);
  Value scoresSize = h.mul(t, e);
  Value scores = h.alloc(scoresSize, f32);
  // A block a chunk: the scores (logits rounded first) and the partial sums.
  h.launch("moe_router_scores_aux", chunks, one, one,
           {lf, scores, t, e, h.arg("scoring"), h.arg("round_logits"),
            chunkTokens, chunks, partials});
  Value nb = h.dim(h.arg("bias"), 0);
  Value selectBlocks = h.ceil(t, kTokenWarps);
  h.launch("moe_router_select_counts", selectBlocks, one, one,
           {scores, h.arg("bias"), nb, t, e, k, h.arg("num_groups"),
            h.arg("topk_groups"), h.arg("renormalize"), h.arg("scaling"), wf,
            ef, counts});
  h.dealloc(scores);
  finishLosses(h, partials, chunks, counts, t, e, slots, loadBalance, zLoss);
  h.dealloc(partials);
  h.dealloc(counts);
}

void mlir::moe::host::buildAuxLossHost(OpBuilder &b, ModuleOp module) {
  Type f32 = b.getF32Type();
  HostFunctionBuilder h(b, module, "aux_loss",
                        {{"logits", buffer(f32, 2)},
                         {"experts", buffer(b.getI32Type(), 2)},
                         {"scoring", b.getI32Type()},
                         {"load_balance", buffer(f32, 0)},
                         {"z_loss", buffer(f32, 0)}});
  Value one = h.c(1);
  Value t = h.dim(h.arg("logits"), 0);
  Value e = h.dim(h.arg("logits"), 1);
  Value k = h.dim(h.arg("experts"), 1);
  Value slots = h.mul(t, k);
  Value counts = countSelections(h, h.arg("experts"), slots, e);
  // The chunks depend on T alone: the sums' order is fixed by the sizes.
  Value perChunk = h.ceil(t, kMaxChunks);
  Value minTokens = h.c(kMinChunkTokens);
  Value chunkTokens = h.maxu(perChunk, minTokens);
  Value last = h.sub(chunkTokens, one);
  Value spanned = h.add(t, last);
  Value chunks = h.div(spanned, chunkTokens);
  Value columns = h.add(e, one);
  Value rows = h.grid(chunks);
  Value size = h.mul(rows, columns);
  Value partials = h.alloc(size, f32);
  Value logits = h.flat(h.arg("logits"));
  h.launch("moe_aux_partials", chunks, one, one,
           {logits, t, e, h.arg("scoring"), chunkTokens, chunks, partials});
  Value sums = h.alloc(columns, f32);
  Value columnBlocks = h.ceil(columns, kTokenWarps);
  h.launch("moe_aux_columns", columnBlocks, one, one,
           {partials, chunks, e, sums});
  h.launch("moe_aux_finish", one, one, one,
           {sums, counts, t, e, slots, h.arg("load_balance"), h.arg("z_loss")});
  h.dealloc(sums);
  h.dealloc(partials);
  h.dealloc(counts);
  h.finish();
}

void mlir::moe::host::buildAuxLossGradHost(OpBuilder &b, ModuleOp module) {
  Type f32 = b.getF32Type();
  HostFunctionBuilder h(b, module, "aux_loss_grad",
                        {{"logits", buffer(f32, 2)},
                         {"experts", buffer(b.getI32Type(), 2)},
                         {"d_load_balance", buffer(f32, 0)},
                         {"d_z_loss", buffer(f32, 0)},
                         {"scoring", b.getI32Type()},
                         {"d_logits", buffer(f32, 2)}});
  Value one = h.c(1);
  Value t = h.dim(h.arg("logits"), 0);
  Value e = h.dim(h.arg("logits"), 1);
  Value k = h.dim(h.arg("experts"), 1);
  Value slots = h.mul(t, k);
  Value counts = countSelections(h, h.arg("experts"), slots, e);
  Value blocks = h.ceil(t, kTokenWarps);
  Value logits = h.flat(h.arg("logits"));
  Value dLogits = h.flat(h.arg("d_logits"));
  h.launch("moe_aux_loss_grad", blocks, one, one,
           {logits, counts, h.arg("d_load_balance"), h.arg("d_z_loss"), t, e,
            slots, h.arg("scoring"), dLogits});
  h.dealloc(counts);
  h.finish();
}
