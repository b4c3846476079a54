//===- Driver.cpp - Errors, lazy libcuda loading, contexts ------*- C++ -*-===//
//
// libcuda.so.1 is opened on first use and every entry point is resolved then,
// so the library loads, and its CPU tests run, on machines without a driver.
// Errors are recorded per thread; nothing aborts.
//
//===----------------------------------------------------------------------===//

#include "Internal.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

using namespace moe::runtime;

//===----------------------------------------------------------------------===//
// Errors
//===----------------------------------------------------------------------===//

namespace {

// Long enough for a typical JIT error log; longer messages are truncated.
constexpr size_t kMessageCapacity = 16384;

thread_local moeStatus tlsLastStatus = MOE_SUCCESS;
thread_local char tlsLastMessage[kMessageCapacity];

// The driver's cuGetErrorName/cuGetErrorString, once resolved.
std::atomic<decltype(&::cuGetErrorName)> errorNameFn{nullptr};
std::atomic<decltype(&::cuGetErrorString)> errorStringFn{nullptr};

} // namespace

bool moe::runtime::verboseEnabled() {
  static const bool verbose = [] {
    const char *value = std::getenv("MOE_RUNTIME_VERBOSE");
    return value && *value && std::strcmp(value, "0") != 0;
  }();
  return verbose;
}

namespace {

void recordV(moeStatus status, const char *format, va_list args) {
  tlsLastStatus = status;
  int written = std::vsnprintf(tlsLastMessage, kMessageCapacity, format, args);
  if (written >= static_cast<int>(kMessageCapacity)) {
    static const char kTruncated[] = " [truncated]";
    std::memcpy(tlsLastMessage + kMessageCapacity - sizeof(kTruncated),
                kTruncated, sizeof(kTruncated));
  }
}

// Names for the CUresults that matter here, for when the driver cannot name
// them itself (not loaded, or the toolkit's stub library).
const char *fallbackCudaName(CUresult result) {
  switch (result) {
  case CUDA_SUCCESS:
    return "CUDA_SUCCESS";
  case CUDA_ERROR_INVALID_VALUE:
    return "CUDA_ERROR_INVALID_VALUE";
  case CUDA_ERROR_OUT_OF_MEMORY:
    return "CUDA_ERROR_OUT_OF_MEMORY";
  case CUDA_ERROR_NOT_INITIALIZED:
    return "CUDA_ERROR_NOT_INITIALIZED";
  case CUDA_ERROR_STUB_LIBRARY:
    return "CUDA_ERROR_STUB_LIBRARY";
  case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
    return "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER";
  case CUDA_ERROR_NO_DEVICE:
    return "CUDA_ERROR_NO_DEVICE";
  case CUDA_ERROR_INVALID_DEVICE:
    return "CUDA_ERROR_INVALID_DEVICE";
  case CUDA_ERROR_INVALID_IMAGE:
    return "CUDA_ERROR_INVALID_IMAGE";
  case CUDA_ERROR_INVALID_PTX:
    return "CUDA_ERROR_INVALID_PTX";
  case CUDA_ERROR_NOT_FOUND:
    return "CUDA_ERROR_NOT_FOUND";
  case CUDA_ERROR_INVALID_HANDLE:
    return "CUDA_ERROR_INVALID_HANDLE";
  default:
    return nullptr;
  }
}

} // namespace

moeStatus moe::runtime::statusFromCuda(CUresult result) {
  switch (result) {
  case CUDA_SUCCESS:
    return MOE_SUCCESS;
  case CUDA_ERROR_STUB_LIBRARY:
  case CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER:
  case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
  case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    return MOE_ERROR_NO_DRIVER;
  case CUDA_ERROR_NO_DEVICE:
  case CUDA_ERROR_INVALID_DEVICE:
    return MOE_ERROR_NO_DEVICE;
  case CUDA_ERROR_INVALID_VALUE:
    return MOE_ERROR_INVALID_ARGUMENT;
  case CUDA_ERROR_OUT_OF_MEMORY:
    return MOE_ERROR_OUT_OF_MEMORY;
  case CUDA_ERROR_NOT_FOUND:
    return MOE_ERROR_NOT_FOUND;
  case CUDA_ERROR_INVALID_IMAGE:
  case CUDA_ERROR_INVALID_PTX:
  case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
  case CUDA_ERROR_NO_BINARY_FOR_GPU:
  case CUDA_ERROR_JIT_COMPILER_NOT_FOUND:
  case CUDA_ERROR_JIT_COMPILATION_DISABLED:
  case CUDA_ERROR_SHARED_OBJECT_INIT_FAILED:
  case CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND:
  case CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY:
    return MOE_ERROR_MODULE_LOAD;
  case CUDA_ERROR_MISALIGNED_ADDRESS:
  case CUDA_ERROR_ILLEGAL_ADDRESS:
  case CUDA_ERROR_ILLEGAL_INSTRUCTION:
  case CUDA_ERROR_INVALID_ADDRESS_SPACE:
  case CUDA_ERROR_INVALID_PC:
  case CUDA_ERROR_HARDWARE_STACK_ERROR:
  case CUDA_ERROR_LAUNCH_FAILED:
  case CUDA_ERROR_LAUNCH_TIMEOUT:
  case CUDA_ERROR_ASSERT:
  case CUDA_ERROR_ECC_UNCORRECTABLE:
    return MOE_ERROR_KERNEL_FAULT;
  default:
    return MOE_ERROR_CUDA;
  }
}

moeStatus moe::runtime::fail(moeStatus status, const char *format, ...) {
  va_list args;
  va_start(args, format);
  recordV(status, format, args);
  va_end(args);
  return status;
}

moeStatus moe::runtime::failCuda(CUresult result, const char *call,
                                 const char *detail) {
  return failCudaAs(statusFromCuda(result), result, call, detail);
}

moeStatus moe::runtime::failCudaAs(moeStatus status, CUresult result,
                                   const char *call, const char *detail) {
  const char *name = nullptr;
  const char *text = nullptr;
  if (auto nameFn = errorNameFn.load(std::memory_order_acquire))
    if (nameFn(result, &name) != CUDA_SUCCESS)
      name = nullptr;
  if (auto stringFn = errorStringFn.load(std::memory_order_acquire))
    if (stringFn(result, &text) != CUDA_SUCCESS)
      text = nullptr;
  if (!name)
    name = fallbackCudaName(result);
  char code[48];
  if (!name) {
    std::snprintf(code, sizeof(code), "CUresult %d", static_cast<int>(result));
    name = code;
  }
  return fail(status, "%s failed: %s (%s)%s%s", call, name,
              text ? text : "no description from the driver",
              detail ? ": " : "", detail ? detail : "");
}

void moe::runtime::reportMgpuFailure(const char *function) {
  if (verboseEnabled())
    std::fprintf(stderr, "moe-runtime: %s: %s: %s\n", function,
                 moeStatusString(tlsLastStatus), tlsLastMessage);
}

extern "C" {

const char *moeStatusString(moeStatus status) {
  // C callers may pass any int; reading it as a moeStatus would be undefined
  // outside the enumerators' range (UBSan -fsanitize=enum), so switch on the
  // bytes as an int.
  int code;
  static_assert(sizeof(code) == sizeof(status), "moeStatus is int-sized");
  std::memcpy(&code, &status, sizeof(code));
  switch (code) {
  case MOE_SUCCESS:
    return "MOE_SUCCESS";
  case MOE_ERROR_NO_DRIVER:
    return "MOE_ERROR_NO_DRIVER";
  case MOE_ERROR_NO_DEVICE:
    return "MOE_ERROR_NO_DEVICE";
  case MOE_ERROR_INVALID_ARGUMENT:
    return "MOE_ERROR_INVALID_ARGUMENT";
  case MOE_ERROR_MISALIGNED:
    return "MOE_ERROR_MISALIGNED";
  case MOE_ERROR_OUT_OF_MEMORY:
    return "MOE_ERROR_OUT_OF_MEMORY";
  case MOE_ERROR_MODULE_LOAD:
    return "MOE_ERROR_MODULE_LOAD";
  case MOE_ERROR_NOT_FOUND:
    return "MOE_ERROR_NOT_FOUND";
  case MOE_ERROR_SHAPE_MISMATCH:
    return "MOE_ERROR_SHAPE_MISMATCH";
  case MOE_ERROR_CUDA:
    return "MOE_ERROR_CUDA";
  case MOE_ERROR_KERNEL_FAULT:
    return "MOE_ERROR_KERNEL_FAULT";
  }
  return "MOE_ERROR_UNKNOWN";
}

moeStatus moeGetLastStatus(void) { return tlsLastStatus; }

moeStatus moeSetErrorMessage(moeStatus status, const char *message) {
  return fail(status, "%s", message ? message : "");
}

const char *moeGetLastErrorMessage(void) { return tlsLastMessage; }

void moeClearLastError(void) {
  tlsLastStatus = MOE_SUCCESS;
  tlsLastMessage[0] = '\0';
}

} // extern "C"

//===----------------------------------------------------------------------===//
// Driver
//===----------------------------------------------------------------------===//

namespace {

struct DriverState {
  std::mutex mutex;
  bool attempted = false;
  moeStatus status = MOE_SUCCESS;
  std::string message;
  void *handle = nullptr;
  DriverApi api;
  int deviceCount = 0;
  std::vector<CUdevice> devices;
  std::vector<CUcontext> contexts; // retained primary contexts, or null
  // Per device: 0 not asked yet, 1 stream-ordered allocation, -1 not.
  std::vector<int> streamOrderedAlloc;
};

// Never destroyed: other libraries' destructors may still call in at exit.
DriverState &driverState() {
  static DriverState *state = new DriverState;
  return *state;
}

std::atomic<const DriverApi *> readyApi{nullptr};
// Bumped by a reset so that threads rebind their context.
std::atomic<uint64_t> contextGeneration{1};

thread_local int tlsDevice = 0;
thread_local CUcontext tlsBoundContext = nullptr;
thread_local uint64_t tlsBoundGeneration = 0;

#define MOE_STRINGIFY_IMPL(x) #x
#define MOE_STRINGIFY(x) MOE_STRINGIFY_IMPL(x)

// Loads and initializes the driver; called with the state's mutex held.
moeStatus loadDriverLocked(DriverState &state) {
  const char *override = std::getenv("MOE_LIBCUDA");
  const char *path = override && *override ? override : "libcuda.so.1";
  dlerror();
  void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char *reason = dlerror();
    return fail(MOE_ERROR_NO_DRIVER,
                "cannot load the CUDA driver '%s': %s (is the NVIDIA driver "
                "installed? MOE_LIBCUDA may name its path)",
                path, reason ? reason : "unknown dlopen error");
  }

  DriverApi api;
  const char *missing = nullptr;
#define MOE_RESOLVE(name)                                                      \
  if (!missing) {                                                              \
    void *symbol = dlsym(handle, MOE_STRINGIFY(name));                         \
    if (symbol)                                                                \
      api.name = reinterpret_cast<decltype(api.name)>(symbol);                 \
    else                                                                       \
      missing = MOE_STRINGIFY(name);                                           \
  }
  MOE_FOR_EACH_CUDA_FUNCTION(MOE_RESOLVE)
#undef MOE_RESOLVE
#define MOE_RESOLVE_OPTIONAL(name)                                             \
  api.name = reinterpret_cast<decltype(api.name)>(                             \
      dlsym(handle, MOE_STRINGIFY(name)));
  MOE_FOR_EACH_OPTIONAL_CUDA_FUNCTION(MOE_RESOLVE_OPTIONAL)
#undef MOE_RESOLVE_OPTIONAL
  if (missing) {
    dlclose(handle);
    return fail(MOE_ERROR_NO_DRIVER,
                "the CUDA driver '%s' has no entry point %s (a driver older "
                "than CUDA %d.%d, which this runtime was built against?)",
                path, missing, CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);
  }
  errorNameFn.store(api.cuGetErrorName, std::memory_order_release);
  errorStringFn.store(api.cuGetErrorString, std::memory_order_release);

  CUresult result = api.cuInit(0);
  int count = 0;
  if (result == CUDA_SUCCESS)
    result = api.cuDeviceGetCount(&count);
  if (result != CUDA_SUCCESS) {
    char detail[512];
    std::snprintf(detail, sizeof(detail), "driver '%s'", path);
    moeStatus status = failCuda(result, "cuInit", detail);
    errorNameFn.store(nullptr);
    errorStringFn.store(nullptr);
    dlclose(handle);
    return status;
  }
  if (count <= 0) {
    errorNameFn.store(nullptr);
    errorStringFn.store(nullptr);
    dlclose(handle);
    return fail(MOE_ERROR_NO_DEVICE,
                "the CUDA driver '%s' reports no device (cuDeviceGetCount "
                "gave %d)",
                path, count);
  }

  state.handle = handle;
  state.api = api;
  state.deviceCount = count;
  state.devices.assign(count, 0);
  state.contexts.assign(count, nullptr);
  state.streamOrderedAlloc.assign(count, 0);
  return MOE_SUCCESS;
}

} // namespace

moeStatus moe::runtime::getDriver(const DriverApi *&api) {
  if (const DriverApi *ready = readyApi.load(std::memory_order_acquire)) {
    api = ready;
    return MOE_SUCCESS;
  }
  DriverState &state = driverState();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (!state.attempted) {
    state.attempted = true;
    state.status = loadDriverLocked(state);
    if (state.status != MOE_SUCCESS)
      state.message = tlsLastMessage;
    else
      readyApi.store(&state.api, std::memory_order_release);
  }
  if (state.status != MOE_SUCCESS)
    return fail(state.status, "%s", state.message.c_str());
  api = &state.api;
  return MOE_SUCCESS;
}

const DriverApi *moe::runtime::loadedDriver() {
  return readyApi.load(std::memory_order_acquire);
}

int moe::runtime::currentDevice() { return tlsDevice; }

moeStatus moe::runtime::getContext(const DriverApi *&api) {
  if (moeStatus status = getDriver(api))
    return status;
  uint64_t generation = contextGeneration.load(std::memory_order_acquire);
  if (tlsBoundContext && tlsBoundGeneration == generation)
    return MOE_SUCCESS;

  DriverState &state = driverState();
  CUcontext context = nullptr;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    int device = tlsDevice;
    if (device < 0 || device >= state.deviceCount)
      return fail(MOE_ERROR_NO_DEVICE,
                  "device %d does not exist (the driver reports %d)", device,
                  state.deviceCount);
    if (!state.contexts[device]) {
      CUdevice handle = 0;
      if (CUresult result = api->cuDeviceGet(&handle, device))
        return failCuda(result, "cuDeviceGet");
      if (CUresult result = api->cuDevicePrimaryCtxRetain(&context, handle))
        return failCuda(result, "cuDevicePrimaryCtxRetain");
      state.devices[device] = handle;
      state.contexts[device] = context;
    }
    context = state.contexts[device];
  }
  if (CUresult result = api->cuCtxSetCurrent(context))
    return failCuda(result, "cuCtxSetCurrent");
  tlsBoundContext = context;
  tlsBoundGeneration = generation;
  return MOE_SUCCESS;
}

bool moe::runtime::streamOrderedAllocSupported(const DriverApi *api) {
  if (!api->cuMemAllocAsync || !api->cuMemFreeAsync)
    return false;
  DriverState &state = driverState();
  std::lock_guard<std::mutex> lock(state.mutex);
  int device = tlsDevice;
  if (device < 0 || device >= static_cast<int>(state.streamOrderedAlloc.size()))
    return false;
  int &known = state.streamOrderedAlloc[device];
  if (known == 0) {
    CUdevice handle = state.devices[device];
    int supported = 0;
    if (api->cuDeviceGetAttribute(&supported,
                                  CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
                                  handle) != CUDA_SUCCESS)
      supported = 0;
    known = supported ? 1 : -1;
    // Without a threshold the pool returns memory to the OS at every
    // synchronization, and each call would pay for cuMemAlloc again.
    CUmemoryPool pool = nullptr;
    if (supported && api->cuDeviceGetDefaultMemPool &&
        api->cuMemPoolSetAttribute &&
        api->cuDeviceGetDefaultMemPool(&pool, handle) == CUDA_SUCCESS) {
      cuuint64_t threshold = ~cuuint64_t(0);
      (void)api->cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                                       &threshold);
    }
  }
  return known > 0;
}

void moe::runtime::resetDriverForTesting() {
  DriverState &state = driverState();
  std::lock_guard<std::mutex> lock(state.mutex);
  readyApi.store(nullptr, std::memory_order_release);
  contextGeneration.fetch_add(1, std::memory_order_acq_rel);
  if (state.handle) {
    for (size_t i = 0; i < state.contexts.size(); ++i)
      if (state.contexts[i])
        (void)state.api.cuDevicePrimaryCtxRelease(state.devices[i]);
    dlclose(state.handle);
  }
  errorNameFn.store(nullptr);
  errorStringFn.store(nullptr);
  state.attempted = false;
  state.status = MOE_SUCCESS;
  state.message.clear();
  state.handle = nullptr;
  state.api = DriverApi();
  state.deviceCount = 0;
  state.devices.clear();
  state.contexts.clear();
  state.streamOrderedAlloc.clear();
  tlsDevice = 0;
  tlsBoundContext = nullptr;
  tlsBoundGeneration = 0;
}

//===----------------------------------------------------------------------===//
// Devices
//===----------------------------------------------------------------------===//

extern "C" {

moeStatus moeInit(void) {
  const DriverApi *api;
  return getDriver(api);
}

moeStatus moeDriverGetVersion(int *version) {
  if (!version)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeDriverGetVersion: null output");
  const DriverApi *api;
  if (moeStatus status = getDriver(api))
    return status;
  if (CUresult result = api->cuDriverGetVersion(version))
    return failCuda(result, "cuDriverGetVersion");
  return MOE_SUCCESS;
}

moeStatus moeGetDeviceCount(int *count) {
  if (!count)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeGetDeviceCount: null output");
  const DriverApi *api;
  if (moeStatus status = getDriver(api))
    return status;
  if (CUresult result = api->cuDeviceGetCount(count))
    return failCuda(result, "cuDeviceGetCount");
  return MOE_SUCCESS;
}

moeStatus moeSetDevice(int ordinal) {
  if (ordinal < 0)
    return fail(MOE_ERROR_INVALID_ARGUMENT,
                "moeSetDevice: negative device ordinal %d", ordinal);
  const DriverApi *api;
  if (moeStatus status = getDriver(api))
    return status;
  int count = 0;
  if (CUresult result = api->cuDeviceGetCount(&count))
    return failCuda(result, "cuDeviceGetCount");
  if (ordinal >= count)
    return fail(MOE_ERROR_NO_DEVICE,
                "moeSetDevice: device %d does not exist (%d device%s)", ordinal,
                count, count == 1 ? "" : "s");
  if (ordinal != tlsDevice) {
    tlsDevice = ordinal;
    tlsBoundContext = nullptr;
  }
  return MOE_SUCCESS;
}

moeStatus moeGetDevice(int *ordinal) {
  if (!ordinal)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeGetDevice: null output");
  *ordinal = tlsDevice;
  return MOE_SUCCESS;
}

moeStatus moeDeviceGetComputeCapability(int *major, int *minor) {
  if (!major || !minor)
    return fail(MOE_ERROR_INVALID_ARGUMENT,
                "moeDeviceGetComputeCapability: null output");
  const DriverApi *api;
  if (moeStatus status = getDriver(api))
    return status;
  CUdevice device = 0;
  if (CUresult result = api->cuDeviceGet(&device, tlsDevice))
    return failCuda(result, "cuDeviceGet");
  if (CUresult result = api->cuDeviceGetAttribute(
          major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device))
    return failCuda(result, "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)");
  if (CUresult result = api->cuDeviceGetAttribute(
          minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device))
    return failCuda(result, "cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)");
  return MOE_SUCCESS;
}

moeStatus moeDeviceSynchronize(void) {
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  if (CUresult result = api->cuCtxSynchronize())
    return failCuda(result, "cuCtxSynchronize");
  return MOE_SUCCESS;
}

} // extern "C"
