//===- FakeCuda.cpp - A scriptable stand-in for libcuda.so.1 ----*- C++ -*-===//
//
// See FakeCuda.h. The definitions use cuda.h's names, so its macros give
// them the versioned symbol names (cuMemAlloc_v2, ...) the runtime resolves.
//
//===----------------------------------------------------------------------===//

#include "FakeCuda.h"

#include <cuda.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

FakeCudaState state;

// A loaded module: the handle is its address.
struct FakeModule {};

struct FakeFunction {
  std::string name;
  int maxThreads = 1024;
  int maxDynamicSmem = 48 * 1024 - kFakeStaticSmem;
};

struct FakeEvent {
  unsigned flags = 0;
};

// Owned here: the fake has no module lifetime to tie functions to.
std::vector<std::unique_ptr<FakeFunction>> functions;

int fakeContextStorage = 0;
int fakeStreamStorage[64];
int nextStream = 0;

} // namespace

extern "C" {

FakeCudaState *fakeCudaState() { return &state; }

void fakeCudaReset() {
  state = FakeCudaState();
  nextStream = 0;
}

CUresult cuGetErrorName(CUresult error, const char **name) {
  switch (error) {
  case CUDA_SUCCESS:
    *name = "CUDA_SUCCESS";
    return CUDA_SUCCESS;
  case CUDA_ERROR_INVALID_VALUE:
    *name = "CUDA_ERROR_INVALID_VALUE";
    return CUDA_SUCCESS;
  case CUDA_ERROR_OUT_OF_MEMORY:
    *name = "CUDA_ERROR_OUT_OF_MEMORY";
    return CUDA_SUCCESS;
  case CUDA_ERROR_NO_DEVICE:
    *name = "CUDA_ERROR_NO_DEVICE";
    return CUDA_SUCCESS;
  case CUDA_ERROR_INVALID_IMAGE:
    *name = "CUDA_ERROR_INVALID_IMAGE";
    return CUDA_SUCCESS;
  case CUDA_ERROR_INVALID_PTX:
    *name = "CUDA_ERROR_INVALID_PTX";
    return CUDA_SUCCESS;
  case CUDA_ERROR_NOT_FOUND:
    *name = "CUDA_ERROR_NOT_FOUND";
    return CUDA_SUCCESS;
  case CUDA_ERROR_INVALID_HANDLE:
    *name = "CUDA_ERROR_INVALID_HANDLE";
    return CUDA_SUCCESS;
  case CUDA_ERROR_ILLEGAL_ADDRESS:
    *name = "CUDA_ERROR_ILLEGAL_ADDRESS";
    return CUDA_SUCCESS;
  default:
    *name = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
  }
}

CUresult cuGetErrorString(CUresult error, const char **text) {
  const char *name = nullptr;
  if (cuGetErrorName(error, &name) != CUDA_SUCCESS) {
    *text = nullptr;
    return CUDA_ERROR_INVALID_VALUE;
  }
  *text = "fake driver description";
  return CUDA_SUCCESS;
}

CUresult cuInit(unsigned int) {
  ++state.initCalls;
  return static_cast<CUresult>(state.initResult);
}

CUresult cuDriverGetVersion(int *version) {
  *version = CUDA_VERSION;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count) {
  *count = state.deviceCount;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  if (ordinal < 0 || ordinal >= state.deviceCount)
    return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, CUdevice_attribute attribute,
                              CUdevice) {
  switch (attribute) {
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
    *value = 9;
    break;
  case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
    *value = 0;
    break;
  case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN:
    *value = kFakeOptinSmem;
    break;
  case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    *value = state.memoryPoolsSupported;
    break;
  default:
    *value = 0;
  }
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice) {
  ++state.primaryRetainCalls;
  *context = reinterpret_cast<CUcontext>(&fakeContextStorage);
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice) {
  ++state.primaryReleaseCalls;
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext) {
  ++state.ctxSetCurrentCalls;
  return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) { return CUDA_SUCCESS; }

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  ++state.moduleLoadCalls;
  if (std::strstr(static_cast<const char *>(image) + 4, "corrupt"))
    return CUDA_ERROR_INVALID_IMAGE;
  *module = reinterpret_cast<CUmodule>(new FakeModule);
  return CUDA_SUCCESS;
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image,
                            unsigned int numOptions, CUjit_option *options,
                            void **values) {
  ++state.moduleLoadExCalls;
  char *log = nullptr;
  size_t logSize = 0;
  state.lastJitHadLogBuffer = false;
  for (unsigned i = 0; i < numOptions; ++i) {
    if (options[i] == CU_JIT_ERROR_LOG_BUFFER)
      log = static_cast<char *>(values[i]);
    else if (options[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
      logSize = reinterpret_cast<uintptr_t>(values[i]);
    else if (options[i] == CU_JIT_OPTIMIZATION_LEVEL)
      state.lastJitOptLevel = int(reinterpret_cast<uintptr_t>(values[i]));
  }
  state.lastJitHadLogBuffer = log && logSize > 0;
  if (std::strstr(static_cast<const char *>(image), "syntax_error")) {
    if (log && logSize > 0) {
      std::strncpy(log, kFakeJitLog, logSize - 1);
      log[logSize - 1] = '\0';
    }
    return CUDA_ERROR_INVALID_PTX;
  }
  *module = reinterpret_cast<CUmodule>(new FakeModule);
  return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule module) {
  ++state.moduleUnloadCalls;
  delete reinterpret_cast<FakeModule *>(module);
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *function, CUmodule, const char *name) {
  ++state.getFunctionCalls;
  if (std::strncmp(name, "missing", 7) == 0)
    return CUDA_ERROR_NOT_FOUND;
  functions.push_back(std::make_unique<FakeFunction>());
  FakeFunction *record = functions.back().get();
  record->name = name;
  if (std::strncmp(name, "small", 5) == 0)
    record->maxThreads = 128;
  *function = reinterpret_cast<CUfunction>(record);
  return CUDA_SUCCESS;
}

CUresult cuFuncGetAttribute(int *value, CUfunction_attribute attribute,
                            CUfunction function) {
  auto *record = reinterpret_cast<FakeFunction *>(function);
  switch (attribute) {
  case CU_FUNC_ATTRIBUTE_NUM_REGS:
    *value = kFakeNumRegs;
    break;
  case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES:
    *value = kFakeStaticSmem;
    break;
  case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
    *value = record->maxThreads;
    break;
  case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
    *value = record->maxDynamicSmem;
    break;
  default:
    *value = 0;
  }
  return CUDA_SUCCESS;
}

CUresult cuFuncSetAttribute(CUfunction function, CUfunction_attribute attribute,
                            int value) {
  auto *record = reinterpret_cast<FakeFunction *>(function);
  if (attribute == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
    if (value > kFakeOptinSmem - kFakeStaticSmem)
      return CUDA_ERROR_INVALID_VALUE;
    ++state.setMaxDynamicSmemCalls;
    state.lastMaxDynamicSmem = value;
    record->maxDynamicSmem = value;
  }
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernel(CUfunction function, unsigned gridX, unsigned gridY,
                        unsigned gridZ, unsigned blockX, unsigned blockY,
                        unsigned blockZ, unsigned smem, CUstream stream,
                        void **params, void **) {
  auto *record = reinterpret_cast<FakeFunction *>(function);
  if (int(smem) > record->maxDynamicSmem)
    return CUDA_ERROR_INVALID_VALUE;
  ++state.launchCalls;
  state.lastGrid[0] = gridX;
  state.lastGrid[1] = gridY;
  state.lastGrid[2] = gridZ;
  state.lastBlock[0] = blockX;
  state.lastBlock[1] = blockY;
  state.lastBlock[2] = blockZ;
  state.lastSmem = smem;
  state.lastStream = stream;
  state.lastParams = params;
  return CUDA_SUCCESS;
}

CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction function,
                          void **params, void **) {
  auto *record = reinterpret_cast<FakeFunction *>(function);
  if (int(config->sharedMemBytes) > record->maxDynamicSmem)
    return CUDA_ERROR_INVALID_VALUE;
  ++state.launchExCalls;
  state.lastGrid[0] = config->gridDimX;
  state.lastGrid[1] = config->gridDimY;
  state.lastGrid[2] = config->gridDimZ;
  state.lastBlock[0] = config->blockDimX;
  state.lastBlock[1] = config->blockDimY;
  state.lastBlock[2] = config->blockDimZ;
  state.lastSmem = config->sharedMemBytes;
  state.lastStream = config->hStream;
  state.lastParams = params;
  state.lastCluster[0] = state.lastCluster[1] = state.lastCluster[2] = 0;
  for (unsigned i = 0; i < config->numAttrs; ++i)
    if (config->attrs[i].id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
      state.lastCluster[0] = config->attrs[i].value.clusterDim.x;
      state.lastCluster[1] = config->attrs[i].value.clusterDim.y;
      state.lastCluster[2] = config->attrs[i].value.clusterDim.z;
    }
  return CUDA_SUCCESS;
}

CUresult cuStreamCreate(CUstream *stream, unsigned int flags) {
  ++state.streamCreateCalls;
  state.lastStreamFlags = flags;
  *stream = reinterpret_cast<CUstream>(&fakeStreamStorage[nextStream++ % 64]);
  return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream) {
  ++state.streamDestroyCalls;
  return CUDA_SUCCESS;
}

CUresult cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus *status) {
  *status = stream && stream == state.capturingStream
                ? CU_STREAM_CAPTURE_STATUS_ACTIVE
                : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream) {
  ++state.streamSynchronizeCalls;
  return CUDA_SUCCESS;
}

CUresult cuStreamWaitEvent(CUstream stream, CUevent, unsigned int) {
  ++state.streamWaitEventCalls;
  state.lastWaitStream = stream;
  return CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *event, unsigned int flags) {
  ++state.eventCreateCalls;
  state.lastEventFlags = flags;
  auto *record = new FakeEvent;
  record->flags = flags;
  *event = reinterpret_cast<CUevent>(record);
  return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent, CUstream stream) {
  ++state.eventRecordCalls;
  state.lastRecordStream = stream;
  return CUDA_SUCCESS;
}

CUresult cuEventSynchronize(CUevent) { return CUDA_SUCCESS; }

// Copies happen at once here: every event has completed.
CUresult cuEventQuery(CUevent) {
  ++state.eventQueryCalls;
  return CUDA_SUCCESS;
}

CUresult cuEventElapsedTime(float *milliseconds, CUevent start, CUevent end) {
  if ((reinterpret_cast<FakeEvent *>(start)->flags |
       reinterpret_cast<FakeEvent *>(end)->flags) &
      CU_EVENT_DISABLE_TIMING)
    return CUDA_ERROR_INVALID_HANDLE;
  *milliseconds = 1.5f;
  return CUDA_SUCCESS;
}

CUresult cuEventDestroy(CUevent event) {
  ++state.eventDestroyCalls;
  delete reinterpret_cast<FakeEvent *>(event);
  return CUDA_SUCCESS;
}

CUresult cuMemAlloc(CUdeviceptr *ptr, size_t bytes) {
  ++state.memAllocCalls;
  if (bytes > state.memoryLimit)
    return CUDA_ERROR_OUT_OF_MEMORY;
  void *memory = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!memory)
    return CUDA_ERROR_OUT_OF_MEMORY;
  ++state.liveDeviceAllocations;
  *ptr = reinterpret_cast<CUdeviceptr>(memory);
  return CUDA_SUCCESS;
}

CUresult cuMemAllocManaged(CUdeviceptr *ptr, size_t bytes, unsigned int) {
  ++state.managedAllocCalls;
  return cuMemAlloc(ptr, bytes);
}

CUresult cuMemFree(CUdeviceptr ptr) {
  ++state.memFreeCalls;
  --state.liveDeviceAllocations;
  std::free(reinterpret_cast<void *>(ptr));
  return CUDA_SUCCESS;
}

#ifndef MOE_FAKE_CUDA_NO_MEMPOOL
int fakeMemPoolStorage = 0;

CUresult cuMemAllocAsync(CUdeviceptr *ptr, size_t bytes, CUstream stream) {
  ++state.memAllocAsyncCalls;
  state.lastAllocStream = stream;
  --state.memAllocCalls; // counted as async only
  return cuMemAlloc(ptr, bytes);
}

CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream) {
  ++state.memFreeAsyncCalls;
  state.lastFreeStream = stream;
  --state.memFreeCalls;
  return cuMemFree(ptr);
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice) {
  *pool = reinterpret_cast<CUmemoryPool>(&fakeMemPoolStorage);
  return CUDA_SUCCESS;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool, CUmemPool_attribute attribute,
                               void *value) {
  ++state.poolSetAttributeCalls;
  if (attribute == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    state.lastReleaseThreshold = *static_cast<cuuint64_t *>(value);
  return CUDA_SUCCESS;
}
#endif

CUresult cuMemGetInfo(size_t *freeBytes, size_t *totalBytes) {
  *freeBytes = state.memoryLimit;
  *totalBytes = state.memoryLimit;
  return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void **ptr, size_t bytes, unsigned int flags) {
  ++state.hostAllocCalls;
  state.lastHostAllocFlags = flags;
  *ptr = std::malloc(bytes);
  if (!*ptr)
    return CUDA_ERROR_OUT_OF_MEMORY;
  ++state.liveHostAllocations;
  return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *ptr) {
  --state.liveHostAllocations;
  std::free(ptr);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                       CUstream) {
  ++state.memcpyCalls;
  std::memcpy(reinterpret_cast<void *>(dst), reinterpret_cast<void *>(src),
              bytes);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t bytes,
                           CUstream stream) {
  ++state.memcpyCalls;
  ++state.memcpyHtoDCalls;
  state.lastMemcpyStream = stream;
  std::memcpy(reinterpret_cast<void *>(dst), src, bytes);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t bytes,
                           CUstream stream) {
  ++state.memcpyCalls;
  ++state.memcpyDtoHCalls;
  state.lastMemcpyStream = stream;
  std::memcpy(dst, reinterpret_cast<void *>(src), bytes);
  return CUDA_SUCCESS;
}

CUresult cuMemcpyDtoDAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes,
                           CUstream) {
  ++state.memcpyCalls;
  std::memmove(reinterpret_cast<void *>(dst), reinterpret_cast<void *>(src),
               bytes);
  return CUDA_SUCCESS;
}

CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count,
                          CUstream) {
  ++state.memsetCalls;
  auto *words = reinterpret_cast<uint32_t *>(dst);
  for (size_t i = 0; i < count; ++i)
    words[i] = value;
  return CUDA_SUCCESS;
}

CUresult cuTensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType,
                                cuuint32_t, void *, const cuuint64_t *,
                                const cuuint64_t *, const cuuint32_t *,
                                const cuuint32_t *, CUtensorMapInterleave,
                                CUtensorMapSwizzle, CUtensorMapL2promotion,
                                CUtensorMapFloatOOBfill) {
  ++state.tensorMapEncodeCalls;
  std::memset(map, 0xab, sizeof(*map));
  return CUDA_SUCCESS;
}

CUresult cuTensorMapReplaceAddress(CUtensorMap *, void *) {
  ++state.tensorMapReplaceCalls;
  return CUDA_SUCCESS;
}

} // extern "C"
