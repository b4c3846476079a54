//===- moe-compile.cpp - A moe layer to a linkable object ----*- C++ -*-===//
//
// moe-compile layer.mlir -o DIR/NAME runs moe-training-pipeline{chip=sm_90a}
// in process, adds C entry points around the forward and backward host
// functions, and writes NAME.o (x86-64, PIC, kernels embedded), NAME.h and
// NAME.json, the manifest python/moe_mlir/gpu.py reads (docs/gpu-path.md
// section 2).
//
//===----------------------------------------------------------------------===//

#include "moe/Conversion/MoEToGPU/EntryPoints.h"
#include "moe/Conversion/MoEToGPU/GPUContract.h"
#include "moe/Conversion/MoEToGPU/MoEToGPU.h"
#include "moe/Conversion/Passes.h"
#include "moe/Dialect/MoEGPU/Transforms/KernelRoles.h"
#include "moe/InitAll.h"
#include "moe/Pipelines/Pipelines.h"
#include "moe/Support/InputNesting.h"
#include "moe/Support/MemorySize.h"

#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/Vector/IR/VectorOps.h"
#include "mlir/ExecutionEngine/OptUtils.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Support/FileUtilities.h"
#include "mlir/Target/LLVMIR/Dialect/GPU/GPUToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Export.h"

#include "llvm/ADT/MapVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/LegacyPassManager.h"
#include "llvm/IR/Module.h"
#include "llvm/MC/TargetRegistry.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Target/TargetMachine.h"
#include "llvm/Target/TargetOptions.h"
#include "llvm/TargetParser/Triple.h"

#include <cstdlib>
#include <optional>
#include <string>

extern "C" {
void LLVMInitializeX86TargetInfo();
void LLVMInitializeX86Target();
void LLVMInitializeX86TargetMC();
void LLVMInitializeX86AsmPrinter();
}

using namespace mlir;
using mlir::moe::cIdentifier;
using mlir::moe::describeEntryParam;
using mlir::moe::EntryParam;
using mlir::moe::EntryPointInfo;
namespace cl = llvm::cl;

#ifndef MOE_MLIR_VERSION
#define MOE_MLIR_VERSION "dev"
#endif

namespace {

cl::opt<std::string> inputFilename(cl::Positional, cl::desc("<layer.mlir>"),
                                   cl::Required);
cl::opt<std::string>
    outputPrefix("o",
                 cl::desc("Output prefix DIR/NAME: writes NAME.o, NAME.h, "
                          "NAME.json, ..."),
                 cl::value_desc("prefix"), cl::Required);
cl::opt<std::string>
    format("format",
           cl::desc("Kernel binary: bin (cubin, needs ptxas), isa (PTX, "
                    "JIT-compiled when the object loads) or fatbin"),
           cl::init("bin"));
cl::opt<unsigned> optLevel("opt-level",
                           cl::desc("Optimisation level of the kernels (0-3)"),
                           cl::init(3));
cl::opt<std::string> policy(
    "policy",
    cl::desc("Activation plan (moe-plan-activations, docs/memory.md): auto, "
             "keep, recompute or offload (H in pinned host memory between "
             "forward and backward)"),
    cl::init("auto"));
cl::opt<std::string>
    memoryBudget("memory-budget",
                 cl::desc("Activation bytes backward may keep, e.g. 2GiB "
                          "(empty: no limit)"),
                 cl::init(""));
cl::opt<std::string> kernelCache(
    "kernel-cache",
    cl::desc("Directory where compiled kernel binaries are kept and found "
             "again by later compiles, of any layer (default: "
             "$MOE_MLIR_CACHE/kernels, else ~/.cache/moe_mlir/kernels; "
             "'none': compile the kernels every time)"),
    cl::init(""));
cl::opt<std::string> kernelLibrary(
    "kernel-library",
    cl::desc("Read-only directory of prebuilt kernel binaries, searched after "
             "the kernel cache: the kernel library the project's build "
             "compiles (default: share/moe_mlir/kernels beside this "
             "program's bin/, when it exists; 'none': not searched)"),
    cl::init(""));
cl::opt<std::string> gpuLibrary(
    "gpu-library",
    cl::desc("A GPU library file (kernels and host functions) to compile "
             "the layer against instead of the one the kernel builder makes, "
             "e.g. moe-opt --moe-gpu-emit-library's output of another build, "
             "to time two libraries in one run"),
    cl::value_desc("file"), cl::init(""));
cl::opt<int64_t> numSMs(
    "num-sms",
    cl::desc("SMs of the GPU the layer runs on: the persistent GEMMs launch a "
             "CTA an SM (default 0: the chip's, 132 for sm_90a, H100 SXM and "
             "H200; an H100 PCIe has 114)"),
    cl::init(0));
cl::list<std::string> kernelConfig(
    "kernel-config",
    cl::desc("Parameters of the GEMM kernels the compiler chooses, "
             "[OP.]ROLE:KEY=VALUE[:KEY=VALUE...] with the keys and values of "
             "#moe_gpu.gemm, e.g. expert_ffn.down:stages=2 or "
             "dact:dact_unroll=8 (docs/dialect.md); repeatable, a later one "
             "wins"),
    cl::value_desc("config"));
cl::list<std::string>
    emit("emit",
         cl::desc("What to write: obj (NAME.o), header (NAME.h), manifest "
                  "(NAME.json), llvm (NAME.ll), mlir (NAME.mlir, the LLVM "
                  "dialect); default obj,header,manifest"),
         cl::CommaSeparated);

/// The chip of the GPU path's contract (python/moe_mlir/gpu_contract.json).
constexpr llvm::StringLiteral kChip = moe::gpu_contract::kChip;
constexpr llvm::StringLiteral kHostTriple = "x86_64-unknown-linux-gnu";

int fail(const llvm::Twine &message) {
  llvm::errs() << "moe-compile: error: " << message << "\n";
  return 1;
}

/// LLVM reports some errors (a PTX version the chip does not take: pitfall P2
/// of docs/gpu-kernels.md) by aborting; say what happened and exit instead.
void onFatalError(void *, const char *reason, bool) {
  llvm::errs() << "moe-compile: error: LLVM: " << reason << "\n";
  llvm::errs().flush();
  std::_Exit(1);
}

std::string getString(DictionaryAttr dict, StringRef key) {
  if (auto value = dict.getAs<StringAttr>(key))
    return value.str();
  return "";
}

//===----------------------------------------------------------------------===//
// Header and manifest
//===----------------------------------------------------------------------===//

std::string layerSummary(DictionaryAttr layer) {
  if (!layer)
    return "";
  std::string text;
  llvm::raw_string_ostream os(text);
  auto integer = [&](StringRef key) -> int64_t {
    if (auto value = layer.getAs<IntegerAttr>(key))
      return value.getInt();
    return 0;
  };
  auto boolean = [&](StringRef key) {
    auto value = layer.getAs<BoolAttr>(key);
    return value && value.getValue();
  };
  double scaling = 1.0;
  if (auto value = layer.getAs<FloatAttr>("scaling_factor"))
    scaling = value.getValueAsDouble();
  if (integer("max_tokens"))
    os << " *   T = 1 .. " << integer("max_tokens");
  else
    os << " *   T = " << integer("T");
  os << " tokens, d = " << integer("d") << ", n = " << integer("n")
     << ", E = " << integer("E") << " experts, top k = " << integer("k") << "\n"
     << " *   activation " << getString(layer, "activation") << ", scoring "
     << getString(layer, "scoring")
     << ", renormalize = " << (boolean("renormalize") ? "true" : "false")
     << ", groups " << integer("topk_groups") << " of " << integer("num_groups")
     << ", scaling " << llvm::format("%g", scaling)
     << (boolean("round_logits") ? ", logits rounded to bf16" : "") << "\n"
     << " *   selection bias: " << (boolean("has_bias") ? "yes" : "no")
     << ", shared expert width: " << integer("shared_n")
     << (boolean("expert_bias") ? ", expert biases" : "") << "\n";
  if (auto inputs = layer.getAs<DictionaryAttr>("inputs")) {
    os << " *   inputs:";
    for (StringRef key :
         {"x", "w_router", "bias", "w_gate_up", "w_down", "b_gate_up", "b_down",
          "shared_w_gate_up", "shared_w_down"})
      if (auto arg = inputs.getAs<StringAttr>(key))
        os << " " << key << " = " << arg.getValue() << ";";
    os << "\n";
  }
  return text;
}

/// The layer configuration of an expert-parallel layer, whose forward
/// stages each see a part of it (the router in the first, the experts in
/// the next): each key from the first stage that gives it (a non-zero number,
/// a non-empty string), and each input named by the argument of the layer
/// function that the stage's own argument is (its moe.ep_inputs).
DictionaryAttr mergeStageLayers(ArrayRef<EntryPointInfo> entries) {
  Builder b(entries.front().layer.getContext());
  llvm::MapVector<StringAttr, Attribute> merged;
  llvm::MapVector<StringAttr, Attribute> inputs;
  auto given = [](Attribute value) {
    if (auto integer = dyn_cast<IntegerAttr>(value))
      return integer.getValue() != 0;
    if (auto text = dyn_cast<StringAttr>(value))
      return !text.getValue().empty();
    return true;
  };
  for (const EntryPointInfo &entry : entries) {
    if (!entry.layer || !StringRef(entry.kind).starts_with("forward_stage"))
      continue;
    auto stageInputs = entry.stage.getAs<ArrayAttr>("inputs");
    for (NamedAttribute attr : entry.layer) {
      if (attr.getName() == "inputs") {
        for (NamedAttribute input : cast<DictionaryAttr>(attr.getValue())) {
          StringRef own = cast<StringAttr>(input.getValue()).getValue();
          unsigned position;
          if (!stageInputs || !own.consume_front("arg") ||
              own.getAsInteger(10, position) || position >= stageInputs.size())
            continue;
          inputs.insert({input.getName(), stageInputs[position]});
        }
        continue;
      }
      auto it = merged.find(attr.getName());
      if (it == merged.end())
        merged.insert({attr.getName(), attr.getValue()});
      else if (!given(it->second) && given(attr.getValue()))
        it->second = attr.getValue();
    }
  }
  SmallVector<NamedAttribute> entriesOut;
  for (auto &[name, value] : merged)
    entriesOut.push_back(NamedAttribute(name, value));
  SmallVector<NamedAttribute> inputList;
  for (auto &[name, value] : inputs)
    inputList.push_back(NamedAttribute(name, value));
  entriesOut.push_back(
      b.getNamedAttr("inputs", b.getDictionaryAttr(inputList)));
  return b.getDictionaryAttr(entriesOut);
}

/// What a stage's parameters are, for the header: "forward (stage 0 of 3):
/// its arguments arg0, arg1; then it gives send0 (the rows for each rank) ...".
std::string stageSummary(const EntryPointInfo &entry) {
  auto names = [&](StringRef key) {
    SmallVector<std::string> out;
    if (auto array = entry.stage.getAs<ArrayAttr>(key))
      for (Attribute attr : array)
        if (auto text = dyn_cast<StringAttr>(attr))
          out.push_back(text.str());
    return llvm::join(out, ", ");
  };
  auto integer = [&](StringRef key) -> int64_t {
    auto value = entry.stage.getAs<IntegerAttr>(key);
    return value ? value.getInt() : 0;
  };
  std::string text;
  llvm::raw_string_ostream os(text);
  os << StringRef(entry.kind).split('_').first << " (stage " << integer("stage")
     << " of " << integer("stages") << ", docs/distributed.md): it takes "
     << names("inputs") << "; it gives " << names("outputs") << ".";
  // A chunked layer's entry points serve one chunk; the caller splits the
  // step and runs the stages once a chunk.
  if (int64_t step = integer("step_tokens"))
    os << " Called once a chunk: a step of up to " << step
       << " tokens runs as ceil(" << step << " / " << entry.maxTokens
       << ") chunks of at most " << entry.maxTokens
       << " tokens, each its own dispatch and combine.";
  return text;
}

std::string makeHeader(StringRef cName, ArrayRef<EntryPointInfo> entries,
                       DictionaryAttr layer, StringRef input,
                       StringRef fileName) {
  std::string text;
  llvm::raw_string_ostream os(text);
  std::string guard = StringRef(cIdentifier(fileName)).upper();
  os << "/* " << fileName << ": generated by moe-compile (moe-mlir "
     << MOE_MLIR_VERSION << ") from " << llvm::sys::path::filename(input)
     << "; do not edit.\n"
     << " *\n"
     << " * MoE layer @" << cName << " for " << kChip << ":\n"
     << layerSummary(layer) << " *\n"
     << " * Every tensor is a device pointer (a CUdeviceptr cast to void *),\n"
     << " * row-major, 16-byte aligned, of the element type and shape given.\n"
     << " * stream is a CUstream: the call enqueues its work there and "
        "returns\n"
     << " * without waiting; NULL runs it on a stream of the runtime and "
        "waits.\n"
     << " * Returns 0, or a moeStatus code; moeGetLastErrorMessage() then "
        "says\n"
     << " * what failed (a null or misaligned pointer is refused before any\n"
     << " * work). Link the object with libmoe_runtime.\n";
  int64_t maxTokens = entries.empty() ? 0 : entries.front().maxTokens;
  if (maxTokens > 0)
    os << " *\n"
       << " * The token count T is dynamic: each call takes it after the "
          "stream, any T\n"
       << " * in [1, " << maxTokens
       << "] (the bound it was compiled for; another is refused\n"
       << " * with MOE_ERROR_INVALID_ARGUMENT before any work). A size T "
          "or T * k is\n"
       << " * the leading size of that tensor for the call.\n";
  os << " */\n"
     << "#ifndef " << guard << "\n#define " << guard << "\n\n"
     << "#include <stddef.h>\n"
     << (maxTokens > 0 ? "#include <stdint.h>\n" : "") << "\n"
     << "#ifdef __cplusplus\nextern \"C\" {\n#endif\n";
  for (const EntryPointInfo &entry : entries) {
    os << "\n/* " << entry.kind << ": ";
    if (entry.stage)
      os << "a stage of the expert-parallel " << stageSummary(entry) << " */\n";
    else if (entry.kind == "forward")
      os << "inputs, results, then the tensors backward needs that are not "
            "inputs. */\n";
    else
      os << "the saved tensors (a saved input is the forward's input "
            "again), the gradients of the results, then the gradients of "
            "the inputs. */\n";
    if (llvm::any_of(entry.params, [](const EntryParam &param) {
          return param.memory == "host";
        }))
      os << "/* Saved tensors in pinned host memory (moeHostAlloc): forward "
            "copies them there\n   on a copy stream, overlapping the work "
            "after it, and backward brings them\n   back; "
            "moeOffloadSynchronize() waits for the copies in flight. */\n";
    os << "int " << cName << "_" << entry.kind << "(void *stream";
    if (entry.maxTokens > 0)
      os << ", int64_t T";
    for (const EntryParam &param : entry.params)
      os << ",\n    void *" << cIdentifier(param.name) << " /* "
         << describeEntryParam(param) << " */";
    os << ");\n";
    if (entry.maxTokens > 0)
      os << "/* Device memory the " << entry.kind
         << " call at T tokens holds at once in temporaries, in\n"
         << "   bytes (planned at the bound, so the same for every T); -1 "
            "for a T outside\n   [1, "
         << entry.maxTokens << "]. */\n"
         << "int64_t " << cName << "_" << entry.kind
         << "_workspace_bytes(int64_t T);\n";
    else
      os << "/* Device memory the " << entry.kind
         << " call holds at once in temporaries, in bytes. */\n"
         << "size_t " << cName << "_" << entry.kind
         << "_workspace_bytes(void);\n";
  }
  os << "\n#ifdef __cplusplus\n}\n#endif\n\n#endif /* " << guard << " */\n";
  return text;
}

void writeLayer(llvm::json::OStream &j, DictionaryAttr layer) {
  auto integer = [&](StringRef key) -> int64_t {
    if (auto value = layer ? layer.getAs<IntegerAttr>(key) : nullptr)
      return value.getInt();
    return 0;
  };
  auto boolean = [&](StringRef key) {
    auto value = layer ? layer.getAs<BoolAttr>(key) : nullptr;
    return value && value.getValue();
  };
  j.objectBegin();
  for (StringRef key : {"T", "d", "n", "E", "k"})
    j.attribute(key, integer(key));
  // A dynamic token count: T above is its bound.
  if (int64_t bound = integer("max_tokens"))
    j.attribute("max_tokens", bound);
  j.attribute("activation", layer ? getString(layer, "activation") : "");
  j.attribute("scoring", layer ? getString(layer, "scoring") : "");
  j.attribute("renormalize", boolean("renormalize"));
  j.attribute("num_groups", integer("num_groups"));
  j.attribute("topk_groups", integer("topk_groups"));
  double scaling = 1.0;
  if (auto value = layer ? layer.getAs<FloatAttr>("scaling_factor") : nullptr)
    scaling = value.getValueAsDouble();
  j.attribute("scaling_factor", scaling);
  j.attribute("round_logits", boolean("round_logits"));
  j.attribute("has_bias", boolean("has_bias"));
  j.attribute("shared_n", integer("shared_n"));
  j.attribute("expert_bias", boolean("expert_bias"));
  j.attributeObject("inputs", [&] {
    auto inputs = layer ? layer.getAs<DictionaryAttr>("inputs") : nullptr;
    if (!inputs)
      return;
    for (StringRef key :
         {"x", "w_router", "bias", "w_gate_up", "w_down", "b_gate_up", "b_down",
          "shared_w_gate_up", "shared_w_down"})
      if (auto arg = inputs.getAs<StringAttr>(key))
        j.attribute(key, arg.getValue());
  });
  j.objectEnd();
}

/// The limits of the GPU path's contract (GPUContract.h), as
/// python/moe_mlir/gpu_contract.json gives them: an object a limit, with its
/// value, the sizes it applies to (where given) and its reason.
void writeGPULimits(llvm::json::OStream &j) {
  auto strings = [&](ArrayRef<llvm::StringLiteral> values) {
    j.array([&] {
      for (StringRef value : values)
        j.value(value);
    });
  };
  j.objectBegin();
  for (const moe::GPULimit &limit : moe::gpuLimits())
    j.attributeObject(limit.name, [&] {
      j.attributeBegin("value");
      switch (limit.kind) {
      case moe::GPULimit::Kind::Integer:
        j.value(limit.integer);
        break;
      case moe::GPULimit::Kind::String:
        j.value(limit.string);
        break;
      case moe::GPULimit::Kind::Boolean:
        j.value(limit.boolean);
        break;
      case moe::GPULimit::Kind::StringList:
        strings(limit.strings);
        break;
      }
      j.attributeEnd();
      if (!limit.appliesTo.empty()) {
        j.attributeBegin("applies_to");
        strings(limit.appliesTo);
        j.attributeEnd();
      }
      j.attribute("reason", limit.reason);
    });
  j.objectEnd();
}

/// A stage's moe.gpu.ep_stage (strings, integers, arrays of them) as an
/// object.
void writeStage(llvm::json::OStream &j, DictionaryAttr stage) {
  auto value = [&](Attribute attr) {
    if (auto text = dyn_cast<StringAttr>(attr))
      j.value(text.getValue());
    else if (auto integer = dyn_cast<IntegerAttr>(attr))
      j.value(integer.getInt());
    else
      j.value(nullptr);
  };
  j.objectBegin();
  for (NamedAttribute attr : stage) {
    j.attributeBegin(attr.getName().getValue());
    if (auto array = dyn_cast<ArrayAttr>(attr.getValue()))
      j.array([&] {
        for (Attribute element : array)
          value(element);
      });
    else if (auto ints = dyn_cast<DenseI64ArrayAttr>(attr.getValue()))
      j.array([&] {
        for (int64_t element : ints.asArrayRef())
          j.value(element);
      });
    else
      value(attr.getValue());
    j.attributeEnd();
  }
  j.objectEnd();
}

std::string makeManifest(StringRef cName, ArrayRef<EntryPointInfo> entries,
                         DictionaryAttr layer, int64_t numSMs) {
  std::string text;
  llvm::raw_string_ostream os(text);
  llvm::json::OStream j(os, 2);
  j.objectBegin();
  j.attribute("name", cName);
  j.attribute("chip", kChip);
  j.attribute("num_sms", numSMs);
  j.attribute("compiler", "moe-mlir " MOE_MLIR_VERSION);
  j.attributeBegin("layer");
  writeLayer(j, layer);
  j.attributeEnd();
  j.attributeObject("entry_points", [&] {
    for (const EntryPointInfo &entry : entries)
      j.attributeObject(entry.kind, [&] {
        j.attribute("symbol", (cName + "_" + entry.kind).str());
        j.attribute("workspace_symbol",
                    (cName + "_" + entry.kind + "_workspace_bytes").str());
        j.attribute("workspace_bytes", entry.workspaceBytes);
        if (entry.maxTokens > 0)
          j.attribute("max_tokens", entry.maxTokens);
        if (entry.stage) {
          j.attributeBegin("ep");
          writeStage(j, entry.stage);
          j.attributeEnd();
        }
        j.attributeArray("params", [&] {
          for (const EntryParam &param : entry.params)
            j.object([&] {
              j.attribute("name", param.name);
              j.attribute("c_name", cIdentifier(param.name));
              j.attribute("role", param.role);
              if (!param.forwardParam.empty())
                j.attribute("forward_param", param.forwardParam);
              if (!param.of.empty())
                j.attribute("of", param.of);
              if (!param.memory.empty())
                j.attribute("memory", param.memory);
              j.attribute("dtype", param.dtype);
              // -1 for a leading size that follows T (rows_per_token).
              j.attributeArray("shape", [&] {
                for (int64_t size : param.shape)
                  j.value(size < 0 ? -1 : size);
              });
              if (param.rowsPerToken > 0)
                j.attribute("rows_per_token", param.rowsPerToken);
            });
        });
      });
  });
  j.attributeBegin("gpu_limits");
  writeGPULimits(j);
  j.attributeEnd();
  j.objectEnd();
  os << "\n";
  return text;
}

//===----------------------------------------------------------------------===//
// Driver
//===----------------------------------------------------------------------===//

/// --kernel-cache, or its default: the kernels/ folder of moe_mlir's cache
/// (MOE_MLIR_CACHE, else ~/.cache/moe_mlir), so Python and the command line
/// share one. Empty ('none', or no home) turns the cache off.
std::string kernelCacheDir() {
  if (kernelCache == "none")
    return "";
  if (!kernelCache.empty())
    return kernelCache;
  SmallString<256> dir;
  if (std::optional<std::string> root =
          llvm::sys::Process::GetEnv("MOE_MLIR_CACHE");
      root && !root->empty()) {
    dir = *root;
  } else if (!llvm::sys::path::home_directory(dir)) {
    return "";
  } else {
    llvm::sys::path::append(dir, ".cache", "moe_mlir");
  }
  llvm::sys::path::append(dir, "kernels");
  return std::string(dir);
}

/// The path of this program (for the kernel library beside it).
std::string mainExecutable;

/// --kernel-library, or its default: <prefix>/share/moe_mlir/kernels for
/// <prefix>/bin/moe-compile, in the build tree and once installed, when it
/// exists. Empty when 'none' or absent.
std::string kernelLibraryDir() {
  if (kernelLibrary == "none")
    return "";
  if (!kernelLibrary.empty())
    return kernelLibrary;
  if (mainExecutable.empty())
    return "";
  SmallString<256> dir(llvm::sys::path::parent_path(
      llvm::sys::path::parent_path(mainExecutable)));
  llvm::sys::path::append(dir, "share", "moe_mlir", "kernels");
  return llvm::sys::fs::is_directory(dir) ? std::string(dir) : "";
}

/// The files of one compile, each written to a temporary file beside its
/// final path and renamed there only when all of them are written: they
/// appear together or not at all, and a failure leaves the files of an
/// earlier compile as they were.
class StagedOutputs {
public:
  StagedOutputs() = default;
  StagedOutputs(const StagedOutputs &) = delete;
  StagedOutputs &operator=(const StagedOutputs &) = delete;
  ~StagedOutputs() {
    for (Output &output : outputs)
      if (output.file)
        llvm::consumeError(output.file->discard());
  }

  /// A stream into the temporary file for `path`, or null after an error.
  llvm::raw_pwrite_stream *open(StringRef path) {
    llvm::Expected<llvm::sys::fs::TempFile> file =
        llvm::sys::fs::TempFile::create(path + ".tmp-%%%%%%");
    if (!file) {
      fail("cannot write '" + path + "': " + llvm::toString(file.takeError()));
      return nullptr;
    }
    Output &output = outputs.emplace_back();
    output.path = path.str();
    output.file.emplace(std::move(*file));
    output.os = std::make_unique<llvm::raw_fd_ostream>(output.file->FD,
                                                       /*shouldClose=*/false);
    return output.os.get();
  }

  /// Writes `contents` to `path` (staged).
  LogicalResult write(StringRef path, StringRef contents) {
    llvm::raw_pwrite_stream *os = open(path);
    if (!os)
      return failure();
    *os << contents;
    return success();
  }

  /// Flushes every file, then renames each to its final path. What would
  /// stop a rename (a directory in the way) is found before the first one.
  LogicalResult commit() {
    for (Output &output : outputs) {
      if (llvm::sys::fs::is_directory(output.path)) {
        fail("cannot write '" + output.path + "': it is a directory");
        return failure();
      }
      output.os->flush();
      if (output.os->has_error()) {
        fail("cannot write '" + output.path +
             "': " + output.os->error().message());
        output.os->clear_error();
        return failure();
      }
    }
    for (Output &output : outputs) {
      if (llvm::Error error = output.file->keep(output.path)) {
        fail("cannot write '" + output.path +
             "': " + llvm::toString(std::move(error)));
        return failure();
      }
      output.file.reset();
    }
    return success();
  }

private:
  struct Output {
    std::string path;
    std::optional<llvm::sys::fs::TempFile> file;
    std::unique_ptr<llvm::raw_fd_ostream> os;
  };
  std::vector<Output> outputs;
};

LogicalResult writeObject(llvm::Module &llvmModule, StringRef path,
                          StagedOutputs &outputs) {
  LLVMInitializeX86TargetInfo();
  LLVMInitializeX86Target();
  LLVMInitializeX86TargetMC();
  LLVMInitializeX86AsmPrinter();
  llvm::Triple triple(kHostTriple);
  std::string error;
  const llvm::Target *target =
      llvm::TargetRegistry::lookupTarget(triple, error);
  if (!target) {
    fail("no x86-64 target in this LLVM: " + error);
    return failure();
  }
  std::unique_ptr<llvm::TargetMachine> machine(target->createTargetMachine(
      triple, "x86-64", "", llvm::TargetOptions(), llvm::Reloc::PIC_));
  llvmModule.setDataLayout(machine->createDataLayout());
  llvmModule.setTargetTriple(triple);
  if (llvm::Error err =
          makeOptimizingTransformer(2, 0, machine.get())(&llvmModule)) {
    fail("optimising the host code: " + llvm::toString(std::move(err)));
    return failure();
  }
  llvm::raw_pwrite_stream *os = outputs.open(path);
  if (!os)
    return failure();
  llvm::legacy::PassManager codegen;
  if (machine->addPassesToEmitFile(codegen, *os, nullptr,
                                   llvm::CodeGenFileType::ObjectFile)) {
    fail("the x86-64 target cannot emit an object file");
    return failure();
  }
  codegen.run(llvmModule);
  return success();
}

/// A plan option's value goes into the pipeline's option string: only a
/// word of letters, digits, '.' and '_' may, so that no other option can
/// ride along.
bool isPlainWord(StringRef value) {
  return !value.empty() && llvm::all_of(value, [](char c) {
    return llvm::isAlnum(c) || c == '.' || c == '_';
  });
}

int compile() {
  llvm::StringSet<> kinds;
  for (const std::string &kind : emit) {
    if (kind != "obj" && kind != "header" && kind != "manifest" &&
        kind != "llvm" && kind != "mlir")
      return fail("unknown --emit kind '" + kind +
                  "' (expected obj, header, manifest, llvm or mlir)");
    kinds.insert(kind);
  }
  if (kinds.empty())
    for (StringRef kind : {"obj", "header", "manifest"})
      kinds.insert(kind);
  if (format != "bin" && format != "isa" && format != "fatbin")
    return fail("unknown --format '" + format +
                "' (expected bin, isa or fatbin)");
  if (optLevel > 3)
    return fail("--opt-level must be 0 to 3, got " + Twine(optLevel));
  if (format != "isa" && moe::findPtxas().empty())
    return fail("--format=" + format +
                " needs ptxas from the CUDA toolkit, which is not in PATH, "
                "$CUDA_ROOT/bin or /usr/local/cuda/bin; install it, set "
                "CUDA_ROOT, or use --format=isa (PTX, JIT-compiled at load)");
  StringRef prefix = outputPrefix;
  StringRef name = llvm::sys::path::filename(prefix);
  if (prefix.empty() || llvm::sys::path::is_separator(prefix.back()) ||
      name.empty() || name.starts_with("."))
    return fail("-o needs DIR/NAME, a name that does not start with '.', "
                "got '" +
                prefix + "'");
  if (policy != "auto" && policy != "keep" && policy != "recompute" &&
      policy != "offload")
    return fail("unknown --policy '" + policy +
                "' (expected auto, keep, recompute or offload)");
  std::string budgetError;
  if (!memoryBudget.empty() &&
      (!moe::parseMemorySize(memoryBudget, &budgetError) ||
       !isPlainWord(memoryBudget)))
    return fail("bad --memory-budget '" + memoryBudget + "': " +
                (budgetError.empty() ? "write a size without spaces, e.g. 2GiB"
                                     : budgetError));
  if (!gpuLibrary.empty() && !llvm::sys::fs::is_regular_file(gpuLibrary))
    return fail("cannot read the GPU library '" + gpuLibrary + "': not a file");
  if (numSMs < 0 || numSMs > 1024)
    return fail("--num-sms must be 1 to 1024 (0: the chip's), got " +
                std::to_string(numSMs));

  DialectRegistry registry;
  moe::registerAllMoEToolDialects(registry);
  registry.insert<vector::VectorDialect>();
  // How gpu.binary is embedded in the host module (#gpu.select_object); the
  // translation crashes without it.
  gpu::registerOffloadingLLVMTranslationInterfaceExternalModels(registry);
  MLIRContext context(registry);
  // A user's error names its place in the layer; the IR of the module
  // around it is the compiler's business.
  context.printOpOnDiagnostic(false);
  context.loadAllAvailableDialects();

  std::string error;
  std::unique_ptr<llvm::MemoryBuffer> input =
      openInputFile(inputFilename, &error);
  if (!input)
    return fail("cannot read '" + inputFilename + "': " + error);
  if (std::optional<moe::NestingError> deep =
          moe::checkInputNesting(input->getBuffer())) {
    llvm::errs() << inputFilename << ":" << deep->line << ":" << deep->column
                 << ": error: " << deep->message << "\n";
    return fail("cannot parse '" + inputFilename + "'");
  }
  llvm::SourceMgr sourceMgr;
  sourceMgr.AddNewSourceBuffer(std::move(input), llvm::SMLoc());
  SourceMgrDiagnosticHandler printer(sourceMgr, &context);
  // Errors are counted as well as printed: some passes report an error and
  // still succeed (docs/gpu-kernels.md, pitfall P3).
  unsigned errors = 0;
  ScopedDiagnosticHandler counter(&context, [&](Diagnostic &diagnostic) {
    if (diagnostic.getSeverity() == DiagnosticSeverity::Error)
      ++errors;
    return failure();
  });

  OwningOpRef<ModuleOp> module = parseSourceFile<ModuleOp>(sourceMgr, &context);
  if (!module || errors)
    return fail("cannot parse '" + inputFilename + "'");

  moe::MoETrainingPipelineOptions options;
  options.chip = kChip.str();
  options.format = format;
  options.optLevel = optLevel;
  options.kernelCache = kernelCacheDir();
  options.kernelLibrary = kernelLibraryDir();
  options.gpuLibrary = gpuLibrary;
  options.kernelConfigs = kernelConfig;
  options.numSMs = numSMs;
  // The plan options go through the pipeline's own parsers (units, policies).
  std::string planOptions = "policy=" + policy;
  if (!memoryBudget.empty())
    planOptions += " memory-budget=" + memoryBudget;
  std::string planError;
  llvm::raw_string_ostream planErrorStream(planError);
  if (failed(options.parseFromString(planOptions, planErrorStream)))
    return fail("bad plan options '" + planOptions + "'" +
                (planError.empty() ? "" : ": " + planError));
  PassManager pm(&context);
  if (failed(moe::buildMoETrainingPipeline(pm, options, &error)))
    return fail(error);
  pm.addPass(moe::createMoEGPUBuildEntryPoints());
  if (failed(pm.run(*module)) || errors)
    return fail("compiling '" + inputFilename + "' failed");

  // The entry points moe-gpu-build-entry-points made (the pipeline's last
  // pass), forward first; the header and manifest come from their
  // attributes, which the object does not need.
  SmallVector<EntryPointInfo, 2> entries = moe::getEntryPoints(*module);
  if (entries.empty())
    return fail("unexpected compiler output: no entry points");
  std::string cName = cIdentifier(entries.front().layerName);
  DictionaryAttr layer =
      entries.front().stage ? mergeStageLayers(entries) : entries.front().layer;
  for (EntryPointInfo &entry : entries)
    for (StringRef attr :
         {moe::kGPUEntryAttr, moe::kGPULayerNameAttr, moe::kGPUParamsAttr,
          moe::kGPUWorkspaceBytesAttr, moe::kGPULayerAttr})
      entry.func->removeAttr(attr);
  if (failed(verify(*module)) || errors)
    return fail("the generated entry points do not verify");

  std::string base = prefix.str();
  StagedOutputs outputs;
  if (kinds.contains("header") &&
      failed(outputs.write(base + ".h",
                           makeHeader(cName, entries, layer, inputFilename,
                                      llvm::sys::path::filename(base + ".h")))))
    return 1;
  int64_t launchedSMs = 0;
  if (auto sms =
          (*module)->getAttrOfType<IntegerAttr>(moe_gpu::kNumSMsAttrName))
    launchedSMs = sms.getInt();
  if (kinds.contains("manifest") &&
      failed(outputs.write(base + ".json",
                           makeManifest(cName, entries, layer, launchedSMs))))
    return 1;
  if (kinds.contains("mlir")) {
    std::string text;
    llvm::raw_string_ostream os(text);
    module->print(os);
    if (failed(outputs.write(base + ".mlir", text)))
      return 1;
  }
  if (kinds.contains("llvm") || kinds.contains("obj")) {
    llvm::LLVMContext llvmContext;
    std::unique_ptr<llvm::Module> llvmModule =
        translateModuleToLLVMIR(*module, llvmContext, cName);
    if (!llvmModule || errors)
      return fail("translating to LLVM IR failed");
    if (kinds.contains("llvm")) {
      std::string text;
      llvm::raw_string_ostream os(text);
      llvmModule->print(os, nullptr);
      if (failed(outputs.write(base + ".ll", text)))
        return 1;
    }
    if (kinds.contains("obj") &&
        failed(writeObject(*llvmModule, base + ".o", outputs)))
      return 1;
  }
  return failed(outputs.commit()) ? 1 : 0;
}

} // namespace

int main(int argc, char **argv) {
  llvm::InitLLVM init(argc, argv);
  llvm::install_fatal_error_handler(onFatalError);
  moe::registerAllMoEPasses();
  // The address of a function of this program finds it on disk.
  static int anchor;
  mainExecutable = llvm::sys::fs::getMainExecutable(argv[0], &anchor);
  cl::ParseCommandLineOptions(
      argc, argv,
      "moe-compile: a moe layer to NAME.o (x86-64 host code, sm_90a kernels "
      "embedded), NAME.h and NAME.json\n");
  return compile();
}
