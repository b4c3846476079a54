//===- FakeDriverTest.cpp - The runtime against a scripted driver -*- C++
//-*-===//
//
// FakeCuda.h's stand-in for libcuda checks what the runtime asks of the
// driver: contexts once per thread, the module and function caches, the
// JIT options and log, launch flags, stream and event flags, the arena, and
// how each CUresult becomes a status. Real GPU behaviour is the smoke
// test's job (runtime/test/smoke.cpp).
//
//===----------------------------------------------------------------------===//

#include "RuntimeTestUtils.h"

#include <cuda.h>

#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

using namespace moe::runtime::test;

namespace {

using RuntimeFake = FakeDriverTest;

const char kElf[] = "\x7f"
                    "ELF fake cubin";
const char kPtx[] = ".version 8.0\n.target sm_90a\n.address_size 64\n";

TEST_F(RuntimeFake, InitAndDeviceQueries) {
  EXPECT_EQ(moeInit(), MOE_SUCCESS) << lastMessage();
  EXPECT_EQ(moeInit(), MOE_SUCCESS);
  EXPECT_EQ(fake->initCalls, 1);
  int count = 0, version = 0, major = 0, minor = 0;
  EXPECT_EQ(moeGetDeviceCount(&count), MOE_SUCCESS);
  EXPECT_EQ(count, 1);
  EXPECT_EQ(moeDriverGetVersion(&version), MOE_SUCCESS);
  EXPECT_EQ(version, CUDA_VERSION);
  EXPECT_EQ(moeDeviceGetComputeCapability(&major, &minor), MOE_SUCCESS);
  EXPECT_EQ(major, 9);
  EXPECT_EQ(minor, 0);
  EXPECT_EQ(moeSetDevice(1), MOE_ERROR_NO_DEVICE);
  EXPECT_NE(lastMessage().find("device 1"), std::string::npos);
  EXPECT_EQ(moeSetDevice(0), MOE_SUCCESS);
}

TEST_F(RuntimeFake, InitFailuresMapToStatuses) {
  struct Case {
    CUresult result;
    moeStatus status;
  } cases[] = {
      {CUDA_ERROR_NO_DEVICE, MOE_ERROR_NO_DEVICE},
      {CUDA_ERROR_STUB_LIBRARY, MOE_ERROR_NO_DRIVER},
      {CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, MOE_ERROR_NO_DRIVER},
      {CUDA_ERROR_ILLEGAL_ADDRESS, MOE_ERROR_KERNEL_FAULT},
      {CUDA_ERROR_UNKNOWN, MOE_ERROR_CUDA},
  };
  for (const Case &c : cases) {
    fake->initResult = c.result;
    useDriver(MOE_FAKE_CUDA_PATH);
    EXPECT_EQ(moeInit(), c.status) << int(c.result) << ": " << lastMessage();
    EXPECT_NE(lastMessage().find("cuInit failed"), std::string::npos)
        << lastMessage();
  }
  // The fake names CUDA_ERROR_NO_DEVICE itself; for CUDA_ERROR_UNKNOWN it
  // has no name, and the runtime prints the number.
  fake->initResult = CUDA_ERROR_NO_DEVICE;
  useDriver(MOE_FAKE_CUDA_PATH);
  EXPECT_EQ(moeInit(), MOE_ERROR_NO_DEVICE);
  EXPECT_NE(lastMessage().find("CUDA_ERROR_NO_DEVICE"), std::string::npos);
  EXPECT_NE(lastMessage().find("fake driver description"), std::string::npos);
  fake->initResult = CUDA_ERROR_UNKNOWN;
  useDriver(MOE_FAKE_CUDA_PATH);
  EXPECT_EQ(moeInit(), MOE_ERROR_CUDA);
  EXPECT_NE(lastMessage().find("CUresult 999"), std::string::npos)
      << lastMessage();
}

TEST_F(RuntimeFake, NoDevices) {
  fake->deviceCount = 0;
  useDriver(MOE_FAKE_CUDA_PATH);
  EXPECT_EQ(moeInit(), MOE_ERROR_NO_DEVICE);
  moeDevicePtr ptr = 0;
  EXPECT_EQ(moeMemAlloc(64, &ptr), MOE_ERROR_NO_DEVICE);
}

TEST_F(RuntimeFake, ContextIsMadeCurrentOncePerThread) {
  moeDevicePtr a = 0, b = 0;
  ASSERT_EQ(moeMemAlloc(64, &a), MOE_SUCCESS) << lastMessage();
  ASSERT_EQ(moeMemAlloc(64, &b), MOE_SUCCESS);
  moeStream stream = nullptr;
  ASSERT_EQ(moeStreamCreate(&stream), MOE_SUCCESS);
  EXPECT_EQ(fake->primaryRetainCalls, 1);
  EXPECT_EQ(fake->ctxSetCurrentCalls, 1);
  std::thread other([] {
    moeDevicePtr c = 0, d = 0;
    EXPECT_EQ(moeMemAlloc(64, &c), MOE_SUCCESS);
    EXPECT_EQ(moeMemAlloc(64, &d), MOE_SUCCESS);
    EXPECT_EQ(moeMemFree(c), MOE_SUCCESS);
    EXPECT_EQ(moeMemFree(d), MOE_SUCCESS);
  });
  other.join();
  EXPECT_EQ(fake->primaryRetainCalls, 1);
  EXPECT_EQ(fake->ctxSetCurrentCalls, 2);
  EXPECT_EQ(moeMemFree(a), MOE_SUCCESS);
  EXPECT_EQ(moeMemFree(b), MOE_SUCCESS);
  EXPECT_EQ(moeStreamDestroy(stream), MOE_SUCCESS);
  EXPECT_EQ(fake->liveDeviceAllocations, 0);
  moeRuntimeResetForTesting();
  EXPECT_EQ(fake->primaryReleaseCalls, 1);
}

TEST_F(RuntimeFake, ModulesAreCachedByImage) {
  moeModule first = nullptr, second = nullptr, other = nullptr;
  ASSERT_EQ(moeModuleLoad(kElf, sizeof(kElf), &first), MOE_SUCCESS)
      << lastMessage();
  ASSERT_EQ(moeModuleLoad(kElf, sizeof(kElf), &second), MOE_SUCCESS);
  EXPECT_EQ(first, second);
  EXPECT_EQ(fake->moduleLoadCalls, 1);
  ASSERT_EQ(moeModuleLoadPTX(kPtx, 3, &other), MOE_SUCCESS) << lastMessage();
  EXPECT_NE(other, first);
  EXPECT_EQ(fake->moduleLoadExCalls, 1);
  EXPECT_EQ(fake->lastJitOptLevel, 3);
  EXPECT_TRUE(fake->lastJitHadLogBuffer);

  EXPECT_EQ(moeModuleUnload(first), MOE_SUCCESS);
  EXPECT_EQ(fake->moduleUnloadCalls, 0);
  EXPECT_EQ(moeModuleUnload(second), MOE_SUCCESS);
  EXPECT_EQ(fake->moduleUnloadCalls, 1);
  EXPECT_EQ(moeModuleUnload(first), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(moeModuleUnload(other), MOE_SUCCESS);
  EXPECT_EQ(fake->moduleUnloadCalls, 2);
}

TEST_F(RuntimeFake, ImageKindIsSniffed) {
  moeModule cubin = nullptr, ptx = nullptr, fatbin = nullptr;
  ASSERT_EQ(moeModuleLoad(kElf, sizeof(kElf), &cubin), MOE_SUCCESS);
  ASSERT_EQ(moeModuleLoad(kPtx, sizeof(kPtx), &ptx), MOE_SUCCESS);
  static const unsigned char kFatbin[] = {0x50, 0xed, 0x55, 0xba, 1, 0, 0, 0};
  ASSERT_EQ(moeModuleLoad(kFatbin, sizeof(kFatbin), &fatbin), MOE_SUCCESS);
  EXPECT_EQ(fake->moduleLoadCalls, 2);
  EXPECT_EQ(fake->moduleLoadExCalls, 1);
  EXPECT_EQ(fake->lastJitOptLevel, 4);
}

TEST_F(RuntimeFake, LoadFailures) {
  static const char kCorrupt[] = "\x7f"
                                 "ELF corrupt";
  moeModule module = nullptr;
  EXPECT_EQ(moeModuleLoad(kCorrupt, sizeof(kCorrupt), &module),
            MOE_ERROR_MODULE_LOAD);
  EXPECT_EQ(module, nullptr);
  EXPECT_NE(lastMessage().find("cuModuleLoadData failed"), std::string::npos)
      << lastMessage();
  EXPECT_NE(lastMessage().find("CUDA_ERROR_INVALID_IMAGE"), std::string::npos);

  static const char kBad[] = ".version 8.0\nsyntax_error here\n";
  EXPECT_EQ(moeModuleLoadPTX(kBad, 4, &module), MOE_ERROR_MODULE_LOAD);
  std::string message = lastMessage();
  EXPECT_NE(message.find("cuModuleLoadDataEx failed"), std::string::npos)
      << message;
  EXPECT_NE(message.find("CUDA_ERROR_INVALID_PTX"), std::string::npos);
  EXPECT_NE(message.find(kFakeJitLog), std::string::npos) << message;
  // A failed load is not cached.
  EXPECT_EQ(moeModuleLoadPTX(kBad, 4, &module), MOE_ERROR_MODULE_LOAD);
  EXPECT_EQ(fake->moduleLoadExCalls, 2);
}

TEST_F(RuntimeFake, FunctionLookupIsCachedAndSetsSmemOnce) {
  moeModule module = nullptr;
  ASSERT_EQ(moeModuleLoad(kElf, sizeof(kElf), &module), MOE_SUCCESS);
  moeFunction a = nullptr, b = nullptr, c = nullptr;
  ASSERT_EQ(moeModuleGetFunction(module, "gemm", &a), MOE_SUCCESS)
      << lastMessage();
  ASSERT_EQ(moeModuleGetFunction(module, "gemm", &b), MOE_SUCCESS);
  EXPECT_EQ(a, b);
  EXPECT_EQ(fake->getFunctionCalls, 1);
  EXPECT_EQ(fake->setMaxDynamicSmemCalls, 1);
  EXPECT_EQ(fake->lastMaxDynamicSmem, kFakeOptinSmem - kFakeStaticSmem);
  ASSERT_EQ(moeModuleGetFunction(module, "other", &c), MOE_SUCCESS);
  EXPECT_NE(a, c);
  EXPECT_EQ(fake->setMaxDynamicSmemCalls, 2);

  moeFunctionInfo info;
  ASSERT_EQ(moeFunctionGetInfo(a, &info), MOE_SUCCESS);
  EXPECT_EQ(info.numRegs, kFakeNumRegs);
  EXPECT_EQ(info.staticSmemBytes, kFakeStaticSmem);
  EXPECT_EQ(info.maxThreadsPerBlock, 1024);
  EXPECT_EQ(info.maxDynamicSmemBytes, kFakeOptinSmem - kFakeStaticSmem);
  EXPECT_EQ(moeModuleUnload(module), MOE_SUCCESS);
}

TEST_F(RuntimeFake, UnknownKernelIsNotFound) {
  moeModule module = nullptr;
  ASSERT_EQ(moeModuleLoad(kElf, sizeof(kElf), &module), MOE_SUCCESS);
  moeFunction function = nullptr;
  EXPECT_EQ(moeModuleGetFunction(module, "missing_gemm", &function),
            MOE_ERROR_NOT_FOUND);
  EXPECT_EQ(function, nullptr);
  EXPECT_NE(lastMessage().find("'missing_gemm'"), std::string::npos)
      << lastMessage();
  EXPECT_EQ(moeModuleGetFunction(module, "", &function),
            MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(moeModuleUnload(module), MOE_SUCCESS);
}

TEST_F(RuntimeFake, Launches) {
  moeModule module = nullptr;
  ASSERT_EQ(moeModuleLoad(kElf, sizeof(kElf), &module), MOE_SUCCESS);
  moeFunction function = nullptr, small = nullptr;
  ASSERT_EQ(moeModuleGetFunction(module, "gemm", &function), MOE_SUCCESS);
  ASSERT_EQ(moeModuleGetFunction(module, "small_kernel", &small), MOE_SUCCESS);
  moeStream stream = nullptr;
  ASSERT_EQ(moeStreamCreate(&stream), MOE_SUCCESS);
  int value = 7;
  void *params[] = {&value};

  moeLaunchConfig config = plainLaunch(132, 384, 200 * 1024, stream);
  ASSERT_EQ(moeLaunch(function, &config, params), MOE_SUCCESS) << lastMessage();
  EXPECT_EQ(fake->launchCalls, 1);
  EXPECT_EQ(fake->launchExCalls, 0);
  EXPECT_EQ(fake->lastGrid[0], 132u);
  EXPECT_EQ(fake->lastBlock[0], 384u);
  EXPECT_EQ(fake->lastSmem, 200u * 1024u);
  EXPECT_EQ(fake->lastParams, static_cast<void **>(params));
  EXPECT_EQ(fake->lastStream, static_cast<void *>(stream));

  // Beyond what the kernel allows beside its static smem.
  config.sharedMemBytes = kFakeOptinSmem - kFakeStaticSmem + 16;
  EXPECT_EQ(moeLaunch(function, &config, params), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastMessage().find("static"), std::string::npos) << lastMessage();
  config.sharedMemBytes = 0;

  // More threads than the kernel's maximum.
  config.blockX = 256;
  EXPECT_EQ(moeLaunch(small, &config, params), MOE_ERROR_SHAPE_MISMATCH);
  EXPECT_NE(lastMessage().find("small_kernel"), std::string::npos);
  EXPECT_EQ(fake->launchCalls, 1);
  config.blockX = 128;
  EXPECT_EQ(moeLaunch(small, &config, params), MOE_SUCCESS);
  EXPECT_EQ(fake->launchCalls, 2);

  // A cluster of 2 goes through cuLaunchKernelEx.
  config.clusterX = 2;
  config.clusterY = config.clusterZ = 1;
  ASSERT_EQ(moeLaunch(function, &config, params), MOE_SUCCESS) << lastMessage();
  EXPECT_EQ(fake->launchExCalls, 1);
  EXPECT_EQ(fake->lastCluster[0], 2u);
  EXPECT_EQ(fake->lastCluster[1], 1u);
  EXPECT_EQ(fake->lastCluster[2], 1u);
  EXPECT_EQ(fake->lastGrid[0], 132u);
  config.gridX = 133;
  EXPECT_EQ(moeLaunch(function, &config, params), MOE_ERROR_SHAPE_MISMATCH);
  EXPECT_EQ(fake->launchExCalls, 1);

  EXPECT_EQ(moeStreamDestroy(stream), MOE_SUCCESS);
  EXPECT_EQ(moeModuleUnload(module), MOE_SUCCESS);
}

TEST_F(RuntimeFake, StreamsAndEvents) {
  moeStream stream = nullptr;
  ASSERT_EQ(moeStreamCreate(&stream), MOE_SUCCESS);
  EXPECT_EQ(fake->lastStreamFlags, unsigned(CU_STREAM_NON_BLOCKING));

  moeEvent dependency = nullptr, start = nullptr, stop = nullptr;
  ASSERT_EQ(moeEventCreate(&dependency), MOE_SUCCESS);
  EXPECT_TRUE(fake->lastEventFlags & CU_EVENT_DISABLE_TIMING);
  ASSERT_EQ(moeEventCreateTiming(&start), MOE_SUCCESS);
  EXPECT_FALSE(fake->lastEventFlags & CU_EVENT_DISABLE_TIMING);
  ASSERT_EQ(moeEventCreateTiming(&stop), MOE_SUCCESS);

  EXPECT_EQ(moeEventRecord(start, stream), MOE_SUCCESS);
  EXPECT_EQ(moeEventRecord(dependency, stream), MOE_SUCCESS);
  EXPECT_EQ(moeStreamWaitEvent(nullptr, dependency), MOE_SUCCESS);
  EXPECT_EQ(moeEventRecord(stop, stream), MOE_SUCCESS);
  EXPECT_EQ(moeEventSynchronize(stop), MOE_SUCCESS);
  float ms = 0;
  EXPECT_EQ(moeEventElapsedMs(start, stop, &ms), MOE_SUCCESS);
  EXPECT_FLOAT_EQ(ms, 1.5f);
  // A dependency event cannot be timed; caught before the driver.
  EXPECT_EQ(moeEventElapsedMs(start, dependency, &ms),
            MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastMessage().find("moeEventCreateTiming"), std::string::npos);

  EXPECT_EQ(moeEventDestroy(dependency), MOE_SUCCESS);
  EXPECT_EQ(moeEventDestroy(start), MOE_SUCCESS);
  EXPECT_EQ(moeEventDestroy(stop), MOE_SUCCESS);
  EXPECT_EQ(fake->eventDestroyCalls, 3);
  EXPECT_EQ(moeStreamSynchronize(stream), MOE_SUCCESS);
  EXPECT_EQ(moeStreamDestroy(stream), MOE_SUCCESS);
  EXPECT_EQ(fake->streamDestroyCalls, 1);
}

TEST_F(RuntimeFake, ArenaOnTheDevice) {
  moeArena arena = nullptr;
  ASSERT_EQ(moeArenaCreate(1 << 20, &arena), MOE_SUCCESS) << lastMessage();
  EXPECT_EQ(fake->memAllocCalls, 1);
  moeDevicePtr a = 0, b = 0, c = 0;
  ASSERT_EQ(moeArenaAlloc(arena, 1000, 0, &a), MOE_SUCCESS);
  ASSERT_EQ(moeArenaAlloc(arena, 4096, 1024, &b), MOE_SUCCESS);
  EXPECT_EQ(a % 256, 0u);
  EXPECT_EQ(b % 1024, 0u);
  EXPECT_GE(b, a + 1000);
  EXPECT_EQ(fake->memAllocCalls, 1) << "the arena allocates once";

  moeArenaInfo info;
  ASSERT_EQ(moeArenaGetInfo(arena, &info), MOE_SUCCESS);
  EXPECT_EQ(info.capacity, size_t(1) << 20);
  EXPECT_EQ(info.base, a);
  EXPECT_EQ(info.used, b + 4096 - a);
  EXPECT_EQ(info.allocations, 2u);

  EXPECT_EQ(moeArenaAlloc(arena, 2 << 20, 0, &c), MOE_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(lastMessage().find("arena exhausted"), std::string::npos)
      << lastMessage();
  EXPECT_EQ(moeArenaAlloc(arena, 64, 48, &c), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(moeArenaAlloc(arena, 0, 0, &c), MOE_ERROR_INVALID_ARGUMENT);

  size_t peak = info.used;
  ASSERT_EQ(moeArenaReset(arena), MOE_SUCCESS);
  ASSERT_EQ(moeArenaAlloc(arena, 16, 0, &c), MOE_SUCCESS);
  EXPECT_EQ(c, a);
  ASSERT_EQ(moeArenaGetInfo(arena, &info), MOE_SUCCESS);
  EXPECT_EQ(info.used, 16u);
  EXPECT_EQ(info.highWater, peak);

  // The arena's memory is real (fake) device memory.
  std::vector<uint32_t> host(64, 0x01020304u), back(64, 0);
  ASSERT_EQ(moeMemcpyHtoDAsync(c, host.data(), 256, nullptr), MOE_SUCCESS);
  ASSERT_EQ(moeMemcpyDtoHAsync(back.data(), c, 256, nullptr), MOE_SUCCESS);
  EXPECT_EQ(back, host);

  EXPECT_EQ(moeArenaDestroy(arena), MOE_SUCCESS);
  EXPECT_EQ(fake->liveDeviceAllocations, 0);
}

TEST_F(RuntimeFake, ArenaCreationOutOfMemory) {
  fake->memoryLimit = 1 << 20;
  moeArena arena = nullptr;
  EXPECT_EQ(moeArenaCreate(2 << 20, &arena), MOE_ERROR_OUT_OF_MEMORY);
  EXPECT_EQ(arena, nullptr);
  EXPECT_NE(lastMessage().find("cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY"),
            std::string::npos)
      << lastMessage();
  moeDevicePtr ptr = 0;
  EXPECT_EQ(moeMemAlloc(2 << 20, &ptr), MOE_ERROR_OUT_OF_MEMORY);
}

TEST_F(RuntimeFake, PinnedBuffersAndCopies) {
  void *pinned = nullptr;
  ASSERT_EQ(moeHostAlloc(4096, &pinned), MOE_SUCCESS);
  EXPECT_EQ(fake->lastHostAllocFlags, unsigned(CU_MEMHOSTALLOC_PORTABLE));
  moeDevicePtr a = 0, b = 0;
  ASSERT_EQ(moeMemAlloc(4096, &a), MOE_SUCCESS);
  ASSERT_EQ(moeMemAlloc(4096, &b), MOE_SUCCESS);
  auto *words = static_cast<uint32_t *>(pinned);
  for (int i = 0; i < 1024; ++i)
    words[i] = uint32_t(i);
  moeStream stream = nullptr;
  ASSERT_EQ(moeStreamCreate(&stream), MOE_SUCCESS);
  ASSERT_EQ(moeMemcpyHtoDAsync(a, pinned, 4096, stream), MOE_SUCCESS);
  ASSERT_EQ(moeMemcpyDtoDAsync(b, a, 4096, stream), MOE_SUCCESS);
  ASSERT_EQ(moeMemsetD32Async(b, 0xffffffffu, 16, stream), MOE_SUCCESS);
  std::memset(pinned, 0, 4096);
  ASSERT_EQ(moeMemcpyDtoHAsync(pinned, b, 4096, stream), MOE_SUCCESS);
  ASSERT_EQ(moeStreamSynchronize(stream), MOE_SUCCESS);
  for (int i = 0; i < 1024; ++i)
    ASSERT_EQ(words[i], i < 16 ? 0xffffffffu : uint32_t(i)) << i;
  EXPECT_EQ(moeMemFree(a), MOE_SUCCESS);
  EXPECT_EQ(moeMemFree(b), MOE_SUCCESS);
  EXPECT_EQ(moeHostFree(pinned), MOE_SUCCESS);
  EXPECT_EQ(fake->liveHostAllocations, 0);
  EXPECT_EQ(moeStreamDestroy(stream), MOE_SUCCESS);
  size_t freeBytes = 0, totalBytes = 0;
  EXPECT_EQ(moeMemGetInfo(&freeBytes, &totalBytes), MOE_SUCCESS);
  EXPECT_EQ(totalBytes, size_t(1) << 30);
}

TEST_F(RuntimeFake, TensorMapsAreValidatedBeforeEncoding) {
  moeTensorMap map;
  alignas(16) static uint16_t global[256 * 64];
  const uint64_t dims[2] = {64, 256};
  const uint64_t strides[1] = {128};
  const uint32_t box[2] = {64, 128};
  ASSERT_EQ(moeTensorMapEncodeTiled(
                &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, global, dims,
                strides, box, nullptr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
            MOE_SUCCESS)
      << lastMessage();
  EXPECT_EQ(fake->tensorMapEncodeCalls, 1);
  EXPECT_EQ(map.opaque[0], 0xababababababababull);

  const uint32_t wideBox[2] = {128, 128}; // 256 B > the 128 B swizzle span
  EXPECT_EQ(moeTensorMapEncodeTiled(
                &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, global, dims,
                strides, wideBox, nullptr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
            MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(fake->tensorMapEncodeCalls, 1);

  EXPECT_EQ(moeTensorMapReplaceAddress(&map, global + 64), MOE_SUCCESS);
  EXPECT_EQ(fake->tensorMapReplaceCalls, 1);
}

// The weight maps of the generated GEMMs: encoded and uploaded once, then
// found by their arguments; a broken rule is an error that also stops the
// calls after it, like the mgpu* functions.
TEST_F(RuntimeFake, DeviceTensorMapsAreCachedByArguments) {
  alignas(16) static uint16_t weights[4 * 64 * 256];
  auto mapOf = [](void *base, int64_t n) {
    // [E = 4][K = 64][N = n], boxes of 64 columns x 64 rows of one expert
    return moeTensorMapDeviceBf16(base, 3, n, 64, 4, 0, n * 2, 64 * n * 2, 0,
                                  64, 64, 1, 0);
  };
  void *first = mapOf(weights, 256);
  ASSERT_NE(first, nullptr) << lastMessage();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 128, 0u);
  EXPECT_EQ(fake->tensorMapEncodeCalls, 1);
  EXPECT_EQ(fake->memcpyCalls, 1);
  // The slot holds the encoded map (the fake fills it with 0xab).
  EXPECT_EQ(static_cast<const uint8_t *>(first)[127], 0xab);

  EXPECT_EQ(mapOf(weights, 256), first);
  EXPECT_EQ(fake->tensorMapEncodeCalls, 1);
  EXPECT_EQ(fake->memcpyCalls, 1);
  EXPECT_EQ(moeTensorMapDeviceCacheSize(), 1u);

  void *other = mapOf(weights + 8, 248); // another address and shape
  ASSERT_NE(other, nullptr) << lastMessage();
  EXPECT_NE(other, first);
  EXPECT_EQ(moeTensorMapDeviceCacheSize(), 2u);

  // A misaligned address names the rule and leaves a pending failure.
  EXPECT_EQ(mapOf(weights + 1, 256), nullptr);
  EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_MISALIGNED);
  EXPECT_NE(lastMessage().find("16-byte aligned"), std::string::npos)
      << lastMessage();
  EXPECT_EQ(mapOf(weights, 256), nullptr); // pending: nothing runs
  moeClearLastError();
  EXPECT_EQ(mapOf(weights, 256), first);

  EXPECT_EQ(
      moeTensorMapDeviceBf16(weights, 5, 1, 1, 1, 1, 16, 16, 16, 1, 1, 1, 1),
      nullptr);
  EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastMessage().find("rank 5"), std::string::npos) << lastMessage();
  moeClearLastError();
  EXPECT_EQ(
      moeTensorMapDeviceBf16(weights, 2, 64, -1, 0, 0, 128, 0, 0, 64, 64, 0, 0),
      nullptr);
  EXPECT_NE(lastMessage().find("negative"), std::string::npos) << lastMessage();
  moeClearLastError();
  EXPECT_EQ(moeTensorMapDeviceBf16(weights, 2, 64, 64, 0, 0, 128, 0, 0, 64, 512,
                                   0, 0),
            nullptr);
  EXPECT_NE(lastMessage().find("boxDim"), std::string::npos) << lastMessage();
  moeClearLastError();
}

// At the limit the cache waits for the device and starts over, reusing its
// slots.
TEST_F(RuntimeFake, DeviceTensorMapCacheStartsOverAtItsLimit) {
  alignas(16) static uint16_t weights[64 * 64];
  void *firstSlot = nullptr;
  for (int64_t i = 0; i <= MOE_TENSOR_MAP_CACHE_LIMIT; ++i) {
    // distinct maps: one more row each
    void *slot = moeTensorMapDeviceBf16(weights, 2, 64, 1 + i, 0, 0, 128, 0, 0,
                                        64, 1, 0, 0);
    ASSERT_NE(slot, nullptr) << i << ": " << lastMessage();
    if (i == 0)
      firstSlot = slot;
    if (i == MOE_TENSOR_MAP_CACHE_LIMIT)
      EXPECT_EQ(slot, firstSlot);
  }
  EXPECT_EQ(moeTensorMapDeviceCacheSize(), 1u);
  EXPECT_EQ(fake->tensorMapEncodeCalls, MOE_TENSOR_MAP_CACHE_LIMIT + 1);
}

} // namespace
