//===- Mgpu.cpp - The mgpu* ABI that gpu-to-llvm emits ----------*- C++ -*-===//
//
// LLVM 22.1 signatures (../shared/CODEGEN.md section 7.2) on the runtime's
// internals. Unlike upstream's CudaRuntimeWrappers.cpp the context is made
// current once per thread, the dynamic smem attribute is set once per
// function, and failures are recorded (moeGetLastStatus) instead of printed.
//
//===----------------------------------------------------------------------===//

#include "Internal.h"
#include "moe/Runtime/MgpuABI.h"

#include <cstring>

using namespace moe::runtime;

namespace {

// Records nothing new on success; on failure lets MOE_RUNTIME_VERBOSE print.
void check(moeStatus status, const char *function) {
  if (status != MOE_SUCCESS)
    reportMgpuFailure(function);
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

} // namespace

extern "C" {

void *mgpuModuleLoad(void *data, uint64_t size) {
  moeModule module = nullptr;
  check(loadImage(data, size, &module), "mgpuModuleLoad");
  return module;
}

void *mgpuModuleLoadJIT(void *data, int32_t optLevel) {
  moeModule module = nullptr;
  check(moeModuleLoadPTX(static_cast<const char *>(data), optLevel, &module),
        "mgpuModuleLoadJIT");
  return module;
}

void mgpuModuleUnload(void *module) {
  check(moeModuleUnload(static_cast<moeModule>(module)), "mgpuModuleUnload");
}

void *mgpuModuleGetFunction(void *module, const char *name) {
  moeFunction function = nullptr;
  check(moeModuleGetFunction(static_cast<moeModule>(module), name, &function),
        "mgpuModuleGetFunction");
  return function;
}

void mgpuLaunchKernel(void *function, intptr_t gridX, intptr_t gridY,
                      intptr_t gridZ, intptr_t blockX, intptr_t blockY,
                      intptr_t blockZ, int32_t smem, void *stream,
                      void **params, void **extra, size_t /*paramsCount*/) {
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
  moeStream stream = nullptr;
  check(moeStreamCreate(&stream), "mgpuStreamCreate");
  return stream;
}

void mgpuStreamSynchronize(void *stream) {
  check(moeStreamSynchronize(asStream(stream)), "mgpuStreamSynchronize");
}

void mgpuStreamDestroy(void *stream) {
  check(moeStreamDestroy(asStream(stream)), "mgpuStreamDestroy");
}

void *mgpuEventCreate(void) {
  moeEvent event = nullptr;
  check(moeEventCreate(&event), "mgpuEventCreate");
  return event;
}

void mgpuEventRecord(void *event, void *stream) {
  check(moeEventRecord(static_cast<moeEvent>(event), asStream(stream)),
        "mgpuEventRecord");
}

void mgpuStreamWaitEvent(void *stream, void *event) {
  check(moeStreamWaitEvent(asStream(stream), static_cast<moeEvent>(event)),
        "mgpuStreamWaitEvent");
}

void mgpuEventSynchronize(void *event) {
  check(moeEventSynchronize(static_cast<moeEvent>(event)),
        "mgpuEventSynchronize");
}

void mgpuEventDestroy(void *event) {
  check(moeEventDestroy(static_cast<moeEvent>(event)), "mgpuEventDestroy");
}

void *mgpuMemAlloc(uint64_t sizeBytes, void * /*stream*/, bool hostShared) {
  if (sizeBytes == 0)
    return nullptr;
  const DriverApi *api;
  if (moeStatus status = getContext(api)) {
    check(status, "mgpuMemAlloc");
    return nullptr;
  }
  CUdeviceptr ptr = 0;
  CUresult result =
      hostShared ? api->cuMemAllocManaged(&ptr, sizeBytes, CU_MEM_ATTACH_GLOBAL)
                 : api->cuMemAlloc(&ptr, sizeBytes);
  if (result) {
    check(failCuda(result, hostShared ? "cuMemAllocManaged" : "cuMemAlloc"),
          "mgpuMemAlloc");
    return nullptr;
  }
  return reinterpret_cast<void *>(ptr);
}

void mgpuMemFree(void *ptr, void * /*stream*/) {
  check(moeMemFree(reinterpret_cast<moeDevicePtr>(ptr)), "mgpuMemFree");
}

void mgpuMemcpy(void *dst, void *src, size_t sizeBytes, void *stream) {
  if (sizeBytes == 0)
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
  if (count == 0)
    return;
  check(moeMemsetD32Async(reinterpret_cast<moeDevicePtr>(dst), value, count,
                          asStream(stream)),
        "mgpuMemset32");
}

void mgpuSetDefaultDevice(int32_t device) {
  check(moeSetDevice(device), "mgpuSetDefaultDevice");
}

} // extern "C"
