//===- FakeCuda.h - A scriptable stand-in for libcuda.so.1 ------*- C++ -*-===//
//
// libmoe_fake_cuda.so defines every driver entry point the runtime resolves,
// with the cuda.h signatures, on host memory. The runtime loads it through
// MOE_LIBCUDA like the real driver; the tests open it too and read or set
// this state through fakeCudaState(). It checks the runtime's logic (what it
// calls, with which flags, how often, and what it does with each CUresult);
// it says nothing about real GPU behaviour.
//
// Behaviour:
// - cuModuleLoadData fails with CUDA_ERROR_INVALID_IMAGE when the image
//   contains "corrupt"; cuModuleLoadDataEx fails with CUDA_ERROR_INVALID_PTX
//   and writes kFakeJitLog into the error log when the PTX contains
//   "syntax_error".
// - cuModuleGetFunction answers CUDA_ERROR_NOT_FOUND for names starting with
//   "missing"; a name starting with "small" gets MAX_THREADS_PER_BLOCK 128,
//   others 1024. Every kernel has 40 registers and 1024 B of static smem.
// - Device pointers are host pointers: copies and memsets really happen.
// - cuMemAlloc fails with CUDA_ERROR_OUT_OF_MEMORY above memoryLimit bytes;
//   so does cuMemAllocAsync, which allocates like cuMemAlloc.
// - Built twice: libmoe_fake_cuda.so has the stream-ordered allocator
//   (cuMemAllocAsync, cuMemFreeAsync, the default pool); the
//   MOE_FAKE_CUDA_NO_MEMPOOL build, libmoe_fake_cuda_nopool.so, lacks those
//   entry points like a driver older than CUDA 11.2.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_TEST_UNIT_RUNTIME_FAKECUDA_H
#define MOE_TEST_UNIT_RUNTIME_FAKECUDA_H

#include <cstddef>
#include <cstdint>

constexpr const char *kFakeJitLog =
    "ptxas application ptx input, line 3; error   : fake syntax error";
constexpr int kFakeOptinSmem = 232448;
constexpr int kFakeStaticSmem = 1024;
constexpr int kFakeNumRegs = 40;

struct FakeCudaState {
  // Knobs.
  int initResult = 0; // CUresult of cuInit
  int deviceCount = 1;
  size_t memoryLimit = size_t(1) << 30;
  int memoryPoolsSupported = 1; // CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED

  // Counters and last arguments.
  int initCalls = 0;
  int primaryRetainCalls = 0;
  int primaryReleaseCalls = 0;
  int ctxSetCurrentCalls = 0;
  int moduleLoadCalls = 0;
  int moduleLoadExCalls = 0;
  int moduleUnloadCalls = 0;
  int lastJitOptLevel = -1;
  bool lastJitHadLogBuffer = false;
  int getFunctionCalls = 0;
  int setMaxDynamicSmemCalls = 0;
  int lastMaxDynamicSmem = 0;
  int launchCalls = 0;
  int launchExCalls = 0;
  unsigned lastGrid[3] = {0, 0, 0};
  unsigned lastBlock[3] = {0, 0, 0};
  unsigned lastCluster[3] = {0, 0, 0};
  unsigned lastSmem = 0;
  void **lastParams = nullptr;
  void *lastStream = nullptr;
  int streamCreateCalls = 0;
  unsigned lastStreamFlags = 0;
  int streamDestroyCalls = 0;
  int eventCreateCalls = 0;
  unsigned lastEventFlags = 0;
  int eventDestroyCalls = 0;
  int eventRecordCalls = 0;
  int eventQueryCalls = 0;
  void *lastRecordStream = nullptr;
  void *lastWaitStream = nullptr;
  int streamWaitEventCalls = 0;
  int memAllocCalls = 0;
  int managedAllocCalls = 0;
  int memFreeCalls = 0;
  int memAllocAsyncCalls = 0;
  int memFreeAsyncCalls = 0;
  void *lastAllocStream = nullptr;
  void *lastFreeStream = nullptr;
  int poolSetAttributeCalls = 0;
  unsigned long long lastReleaseThreshold = 0;
  int streamSynchronizeCalls = 0;
  long liveDeviceAllocations = 0;
  int hostAllocCalls = 0;
  unsigned lastHostAllocFlags = 0;
  long liveHostAllocations = 0;
  int memcpyCalls = 0;
  int memcpyHtoDCalls = 0;
  int memcpyDtoHCalls = 0;
  void *lastMemcpyStream = nullptr;
  int memsetCalls = 0;
  int tensorMapEncodeCalls = 0;
  int tensorMapReplaceCalls = 0;
  // cuStreamIsCapturing answers ACTIVE for this stream, NONE for others.
  void *capturingStream = nullptr;
};

extern "C" {
/// The fake's state (one per process).
FakeCudaState *fakeCudaState();
/// Back to the defaults above; frees nothing the runtime still holds.
void fakeCudaReset();
}

#endif // MOE_TEST_UNIT_RUNTIME_FAKECUDA_H
