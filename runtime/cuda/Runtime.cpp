//===- Runtime.cpp - Modules, launches, streams, events, memory -*- C++ -*-===//
//
// The C API of Runtime.h on top of the lazily loaded driver (Driver.cpp).
// Every argument check runs before the driver is touched.
//
//===----------------------------------------------------------------------===//

#include "Internal.h"
#include "moe/Runtime/BumpAllocator.h"
#include "moe/Runtime/MgpuABI.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>

using namespace moe::runtime;

struct moeFunction_st {
  CUfunction function = nullptr;
  moeModule_st *module = nullptr;
  std::string name;
  moeFunctionInfo info = {};
};

struct moeModule_st {
  CUmodule module = nullptr;
  const void *image = nullptr;
  int device = 0;
  int references = 1;
  std::unordered_map<std::string, std::unique_ptr<moeFunction_st>> functions;
};

struct moeEvent_st {
  CUevent event = nullptr;
  bool timing = false;
};

struct moeArena_st {
  std::mutex mutex;
  BumpAllocator allocator;
  int device = 0;
};

namespace {

struct ModuleCache {
  std::mutex mutex;
  std::map<std::pair<const void *, int>, moeModule_st *> modules;
};

ModuleCache &moduleCache() {
  static ModuleCache *cache = new ModuleCache;
  return *cache;
}

constexpr size_t kJitLogBytes = 8192;

bool isCudaBinary(const void *image, size_t size) {
  if (size < 4)
    return false;
  const unsigned char *bytes = static_cast<const unsigned char *>(image);
  static const unsigned char kElf[4] = {0x7f, 'E', 'L', 'F'};
  // Fatbinary (50 ed 55 ba) and nvcc's fatbin wrapper (b1 43 62 46).
  static const unsigned char kFatbin[4] = {0x50, 0xed, 0x55, 0xba};
  static const unsigned char kFatbinWrapper[4] = {0xb1, 0x43, 0x62, 0x46};
  return std::memcmp(bytes, kElf, 4) == 0 ||
         std::memcmp(bytes, kFatbin, 4) == 0 ||
         std::memcmp(bytes, kFatbinWrapper, 4) == 0;
}

// A failed load is MOE_ERROR_MODULE_LOAD unless the cause is more specific
// (no memory, no driver, a dead context).
moeStatus moduleLoadStatus(CUresult result) {
  moeStatus status = statusFromCuda(result);
  return status == MOE_ERROR_CUDA || status == MOE_ERROR_INVALID_ARGUMENT ||
                 status == MOE_ERROR_NOT_FOUND
             ? MOE_ERROR_MODULE_LOAD
             : status;
}

// Loads (or finds in the cache) an image; `ptx` selects the JIT path.
moeStatus loadModule(const void *image, bool ptx, int optLevel,
                     moeModule *out) {
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  int device = currentDevice();
  ModuleCache &cache = moduleCache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto key = std::make_pair(image, device);
  auto found = cache.modules.find(key);
  if (found != cache.modules.end()) {
    ++found->second->references;
    *out = found->second;
    return MOE_SUCCESS;
  }

  CUmodule module = nullptr;
  if (!ptx) {
    if (CUresult result = api->cuModuleLoadData(&module, image))
      return failCudaAs(moduleLoadStatus(result), result, "cuModuleLoadData");
  } else {
    char log[kJitLogBytes];
    log[0] = '\0';
    CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER,
                              CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                              CU_JIT_OPTIMIZATION_LEVEL};
    void *values[] = {log, reinterpret_cast<void *>(uintptr_t(sizeof(log))),
                      reinterpret_cast<void *>(uintptr_t(optLevel))};
    if (CUresult result =
            api->cuModuleLoadDataEx(&module, image, 3, options, values)) {
      log[sizeof(log) - 1] = '\0';
      char detail[kJitLogBytes + 64];
      std::snprintf(detail, sizeof(detail), "JIT log: %s",
                    log[0] ? log : "(empty)");
      return failCudaAs(moduleLoadStatus(result), result, "cuModuleLoadDataEx",
                        detail);
    }
  }

  auto *record = new (std::nothrow) moeModule_st;
  if (!record) {
    (void)api->cuModuleUnload(module);
    return fail(MOE_ERROR_OUT_OF_MEMORY, "no host memory for a module record");
  }
  record->module = module;
  record->image = image;
  record->device = device;
  cache.modules.emplace(key, record);
  *out = record;
  return MOE_SUCCESS;
}

bool inRange(int64_t value, int64_t low, int64_t high) {
  return value >= low && value <= high;
}

// The driver-free part of launch validation, on 64-bit values so that the
// mgpu* entry points (intptr_t dims) are checked before narrowing.
moeStatus validateLaunch(const int64_t grid[3], const int64_t block[3],
                         const int64_t cluster[3], int64_t smem) {
  static const char *const kAxis[3] = {"x", "y", "z"};
  static const int64_t kGridMax[3] = {INT32_MAX, 65535, 65535};
  static const int64_t kBlockMax[3] = {1024, 1024, 64};
  for (int i = 0; i < 3; ++i) {
    if (!inRange(grid[i], 1, kGridMax[i]))
      return fail(MOE_ERROR_INVALID_ARGUMENT,
                  "launch: grid %s = %" PRId64 " is outside 1..%" PRId64,
                  kAxis[i], grid[i], kGridMax[i]);
    if (!inRange(block[i], 1, kBlockMax[i]))
      return fail(MOE_ERROR_INVALID_ARGUMENT,
                  "launch: block %s = %" PRId64 " is outside 1..%" PRId64,
                  kAxis[i], block[i], kBlockMax[i]);
  }
  int64_t threads = block[0] * block[1] * block[2];
  if (threads > MOE_MAX_THREADS_PER_BLOCK)
    return fail(MOE_ERROR_INVALID_ARGUMENT,
                "launch: block %" PRId64 "x%" PRId64 "x%" PRId64 " has %" PRId64
                " threads, more than %u",
                block[0], block[1], block[2], threads,
                MOE_MAX_THREADS_PER_BLOCK);
  if (!inRange(smem, 0, MOE_MAX_DYNAMIC_SMEM_BYTES))
    return fail(MOE_ERROR_INVALID_ARGUMENT,
                "launch: %" PRId64
                " bytes of dynamic shared memory is outside 0..%u (227 KB)",
                smem, MOE_MAX_DYNAMIC_SMEM_BYTES);
  bool clustered = cluster[0] || cluster[1] || cluster[2];
  if (!clustered)
    return MOE_SUCCESS;
  for (int i = 0; i < 3; ++i)
    if (!inRange(cluster[i], 1, MOE_MAX_CLUSTER_BLOCKS))
      return fail(MOE_ERROR_INVALID_ARGUMENT,
                  "launch: cluster %s = %" PRId64 " is outside 1..%u", kAxis[i],
                  cluster[i], MOE_MAX_CLUSTER_BLOCKS);
  int64_t blocks = cluster[0] * cluster[1] * cluster[2];
  if (blocks > MOE_MAX_CLUSTER_BLOCKS)
    return fail(MOE_ERROR_INVALID_ARGUMENT,
                "launch: cluster %" PRId64 "x%" PRId64 "x%" PRId64
                " has %" PRId64 " blocks, more than the portable %u",
                cluster[0], cluster[1], cluster[2], blocks,
                MOE_MAX_CLUSTER_BLOCKS);
  for (int i = 0; i < 3; ++i)
    if (grid[i] % cluster[i] != 0)
      return fail(MOE_ERROR_SHAPE_MISMATCH,
                  "launch: grid %s = %" PRId64
                  " is not a multiple of cluster %s = %" PRId64,
                  kAxis[i], grid[i], kAxis[i], cluster[i]);
  return MOE_SUCCESS;
}

} // namespace

namespace moe::runtime {

moeStatus launchKernel(moeFunction function, const int64_t grid[3],
                       const int64_t block[3], const int64_t cluster[3],
                       int64_t smem, CUstream stream, void **params,
                       void **extra) {
  if (!function)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "launch: null function");
  if (moeStatus status = validateLaunch(grid, block, cluster, smem))
    return status;
  const moeFunctionInfo &info = function->info;
  int64_t threads = block[0] * block[1] * block[2];
  if (info.maxThreadsPerBlock > 0 && threads > info.maxThreadsPerBlock)
    return fail(MOE_ERROR_SHAPE_MISMATCH,
                "launch of '%s': %" PRId64
                " threads per block, but the kernel allows at most %d "
                "(.maxntid / registers)",
                function->name.c_str(), threads, info.maxThreadsPerBlock);
  if (smem > info.maxDynamicSmemBytes)
    return fail(MOE_ERROR_INVALID_ARGUMENT,
                "launch of '%s': %" PRId64
                " bytes of dynamic shared memory, but the kernel allows at "
                "most %d beside its %d static bytes",
                function->name.c_str(), smem, info.maxDynamicSmemBytes,
                info.staticSmemBytes);

  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  if (!cluster[0] && !cluster[1] && !cluster[2]) {
    if (CUresult result = api->cuLaunchKernel(
            function->function, unsigned(grid[0]), unsigned(grid[1]),
            unsigned(grid[2]), unsigned(block[0]), unsigned(block[1]),
            unsigned(block[2]), unsigned(smem), stream, params, extra))
      return failCuda(result, "cuLaunchKernel", function->name.c_str());
    return MOE_SUCCESS;
  }
  CUlaunchAttribute attribute;
  std::memset(&attribute, 0, sizeof(attribute));
  attribute.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  attribute.value.clusterDim.x = unsigned(cluster[0]);
  attribute.value.clusterDim.y = unsigned(cluster[1]);
  attribute.value.clusterDim.z = unsigned(cluster[2]);
  CUlaunchConfig config;
  std::memset(&config, 0, sizeof(config));
  config.gridDimX = unsigned(grid[0]);
  config.gridDimY = unsigned(grid[1]);
  config.gridDimZ = unsigned(grid[2]);
  config.blockDimX = unsigned(block[0]);
  config.blockDimY = unsigned(block[1]);
  config.blockDimZ = unsigned(block[2]);
  config.sharedMemBytes = unsigned(smem);
  config.hStream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  if (CUresult result =
          api->cuLaunchKernelEx(&config, function->function, params, extra))
    return failCuda(result, "cuLaunchKernelEx", function->name.c_str());
  return MOE_SUCCESS;
}

moeStatus loadImage(const void *image, size_t size, moeModule *module) {
  if (!image || !module)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeModuleLoad: null %s",
                image ? "output" : "image");
  if (size < 4)
    return fail(MOE_ERROR_INVALID_ARGUMENT,
                "moeModuleLoad: image of %zu bytes is too small", size);
  if (isCudaBinary(image, size))
    return loadModule(image, /*ptx=*/false, 0, module);
  if (!std::memchr(image, '\0', size))
    return fail(MOE_ERROR_INVALID_ARGUMENT,
                "moeModuleLoad: the image is neither a cubin nor a fatbin, "
                "and as PTX it is not NUL-terminated within %zu bytes",
                size);
  return loadModule(image, /*ptx=*/true, 4, module);
}

moeStatus createStream(unsigned flags, CUstream *stream) {
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  if (CUresult result = api->cuStreamCreate(stream, flags))
    return failCuda(result, "cuStreamCreate");
  return MOE_SUCCESS;
}

} // namespace moe::runtime

extern "C" {

void moeRuntimeResetForTesting(void) {
  const DriverApi *api = loadedDriver();
  ModuleCache &cache = moduleCache();
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    for (auto &entry : cache.modules) {
      if (api)
        (void)api->cuModuleUnload(entry.second->module);
      delete entry.second;
    }
    cache.modules.clear();
  }
  resetOffloadForTesting();
  resetMgpuForTesting();
  resetTensorMapsForTesting();
  resetDriverForTesting();
  moeClearLastError();
}

//===----------------------------------------------------------------------===//
// Modules and functions
//===----------------------------------------------------------------------===//

moeStatus moeModuleLoad(const void *image, size_t size, moeModule *module) {
  return loadImage(image, size, module);
}

moeStatus moeModuleLoadPTX(const char *ptx, int optLevel, moeModule *module) {
  if (!ptx || !module)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeModuleLoadPTX: null %s",
                ptx ? "output" : "PTX");
  if (!ptx[0])
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeModuleLoadPTX: empty PTX");
  if (optLevel < 0 || optLevel > 4)
    return fail(MOE_ERROR_INVALID_ARGUMENT,
                "moeModuleLoadPTX: optimization level %d is outside 0..4",
                optLevel);
  return loadModule(ptx, /*ptx=*/true, optLevel, module);
}

moeStatus moeModuleUnload(moeModule module) {
  if (!module)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeModuleUnload: null module");
  const DriverApi *api;
  if (moeStatus status = getDriver(api))
    return status;
  ModuleCache &cache = moduleCache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  // Found by value, without dereferencing: the handle may be stale.
  auto found = cache.modules.begin();
  while (found != cache.modules.end() && found->second != module)
    ++found;
  if (found == cache.modules.end())
    return fail(MOE_ERROR_INVALID_ARGUMENT,
                "moeModuleUnload: not a loaded module (unloaded twice?)");
  if (--module->references > 0)
    return MOE_SUCCESS;
  cache.modules.erase(found);
  CUresult result = api->cuModuleUnload(module->module);
  delete module;
  if (result)
    return failCuda(result, "cuModuleUnload");
  return MOE_SUCCESS;
}

moeStatus moeModuleGetFunction(moeModule module, const char *name,
                               moeFunction *function) {
  if (!module || !name || !function)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeModuleGetFunction: null %s",
                !module ? "module"
                : !name ? "name"
                        : "output");
  if (!name[0])
    return fail(MOE_ERROR_INVALID_ARGUMENT,
                "moeModuleGetFunction: empty kernel name");
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  ModuleCache &cache = moduleCache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto found = module->functions.find(name);
  if (found != module->functions.end()) {
    *function = found->second.get();
    return MOE_SUCCESS;
  }

  CUfunction handle = nullptr;
  if (CUresult result =
          api->cuModuleGetFunction(&handle, module->module, name)) {
    if (result == CUDA_ERROR_NOT_FOUND)
      return fail(MOE_ERROR_NOT_FOUND,
                  "cuModuleGetFunction failed: kernel '%s' is not in the "
                  "module (CUDA_ERROR_NOT_FOUND)",
                  name);
    return failCuda(result, "cuModuleGetFunction", name);
  }

  moeFunctionInfo info = {};
  struct {
    CUfunction_attribute attribute;
    int *value;
    const char *what;
  } queries[] = {
      {CU_FUNC_ATTRIBUTE_NUM_REGS, &info.numRegs, "NUM_REGS"},
      {CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, &info.staticSmemBytes,
       "SHARED_SIZE_BYTES"},
      {CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, &info.localBytes,
       "LOCAL_SIZE_BYTES"},
      {CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, &info.maxThreadsPerBlock,
       "MAX_THREADS_PER_BLOCK"},
  };
  for (auto &query : queries)
    if (CUresult result =
            api->cuFuncGetAttribute(query.value, query.attribute, handle)) {
      char call[96];
      std::snprintf(call, sizeof(call), "cuFuncGetAttribute(%s)", query.what);
      return failCuda(result, call, name);
    }

  CUdevice device = 0;
  if (CUresult result = api->cuDeviceGet(&device, module->device))
    return failCuda(result, "cuDeviceGet");
  int optin = 0;
  if (CUresult result = api->cuDeviceGetAttribute(
          &optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
          device))
    return failCuda(result,
                    "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)");
  int maxDynamic = optin - info.staticSmemBytes;
  if (maxDynamic < 0)
    maxDynamic = 0;
  if (maxDynamic > 0)
    if (CUresult result = api->cuFuncSetAttribute(
            handle, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            maxDynamic))
      return failCuda(
          result, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", name);
  info.maxDynamicSmemBytes = maxDynamic;

  auto record =
      std::unique_ptr<moeFunction_st>(new (std::nothrow) moeFunction_st);
  if (!record)
    return fail(MOE_ERROR_OUT_OF_MEMORY,
                "no host memory for a function record");
  record->function = handle;
  record->module = module;
  record->name = name;
  record->info = info;
  if (verboseEnabled())
    std::fprintf(stderr,
                 "moe-runtime: kernel '%s': %d registers, %d B static smem, "
                 "%d B local, up to %d threads, up to %d B dynamic smem\n",
                 name, info.numRegs, info.staticSmemBytes, info.localBytes,
                 info.maxThreadsPerBlock, info.maxDynamicSmemBytes);
  *function = record.get();
  module->functions.emplace(name, std::move(record));
  return MOE_SUCCESS;
}

moeStatus moeFunctionGetInfo(moeFunction function, moeFunctionInfo *info) {
  if (!function || !info)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeFunctionGetInfo: null %s",
                function ? "output" : "function");
  *info = function->info;
  return MOE_SUCCESS;
}

//===----------------------------------------------------------------------===//
// Launch
//===----------------------------------------------------------------------===//

moeStatus moeLaunchValidate(const moeLaunchConfig *config) {
  if (!config)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "launch: null configuration");
  int64_t grid[3] = {config->gridX, config->gridY, config->gridZ};
  int64_t block[3] = {config->blockX, config->blockY, config->blockZ};
  int64_t cluster[3] = {config->clusterX, config->clusterY, config->clusterZ};
  return validateLaunch(grid, block, cluster, config->sharedMemBytes);
}

moeStatus moeLaunch(moeFunction function, const moeLaunchConfig *config,
                    void **params) {
  if (!function)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "launch: null function");
  if (!config)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "launch: null configuration");
  int64_t grid[3] = {config->gridX, config->gridY, config->gridZ};
  int64_t block[3] = {config->blockX, config->blockY, config->blockZ};
  int64_t cluster[3] = {config->clusterX, config->clusterY, config->clusterZ};
  return launchKernel(function, grid, block, cluster, config->sharedMemBytes,
                      reinterpret_cast<CUstream>(config->stream), params,
                      nullptr);
}

//===----------------------------------------------------------------------===//
// Streams and events
//===----------------------------------------------------------------------===//

moeStatus moeStreamCreate(moeStream *stream) {
  if (!stream)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeStreamCreate: null output");
  CUstream handle = nullptr;
  if (moeStatus status = createStream(CU_STREAM_NON_BLOCKING, &handle))
    return status;
  *stream = reinterpret_cast<moeStream>(handle);
  return MOE_SUCCESS;
}

moeStatus moeStreamDestroy(moeStream stream) {
  if (!stream)
    return fail(MOE_ERROR_INVALID_ARGUMENT,
                "moeStreamDestroy: null stream (the default stream cannot be "
                "destroyed)");
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  if (CUresult result =
          api->cuStreamDestroy(reinterpret_cast<CUstream>(stream)))
    return failCuda(result, "cuStreamDestroy");
  return MOE_SUCCESS;
}

moeStatus moeStreamSynchronize(moeStream stream) {
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  if (CUresult result =
          api->cuStreamSynchronize(reinterpret_cast<CUstream>(stream)))
    return failCuda(result, "cuStreamSynchronize");
  return MOE_SUCCESS;
}

moeStatus moeStreamWaitEvent(moeStream stream, moeEvent event) {
  if (!event)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeStreamWaitEvent: null event");
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  if (CUresult result = api->cuStreamWaitEvent(
          reinterpret_cast<CUstream>(stream), event->event, 0))
    return failCuda(result, "cuStreamWaitEvent");
  return MOE_SUCCESS;
}

static moeStatus createEvent(moeEvent *event, bool timing) {
  if (!event)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeEventCreate: null output");
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  CUevent handle = nullptr;
  unsigned flags = timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING;
  if (CUresult result = api->cuEventCreate(&handle, flags))
    return failCuda(result, "cuEventCreate");
  auto *record = new (std::nothrow) moeEvent_st;
  if (!record) {
    (void)api->cuEventDestroy(handle);
    return fail(MOE_ERROR_OUT_OF_MEMORY, "no host memory for an event record");
  }
  record->event = handle;
  record->timing = timing;
  *event = record;
  return MOE_SUCCESS;
}

moeStatus moeEventCreate(moeEvent *event) { return createEvent(event, false); }

moeStatus moeEventCreateTiming(moeEvent *event) {
  return createEvent(event, true);
}

moeStatus moeEventRecord(moeEvent event, moeStream stream) {
  if (!event)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeEventRecord: null event");
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  if (CUresult result =
          api->cuEventRecord(event->event, reinterpret_cast<CUstream>(stream)))
    return failCuda(result, "cuEventRecord");
  return MOE_SUCCESS;
}

moeStatus moeEventSynchronize(moeEvent event) {
  if (!event)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeEventSynchronize: null event");
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  if (CUresult result = api->cuEventSynchronize(event->event))
    return failCuda(result, "cuEventSynchronize");
  return MOE_SUCCESS;
}

moeStatus moeEventElapsedMs(moeEvent start, moeEvent end, float *milliseconds) {
  if (!start || !end || !milliseconds)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeEventElapsedMs: null %s",
                !start ? "start event"
                : !end ? "end event"
                       : "output");
  if (!start->timing || !end->timing)
    return fail(MOE_ERROR_INVALID_ARGUMENT,
                "moeEventElapsedMs: the %s event is a dependency event "
                "(CU_EVENT_DISABLE_TIMING); create it with "
                "moeEventCreateTiming",
                !start->timing ? "start" : "end");
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  if (CUresult result =
          api->cuEventElapsedTime(milliseconds, start->event, end->event))
    return failCuda(result, "cuEventElapsedTime");
  return MOE_SUCCESS;
}

moeStatus moeEventDestroy(moeEvent event) {
  if (!event)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeEventDestroy: null event");
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  CUresult result = api->cuEventDestroy(event->event);
  delete event;
  if (result)
    return failCuda(result, "cuEventDestroy");
  return MOE_SUCCESS;
}

//===----------------------------------------------------------------------===//
// Memory
//===----------------------------------------------------------------------===//

moeStatus moeMemAlloc(size_t bytes, moeDevicePtr *ptr) {
  if (!ptr)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeMemAlloc: null output");
  if (bytes == 0)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeMemAlloc: 0 bytes");
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  CUdeviceptr device = 0;
  if (CUresult result = api->cuMemAlloc(&device, bytes)) {
    char detail[64];
    std::snprintf(detail, sizeof(detail), "%zu bytes", bytes);
    return failCuda(result, "cuMemAlloc", detail);
  }
  *ptr = device;
  return MOE_SUCCESS;
}

moeStatus moeMemFree(moeDevicePtr ptr) {
  if (!ptr)
    return MOE_SUCCESS;
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  if (CUresult result = api->cuMemFree(ptr))
    return failCuda(result, "cuMemFree");
  return MOE_SUCCESS;
}

moeStatus moeMemGetInfo(size_t *freeBytes, size_t *totalBytes) {
  if (!freeBytes || !totalBytes)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeMemGetInfo: null output");
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  if (CUresult result = api->cuMemGetInfo(freeBytes, totalBytes))
    return failCuda(result, "cuMemGetInfo");
  return MOE_SUCCESS;
}

moeStatus moeHostAlloc(size_t bytes, void **ptr) {
  if (!ptr)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeHostAlloc: null output");
  if (bytes == 0)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeHostAlloc: 0 bytes");
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  void *host = nullptr;
  if (CUresult result =
          api->cuMemHostAlloc(&host, bytes, CU_MEMHOSTALLOC_PORTABLE)) {
    char detail[64];
    std::snprintf(detail, sizeof(detail), "%zu bytes", bytes);
    return failCuda(result, "cuMemHostAlloc", detail);
  }
  *ptr = host;
  return MOE_SUCCESS;
}

moeStatus moeHostFree(void *ptr) {
  if (!ptr)
    return MOE_SUCCESS;
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  if (CUresult result = api->cuMemFreeHost(ptr))
    return failCuda(result, "cuMemFreeHost");
  return MOE_SUCCESS;
}

static moeStatus checkCopy(const char *what, bool dstNull, bool srcNull,
                           size_t bytes) {
  if (dstNull || srcNull)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "%s: null %s", what,
                dstNull ? "destination" : "source");
  if (bytes == 0)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "%s: 0 bytes", what);
  return MOE_SUCCESS;
}

moeStatus moeMemcpyHtoDAsync(moeDevicePtr dst, const void *src, size_t bytes,
                             moeStream stream) {
  if (moeStatus status =
          checkCopy("moeMemcpyHtoDAsync", dst == 0, src == nullptr, bytes))
    return status;
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  if (CUresult result = api->cuMemcpyHtoDAsync(
          dst, src, bytes, reinterpret_cast<CUstream>(stream)))
    return failCuda(result, "cuMemcpyHtoDAsync");
  return MOE_SUCCESS;
}

moeStatus moeMemcpyDtoHAsync(void *dst, moeDevicePtr src, size_t bytes,
                             moeStream stream) {
  if (moeStatus status =
          checkCopy("moeMemcpyDtoHAsync", dst == nullptr, src == 0, bytes))
    return status;
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  if (CUresult result = api->cuMemcpyDtoHAsync(
          dst, src, bytes, reinterpret_cast<CUstream>(stream)))
    return failCuda(result, "cuMemcpyDtoHAsync");
  return MOE_SUCCESS;
}

moeStatus moeMemcpyDtoDAsync(moeDevicePtr dst, moeDevicePtr src, size_t bytes,
                             moeStream stream) {
  if (moeStatus status =
          checkCopy("moeMemcpyDtoDAsync", dst == 0, src == 0, bytes))
    return status;
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  if (CUresult result = api->cuMemcpyDtoDAsync(
          dst, src, bytes, reinterpret_cast<CUstream>(stream)))
    return failCuda(result, "cuMemcpyDtoDAsync");
  return MOE_SUCCESS;
}

moeStatus moeMemsetD32Async(moeDevicePtr dst, uint32_t value, size_t count,
                            moeStream stream) {
  if (!dst)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeMemsetD32Async: null pointer");
  if (dst % 4 != 0)
    return fail(MOE_ERROR_MISALIGNED,
                "moeMemsetD32Async: 0x%" PRIx64 " is not 4-byte aligned",
                static_cast<uint64_t>(dst));
  if (count == 0)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeMemsetD32Async: 0 words");
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  if (CUresult result = api->cuMemsetD32Async(
          dst, value, count, reinterpret_cast<CUstream>(stream)))
    return failCuda(result, "cuMemsetD32Async");
  return MOE_SUCCESS;
}

//===----------------------------------------------------------------------===//
// Arena
//===----------------------------------------------------------------------===//

moeStatus moeArenaCreate(size_t capacity, moeArena *arena) {
  if (!arena)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeArenaCreate: null output");
  if (capacity == 0)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeArenaCreate: 0 bytes");
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  CUdeviceptr base = 0;
  if (CUresult result = api->cuMemAlloc(&base, capacity)) {
    char detail[64];
    std::snprintf(detail, sizeof(detail), "arena of %zu bytes", capacity);
    return failCuda(result, "cuMemAlloc", detail);
  }
  auto *record = new (std::nothrow) moeArena_st;
  if (!record) {
    (void)api->cuMemFree(base);
    return fail(MOE_ERROR_OUT_OF_MEMORY, "no host memory for an arena record");
  }
  record->allocator = BumpAllocator(base, capacity);
  record->device = currentDevice();
  *arena = record;
  return MOE_SUCCESS;
}

moeStatus moeArenaAlloc(moeArena arena, size_t bytes, size_t alignment,
                        moeDevicePtr *ptr) {
  if (!arena || !ptr)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeArenaAlloc: null %s",
                arena ? "output" : "arena");
  std::lock_guard<std::mutex> lock(arena->mutex);
  uint64_t address = 0;
  moeStatus status = arena->allocator.allocate(bytes, alignment, address);
  if (status == MOE_ERROR_INVALID_ARGUMENT)
    return fail(status,
                "moeArenaAlloc: %s (bytes %zu, alignment %zu; alignment must "
                "be 0 or a power of two)",
                bytes == 0 ? "0 bytes" : "bad alignment", bytes, alignment);
  if (status == MOE_ERROR_OUT_OF_MEMORY)
    return fail(status,
                "moeArenaAlloc: arena exhausted: %zu bytes at alignment %zu "
                "requested, %" PRIu64 " of %" PRIu64 " bytes in use",
                bytes, alignment ? alignment : MOE_ARENA_DEFAULT_ALIGNMENT,
                arena->allocator.getUsed(), arena->allocator.getCapacity());
  if (status)
    return fail(status, "moeArenaAlloc failed");
  *ptr = address;
  return MOE_SUCCESS;
}

moeStatus moeArenaReset(moeArena arena) {
  if (!arena)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeArenaReset: null arena");
  std::lock_guard<std::mutex> lock(arena->mutex);
  arena->allocator.reset();
  return MOE_SUCCESS;
}

moeStatus moeArenaGetInfo(moeArena arena, moeArenaInfo *info) {
  if (!arena || !info)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeArenaGetInfo: null %s",
                arena ? "output" : "arena");
  std::lock_guard<std::mutex> lock(arena->mutex);
  const BumpAllocator &allocator = arena->allocator;
  info->base = allocator.getBase();
  info->capacity = allocator.getCapacity();
  info->used = allocator.getUsed();
  info->highWater = allocator.getHighWater();
  info->allocations = allocator.getAllocationCount();
  return MOE_SUCCESS;
}

moeStatus moeArenaDestroy(moeArena arena) {
  if (!arena)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moeArenaDestroy: null arena");
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  CUresult result = api->cuMemFree(arena->allocator.getBase());
  delete arena;
  if (result)
    return failCuda(result, "cuMemFree", "arena");
  return MOE_SUCCESS;
}

} // extern "C"
