//===- HostExpertParallel.cpp - host functions of the expert-parallel ops -===//
//
// The host functions of the local expert-parallel ops and the row moves
// (docs/gpu-path.md section 1): each works out the source row of every
// result row in a small kernel (ExpertParallel.cpp), then moves the rows with
// moe_gather_rows, or sums them with moe_ep_unpack_sum. Row sources are -1
// (a zero row) unless a kernel sets them.
//
//===----------------------------------------------------------------------===//

#include "HostBuilder.h"

using namespace mlir;
using namespace mlir::moe;
using namespace mlir::moe::host;

namespace {

/// The blocks of `offsets` (E + 1 entries) for `ranks` ranks: the offsets'
/// count and the local experts E / S; `ranks` is at least 1.
struct Blocks {
  Value numOffsets, ranks, local;
};

Blocks getBlocks(HostFunctionBuilder &h, Value offsets, Value epSize) {
  Value one = h.c(1);
  Value numOffsets = h.dim(offsets, 0);
  Value ranks = h.maxu(epSize, one);
  Value some = h.maxu(numOffsets, one);
  Value experts = h.sub(some, one);
  Value local = h.div(experts, ranks);
  return {numOffsets, ranks, local};
}

/// A new buffer of `n` (at least 1) row sources, all -1.
Value noSources(HostFunctionBuilder &h, Value n) {
  Value size = h.grid(n);
  Value sources = h.alloc(size, h.i32());
  Value none = h.cI32(-1);
  h.memset(sources, none);
  return sources;
}

/// moe_gather_rows: `rows` rows of out from src's rows `sources` (a zero row
/// for one outside src's `numSrc`).
void gatherRows(HostFunctionBuilder &h, Value src, Value sources, Value numSrc,
                Value rows, Value d, Value out) {
  Value one = h.c(1);
  Value srcFlat = h.flat(src);
  Value outFlat = h.flat(out);
  h.launch("moe_gather_rows", rows, one, one,
           {srcFlat, sources, numSrc, rows, d, outFlat});
}

} // namespace

void mlir::moe::host::buildEPPackHost(OpBuilder &b, ModuleOp module,
                                      bool gather) {
  Type bf16 = b.getBF16Type(), i32 = b.getI32Type(), index = b.getIndexType();
  SmallVector<std::pair<StringRef, Type>> args = {{"source", buffer(bf16, 2)},
                                                  {"offsets", buffer(i32)}};
  if (gather)
    args.push_back({"token_ids", buffer(i32)});
  args.append({{"ep_size", index},
               {"capacity", index},
               {"send", buffer(bf16, 2)},
               {"send_counts", buffer(i32, 2)},
               {"dropped", buffer(i32)}});
  HostFunctionBuilder h(b, module, gather ? "ep_pack_gather" : "ep_pack", args);
  Value one = h.c(1);
  Value numSrc = h.dim(h.arg("source"), 0);
  Value d = h.dim(h.arg("source"), 1);
  Blocks blocks = getBlocks(h, h.arg("offsets"), h.arg("ep_size"));
  Value slots = h.dim(h.arg("send"), 0);
  // Without gather the block rows are the source's rows: token_ids is not
  // read, and the offsets stand in for it.
  Value ids = gather ? h.arg("token_ids") : h.arg("offsets");
  Value numIds = gather ? h.dim(ids, 0) : numSrc;
  Value sources = h.alloc(h.grid(slots), i32);
  // A thread a send row, a local expert's count and a rank's drops.
  Value entries = h.mul(blocks.ranks, blocks.local);
  Value most = h.maxu(slots, entries);
  Value work = h.maxu(most, blocks.ranks);
  Value grid = h.ceil(work, kThreads);
  Value gatherFlag = h.cI1(gather);
  Value counts = h.flat(h.arg("send_counts"));
  h.launch("moe_ep_pack_rows", grid, one, one,
           {h.arg("offsets"), blocks.numOffsets, ids, numIds, gatherFlag,
            blocks.ranks, blocks.local, h.arg("capacity"), slots, sources,
            counts, h.arg("dropped")});
  gatherRows(h, h.arg("source"), sources, numSrc, slots, d, h.arg("send"));
  h.dealloc(sources);
  h.finish();
}

void mlir::moe::host::buildEPUnpackHost(OpBuilder &b, ModuleOp module,
                                        bool reduce) {
  Type bf16 = b.getBF16Type(), i32 = b.getI32Type(), index = b.getIndexType();
  SmallVector<std::pair<StringRef, Type>> args = {{"returned", buffer(bf16, 2)},
                                                  {"offsets", buffer(i32)}};
  if (reduce)
    args.push_back({"rows_of", buffer(i32, 2)});
  args.append(
      {{"ep_size", index}, {"capacity", index}, {"result", buffer(bf16, 2)}});
  HostFunctionBuilder h(b, module, reduce ? "ep_unpack_reduce" : "ep_unpack",
                        args);
  Value one = h.c(1);
  Value numSrc = h.dim(h.arg("returned"), 0);
  Value d = h.dim(h.arg("returned"), 1);
  Blocks blocks = getBlocks(h, h.arg("offsets"), h.arg("ep_size"));
  // The unpacked rows: the result's, or T * k that rows_of points into.
  Value tokens, k, rows;
  if (reduce) {
    Value slotTokens = h.dim(h.arg("rows_of"), 0);
    k = h.dim(h.arg("rows_of"), 1);
    rows = h.mul(slotTokens, k);
    Value resultTokens = h.dim(h.arg("result"), 0);
    tokens = h.minu(slotTokens, resultTokens);
  } else {
    rows = h.dim(h.arg("result"), 0);
  }
  Value sources = noSources(h, rows);
  Value slots = h.mul(blocks.ranks, h.arg("capacity"));
  Value grid = h.ceil(slots, kThreads);
  h.launch("moe_ep_unpack_rows", grid, one, one,
           {h.arg("offsets"), blocks.numOffsets, blocks.ranks, blocks.local,
            h.arg("capacity"), rows, sources});
  if (reduce) {
    Value returned = h.flat(h.arg("returned"));
    Value rowsOf = h.flat(h.arg("rows_of"));
    Value result = h.flat(h.arg("result"));
    h.launch("moe_ep_unpack_sum", tokens, one, one,
             {returned, sources, rowsOf, numSrc, rows, tokens, k, d, result});
  } else {
    gatherRows(h, h.arg("returned"), sources, numSrc, rows, d, h.arg("result"));
  }
  h.dealloc(sources);
  h.finish();
}

void mlir::moe::host::buildEPQueuesHost(OpBuilder &b, ModuleOp module) {
  Type i32 = b.getI32Type();
  HostFunctionBuilder h(b, module, "ep_queues",
                        {{"received_counts", buffer(i32, 2)},
                         {"capacity", b.getIndexType()},
                         {"token_ids", buffer(i32)},
                         {"offsets", buffer(i32)}});
  Value one = h.c(1);
  Value ranks = h.dim(h.arg("received_counts"), 0);
  Value local = h.dim(h.arg("received_counts"), 1);
  Value entries = h.mul(ranks, local);
  Value numSlots = h.dim(h.arg("token_ids"), 0);
  // Each (expert, rank)'s rows taken, first received row and first queue
  // position.
  Value three = h.c(3);
  Value planSize = h.mul(entries, three);
  Value plan = h.alloc(h.grid(planSize), i32);
  Value counts = h.flat(h.arg("received_counts"));
  h.launch("moe_ep_queue_plan", one, one, one,
           {counts, ranks, local, h.arg("capacity"), plan, h.arg("offsets")});
  h.launch(
      "moe_ep_queue_fill", entries, one, one,
      {plan, entries, local, h.arg("offsets"), numSlots, h.arg("token_ids")});
  h.dealloc(plan);
  h.finish();
}

void mlir::moe::host::buildGatherRowsHost(OpBuilder &b, ModuleOp module) {
  Type bf16 = b.getBF16Type();
  HostFunctionBuilder h(b, module, "gather_rows",
                        {{"source", buffer(bf16, 2)},
                         {"indices", buffer(b.getI32Type())},
                         {"result", buffer(bf16, 2)}});
  Value numSrc = h.dim(h.arg("source"), 0);
  Value d = h.dim(h.arg("source"), 1);
  Value numIndices = h.dim(h.arg("indices"), 0);
  Value numResult = h.dim(h.arg("result"), 0);
  Value rows = h.minu(numIndices, numResult);
  gatherRows(h, h.arg("source"), h.arg("indices"), numSrc, rows, d,
             h.arg("result"));
  h.finish();
}

void mlir::moe::host::buildScatterRowsHost(OpBuilder &b, ModuleOp module) {
  Type bf16 = b.getBF16Type();
  HostFunctionBuilder h(b, module, "scatter_rows",
                        {{"source", buffer(bf16, 2)},
                         {"indices", buffer(b.getI32Type())},
                         {"result", buffer(bf16, 2)}});
  Value one = h.c(1);
  Value numSrc = h.dim(h.arg("source"), 0);
  Value d = h.dim(h.arg("source"), 1);
  Value numIndices = h.dim(h.arg("indices"), 0);
  Value rows = h.dim(h.arg("result"), 0);
  // result[indices[i]] = source[i]: the inverse of the indices, then a
  // gather by it.
  Value sources = noSources(h, rows);
  Value used = h.minu(numIndices, numSrc);
  Value grid = h.ceil(used, kThreads);
  h.launch("moe_invert_rows", grid, one, one,
           {h.arg("indices"), used, rows, sources});
  gatherRows(h, h.arg("source"), sources, numSrc, rows, d, h.arg("result"));
  h.dealloc(sources);
  h.finish();
}
