//===- Internal.h - Shared internals of libmoe_runtime ----------*- C++ -*-===//
//
// Not installed, not exported (the library is built with hidden visibility):
// the driver table, error recording and the context helper that Runtime.cpp,
// TensorMap.cpp and Mgpu.cpp share.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_RUNTIME_CUDA_INTERNAL_H
#define MOE_RUNTIME_CUDA_INTERNAL_H

#include "moe/Runtime/Runtime.h"

#include <cuda.h>

#include <cstdint>
#include <string>

namespace moe::runtime {

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

/// Records `status` and a printf-style message as this thread's last error
/// and returns `status`.
moeStatus fail(moeStatus status, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

/// Maps a failed CUresult to a status and records "<call> failed: <NAME>
/// (<string>)" plus `detail` if given. Returns the status.
moeStatus failCuda(CUresult result, const char *call,
                   const char *detail = nullptr);

/// failCuda with the status given instead of the one the CUresult maps to.
moeStatus failCudaAs(moeStatus status, CUresult result, const char *call,
                     const char *detail = nullptr);

/// True when a failure is pending: the work that depends on earlier results
/// is skipped (see MgpuABI.h).
inline bool failurePending() { return moeGetLastStatus() != MOE_SUCCESS; }

/// Keeps a pending failure as the last error across a call that still runs
/// (a free, a synchronization), so the first cause is what the caller reads.
class KeepFirstFailure {
public:
  KeepFirstFailure() : status(moeGetLastStatus()) {
    if (status != MOE_SUCCESS)
      message = moeGetLastErrorMessage();
  }
  ~KeepFirstFailure() {
    if (status != MOE_SUCCESS &&
        (moeGetLastStatus() != status || message != moeGetLastErrorMessage()))
      moeSetErrorMessage(status, message.c_str());
  }
  KeepFirstFailure(const KeepFirstFailure &) = delete;
  KeepFirstFailure &operator=(const KeepFirstFailure &) = delete;

private:
  moeStatus status;
  std::string message;
};

/// True when MOE_RUNTIME_VERBOSE is set (and not "0").
bool verboseEnabled();

/// The status a CUresult maps to (MOE_SUCCESS for CUDA_SUCCESS).
moeStatus statusFromCuda(CUresult result);

//===----------------------------------------------------------------------===//
// Driver
//===----------------------------------------------------------------------===//

// Every driver entry point the runtime uses. The names go through cuda.h's
// macros, so `cuMemAlloc` becomes the member (and symbol) `cuMemAlloc_v2`.
#define MOE_FOR_EACH_CUDA_FUNCTION(X)                                          \
  X(cuGetErrorName)                                                            \
  X(cuGetErrorString)                                                          \
  X(cuInit)                                                                    \
  X(cuDriverGetVersion)                                                        \
  X(cuDeviceGetCount)                                                          \
  X(cuDeviceGet)                                                               \
  X(cuDeviceGetAttribute)                                                      \
  X(cuDevicePrimaryCtxRetain)                                                  \
  X(cuDevicePrimaryCtxRelease)                                                 \
  X(cuCtxSetCurrent)                                                           \
  X(cuCtxSynchronize)                                                          \
  X(cuModuleLoadData)                                                          \
  X(cuModuleLoadDataEx)                                                        \
  X(cuModuleUnload)                                                            \
  X(cuModuleGetFunction)                                                       \
  X(cuFuncGetAttribute)                                                        \
  X(cuFuncSetAttribute)                                                        \
  X(cuLaunchKernel)                                                            \
  X(cuLaunchKernelEx)                                                          \
  X(cuStreamCreate)                                                            \
  X(cuStreamDestroy)                                                           \
  X(cuStreamSynchronize)                                                       \
  X(cuStreamWaitEvent)                                                         \
  X(cuEventCreate)                                                             \
  X(cuEventRecord)                                                             \
  X(cuEventSynchronize)                                                        \
  X(cuEventQuery)                                                              \
  X(cuEventElapsedTime)                                                        \
  X(cuEventDestroy)                                                            \
  X(cuMemAlloc)                                                                \
  X(cuMemAllocManaged)                                                         \
  X(cuMemFree)                                                                 \
  X(cuMemGetInfo)                                                              \
  X(cuMemHostAlloc)                                                            \
  X(cuMemFreeHost)                                                             \
  X(cuMemcpyAsync)                                                             \
  X(cuMemcpyHtoDAsync)                                                         \
  X(cuMemcpyDtoHAsync)                                                         \
  X(cuMemcpyDtoDAsync)                                                         \
  X(cuMemsetD32Async)                                                          \
  X(cuTensorMapEncodeTiled)                                                    \
  X(cuTensorMapReplaceAddress)

// Entry points the runtime can do without (older drivers, fakes): null when
// the driver lacks them, and callers fall back.
#define MOE_FOR_EACH_OPTIONAL_CUDA_FUNCTION(X)                                 \
  X(cuMemAllocAsync)                                                           \
  X(cuMemFreeAsync)                                                            \
  X(cuDeviceGetDefaultMemPool)                                                 \
  X(cuMemPoolSetAttribute)                                                     \
  X(cuStreamIsCapturing)

struct DriverApi {
#define MOE_DECLARE_MEMBER(name) decltype(&::name) name = nullptr;
  MOE_FOR_EACH_CUDA_FUNCTION(MOE_DECLARE_MEMBER)
  MOE_FOR_EACH_OPTIONAL_CUDA_FUNCTION(MOE_DECLARE_MEMBER)
#undef MOE_DECLARE_MEMBER
};

/// Loads the driver on first use (dlopen of MOE_LIBCUDA or libcuda.so.1,
/// every entry point resolved, cuInit(0)). Later calls return the cached
/// result. On failure records the reason and returns it.
moeStatus getDriver(const DriverApi *&api);

/// The driver if it is loaded already, else null; never loads it.
const DriverApi *loadedDriver();

/// getDriver, then makes the primary context of this thread's device current
/// on this thread if it is not yet.
moeStatus getContext(const DriverApi *&api);

/// getContext, then cuStreamCreate with `flags` (CU_STREAM_*); records a
/// failure. moeStreamCreate makes non-blocking streams, the mgpu ABI blocking
/// ones.
moeStatus createStream(unsigned flags, CUstream *stream);

/// After getContext: whether this thread's device takes stream-ordered
/// allocations (the driver has cuMemAllocAsync and cuMemFreeAsync, and the
/// device supports memory pools). The first call per device also raises the
/// default pool's release threshold, so freed memory stays cached across
/// calls. Records no error: callers fall back to cuMemAlloc.
bool streamOrderedAllocSupported(const DriverApi *api);

/// Releases the primary contexts and closes the driver, so that the next
/// getDriver loads it again. For moeRuntimeResetForTesting.
void resetDriverForTesting();

/// This thread's device ordinal.
int currentDevice();

/// Loads a cubin, fatbin or PTX image through the module cache (the body of
/// moeModuleLoad and mgpuModuleLoad).
moeStatus loadImage(const void *image, size_t size, moeModule *module);

/// Validates and launches; all-zero `cluster` means a plain launch (the body
/// of moeLaunch and the mgpu* launches).
moeStatus launchKernel(moeFunction function, const int64_t grid[3],
                       const int64_t block[3], const int64_t cluster[3],
                       int64_t smem, CUstream stream, void **params,
                       void **extra);

/// Records a failure from a mgpu* entry point (prints it when
/// MOE_RUNTIME_VERBOSE is set).
void reportMgpuFailure(const char *function);

/// The status of an mgpu* entry point's work: nothing new on success; on
/// failure (already recorded) lets MOE_RUNTIME_VERBOSE print it.
inline void check(moeStatus status, const char *function) {
  if (status != MOE_SUCCESS)
    reportMgpuFailure(function);
}

/// Forgets the mgpu* layer's state (stream-ordered allocations, the last
/// module load failure). For moeRuntimeResetForTesting.
void resetMgpuForTesting();

/// The stream of the generated call in progress on this thread (what its
/// mgpuStreamCreate returned), or null outside one.
void *callStream();

/// Whether that stream is the caller's, lent through moeSetLaunchStream.
bool callStreamIsLent();

/// Records `ptr` (from cuMemAllocAsync) as a stream-ordered allocation, which
/// mgpuMemFree then frees with cuMemFreeAsync.
void adoptPoolPointer(void *ptr);

/// Forgets `ptr` as a stream-ordered allocation of mgpuMemAlloc; true when
/// it was one (the caller then frees it with cuMemFreeAsync).
bool releasePoolPointer(void *ptr);

/// Forgets the copy streams and the copies in flight (Offload.cpp). For
/// moeRuntimeResetForTesting.
void resetOffloadForTesting();

/// Forgets the cached device tensor maps (moeTensorMapDeviceBf16). For
/// moeRuntimeResetForTesting.
void resetTensorMapsForTesting();

} // namespace moe::runtime

#endif // MOE_RUNTIME_CUDA_INTERNAL_H
