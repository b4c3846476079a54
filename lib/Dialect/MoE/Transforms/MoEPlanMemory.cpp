//===- MoEPlanMemory.cpp - One device arena with static offsets -*- C++ -*-===//
//
// Plans the device memory of a training step at the moe level, where every
// tensor value is one buffer and the static types give its size: the
// training forward and then the backward of a layer (the pair
// moe-generate-backward makes), numbered op by op as one sequence. It is the
// placement the GPU path executes: what a function returns is the caller's
// (a saved tensor lives from its definition in forward to its last use in
// backward); each function's other tensors share that function's workspace,
// one arena at offsets from a greedy best fit, largest buffers first, where
// two buffers live at the same op never overlap (checked); an offloaded
// tensor and a prefetched one, whose copies run on another stream, get
// allocations of their own. docs/memory.md.
//
//===----------------------------------------------------------------------===//

#include "moe/Dialect/MoE/IR/MoEOps.h"
#include "moe/Dialect/MoE/IR/MoETypes.h"
#include "moe/Dialect/MoE/IR/TokenShapes.h"
#include "moe/Dialect/MoE/Transforms/NestedModules.h"
#include "moe/Dialect/MoE/Transforms/Passes.h"
#include "moe/Dialect/MoE/Transforms/TrainingAttributes.h"
#include "moe/Support/ArenaPlacement.h"
#include "moe/Support/ByteSize.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"
#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/ScopeExit.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/raw_ostream.h"

namespace mlir::moe {
#define GEN_PASS_DEF_MOEPLANMEMORY
#include "moe/Dialect/MoE/Transforms/Passes.h.inc"
} // namespace mlir::moe

using namespace mlir;
using namespace mlir::moe;

namespace {

/// Where a buffer lives.
enum class Place {
  Arena,    // the workspace of the function that defines it, at an offset
  Returned, // the caller's: the function returns it
  Apart,    // an allocation of its own (offloaded from, prefetched into)
  Host,     // an offloaded tensor's host copy
};

/// One buffer of the plan.
struct Buffer {
  Value value;
  uint64_t size = 0;
  unsigned first = 0, last = 0; // op indices of the step, inclusive
  uint64_t offset = 0;          // in its function's arena
  uint64_t perToken = 0; // of `size` with a dynamic token count, at the bound
  Place place = Place::Arena;
  unsigned function = 0; // 0 forward, 1 backward
  bool saved = false;    // live across the end of forward
};

/// "moe.expert_ffn.h", "arith.addf", "arg3".
std::string valueName(Value value) {
  if (auto argument = dyn_cast<BlockArgument>(value))
    return ("arg" + Twine(argument.getArgNumber())).str();
  auto result = cast<OpResult>(value);
  Operation *op = result.getOwner();
  std::string name = op->getName().getStringRef().str();
  if (auto asmOp = dyn_cast<OpAsmOpInterface>(op)) {
    asmOp.getAsmResultNames([&](Value named, StringRef asmName) {
      if (named == value)
        name += "." + asmName.str();
    });
  } else if (op->getNumResults() > 1) {
    name += "#" + std::to_string(result.getResultNumber());
  }
  return name;
}

std::string gib(uint64_t bytes) {
  std::string text;
  llvm::raw_string_ostream(text)
      << bytes << " B ("
      << llvm::format("%.3g", static_cast<double>(bytes) / (1ull << 30))
      << " GiB)";
  return text;
}

/// A training step (forward then backward) or one function alone.
class StepPlanner {
public:
  StepPlanner(func::FuncOp forward, func::FuncOp backward, uint64_t alignment)
      : forward(forward), backward(backward), alignment(alignment),
        bound(getMaxTokens(forward)) {}

  /// Finds the buffers, their lifetimes and places; fails on a dynamic shape.
  LogicalResult collect();
  /// Assigns the offsets and checks that no two live buffers overlap.
  LogicalResult assign();
  /// Writes the offsets into the IR.
  void annotate();
  void print(llvm::raw_ostream &os);

private:
  /// The buffer of a device tensor value, created on first sight.
  FailureOr<Buffer *> bufferOf(Value value, unsigned index);
  /// The value whose buffer `value` lives in (itself, or what it aliases).
  Value resolve(Value value) const;
  /// Extends the life of `value`'s buffer (when it has one) to `index`.
  void use(Value value, unsigned index);
  /// The functions of the step, forward first.
  SmallVector<func::FuncOp, 2> functions() const;

  func::FuncOp forward, backward; // backward may be null
  uint64_t alignment;
  /// The bound of a dynamic token count: sizes are planned at it.
  std::optional<int64_t> bound;
  SmallVector<Operation *> ops; // the step, in order
  unsigned backwardStart = 0;
  llvm::MapVector<Value, Buffer> buffers;
  /// A backward saved argument -> the forward value; the result of an op
  /// that accumulates -> its `accumulate`, which it overwrites.
  DenseMap<Value, Value> alias;
  uint64_t arenaSize[2] = {0, 0};
  uint64_t peak = 0, peakPerToken = 0;
  unsigned peakIndex = 0;
  uint64_t savedArguments = 0;
};

FailureOr<Buffer *> StepPlanner::bufferOf(Value value, unsigned index) {
  Type type = value.getType();
  bool host = isa<HostTensorType>(type);
  ShapedType shaped;
  if (host) {
    auto hostType = cast<HostTensorType>(type);
    shaped = hostType.getDeviceType();
  } else {
    shaped = dyn_cast<RankedTensorType>(type);
  }
  if (!shaped)
    return static_cast<Buffer *>(nullptr);
  // With a dynamic token count, the size at the bound.
  std::optional<TokenBytes> tokenBytes;
  if (!shaped.hasStaticShape() &&
      (!bound || !(tokenBytes = getTokenBytes(value)))) {
    InFlightDiagnostic diag = isa<BlockArgument>(value)
                                  ? mlir::emitError(value.getLoc())
                                  : value.getDefiningOp()->emitOpError();
    diag << "moe-plan-memory needs static shapes, or a dynamic token count "
            "with its bound (moe.max_tokens), but "
         << valueName(value) << " has type " << type;
    return failure();
  }
  auto [it, inserted] = buffers.try_emplace(value);
  Buffer &buffer = it->second;
  if (inserted) {
    ByteSizeStatus status;
    buffer.value = value;
    if (tokenBytes) {
      std::optional<uint64_t> atBound = tokenBytes->at(*bound);
      status = atBound ? ByteSizeStatus::Known : ByteSizeStatus::Overflow;
      buffer.size = atBound.value_or(0);
      buffer.perToken = tokenBytes->perToken;
    } else {
      buffer.size = getByteSize(shaped, status);
    }
    buffer.first = buffer.last = index;
    buffer.function = index >= backwardStart ? 1 : 0;
    if (host)
      buffer.place = Place::Host;
    else if (value.getDefiningOp<PrefetchOp>())
      buffer.place = Place::Apart;
    if (status != ByteSizeStatus::Known) {
      InFlightDiagnostic diag = isa<BlockArgument>(value)
                                    ? mlir::emitError(value.getLoc())
                                    : value.getDefiningOp()->emitOpError();
      diag << "moe-plan-memory: the bytes of " << valueName(value) << " ("
           << type << ") do not fit in 63 bits";
      return failure();
    }
  }
  return &buffer;
}

Value StepPlanner::resolve(Value value) const {
  while (Value source = alias.lookup(value))
    value = source;
  return value;
}

void StepPlanner::use(Value value, unsigned index) {
  auto it = buffers.find(resolve(value));
  if (it != buffers.end())
    it->second.last = std::max(it->second.last, index);
}

SmallVector<func::FuncOp, 2> StepPlanner::functions() const {
  SmallVector<func::FuncOp, 2> result = {forward};
  if (backward)
    result.push_back(backward);
  return result;
}

/// Whether `value` is an expert FFN's y that nothing reads: recomputing h in
/// backward runs the up projection alone and never makes it.
bool isUnreadY(Value value) {
  Operation *op = value.getDefiningOp();
  return isa_and_nonnull<ExpertFFNOp, SharedExpertOp>(op) &&
         value == op->getResult(0) && value.use_empty();
}

LogicalResult StepPlanner::collect() {
  for (func::FuncOp func : functions()) {
    if (!func.getBody().hasOneBlock())
      return func.emitOpError("has more than one block; moe-plan-memory "
                              "plans straight-line functions only");
    if (func == backward)
      backwardStart = ops.size();
    for (Operation &op : func.front())
      ops.push_back(&op);
  }
  if (!backward)
    backwardStart = ops.size();

  // Saved arguments of backward are the forward values they receive.
  unsigned numSaved = 0;
  auto forwardReturn = cast<func::ReturnOp>(forward.front().getTerminator());
  if (backward) {
    numSaved = forward->getAttrOfType<IntegerAttr>(kNumSavedAttr).getInt();
    if (numSaved > forwardReturn.getNumOperands() ||
        numSaved > backward.getNumArguments())
      return forward.emitOpError("has moe.num_saved ")
             << numSaved << " but returns " << forwardReturn.getNumOperands()
             << " values and @" << backward.getSymName() << " takes "
             << backward.getNumArguments() << " arguments";
    unsigned firstSaved = forwardReturn.getNumOperands() - numSaved;
    for (unsigned i = 0; i < numSaved; ++i) {
      Value value = forwardReturn.getOperand(firstSaved + i);
      alias[backward.getArgument(i)] = value;
      if (auto argument = dyn_cast<BlockArgument>(value))
        if (auto type = dyn_cast<RankedTensorType>(argument.getType())) {
          ByteSizeStatus status;
          uint64_t bytes = getByteSize(type, status);
          if (status == ByteSizeStatus::Dynamic && bound)
            if (std::optional<TokenBytes> tokenBytes = getTokenBytes(argument))
              if (std::optional<uint64_t> atBound = tokenBytes->at(*bound)) {
                bytes = *atBound;
                status = ByteSizeStatus::Known;
              }
          std::optional<uint64_t> sum = addByteSizes(savedArguments, bytes);
          if (status == ByteSizeStatus::Overflow || !sum)
            return mlir::emitError(argument.getLoc())
                   << "moe-plan-memory: the bytes of the saved arguments ("
                   << type << " among them) do not fit in 63 bits";
          if (status == ByteSizeStatus::Known)
            savedArguments = *sum;
        }
    }
  }

  for (auto [index, op] : llvm::enumerate(ops)) {
    unsigned at = index;
    // Uses first: a buffer read here lives until here. Nested regions
    // count as uses by the op that holds them.
    op->walk([&](Operation *inner) {
      for (Value operand : inner->getOperands())
        use(operand, at);
    });
    if (auto returnOp = dyn_cast<func::ReturnOp>(op)) {
      // What a function returns is the caller's; the saved values live on
      // into backward, to their last use there.
      for (auto [i, value] : llvm::enumerate(returnOp.getOperands())) {
        auto it = buffers.find(resolve(value));
        if (it == buffers.end())
          continue;
        if (it->second.place == Place::Arena)
          it->second.place = Place::Returned;
        if (op == forwardReturn && backward &&
            i >= returnOp.getNumOperands() - numSaved)
          it->second.saved = true;
      }
      continue;
    }
    // An op that accumulates writes its result over its `accumulate`, when
    // nothing else reads that (moe-fold-adds makes it so).
    OpOperand *accumulate = getAccumulateOperand(op);
    Value accumulated = getAccumulatedResult(op);
    for (Value result : op->getResults()) {
      if (accumulate && result == accumulated &&
          accumulate->get().hasOneUse() &&
          buffers.count(resolve(accumulate->get()))) {
        alias[result] = accumulate->get();
        continue;
      }
      if (isUnreadY(result))
        continue;
      FailureOr<Buffer *> buffer = bufferOf(result, at);
      if (failed(buffer))
        return failure();
      // The runtime frees an offloaded tensor when its copy to the host is
      // done, which the arena cannot know.
      if (*buffer && llvm::any_of(result.getUsers(), [](Operation *user) {
            return isa<OffloadOp>(user);
          }))
        (*buffer)->place = Place::Apart;
    }
  }
  for (func::FuncOp func : functions())
    for (BlockArgument argument : func.getArguments())
      if (!alias.count(argument) && isa<RankedTensorType>(argument.getType()) &&
          !cast<RankedTensorType>(argument.getType()).hasStaticShape() &&
          !(bound && getTokenBytes(argument))) {
        (void)bufferOf(argument, 0);
        return failure();
      }
  return success();
}

LogicalResult StepPlanner::assign() {
  for (unsigned function : {0u, 1u}) {
    SmallVector<Buffer *> inArena;
    SmallVector<ArenaBuffer> requests;
    for (auto &entry : buffers)
      if (entry.second.place == Place::Arena &&
          entry.second.function == function) {
        inArena.push_back(&entry.second);
        requests.push_back(
            {entry.second.size, entry.second.first, entry.second.last});
      }
    // With every buffer and its alignment padding under 2^63 in all, no
    // offset, end or sum of live bytes below can wrap.
    uint64_t total = 0;
    for (const ArenaBuffer &request : requests) {
      std::optional<uint64_t> sum = addByteSizes(total, request.size);
      sum = sum ? addByteSizes(*sum, alignment) : std::nullopt;
      if (!sum)
        return forward.emitOpError("moe-plan-memory: the step's ")
               << requests.size() << " buffers, aligned to " << alignment
               << " B, do not fit in 63 bits";
      total = *sum;
    }
    SmallVector<uint64_t> offsets;
    arenaSize[function] = placeInArena(requests, alignment, offsets);
    for (auto [buffer, offset] : llvm::zip(inArena, offsets))
      buffer->offset = offset;
    // The check: no two buffers live at one op share a byte.
    if (auto overlap = findArenaOverlap(requests, offsets))
      return forward.emitOpError("moe-plan-memory placed ")
             << valueName(inArena[overlap->first]->value) << " and "
             << valueName(inArena[overlap->second]->value)
             << " at overlapping offsets while both are live (a bug)";
  }

  // The peak: the most device bytes live at one op, wherever they are.
  SmallVector<uint64_t> live(ops.size(), 0), livePerToken(ops.size(), 0);
  for (auto &entry : buffers)
    if (entry.second.place != Place::Host)
      for (unsigned i = entry.second.first; i <= entry.second.last; ++i) {
        live[i] += entry.second.size;
        livePerToken[i] += entry.second.perToken;
      }
  for (auto [index, bytes] : llvm::enumerate(live))
    if (bytes > peak) {
      peak = bytes;
      peakPerToken = livePerToken[index];
      peakIndex = index;
    }
  return success();
}

void StepPlanner::annotate() {
  Builder builder(forward.getContext());
  for (Operation *op : ops) {
    if (op->getNumResults() == 0)
      continue;
    SmallVector<int64_t> offsets;
    bool any = false;
    for (Value result : op->getResults()) {
      auto it = buffers.find(result);
      bool inArena = it != buffers.end() && it->second.place == Place::Arena;
      offsets.push_back(inArena ? static_cast<int64_t>(it->second.offset) : -1);
      any |= inArena;
    }
    if (any)
      op->setAttr(kArenaOffsetsAttr, builder.getDenseI64ArrayAttr(offsets));
  }
  for (auto [function, func] : llvm::enumerate(functions()))
    func->setAttr(
        kArenaSizeAttr,
        builder.getI64IntegerAttr(static_cast<int64_t>(arenaSize[function])));
}

void StepPlanner::print(llvm::raw_ostream &os) {
  os << "moe-plan-memory: forward @" << forward.getSymName() << " ops [0, "
     << static_cast<int64_t>(backwardStart) - 1 << "]";
  if (backward)
    os << ", backward @" << backward.getSymName() << " ops [" << backwardStart
       << ", " << ops.size() - 1 << "]";
  os << ", alignment " << alignment << " B";
  if (bound)
    os << ", at the bound T = " << *bound;
  os << "\n";
  for (auto [index, op] : llvm::enumerate(ops))
    os << "op " << index << " " << op->getName() << "\n";
  unsigned id = 0;
  uint64_t saved = 0, host = 0;
  unsigned numSaved = 0;
  SmallVector<func::FuncOp, 2> funcs = functions();
  for (auto &[value, buffer] : buffers) {
    if (buffer.place == Place::Host) {
      os << "host " << id++ << " " << valueName(value) << ": " << buffer.size
         << " B, live [" << buffer.first << ", " << buffer.last << "]";
      if (buffer.perToken)
        os << ", " << buffer.perToken << " B a token";
      os << "\n";
      host += buffer.size;
      continue;
    }
    os << "buffer " << id++ << " " << valueName(value) << ": " << buffer.size
       << " B ";
    switch (buffer.place) {
    case Place::Arena:
      os << "at offset " << buffer.offset << " in @"
         << funcs[buffer.function].getSymName();
      break;
    case Place::Returned:
      os << "returned";
      break;
    case Place::Apart:
      os << "apart";
      break;
    case Place::Host:
      break;
    }
    os << ", live [" << buffer.first << ", " << buffer.last << "]"
       << (buffer.saved ? ", saved" : "");
    if (buffer.perToken)
      os << ", " << buffer.perToken << " B a token";
    os << "\n";
    if (buffer.saved) {
      saved += buffer.size;
      ++numSaved;
    }
  }
  os << "peak: " << gib(peak) << " at op " << peakIndex;
  if (peakPerToken)
    os << ", " << peakPerToken << " B a token";
  os << "\n";
  for (auto [function, func] : llvm::enumerate(funcs))
    os << "arena @" << func.getSymName() << ": " << gib(arenaSize[function])
       << "\n";
  if (backward) {
    os << "saved for backward: " << gib(saved) << " in " << numSaved
       << " buffers, and " << gib(savedArguments) << " of saved arguments\n";
    os << "offloaded to the host: " << gib(host) << "\n";
  }
}

struct MoEPlanMemoryPass
    : public mlir::moe::impl::MoEPlanMemoryBase<MoEPlanMemoryPass> {
  using MoEPlanMemoryBase::MoEPlanMemoryBase;

  void runOnOperation() override;
};

bool containsMoEOps(func::FuncOp func) {
  return func
      .walk([](Operation *op) {
        return isa<MoEDialect>(op->getDialect()) ? WalkResult::interrupt()
                                                 : WalkResult::advance();
      })
      .wasInterrupted();
}

void MoEPlanMemoryPass::runOnOperation() {
  ModuleOp module = getOperation();
  if (failed(checkNoMoEInNestedModules(module, "moe-plan-memory")))
    return signalPassFailure();
  auto functions = llvm::to_vector(module.getOps<func::FuncOp>());
  Operation *at = functions.empty() ? module.getOperation()
                                    : functions.front().getOperation();
  if (alignment <= 0 || (alignment & (alignment - 1)) != 0) {
    at->emitError("moe-plan-memory: alignment must be a power of two, got ")
        << static_cast<int64_t>(alignment);
    return signalPassFailure();
  }
  std::unique_ptr<llvm::raw_fd_ostream> file;
  llvm::raw_ostream *os = nullptr;
  if (memoryReport == "-") {
    os = &llvm::outs();
  } else if (!memoryReport.empty()) {
    std::error_code error;
    file = std::make_unique<llvm::raw_fd_ostream>(memoryReport, error,
                                                  llvm::sys::fs::OF_Text);
    if (error) {
      at->emitError("moe-plan-memory: cannot write the memory report to '")
          << memoryReport << "': " << error.message();
      return signalPassFailure();
    }
    os = file.get();
  }
  // A failed write (a full disk, /dev/full) is an error here, on every way
  // out; left in the stream it would abort the program when it closes.
  llvm::scope_exit closeReport([&] {
    if (!file)
      return;
    file->close();
    if (!file->has_error())
      return;
    // At the location only: the note with the whole function is noise here.
    mlir::emitError(at->getLoc(),
                    "moe-plan-memory: cannot write the memory report to '")
        << memoryReport << "': " << file->error().message();
    file->clear_error();
    signalPassFailure();
  });

  // Training pairs as steps; functions with moe ops that belong to no pair
  // (and are not the source of one) alone.
  SymbolTable symbols(module);
  DenseSet<Operation *> paired;
  SmallVector<std::pair<func::FuncOp, func::FuncOp>> steps;
  for (func::FuncOp func : functions) {
    StringRef name = func.getSymName();
    if (func.isExternal() || !func->hasAttr(kNumSavedAttr) ||
        !name.ends_with("_forward"))
      continue;
    StringRef base = name.drop_back(strlen("_forward"));
    auto backward = symbols.lookup<func::FuncOp>((base + "_backward").str());
    if (!backward || !backward->hasAttr("moe.gradient_args")) {
      func.emitOpError("saves tensors for backward (moe.num_saved) but has "
                       "no backward function @")
          << base << "_backward";
      return signalPassFailure();
    }
    steps.emplace_back(func, backward);
    paired.insert(func);
    paired.insert(backward);
    if (auto source = symbols.lookup<func::FuncOp>(base))
      paired.insert(source);
  }
  for (func::FuncOp func : functions)
    if (!func.isExternal() && !paired.contains(func) &&
        !func->hasAttr("moe.gradient_args") && containsMoEOps(func))
      steps.emplace_back(func, nullptr);

  for (auto [forward, backward] : steps) {
    StepPlanner planner(forward, backward, alignment);
    if (failed(planner.collect()) || failed(planner.assign()))
      return signalPassFailure();
    planner.annotate();
    if (os)
      planner.print(*os);
  }
  if (os)
    os->flush();
}

} // namespace
