//===- Mgpu.cpp - The mgpu* ABI that gpu-to-llvm emits ----------*- C++ -*-===//
//
// LLVM 22.1 signatures (docs/gpu-kernels.md section 6.8) on the runtime's
// internals. Unlike upstream's CudaRuntimeWrappers.cpp the context is made
// current once per thread, the dynamic smem attribute is set once per
// function, and failures are recorded (moeGetLastStatus) instead of printed.
// For the generated entry points: the caller's stream can be lent
// (moeSetLaunchStream), temporaries come from the stream-ordered pool, and a
// recorded failure stops later launches, copies and allocations.
//
//===----------------------------------------------------------------------===//

#include "Internal.h"
#include "moe/Runtime/MgpuABI.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>

using namespace moe::runtime;

namespace {

// The caller's stream of a generated call (moeSetLaunchStream).
thread_local void *tlsLaunchStream = nullptr;
// The stream of the generated call in progress (its mgpuStreamCreate), for
// the offload copies (Offload.cpp).
thread_local void *tlsCallStream = nullptr;

struct MgpuState {
  std::mutex mutex;
  // Pointers from cuMemAllocAsync, which mgpuMemFree returns with
  // cuMemFreeAsync; everything else goes back through cuMemFree.
  std::unordered_set<uintptr_t> pointers;
  // The last mgpuModuleLoad failure: modules load in a global constructor,
  // long before a null module reaches mgpuModuleGetFunction.
  moeStatus moduleLoadStatus = MOE_SUCCESS;
  std::string moduleLoadMessage;
};

// Never destroyed: generated destructors may still call in at exit.
MgpuState &mgpuState() {
  static MgpuState *state = new MgpuState;
  return *state;
}

// MOE_RUNTIME_TRACE=<microseconds>: every mgpu* call that takes at least that
// long on the host goes to stderr ("moe-trace: <call> <us> us [<bytes> B]"),
// to find host-side stalls between launches (0 or unset: off).
double traceThresholdUs() {
  static const double threshold = [] {
    const char *value = std::getenv("MOE_RUNTIME_TRACE");
    return value ? std::atof(value) : 0.0;
  }();
  return threshold;
}

class TraceScope {
public:
  explicit TraceScope(const char *call, uint64_t bytes = 0)
      : call(call), bytes(bytes), on(traceThresholdUs() > 0) {
    if (on)
      start = std::chrono::steady_clock::now();
  }
  ~TraceScope() {
    if (!on)
      return;
    double us = std::chrono::duration<double, std::micro>(
                    std::chrono::steady_clock::now() - start)
                    .count();
    if (us < traceThresholdUs())
      return;
    if (bytes)
      std::fprintf(stderr, "moe-trace: %s %.1f us %llu B\n", call, us,
                   static_cast<unsigned long long>(bytes));
    else
      std::fprintf(stderr, "moe-trace: %s %.1f us\n", call, us);
  }
  TraceScope(const TraceScope &) = delete;
  TraceScope &operator=(const TraceScope &) = delete;

private:
  const char *call;
  uint64_t bytes;
  bool on;
  std::chrono::steady_clock::time_point start;
};

bool isLaunchStream(void *stream) {
  return stream && stream == tlsLaunchStream;
}

// The mgpu* handles are the runtime's own; a stream is a CUstream.
moeStream asStream(void *stream) { return static_cast<moeStream>(stream); }

void launch(const char *what, void *function, const int64_t grid[3],
            const int64_t block[3], const int64_t cluster[3], int32_t smem,
            void *stream, void **params, void **extra) {
  check(launchKernel(static_cast<moeFunction>(function), grid, block, cluster,
                     smem, static_cast<CUstream>(stream), params, extra),
        what);
}

// Only failures are kept: another layer's module loading fine says nothing
// about the one that did not.
void rememberModuleLoad(moeStatus status) {
  if (status == MOE_SUCCESS)
    return;
  MgpuState &state = mgpuState();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.moduleLoadStatus = status;
  state.moduleLoadMessage = moeGetLastErrorMessage();
}

} // namespace

extern "C" {

void *mgpuModuleLoad(void *data, uint64_t size) {
  TraceScope trace("mgpuModuleLoad", size);
  moeModule module = nullptr;
  moeStatus status = loadImage(data, size, &module);
  rememberModuleLoad(status);
  check(status, "mgpuModuleLoad");
  return module;
}

void *mgpuModuleLoadJIT(void *data, int32_t optLevel) {
  moeModule module = nullptr;
  moeStatus status =
      moeModuleLoadPTX(static_cast<const char *>(data), optLevel, &module);
  rememberModuleLoad(status);
  check(status, "mgpuModuleLoadJIT");
  return module;
}

void mgpuModuleUnload(void *module) {
  KeepFirstFailure keep;
  check(moeModuleUnload(static_cast<moeModule>(module)), "mgpuModuleUnload");
}

void *mgpuModuleGetFunction(void *module, const char *name) {
  if (failurePending())
    return nullptr;
  if (!module) {
    // Say why the module is missing rather than only that it is.
    MgpuState &state = mgpuState();
    std::unique_lock<std::mutex> lock(state.mutex);
    if (state.moduleLoadStatus != MOE_SUCCESS) {
      moeStatus status = state.moduleLoadStatus;
      std::string message = state.moduleLoadMessage;
      lock.unlock();
      check(fail(status,
                 "mgpuModuleGetFunction(%s): the kernel module did not load: "
                 "%s",
                 name ? name : "(null)", message.c_str()),
            "mgpuModuleGetFunction");
      return nullptr;
    }
  }
  moeFunction function = nullptr;
  check(moeModuleGetFunction(static_cast<moeModule>(module), name, &function),
        "mgpuModuleGetFunction");
  return function;
}

void mgpuLaunchKernel(void *function, intptr_t gridX, intptr_t gridY,
                      intptr_t gridZ, intptr_t blockX, intptr_t blockY,
                      intptr_t blockZ, int32_t smem, void *stream,
                      void **params, void **extra, size_t /*paramsCount*/) {
  TraceScope trace("mgpuLaunchKernel");
  if (failurePending())
    return;
  const int64_t grid[3] = {gridX, gridY, gridZ};
  const int64_t block[3] = {blockX, blockY, blockZ};
  const int64_t cluster[3] = {0, 0, 0};
  launch("mgpuLaunchKernel", function, grid, block, cluster, smem, stream,
         params, extra);
}

void mgpuLaunchClusterKernel(void *function, intptr_t clusterX,
                             intptr_t clusterY, intptr_t clusterZ,
                             intptr_t gridX, intptr_t gridY, intptr_t gridZ,
                             intptr_t blockX, intptr_t blockY, intptr_t blockZ,
                             int32_t smem, void *stream, void **params,
                             void **extra) {
  TraceScope trace("mgpuLaunchClusterKernel");
  if (failurePending())
    return;
  const int64_t grid[3] = {gridX, gridY, gridZ};
  const int64_t block[3] = {blockX, blockY, blockZ};
  const int64_t cluster[3] = {clusterX, clusterY, clusterZ};
  if (!clusterX && !clusterY && !clusterZ) {
    // All-zero means "no cluster" inside the runtime; here it is an error.
    const int64_t invalid[3] = {0, 1, 1};
    launch("mgpuLaunchClusterKernel", function, grid, block, invalid, smem,
           stream, params, extra);
    return;
  }
  launch("mgpuLaunchClusterKernel", function, grid, block, cluster, smem,
         stream, params, extra);
}

void *mgpuStreamCreate(void) {
  TraceScope trace("mgpuStreamCreate");
  if (tlsLaunchStream)
    return tlsCallStream = tlsLaunchStream;
  // A call given no stream runs on one of its own and waits for it; a
  // blocking stream also waits for the caller's work on the legacy default
  // stream (inputs still being written there), which a non-blocking one
  // would race with.
  CUstream stream = nullptr;
  if (moeStatus status = createStream(CU_STREAM_DEFAULT, &stream)) {
    check(status, "mgpuStreamCreate");
    return nullptr;
  }
  return tlsCallStream = stream;
}

void mgpuStreamSynchronize(void *stream) {
  TraceScope trace("mgpuStreamSynchronize");
  if (isLaunchStream(stream))
    return;
  KeepFirstFailure keep;
  check(moeStreamSynchronize(asStream(stream)), "mgpuStreamSynchronize");
}

void mgpuStreamDestroy(void *stream) {
  TraceScope trace("mgpuStreamDestroy");
  if (stream == tlsCallStream)
    tlsCallStream = nullptr;
  if (isLaunchStream(stream))
    return;
  KeepFirstFailure keep;
  check(moeStreamDestroy(asStream(stream)), "mgpuStreamDestroy");
}

void *mgpuEventCreate(void) {
  moeEvent event = nullptr;
  check(moeEventCreate(&event), "mgpuEventCreate");
  return event;
}

void mgpuEventRecord(void *event, void *stream) {
  KeepFirstFailure keep;
  check(moeEventRecord(static_cast<moeEvent>(event), asStream(stream)),
        "mgpuEventRecord");
}

void mgpuStreamWaitEvent(void *stream, void *event) {
  KeepFirstFailure keep;
  check(moeStreamWaitEvent(asStream(stream), static_cast<moeEvent>(event)),
        "mgpuStreamWaitEvent");
}

void mgpuEventSynchronize(void *event) {
  KeepFirstFailure keep;
  check(moeEventSynchronize(static_cast<moeEvent>(event)),
        "mgpuEventSynchronize");
}

void mgpuEventDestroy(void *event) {
  KeepFirstFailure keep;
  check(moeEventDestroy(static_cast<moeEvent>(event)), "mgpuEventDestroy");
}

void *mgpuMemAlloc(uint64_t sizeBytes, void *stream, bool hostShared) {
  TraceScope trace("mgpuMemAlloc", sizeBytes);
  if (sizeBytes == 0 || failurePending())
    return nullptr;
  const DriverApi *api;
  if (moeStatus status = getContext(api)) {
    check(status, "mgpuMemAlloc");
    return nullptr;
  }
  char detail[64];
  std::snprintf(detail, sizeof(detail), "%llu bytes",
                static_cast<unsigned long long>(sizeBytes));
  CUdeviceptr ptr = 0;
  if (!hostShared && stream && streamOrderedAllocSupported(api)) {
    if (CUresult result = api->cuMemAllocAsync(&ptr, sizeBytes,
                                               static_cast<CUstream>(stream))) {
      check(failCuda(result, "cuMemAllocAsync", detail), "mgpuMemAlloc");
      return nullptr;
    }
    MgpuState &state = mgpuState();
    std::lock_guard<std::mutex> lock(state.mutex);
    state.pointers.insert(static_cast<uintptr_t>(ptr));
    return reinterpret_cast<void *>(ptr);
  }
  CUresult result =
      hostShared ? api->cuMemAllocManaged(&ptr, sizeBytes, CU_MEM_ATTACH_GLOBAL)
                 : api->cuMemAlloc(&ptr, sizeBytes);
  if (result) {
    check(failCuda(result, hostShared ? "cuMemAllocManaged" : "cuMemAlloc",
                   detail),
          "mgpuMemAlloc");
    return nullptr;
  }
  return reinterpret_cast<void *>(ptr);
}

void mgpuMemFree(void *ptr, void *stream) {
  TraceScope trace("mgpuMemFree");
  if (!ptr)
    return;
  KeepFirstFailure keep;
  bool async = false;
  {
    MgpuState &state = mgpuState();
    std::lock_guard<std::mutex> lock(state.mutex);
    async = state.pointers.erase(reinterpret_cast<uintptr_t>(ptr)) != 0;
  }
  // Without a stream there is no order to free in; cuMemFree then (valid for
  // pool memory too, the caller having waited).
  if (!async || !stream) {
    check(moeMemFree(reinterpret_cast<moeDevicePtr>(ptr)), "mgpuMemFree");
    return;
  }
  const DriverApi *api;
  if (moeStatus status = getContext(api)) {
    check(status, "mgpuMemFree");
    return;
  }
  if (CUresult result = api->cuMemFreeAsync(reinterpret_cast<CUdeviceptr>(ptr),
                                            static_cast<CUstream>(stream)))
    check(failCuda(result, "cuMemFreeAsync"), "mgpuMemFree");
}

void mgpuMemcpy(void *dst, void *src, size_t sizeBytes, void *stream) {
  TraceScope trace("mgpuMemcpy", sizeBytes);
  if (sizeBytes == 0 || failurePending())
    return;
  if (!dst || !src) {
    check(fail(MOE_ERROR_INVALID_ARGUMENT, "mgpuMemcpy: null %s",
               dst ? "source" : "destination"),
          "mgpuMemcpy");
    return;
  }
  const DriverApi *api;
  if (moeStatus status = getContext(api)) {
    check(status, "mgpuMemcpy");
    return;
  }
  if (CUresult result =
          api->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst),
                             reinterpret_cast<CUdeviceptr>(src), sizeBytes,
                             static_cast<CUstream>(stream)))
    check(failCuda(result, "cuMemcpyAsync"), "mgpuMemcpy");
}

void mgpuMemset32(void *dst, uint32_t value, size_t count, void *stream) {
  TraceScope trace("mgpuMemset32", 4 * count);
  if (count == 0 || failurePending())
    return;
  check(moeMemsetD32Async(reinterpret_cast<moeDevicePtr>(dst), value, count,
                          asStream(stream)),
        "mgpuMemset32");
}

void mgpuSetDefaultDevice(int32_t device) {
  check(moeSetDevice(device), "mgpuSetDefaultDevice");
}

moeStatus moeSetLaunchStream(void *stream) {
  tlsLaunchStream = stream;
  return MOE_SUCCESS;
}

void *moeGetLaunchStream(void) { return tlsLaunchStream; }

} // extern "C"

void *moe::runtime::callStream() { return tlsCallStream; }

bool moe::runtime::callStreamIsLent() {
  return tlsCallStream && tlsCallStream == tlsLaunchStream;
}

void moe::runtime::adoptPoolPointer(void *ptr) {
  MgpuState &state = mgpuState();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.pointers.insert(reinterpret_cast<uintptr_t>(ptr));
}

bool moe::runtime::releasePoolPointer(void *ptr) {
  MgpuState &state = mgpuState();
  std::lock_guard<std::mutex> lock(state.mutex);
  return state.pointers.erase(reinterpret_cast<uintptr_t>(ptr)) != 0;
}

void moe::runtime::resetMgpuForTesting() {
  MgpuState &state = mgpuState();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.pointers.clear();
  state.moduleLoadStatus = MOE_SUCCESS;
  state.moduleLoadMessage.clear();
  tlsLaunchStream = nullptr;
  tlsCallStream = nullptr;
}
