//===- smoke.cpp - moe-runtime-smoke: the runtime on a real GPU -*- C++ -*-===//
//
// Runs the kernels of smoke_kernels.cu (embedded as PTX and as an sm_90a
// cubin) through libmoe_runtime on an H200 and checks every result exactly
// on the host: PTX JIT and cubin loads, the arena, pinned buffers, async
// copies on two streams joined by a dependency event, timing events, a launch
// with more than 48 KB of dynamic shared memory, a cluster launch of 2, a TMA
// load through a by-value tensor map, the mgpu* ABI, and the error paths on a
// real driver. Prints one line per check and "N passed, M failed"; exits 1 on
// any failure.
//
//===----------------------------------------------------------------------===//

#include "moe/Runtime/MgpuABI.h"
#include "moe/Runtime/Runtime.h"

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

extern "C" const unsigned char moeSmokePtx[];
extern "C" const unsigned long long moeSmokePtx_size;
extern "C" const unsigned char moeSmokeCubin[];
extern "C" const unsigned long long moeSmokeCubin_size;

namespace {

// cuda.h values, so that this file needs no CUDA header.
constexpr uint32_t kBfloat16 = 9;    // CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
constexpr uint32_t kSwizzle128B = 3; // CU_TENSOR_MAP_SWIZZLE_128B

int passed = 0;
int failed = 0;

void checkf(bool ok, const char *name, const char *format, ...)
    __attribute__((format(printf, 3, 4)));

void checkf(bool ok, const char *name, const char *format, ...) {
  char detail[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(detail, sizeof(detail), format, args);
  va_end(args);
  if (ok) {
    ++passed;
    std::printf("PASS %s%s%s\n", name, detail[0] ? ": " : "", detail);
  } else {
    ++failed;
    std::printf("FAIL %s%s%s [last error %s: %s]\n", name,
                detail[0] ? ": " : "", detail,
                moeStatusString(moeGetLastStatus()), moeGetLastErrorMessage());
  }
  std::fflush(stdout);
}

void check(bool ok, const char *name) { checkf(ok, name, "%s", ""); }

// Checks that a call succeeded; returns whether it did.
bool ok(moeStatus status, const char *name) {
  if (status != MOE_SUCCESS) {
    checkf(false, name, "%s", moeStatusString(status));
    return false;
  }
  return true;
}

int finish() {
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}

const char *kBadPtx = ".version 8.0\n"
                      ".target sm_90a\n"
                      ".address_size 64\n"
                      ".visible .entry broken()\n"
                      "{\n"
                      "  this is not an instruction;\n"
                      "  ret;\n"
                      "}\n";

} // namespace

int main() {
  // Driver and device.
  if (moeStatus status = moeInit()) {
    checkf(false, "driver", "moeInit returned %s", moeStatusString(status));
    return finish();
  }
  int version = 0, count = 0, major = 0, minor = 0;
  ok(moeDriverGetVersion(&version), "driver version");
  ok(moeGetDeviceCount(&count), "device count");
  ok(moeDeviceGetComputeCapability(&major, &minor), "compute capability");
  checkf(major == 9 && minor == 0, "device is sm_90",
         "driver %d, %d device(s), compute capability %d.%d", version, count,
         major, minor);

  // Modules: the PTX through the JIT, the cubin directly.
  moeModule ptxModule = nullptr, cubinModule = nullptr;
  checkf(moeModuleLoadPTX(reinterpret_cast<const char *>(moeSmokePtx), 4,
                          &ptxModule) == MOE_SUCCESS,
         "load PTX (JIT)", "%llu bytes", moeSmokePtx_size);
  checkf(moeModuleLoad(moeSmokeCubin, moeSmokeCubin_size, &cubinModule) ==
             MOE_SUCCESS,
         "load cubin", "%llu bytes", moeSmokeCubin_size);
  if (!ptxModule || !cubinModule)
    return finish();
  moeModule again = nullptr;
  checkf(moeModuleLoad(moeSmokeCubin, moeSmokeCubin_size, &again) ==
                 MOE_SUCCESS &&
             again == cubinModule,
         "module cache", "same image, same module");
  if (again)
    moeModuleUnload(again);

  moeFunction axpbPtx = nullptr, axpbCubin = nullptr, reverse = nullptr,
              exchange = nullptr, tmaLoad = nullptr;
  ok(moeModuleGetFunction(ptxModule, "axpb", &axpbPtx), "lookup axpb (PTX)");
  ok(moeModuleGetFunction(cubinModule, "axpb", &axpbCubin),
     "lookup axpb (cubin)");
  ok(moeModuleGetFunction(cubinModule, "smem_reverse", &reverse),
     "lookup smem_reverse");
  ok(moeModuleGetFunction(cubinModule, "cluster_exchange", &exchange),
     "lookup cluster_exchange");
  ok(moeModuleGetFunction(cubinModule, "tma_load_tile", &tmaLoad),
     "lookup tma_load_tile");
  if (!axpbPtx || !axpbCubin || !reverse || !exchange || !tmaLoad)
    return finish();
  moeFunction cached = nullptr;
  check(moeModuleGetFunction(cubinModule, "axpb", &cached) == MOE_SUCCESS &&
            cached == axpbCubin,
        "function cache");
  moeFunctionInfo info;
  moeFunctionGetInfo(axpbCubin, &info);
  checkf(info.numRegs > 0 && info.maxThreadsPerBlock == 256, "axpb attributes",
         "%d registers, max %d threads (__launch_bounds__(256)), %d B local",
         info.numRegs, info.maxThreadsPerBlock, info.localBytes);
  moeFunctionGetInfo(reverse, &info);
  checkf(info.maxDynamicSmemBytes >= 200 * 1024, "smem_reverse attributes",
         "%d registers, %d B static smem, up to %d B dynamic smem set once",
         info.numRegs, info.staticSmemBytes, info.maxDynamicSmemBytes);

  // Arena, pinned buffers, two streams and a dependency event.
  moeArena arena = nullptr;
  if (!ok(moeArenaCreate(64 << 20, &arena), "arena create"))
    return finish();
  const unsigned n = 1 << 20;
  moeDevicePtr x = 0, y = 0;
  ok(moeArenaAlloc(arena, n * sizeof(float), 0, &x), "arena alloc x");
  ok(moeArenaAlloc(arena, n * sizeof(float), 1024, &y), "arena alloc y");
  checkf(x % 256 == 0 && y % 1024 == 0 && y >= x + n * sizeof(float),
         "arena alignment", "x=0x%llx y=0x%llx", (unsigned long long)x,
         (unsigned long long)y);
  float *hostX = nullptr, *hostY = nullptr;
  ok(moeHostAlloc(n * sizeof(float), reinterpret_cast<void **>(&hostX)),
     "pinned alloc x");
  ok(moeHostAlloc(n * sizeof(float), reinterpret_cast<void **>(&hostY)),
     "pinned alloc y");
  if (!x || !y || !hostX || !hostY)
    return finish();
  for (unsigned i = 0; i < n; ++i)
    hostX[i] = float(i);

  moeStream copyStream = nullptr, computeStream = nullptr;
  ok(moeStreamCreate(&copyStream), "stream create (copy)");
  ok(moeStreamCreate(&computeStream), "stream create (compute)");
  moeEvent copied = nullptr, start = nullptr, stop = nullptr;
  ok(moeEventCreate(&copied), "dependency event");
  ok(moeEventCreateTiming(&start), "timing event start");
  ok(moeEventCreateTiming(&stop), "timing event stop");

  ok(moeMemcpyHtoDAsync(x, hostX, n * sizeof(float), copyStream), "H2D async");
  ok(moeEventRecord(copied, copyStream), "record dependency");
  ok(moeStreamWaitEvent(computeStream, copied), "stream waits on event");
  ok(moeEventRecord(start, computeStream), "record start");
  float a = 2.0f, b = 1.0f;
  void *axpbParams[] = {&y, &x, &a, &b, const_cast<unsigned *>(&n)};
  moeLaunchConfig config = {};
  config.gridX = (n + 255) / 256;
  config.gridY = config.gridZ = 1;
  config.blockX = 256;
  config.blockY = config.blockZ = 1;
  config.stream = computeStream;
  ok(moeLaunch(axpbPtx, &config, axpbParams), "launch axpb (PTX)");
  ok(moeEventRecord(stop, computeStream), "record stop");
  ok(moeMemcpyDtoHAsync(hostY, y, n * sizeof(float), computeStream),
     "D2H async");
  if (ok(moeStreamSynchronize(computeStream), "synchronize")) {
    unsigned bad = 0;
    for (unsigned i = 0; i < n; ++i)
      bad += hostY[i] != 2.0f * float(i) + 1.0f;
    checkf(bad == 0, "axpb (PTX) results", "%u of %u wrong", bad, n);
    float ms = -1;
    bool timed = moeEventElapsedMs(start, stop, &ms) == MOE_SUCCESS;
    checkf(timed && ms >= 0, "elapsed time",
           "%.3f ms for one axpb over %u floats", ms, n);
  }

  a = -0.5f;
  b = 3.0f;
  ok(moeLaunch(axpbCubin, &config, axpbParams), "launch axpb (cubin)");
  ok(moeMemcpyDtoHAsync(hostY, y, n * sizeof(float), computeStream),
     "D2H async");
  if (ok(moeStreamSynchronize(computeStream), "synchronize")) {
    unsigned bad = 0;
    for (unsigned i = 0; i < n; ++i)
      bad += hostY[i] != -0.5f * float(i) + 3.0f;
    checkf(bad == 0, "axpb (cubin) results", "%u of %u wrong", bad, n);
  }

  // More than 48 KB of dynamic shared memory.
  {
    const unsigned words = 100 * 1024 / 4, blocks = 8;
    moeDevicePtr in = 0, out = 0;
    ok(moeArenaAlloc(arena, words * blocks * 4, 0, &in), "arena alloc in");
    ok(moeArenaAlloc(arena, words * blocks * 4, 0, &out), "arena alloc out");
    std::vector<unsigned> host(words * blocks);
    for (size_t i = 0; i < host.size(); ++i)
      host[i] = unsigned(i * 2654435761u);
    ok(moeMemcpyHtoDAsync(in, host.data(), host.size() * 4, computeStream),
       "H2D (pageable)");
    void *params[] = {&in, &out, const_cast<unsigned *>(&words)};
    moeLaunchConfig big = {};
    big.gridX = blocks;
    big.gridY = big.gridZ = 1;
    big.blockX = 256;
    big.blockY = big.blockZ = 1;
    big.sharedMemBytes = words * 4;
    big.stream = computeStream;
    ok(moeLaunch(reverse, &big, params), "launch with 100 KB dynamic smem");
    std::vector<unsigned> back(host.size());
    ok(moeMemcpyDtoHAsync(back.data(), out, back.size() * 4, computeStream),
       "D2H (pageable)");
    if (ok(moeStreamSynchronize(computeStream), "synchronize")) {
      size_t bad = 0;
      for (unsigned blk = 0; blk < blocks; ++blk)
        for (unsigned i = 0; i < words; ++i)
          bad += back[blk * words + i] != host[blk * words + words - 1 - i];
      checkf(bad == 0, "smem_reverse results", "%zu wrong, %u B smem", bad,
             big.sharedMemBytes);
    }
  }

  // A cluster launch of 2.
  {
    const unsigned blocks = 8;
    moeDevicePtr out = 0;
    ok(moeArenaAlloc(arena, blocks * 2 * 4, 0, &out), "arena alloc out");
    ok(moeMemsetD32Async(out, 0xffffffffu, blocks * 2, computeStream),
       "memset32");
    void *params[] = {&out};
    moeLaunchConfig clustered = {};
    clustered.gridX = blocks;
    clustered.gridY = clustered.gridZ = 1;
    clustered.blockX = 32;
    clustered.blockY = clustered.blockZ = 1;
    clustered.clusterX = 2;
    clustered.clusterY = clustered.clusterZ = 1;
    clustered.stream = computeStream;
    ok(moeLaunch(exchange, &clustered, params), "cluster launch (2x1x1)");
    std::vector<unsigned> back(blocks * 2);
    ok(moeMemcpyDtoHAsync(back.data(), out, back.size() * 4, computeStream),
       "D2H");
    if (ok(moeStreamSynchronize(computeStream), "synchronize")) {
      unsigned bad = 0;
      for (unsigned blk = 0; blk < blocks; ++blk)
        bad += back[2 * blk] != (blk ^ 1) * 10 + 1 || back[2 * blk + 1] != 2;
      checkf(bad == 0, "cluster results",
             "%u of %u blocks read a wrong peer or cluster size", bad, blocks);
    }
  }

  // TMA: a 128 x 64 bf16 box with 128B swizzle, the map passed by value.
  {
    const unsigned rows = 256, cols = 64;
    moeDevicePtr global = 0, out = 0;
    ok(moeArenaAlloc(arena, rows * cols * 2, 1024, &global),
       "arena alloc tensor");
    ok(moeArenaAlloc(arena, 128 * 128, 0, &out), "arena alloc tile");
    std::vector<uint16_t> host(rows * cols);
    for (unsigned i = 0; i < rows * cols; ++i)
      host[i] = uint16_t(i);
    ok(moeMemcpyHtoDAsync(global, host.data(), host.size() * 2, computeStream),
       "H2D tensor");
    moeTensorMap map;
    const uint64_t dims[2] = {cols, rows};
    const uint64_t strides[1] = {cols * 2};
    const uint32_t box[2] = {64, 128};
    bool encoded = moeTensorMapEncodeTiled(&map, kBfloat16, 2,
                                           reinterpret_cast<void *>(global),
                                           dims, strides, box, nullptr, 0,
                                           kSwizzle128B, 0, 0) == MOE_SUCCESS;
    check(encoded, "encode 128x64 bf16 128B-swizzle tensor map");
    int tileX = 0, tileY = 128;
    void *params[] = {&map, &tileX, &tileY, &out};
    moeLaunchConfig one = {};
    one.gridX = one.gridY = one.gridZ = 1;
    one.blockX = 128;
    one.blockY = one.blockZ = 1;
    one.stream = computeStream;
    if (encoded)
      ok(moeLaunch(tmaLoad, &one, params), "launch TMA load");
    std::vector<uint8_t> tile(128 * 128);
    ok(moeMemcpyDtoHAsync(tile.data(), out, tile.size(), computeStream),
       "D2H tile");
    if (encoded && ok(moeStreamSynchronize(computeStream), "synchronize")) {
      // 128B swizzle: the 16-byte chunk j of row r lands at chunk j ^ (r % 8).
      unsigned bad = 0;
      for (unsigned r = 0; r < 128; ++r)
        for (unsigned c = 0; c < 64; ++c) {
          unsigned chunk = (c * 2 / 16) ^ (r % 8);
          unsigned offset = r * 128 + chunk * 16 + (c * 2) % 16;
          uint16_t value;
          std::memcpy(&value, &tile[offset], 2);
          bad += value != uint16_t((tileY + r) * cols + c);
        }
      checkf(bad == 0, "TMA tile (by-value CUtensorMap, 128B swizzle)",
             "%u of %u elements wrong", bad, 128 * 64);
    }
  }

  // The mgpu* ABI that gpu-to-llvm code calls.
  {
    moeClearLastError();
    void *module = mgpuModuleLoad(const_cast<unsigned char *>(moeSmokeCubin),
                                  moeSmokeCubin_size);
    checkf(module == cubinModule, "mgpuModuleLoad", "cached module %p", module);
    // A copy, so that the cache (keyed by image pointer) does not answer.
    std::string ptxCopy(reinterpret_cast<const char *>(moeSmokePtx));
    void *jit = mgpuModuleLoadJIT(ptxCopy.data(), 2);
    checkf(jit != nullptr && jit != ptxModule, "mgpuModuleLoadJIT",
           "PTX JIT-compiled again at -O2");
    void *function = mgpuModuleGetFunction(jit, "axpb");
    void *exchangeFn = mgpuModuleGetFunction(module, "cluster_exchange");
    check(function && exchangeFn, "mgpuModuleGetFunction");
    void *streamA = mgpuStreamCreate();
    void *streamB = mgpuStreamCreate();
    const unsigned count = 4096;
    void *dx = mgpuMemAlloc(count * 4, streamA, false);
    void *dy = mgpuMemAlloc(count * 4, streamA, false);
    check(streamA && streamB && dx && dy, "mgpuStreamCreate/mgpuMemAlloc");
    std::vector<float> hx(count), hy(count, -1.0f);
    for (unsigned i = 0; i < count; ++i)
      hx[i] = float(i % 1000);
    mgpuMemcpy(dx, hx.data(), count * 4, streamA);
    void *event = mgpuEventCreate();
    mgpuEventRecord(event, streamA);
    mgpuStreamWaitEvent(streamB, event);
    float ma = 4.0f, mb = -2.0f;
    unsigned mn = count;
    void *params[] = {&dy, &dx, &ma, &mb, &mn};
    mgpuLaunchKernel(function, count / 128, 1, 1, 128, 1, 1, 0, streamB, params,
                     nullptr, 5);
    mgpuMemcpy(hy.data(), dy, count * 4, streamB);
    mgpuStreamSynchronize(streamB);
    unsigned bad = 0;
    for (unsigned i = 0; i < count; ++i)
      bad += hy[i] != 4.0f * float(i % 1000) - 2.0f;
    checkf(bad == 0 && moeGetLastStatus() == MOE_SUCCESS,
           "mgpuLaunchKernel results", "%u of %u wrong", bad, count);

    void *cout = mgpuMemAlloc(4 * 4 * 2, streamB, false);
    mgpuMemset32(cout, 0, 8, streamB);
    void *clusterParams[] = {&cout};
    mgpuLaunchClusterKernel(exchangeFn, 2, 1, 1, 4, 1, 1, 64, 1, 1, 0, streamB,
                            clusterParams, nullptr);
    std::vector<unsigned> back(8, 0);
    mgpuMemcpy(back.data(), cout, 8 * 4, streamB);
    mgpuStreamSynchronize(streamB);
    bad = 0;
    for (unsigned blk = 0; blk < 4; ++blk)
      bad += back[2 * blk] != (blk ^ 1) * 10 + 1 || back[2 * blk + 1] != 2;
    checkf(bad == 0 && moeGetLastStatus() == MOE_SUCCESS,
           "mgpuLaunchClusterKernel results", "%u of 4 blocks wrong", bad);

    mgpuEventSynchronize(event);
    mgpuEventDestroy(event);
    mgpuMemFree(dx, streamA);
    mgpuMemFree(dy, streamA);
    mgpuMemFree(cout, streamB);
    mgpuStreamDestroy(streamA);
    mgpuStreamDestroy(streamB);
    mgpuModuleUnload(jit);
    mgpuModuleUnload(module);
    check(moeGetLastStatus() == MOE_SUCCESS, "mgpu* teardown");
  }

  // Error paths on a real driver.
  {
    moeModule bad = nullptr;
    moeStatus status = moeModuleLoadPTX(kBadPtx, 4, &bad);
    std::string message = moeGetLastErrorMessage();
    checkf(status == MOE_ERROR_MODULE_LOAD &&
               message.find("JIT log: (empty)") == std::string::npos &&
               message.find("JIT log: ") != std::string::npos,
           "bad PTX -> MOE_ERROR_MODULE_LOAD with the JIT log", "%s",
           message.c_str());

    moeFunction missing = nullptr;
    status = moeModuleGetFunction(cubinModule, "no_such_kernel", &missing);
    checkf(status == MOE_ERROR_NOT_FOUND && !missing,
           "unknown kernel -> MOE_ERROR_NOT_FOUND", "%s",
           moeGetLastErrorMessage());

    moeArena tiny = nullptr;
    moeDevicePtr ptr = 0;
    ok(moeArenaCreate(1 << 20, &tiny), "small arena");
    status = moeArenaAlloc(tiny, 2 << 20, 0, &ptr);
    checkf(status == MOE_ERROR_OUT_OF_MEMORY,
           "arena exhausted -> MOE_ERROR_OUT_OF_MEMORY", "%s",
           moeGetLastErrorMessage());
    moeArenaDestroy(tiny);

    status = moeMemAlloc(size_t(1) << 50, &ptr); // 1 PiB
    checkf(status == MOE_ERROR_OUT_OF_MEMORY,
           "1 PiB cuMemAlloc -> MOE_ERROR_OUT_OF_MEMORY", "%s",
           moeGetLastErrorMessage());

    moeLaunchConfig tooBig = config;
    tooBig.sharedMemBytes = MOE_MAX_DYNAMIC_SMEM_BYTES + 1024;
    check(moeLaunch(axpbCubin, &tooBig, axpbParams) ==
              MOE_ERROR_INVALID_ARGUMENT,
          "228 KB smem -> MOE_ERROR_INVALID_ARGUMENT");
    moeLaunchConfig wide = config;
    wide.blockX = 512;
    check(moeLaunch(axpbCubin, &wide, axpbParams) == MOE_ERROR_SHAPE_MISMATCH,
          "512 threads on a 256-thread kernel -> MOE_ERROR_SHAPE_MISMATCH");
    check(moeDeviceSynchronize() == MOE_SUCCESS,
          "context healthy after the error paths");
  }

  // Teardown.
  bool clean = moeEventDestroy(copied) == MOE_SUCCESS &&
               moeEventDestroy(start) == MOE_SUCCESS &&
               moeEventDestroy(stop) == MOE_SUCCESS &&
               moeStreamDestroy(copyStream) == MOE_SUCCESS &&
               moeStreamDestroy(computeStream) == MOE_SUCCESS &&
               moeHostFree(hostX) == MOE_SUCCESS &&
               moeHostFree(hostY) == MOE_SUCCESS &&
               moeArenaDestroy(arena) == MOE_SUCCESS &&
               moeModuleUnload(ptxModule) == MOE_SUCCESS &&
               moeModuleUnload(cubinModule) == MOE_SUCCESS;
  check(clean, "teardown");
  return finish();
}
