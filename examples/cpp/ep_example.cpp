//===- ep_example.cpp - An expert-parallel layer's stages with NCCL -------===//
//
// Runs an expert-parallel layer compiled by moe-compile (docs/distributed.md):
// its forward and backward are stages (NAME_forward_stage0, ...), and between
// stage C and stage C + 1 runs collective C, here NCCL all-to-alls of the
// stages' fixed-size blocks on the same stream. Then it runs the same layer
// unsplit (MOE_LAYER, compiled from the same source without ep_size) on the
// same inputs and cotangents: out and the router logits must be bitwise
// equal, every gradient within a relative 2e-2 (the staged backward sums in
// another order).
//
// One rank: the layer is compiled for S ranks and S must be 1 here. The
// exchange is written for any S, as each rank of several would call it.
//
// The stages come from the manifest (ep_table.h, written by gen_ep_table.py),
// the unsplit layer's parameters from layer_table.h (gen_layer_table.py).
//
// Prints one line per check and "N passed, M failed" last; exits 1 on any
// failure.
//
//===----------------------------------------------------------------------===//

#include "ep_table.h"
#include "layer_table.h"
#include "moe/Runtime/Runtime.h"

#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr double kGradientTolerance = 2e-2; // relative Frobenius error

int passed = 0, failed = 0;

void report(bool ok, const std::string &what) {
  (ok ? passed : failed) += 1;
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
}

bool ok(moeStatus status, const char *what) {
  if (status == MOE_SUCCESS)
    return true;
  report(false, std::string(what) + ": " + moeStatusString(status) + ": " +
                    moeGetLastErrorMessage());
  return false;
}

bool ok(ncclResult_t result, const char *what) {
  if (result == ncclSuccess)
    return true;
  report(false, std::string(what) + ": " + ncclGetErrorString(result));
  return false;
}

// bf16 is the upper half of an f32; rounding to nearest even.
uint16_t toBf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  if (std::isnan(value))
    return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fff + ((bits >> 16) & 1);
  return uint16_t(bits >> 16);
}

float fromBf16(uint16_t half) {
  uint32_t bits = uint32_t(half) << 16;
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

// Both tables list the element types in one order.
static_assert(int(moe_ep::BF16) == int(moe_layer::BF16) &&
                  int(moe_ep::F32) == int(moe_layer::F32) &&
                  int(moe_ep::I32) == int(moe_layer::I32),
              "the tables' DType enums differ");

size_t elementSize(int dtype) {
  return dtype == moe_layer::BF16 || dtype == moe_layer::F16 ? 2 : 4;
}

double element(const std::vector<uint8_t> &host, int dtype, size_t i) {
  if (dtype == moe_layer::BF16) {
    uint16_t v;
    std::memcpy(&v, &host[2 * i], 2);
    return fromBf16(v);
  }
  if (dtype == moe_layer::F32) {
    float v;
    std::memcpy(&v, &host[4 * i], 4);
    return v;
  }
  int32_t v;
  std::memcpy(&v, &host[4 * i], 4);
  return dtype == moe_layer::I32 ? v : NAN;
}

/// Bytes of a tensor of `rank` sizes `shape` at T tokens.
size_t bytesAt(int dtype, int rank, const int64_t *shape, int64_t rowsPerToken,
               int64_t T) {
  size_t count = 1;
  for (int i = 0; i < rank; ++i)
    count *= size_t(i == 0 && rowsPerToken > 0 ? rowsPerToken * T : shape[i]);
  return count * elementSize(dtype);
}

size_t bytesOf(const moe_ep::Value &v, int64_t T) {
  return bytesAt(v.dtype, v.rank, v.shape, v.rowsPerToken, T);
}

size_t bytesOf(const moe_layer::Param &p, int64_t T) {
  return bytesAt(p.dtype, p.rank, p.shape, p.rowsPerToken, T);
}

/// A device buffer and its size.
struct Buffer {
  moeDevicePtr ptr = 0;
  size_t bytes = 0;
  void *get() const { return reinterpret_cast<void *>(ptr); }
};

/// The device memory of one run, freed with it once its stream is idle.
class Memory {
public:
  explicit Memory(moeStream stream) : stream(stream) {}
  ~Memory() {
    moeStreamSynchronize(stream);
    for (moeDevicePtr ptr : owned)
      moeMemFree(ptr);
  }
  bool alloc(size_t bytes, Buffer &buffer) {
    // An empty tensor still needs a valid pointer: the entry points refuse
    // null ones.
    if (!ok(moeMemAlloc(std::max<size_t>(bytes, 16), &buffer.ptr),
            "moeMemAlloc"))
      return false;
    owned.push_back(buffer.ptr);
    buffer.bytes = bytes;
    return true;
  }

private:
  moeStream stream;
  std::vector<moeDevicePtr> owned;
};

/// A NCCL communicator of `size` ranks and the stream every call runs on.
struct Group {
  ncclComm_t comm = nullptr;
  int size = 1;
  moeStream stream = nullptr;
  cudaStream_t cuda() const { return reinterpret_cast<cudaStream_t>(stream); }
};

/// An all-to-all of `send`'s S equal blocks: block p goes to rank p, and the
/// block from rank p lands at p in `received`. NCCL has no all-to-all in
/// every version; grouped sends and receives are one.
bool exchange(const Group &group, Memory &memory, const Buffer &send,
              Buffer &received) {
  if (send.bytes % group.size != 0) {
    report(false, "a send buffer of " + std::to_string(send.bytes) +
                      " bytes is not " + std::to_string(group.size) +
                      " equal blocks");
    return false;
  }
  if (!memory.alloc(send.bytes, received))
    return false;
  size_t block = send.bytes / group.size;
  if (!ok(ncclGroupStart(), "ncclGroupStart"))
    return false;
  for (int peer = 0; peer < group.size; ++peer) {
    auto *from = static_cast<char *>(send.get()) + peer * block;
    auto *to = static_cast<char *>(received.get()) + peer * block;
    if (!ok(ncclSend(from, block, ncclUint8, peer, group.comm, group.cuda()),
            "ncclSend") ||
        !ok(ncclRecv(to, block, ncclUint8, peer, group.comm, group.cuda()),
            "ncclRecv")) {
      ncclGroupEnd();
      return false;
    }
  }
  return ok(ncclGroupEnd(), "ncclGroupEnd");
}

/// With overflow "error", a dispatch that would drop a row on any rank fails
/// on every rank: the worst count is all-reduced before anyone decides, so no
/// rank goes on to an all-to-all the others have left. The one host read of
/// a step.
bool capacityHolds(const Group &group, Memory &memory, const Buffer &dropped,
                   int collective) {
  Buffer worst;
  if (!memory.alloc(dropped.bytes, worst))
    return false;
  size_t count = dropped.bytes / sizeof(int32_t);
  if (!ok(ncclAllReduce(dropped.get(), worst.get(), count, ncclInt32, ncclMax,
                        group.comm, group.cuda()),
          "ncclAllReduce"))
    return false;
  std::vector<int32_t> host(count);
  if (!ok(moeMemcpyDtoHAsync(host.data(), worst.ptr, worst.bytes, group.stream),
          "moeMemcpyDtoHAsync") ||
      !ok(moeStreamSynchronize(group.stream), "moeStreamSynchronize"))
    return false;
  int32_t most = host.empty() ? 0 : *std::max_element(host.begin(), host.end());
  if (most > 0) {
    report(false, "dispatch " + std::to_string(collective) + " needs " +
                      std::to_string(most) + " rows past its capacity of " +
                      std::to_string(moe_ep::kCapacity) +
                      " from one rank to one rank");
    return false;
  }
  return true;
}

/// Runs the stages of `half` with its collectives between them. `values`
/// holds its arguments ("argJ") on entry; the stages' outputs are added by
/// name. Returns the function's results in order, or an empty vector.
std::vector<Buffer> runHalf(const char *title, const moe_ep::Half &half,
                            std::map<std::string, Buffer> &values,
                            const Group &group, Memory &memory, int64_t T) {
  for (int s = 0; s < half.numStages; ++s) {
    const moe_ep::Stage &stage = half.stages[s];
    std::vector<void *> pointers;
    for (int i = 0; i < stage.numInputs; ++i) {
      const moe_ep::Value &in = stage.inputs[i];
      auto it = values.find(in.name);
      if (it == values.end() || it->second.bytes != bytesOf(in, T)) {
        report(false, std::string(stage.symbol) + ": input " + in.name +
                          (it == values.end() ? " is made by nothing before it"
                                              : " has the wrong size"));
        return {};
      }
      pointers.push_back(it->second.get());
    }
    for (int i = 0; i < stage.numOutputs; ++i) {
      const moe_ep::Value &out = stage.outputs[i];
      Buffer &buffer = values[out.name];
      if (!memory.alloc(bytesOf(out, T), buffer))
        return {};
      pointers.push_back(buffer.get());
    }
    std::printf("  %s: %lld workspace bytes\n", stage.symbol,
                (long long)stage.workspaceBytes(T));
    int status = stage.call(group.stream, T, pointers.data());
    if (status != 0) {
      report(false, std::string(stage.symbol) + ": " +
                        moeStatusString(moeStatus(status)) + ": " +
                        moeGetLastErrorMessage());
      return {};
    }
    if (s == half.numStages - 1)
      break;
    // Collective s moves what stage s made for it.
    std::string c = std::to_string(s);
    auto made = [&](const std::string &name) -> const Buffer * {
      auto it = values.find(name);
      if (it != values.end())
        return &it->second;
      report(false, std::string(stage.symbol) + " gives no " + name);
      return nullptr;
    };
    if (half.collectives[s] == moe_ep::Dispatch) {
      const Buffer *send = made("send" + c), *counts = made("send_counts" + c);
      const Buffer *dropped = made("dropped" + c);
      if (!send || !counts || !dropped)
        return {};
      if (half.overflows[s] == moe_ep::OverflowError &&
          !capacityHolds(group, memory, *dropped, s))
        return {};
      if (!exchange(group, memory, *send, values["received" + c]) ||
          !exchange(group, memory, *counts, values["received_counts" + c]))
        return {};
    } else {
      const Buffer *send = made("send" + c);
      if (!send || !exchange(group, memory, *send, values["returned" + c]))
        return {};
    }
  }
  std::vector<Buffer> results;
  for (int k = 0; k < half.numResults; ++k) {
    const moe_ep::Source &source = half.results[k];
    std::string name = source.stage < 0 ? "arg" + std::to_string(source.arg)
                                        : "result" + std::to_string(k);
    auto it = values.find(name);
    if (it == values.end()) {
      report(false, std::string(title) + " result " + std::to_string(k) +
                        ": nothing made " + name);
      return {};
    }
    results.push_back(it->second);
  }
  return results;
}

/// The unsplit layer's parameter named `name`, -1 when none.
int findParam(const moe_layer::Param *params, int count, const char *name) {
  for (int i = 0; i < count; ++i)
    if (std::strcmp(params[i].name, name) == 0)
      return i;
  return -1;
}

/// The layer input ("x", "w_router", ...) argument `arg` holds.
std::string layerName(const std::string &arg) {
  for (int i = 0; i < moe_layer::kNumInputs; ++i)
    if (arg == moe_layer::kInputs[i].param)
      return moe_layer::kInputs[i].layerName;
  return arg;
}

bool download(const Group &group, const Buffer &buffer,
              std::vector<uint8_t> &host) {
  host.resize(buffer.bytes);
  return ok(
      moeMemcpyDtoHAsync(host.data(), buffer.ptr, buffer.bytes, group.stream),
      "moeMemcpyDtoHAsync");
}

double relError(const std::vector<uint8_t> &ours,
                const std::vector<uint8_t> &ref, int dtype) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size() / elementSize(dtype); ++i) {
    double a = element(ours, dtype, i), b = element(ref, dtype, i);
    if (!std::isfinite(a))
      return NAN;
    num += (a - b) * (a - b);
    den += b * b;
  }
  return den == 0 ? (num == 0 ? 0 : INFINITY) : std::sqrt(num / den);
}

/// Every check at T tokens; false when it cannot go on.
bool runAt(const Group &group, int64_t T) {
  std::printf("-- T = %lld\n", (long long)T);
  Memory memory(group.stream);
  std::mt19937_64 rng(2024 + uint64_t(T));
  std::normal_distribution<double> normal(0.0, 1.0);
  auto upload = [&](const Buffer &buffer, int dtype, double stddev) {
    std::vector<uint8_t> host(buffer.bytes);
    for (size_t i = 0; i < buffer.bytes / elementSize(dtype); ++i) {
      double v = stddev * normal(rng);
      if (dtype == moe_layer::BF16) {
        uint16_t b = toBf16(float(v));
        std::memcpy(&host[2 * i], &b, 2);
      } else {
        float f = float(v);
        std::memcpy(&host[4 * i], &f, 4);
      }
    }
    // The copy is enqueued; it has to finish before `host` goes away.
    return ok(moeMemcpyHtoDAsync(buffer.ptr, host.data(), buffer.bytes,
                                 group.stream),
              "moeMemcpyHtoDAsync") &&
           ok(moeStreamSynchronize(group.stream), "moeStreamSynchronize");
  };

  // The unsplit layer: random inputs, its forward, random cotangents, its
  // backward. Both layers read these inputs and cotangents.
  std::vector<Buffer> fwd(moe_layer::kNumForward), bwd(moe_layer::kNumBackward);
  for (int i = 0; i < moe_layer::kNumForward; ++i) {
    const moe_layer::Param &p = moe_layer::kForward[i];
    if (!memory.alloc(bytesOf(p, T), fwd[i]))
      return false;
    if (std::strcmp(p.role, "input") == 0) {
      std::string name = layerName(p.name);
      double stddev = name == "x" ? 1.0 : name == "bias" ? 0.01 : 0.02;
      if (!upload(fwd[i], p.dtype, stddev))
        return false;
    }
  }
  std::vector<int> cotangents; // indices into bwd, in order
  for (int i = 0; i < moe_layer::kNumBackward; ++i) {
    const moe_layer::Param &p = moe_layer::kBackward[i];
    if (std::strcmp(p.role, "saved") == 0) {
      int from = findParam(moe_layer::kForward, moe_layer::kNumForward,
                           p.source[0] ? p.source : p.name);
      if (from < 0) {
        report(false, std::string("unsplit backward: saved ") + p.name +
                          " names no forward parameter");
        return false;
      }
      bwd[i] = fwd[from];
      continue;
    }
    if (!memory.alloc(bytesOf(p, T), bwd[i]))
      return false;
    if (std::strcmp(p.role, "cotangent") == 0) {
      cotangents.push_back(i);
      bool isOut = std::strcmp(p.source, "result0") == 0;
      if (!upload(bwd[i], p.dtype, isOut ? 1.0 : 0.1))
        return false;
    }
  }
  std::vector<void *> fwdPtrs, bwdPtrs;
  for (const Buffer &b : fwd)
    fwdPtrs.push_back(b.get());
  for (const Buffer &b : bwd)
    bwdPtrs.push_back(b.get());
  if (!ok(moeStatus(moe_layer::forward(group.stream, T, fwdPtrs.data())),
          "unsplit forward") ||
      !ok(moeStatus(moe_layer::backward(group.stream, T, bwdPtrs.data())),
          "unsplit backward"))
    return false;

  // The staged forward: its arguments are the unsplit forward's inputs.
  std::map<std::string, Buffer> forwardValues, backwardValues;
  for (int j = 0; j < moe_ep::kForward.numArgs; ++j) {
    std::string arg = "arg" + std::to_string(j);
    int i = findParam(moe_layer::kForward, moe_layer::kNumForward, arg.c_str());
    if (i < 0 || std::strcmp(moe_layer::kForward[i].role, "input") != 0) {
      report(false, "the unsplit forward has no input " + arg);
      return false;
    }
    forwardValues[arg] = fwd[i];
  }
  std::vector<Buffer> results =
      runHalf("forward", moe_ep::kForward, forwardValues, group, memory, T);
  if (results.empty())
    return false;
  report(true, "staged forward: " + std::to_string(moe_ep::kForward.numStages) +
                   " stages, " +
                   std::to_string(moe_ep::kForward.numCollectives) +
                   " collectives");

  // The staged backward: the saved tensors (the forward's results past its
  // own), then the cotangents of its float results, the unsplit ones.
  int numOwn = moe_ep::kForward.numResults - moe_ep::kNumSaved;
  if (moe_ep::kBackward.numArgs != moe_ep::kNumSaved + int(cotangents.size())) {
    report(false, "the staged backward takes " +
                      std::to_string(moe_ep::kBackward.numArgs) +
                      " arguments, not the saved tensors and the cotangents");
    return false;
  }
  for (int j = 0; j < moe_ep::kBackward.numArgs; ++j)
    backwardValues["arg" + std::to_string(j)] =
        j < moe_ep::kNumSaved ? results[numOwn + j]
                              : bwd[cotangents[j - moe_ep::kNumSaved]];
  std::vector<Buffer> grads =
      runHalf("backward", moe_ep::kBackward, backwardValues, group, memory, T);
  if (grads.empty())
    return false;
  report(true,
         "staged backward: " + std::to_string(moe_ep::kBackward.numStages) +
             " stages, " + std::to_string(moe_ep::kBackward.numCollectives) +
             " collectives");

  // out and the logits bitwise; the gradients within tolerance.
  for (int k = 0; k < numOwn; ++k) {
    std::string name = "result" + std::to_string(k);
    int i =
        findParam(moe_layer::kForward, moe_layer::kNumForward, name.c_str());
    std::vector<uint8_t> ours, ref;
    if (i < 0 || !download(group, results[k], ours) ||
        !download(group, fwd[i], ref) ||
        !ok(moeStreamSynchronize(group.stream), "moeStreamSynchronize"))
      return false;
    report(ours == ref, name +
                            (k == 0   ? " (out)"
                             : k == 1 ? " (logits)"
                                      : "") +
                            " bitwise equal to the unsplit layer's");
  }
  for (int k = 0; k < moe_ep::kNumGradients && k < int(grads.size()); ++k) {
    std::string arg = "arg" + std::to_string(moe_ep::kGradientArgs[k]);
    int i = -1;
    for (int b = 0; b < moe_layer::kNumBackward; ++b)
      if (std::strcmp(moe_layer::kBackward[b].role, "gradient") == 0 &&
          arg == moe_layer::kBackward[b].source)
        i = b;
    if (i < 0) {
      report(false, "the unsplit backward has no gradient of " + arg);
      continue;
    }
    std::vector<uint8_t> ours, ref;
    if (!download(group, grads[k], ours) || !download(group, bwd[i], ref) ||
        !ok(moeStreamSynchronize(group.stream), "moeStreamSynchronize"))
      return false;
    int dtype = moe_layer::kBackward[i].dtype;
    double err = ours.size() == ref.size() ? relError(ours, ref, dtype) : NAN;
    char line[256];
    std::snprintf(line, sizeof(line),
                  "d_%-20s relative error %.3e (tolerance %.0e)",
                  layerName(arg).c_str(), err, kGradientTolerance);
    report(err <= kGradientTolerance, line); // NaN fails
  }
  return ok(moeStreamSynchronize(group.stream), "moeStreamSynchronize");
}

} // namespace

int main() {
  const auto &c = moe_layer::kConfig;
  std::printf("layer %s over S=%d ranks (capacity %lld), unsplit %s: d=%lld "
              "n=%lld E=%lld k=%lld\n",
              moe_ep::kName, moe_ep::kSize, (long long)moe_ep::kCapacity,
              moe_layer::kName, (long long)c.d, (long long)c.n, (long long)c.E,
              (long long)c.k);
  int version = 0;
  ncclGetVersion(&version);
  std::printf("NCCL %d\n", version);
  if (moe_ep::kSize != 1) {
    report(false, "this example runs one rank; the layer is compiled for " +
                      std::to_string(moe_ep::kSize));
    std::printf("%d passed, %d failed\n", passed, failed);
    return 1;
  }
  if (moe_ep::kMaxTokens != moe_layer::kMaxTokens) {
    report(false, "the two layers' token bounds differ");
    std::printf("%d passed, %d failed\n", passed, failed);
    return 1;
  }
  if (!ok(moeInit(), "moeInit (is there a GPU and a driver?)"))
    return 1;
  Group group;
  int device = 0;
  if (!ok(moeGetDevice(&device), "moeGetDevice") ||
      !ok(moeStreamCreate(&group.stream), "moeStreamCreate") ||
      !ok(ncclCommInitAll(&group.comm, 1, &device), "ncclCommInitAll"))
    return 1;
  // A layer of dynamic T at several token counts up to its bound.
  std::vector<int64_t> counts = {c.T};
  if (moe_layer::kMaxTokens > 0) {
    counts = {1, 37, moe_layer::kMaxTokens};
    counts.erase(
        std::remove_if(counts.begin(), counts.end(),
                       [](int64_t t) { return t > moe_layer::kMaxTokens; }),
        counts.end());
  }
  for (int64_t T : counts)
    if (!runAt(group, T))
      break;
  ncclCommDestroy(group.comm);
  moeStreamDestroy(group.stream);
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
