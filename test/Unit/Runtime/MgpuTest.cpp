//===- MgpuTest.cpp - The mgpu* ABI without a GPU ---------------*- C++ -*-===//
//
// Without a driver every mgpu* function records an error and returns null
// or nothing; with the fake driver the ABI runs end to end.
//
//===----------------------------------------------------------------------===//

#include "RuntimeTestUtils.h"
#include "moe/Runtime/MgpuABI.h"

#include <cuda.h>

#include <cstring>
#include <type_traits>
#include <vector>

using namespace moe::runtime::test;

namespace {

using RuntimeMgpuNoDriver = NoDriverTest;
using RuntimeMgpuFake = FakeDriverTest;

// The exact LLVM 22.1 signatures of docs/gpu-kernels.md section 6.8: a mismatch
// here is a compile error.
static_assert(
    std::is_same_v<decltype(&mgpuModuleLoad), void *(*)(void *, uint64_t)>);
static_assert(
    std::is_same_v<decltype(&mgpuModuleLoadJIT), void *(*)(void *, int32_t)>);
static_assert(std::is_same_v<decltype(&mgpuModuleGetFunction),
                             void *(*)(void *, const char *)>);
static_assert(std::is_same_v<decltype(&mgpuLaunchKernel),
                             void (*)(void *, intptr_t, intptr_t, intptr_t,
                                      intptr_t, intptr_t, intptr_t, int32_t,
                                      void *, void **, void **, size_t)>);
static_assert(
    std::is_same_v<decltype(&mgpuLaunchClusterKernel),
                   void (*)(void *, intptr_t, intptr_t, intptr_t, intptr_t,
                            intptr_t, intptr_t, intptr_t, intptr_t, intptr_t,
                            int32_t, void *, void **, void **)>);
static_assert(
    std::is_same_v<decltype(&mgpuMemAlloc), void *(*)(uint64_t, void *, bool)>);
static_assert(std::is_same_v<decltype(&mgpuMemcpy),
                             void (*)(void *, void *, size_t, void *)>);
static_assert(std::is_same_v<decltype(&mgpuMemset32),
                             void (*)(void *, uint32_t, size_t, void *)>);
static_assert(
    std::is_same_v<decltype(&mgpuEventRecord), void (*)(void *, void *)>);
static_assert(
    std::is_same_v<decltype(&mgpuStreamWaitEvent), void (*)(void *, void *)>);

void expectRecorded(moeStatus expected, const char *what) {
  EXPECT_EQ(moeGetLastStatus(), expected)
      << what << ": " << moeStatusString(moeGetLastStatus()) << " "
      << moeGetLastErrorMessage();
  EXPECT_STRNE(moeGetLastErrorMessage(), "") << what;
  moeClearLastError();
}

TEST_F(RuntimeMgpuNoDriver, PointerResultsAreNull) {
  static const char kPtx[] = ".version 8.0\n.target sm_90a\n";
  static char kElf[] = "\x7f"
                       "ELF-not-really";
  moeClearLastError();
  EXPECT_EQ(mgpuModuleLoad(kElf, sizeof(kElf)), nullptr);
  expectRecorded(MOE_ERROR_NO_DRIVER, "mgpuModuleLoad");
  EXPECT_EQ(mgpuModuleLoadJIT(const_cast<char *>(kPtx), 2), nullptr);
  expectRecorded(MOE_ERROR_NO_DRIVER, "mgpuModuleLoadJIT");
  EXPECT_EQ(mgpuStreamCreate(), nullptr);
  expectRecorded(MOE_ERROR_NO_DRIVER, "mgpuStreamCreate");
  EXPECT_EQ(mgpuEventCreate(), nullptr);
  expectRecorded(MOE_ERROR_NO_DRIVER, "mgpuEventCreate");
  EXPECT_EQ(mgpuMemAlloc(1024, nullptr, false), nullptr);
  expectRecorded(MOE_ERROR_NO_DRIVER, "mgpuMemAlloc");
  EXPECT_EQ(mgpuMemAlloc(1024, nullptr, true), nullptr);
  expectRecorded(MOE_ERROR_NO_DRIVER, "mgpuMemAlloc(hostShared)");
}

TEST_F(RuntimeMgpuNoDriver, VoidFunctionsRecordAndReturn) {
  alignas(16) char buffer[64] = {};
  moeClearLastError();
  mgpuStreamSynchronize(nullptr);
  expectRecorded(MOE_ERROR_NO_DRIVER, "mgpuStreamSynchronize");
  mgpuMemcpy(buffer, buffer + 32, 16, nullptr);
  expectRecorded(MOE_ERROR_NO_DRIVER, "mgpuMemcpy");
  mgpuMemset32(buffer, 0, 4, nullptr);
  expectRecorded(MOE_ERROR_NO_DRIVER, "mgpuMemset32");
  mgpuSetDefaultDevice(0);
  expectRecorded(MOE_ERROR_NO_DRIVER, "mgpuSetDefaultDevice");
  mgpuMemFree(buffer, nullptr);
  expectRecorded(MOE_ERROR_NO_DRIVER, "mgpuMemFree");
}

TEST_F(RuntimeMgpuNoDriver, NullHandlesRecordInvalidArgument) {
  moeClearLastError();
  EXPECT_EQ(mgpuModuleGetFunction(nullptr, "k"), nullptr);
  expectRecorded(MOE_ERROR_INVALID_ARGUMENT, "mgpuModuleGetFunction");
  mgpuModuleUnload(nullptr);
  expectRecorded(MOE_ERROR_INVALID_ARGUMENT, "mgpuModuleUnload");
  mgpuLaunchKernel(nullptr, 1, 1, 1, 128, 1, 1, 0, nullptr, nullptr, nullptr,
                   0);
  expectRecorded(MOE_ERROR_INVALID_ARGUMENT, "mgpuLaunchKernel");
  mgpuLaunchClusterKernel(nullptr, 2, 1, 1, 4, 1, 1, 128, 1, 1, 0, nullptr,
                          nullptr, nullptr);
  expectRecorded(MOE_ERROR_INVALID_ARGUMENT, "mgpuLaunchClusterKernel");
  mgpuStreamDestroy(nullptr);
  expectRecorded(MOE_ERROR_INVALID_ARGUMENT, "mgpuStreamDestroy");
  mgpuEventRecord(nullptr, nullptr);
  expectRecorded(MOE_ERROR_INVALID_ARGUMENT, "mgpuEventRecord");
  mgpuStreamWaitEvent(nullptr, nullptr);
  expectRecorded(MOE_ERROR_INVALID_ARGUMENT, "mgpuStreamWaitEvent");
  mgpuEventSynchronize(nullptr);
  expectRecorded(MOE_ERROR_INVALID_ARGUMENT, "mgpuEventSynchronize");
  mgpuEventDestroy(nullptr);
  expectRecorded(MOE_ERROR_INVALID_ARGUMENT, "mgpuEventDestroy");
  mgpuMemcpy(nullptr, nullptr, 16, nullptr);
  expectRecorded(MOE_ERROR_INVALID_ARGUMENT, "mgpuMemcpy(null)");
  mgpuMemset32(reinterpret_cast<void *>(0x1002), 0, 4, nullptr);
  expectRecorded(MOE_ERROR_MISALIGNED, "mgpuMemset32(misaligned)");
  mgpuSetDefaultDevice(-1);
  expectRecorded(MOE_ERROR_INVALID_ARGUMENT, "mgpuSetDefaultDevice(-1)");
}

TEST_F(RuntimeMgpuNoDriver, EmptyOperationsAreNoOps) {
  moeClearLastError();
  EXPECT_EQ(mgpuMemAlloc(0, nullptr, false), nullptr);
  mgpuMemcpy(nullptr, nullptr, 0, nullptr);
  mgpuMemset32(nullptr, 0, 0, nullptr);
  mgpuMemFree(nullptr, nullptr);
  EXPECT_EQ(moeGetLastStatus(), MOE_SUCCESS) << moeGetLastErrorMessage();
}

TEST_F(RuntimeMgpuNoDriver, LaunchDimsOutOfRangeForTheDriver) {
  // intptr_t dims are checked before they are narrowed to 32 bits.
  void *notAFunction = reinterpret_cast<void *>(0x1);
  moeClearLastError();
  mgpuLaunchKernel(notAFunction, intptr_t(1) << 32, 1, 1, 128, 1, 1, 0, nullptr,
                   nullptr, nullptr, 0);
  expectRecorded(MOE_ERROR_INVALID_ARGUMENT, "grid 2^32");
  mgpuLaunchKernel(notAFunction, -1, 1, 1, 128, 1, 1, 0, nullptr, nullptr,
                   nullptr, 0);
  expectRecorded(MOE_ERROR_INVALID_ARGUMENT, "grid -1");
  mgpuLaunchKernel(notAFunction, 1, 1, 1, 128, 1, 1, -5, nullptr, nullptr,
                   nullptr, 0);
  expectRecorded(MOE_ERROR_INVALID_ARGUMENT, "smem -5");
  mgpuLaunchClusterKernel(notAFunction, 0, 0, 0, 4, 1, 1, 128, 1, 1, 0, nullptr,
                          nullptr, nullptr);
  expectRecorded(MOE_ERROR_INVALID_ARGUMENT, "cluster 0x0x0");
}

TEST_F(RuntimeMgpuFake, EndToEnd) {
  static char kElf[] = "\x7f"
                       "ELF fake cubin";
  void *module = mgpuModuleLoad(kElf, sizeof(kElf));
  ASSERT_NE(module, nullptr) << moeGetLastErrorMessage();
  EXPECT_EQ(fake->moduleLoadCalls, 1);
  void *function = mgpuModuleGetFunction(module, "scale");
  ASSERT_NE(function, nullptr) << moeGetLastErrorMessage();
  EXPECT_EQ(mgpuModuleGetFunction(module, "scale"), function);
  EXPECT_EQ(fake->getFunctionCalls, 1);
  EXPECT_EQ(fake->setMaxDynamicSmemCalls, 1);

  void *stream = mgpuStreamCreate();
  ASSERT_NE(stream, nullptr);
  EXPECT_EQ(fake->lastStreamFlags, unsigned(CU_STREAM_DEFAULT))
      << "a blocking stream waits for the legacy default stream";

  std::vector<uint32_t> host(256);
  for (size_t i = 0; i < host.size(); ++i)
    host[i] = uint32_t(i * 3);
  void *device = mgpuMemAlloc(host.size() * 4, stream, false);
  ASSERT_NE(device, nullptr);
  mgpuMemcpy(device, host.data(), host.size() * 4, stream);
  mgpuMemset32(static_cast<uint32_t *>(device) + 128, 0xdeadbeef, 128, stream);
  std::vector<uint32_t> back(256);
  mgpuMemcpy(back.data(), device, back.size() * 4, stream);
  for (size_t i = 0; i < back.size(); ++i)
    ASSERT_EQ(back[i], i < 128 ? uint32_t(i * 3) : 0xdeadbeefu) << i;

  void *args[] = {&device};
  mgpuLaunchKernel(function, 4, 2, 1, 256, 1, 1, 100 * 1024, stream, args,
                   nullptr, 1);
  EXPECT_EQ(moeGetLastStatus(), MOE_SUCCESS) << moeGetLastErrorMessage();
  EXPECT_EQ(fake->launchCalls, 1);
  EXPECT_EQ(fake->lastGrid[0], 4u);
  EXPECT_EQ(fake->lastGrid[1], 2u);
  EXPECT_EQ(fake->lastBlock[0], 256u);
  EXPECT_EQ(fake->lastSmem, 100u * 1024u);
  EXPECT_EQ(fake->lastParams, static_cast<void **>(args));
  EXPECT_EQ(fake->lastStream, stream);

  mgpuLaunchClusterKernel(function, 2, 1, 1, 8, 1, 1, 128, 1, 1, 0, stream,
                          args, nullptr);
  EXPECT_EQ(moeGetLastStatus(), MOE_SUCCESS) << moeGetLastErrorMessage();
  EXPECT_EQ(fake->launchExCalls, 1);
  EXPECT_EQ(fake->lastCluster[0], 2u);
  EXPECT_EQ(fake->lastCluster[1], 1u);
  EXPECT_EQ(fake->lastGrid[0], 8u);

  void *event = mgpuEventCreate();
  ASSERT_NE(event, nullptr);
  EXPECT_TRUE(fake->lastEventFlags & CU_EVENT_DISABLE_TIMING);
  mgpuEventRecord(event, stream);
  mgpuStreamWaitEvent(stream, event);
  mgpuEventSynchronize(event);
  mgpuEventDestroy(event);
  EXPECT_EQ(fake->eventRecordCalls, 1);
  EXPECT_EQ(fake->streamWaitEventCalls, 1);
  EXPECT_EQ(fake->eventDestroyCalls, 1);

  mgpuStreamSynchronize(stream);
  mgpuMemFree(device, stream);
  void *shared = mgpuMemAlloc(64, nullptr, true);
  EXPECT_NE(shared, nullptr);
  EXPECT_EQ(fake->managedAllocCalls, 1);
  mgpuMemFree(shared, nullptr);
  EXPECT_EQ(fake->liveDeviceAllocations, 0);
  mgpuStreamDestroy(stream);
  mgpuModuleUnload(module);
  EXPECT_EQ(fake->moduleUnloadCalls, 1);
  EXPECT_EQ(moeGetLastStatus(), MOE_SUCCESS) << moeGetLastErrorMessage();
}

TEST_F(RuntimeMgpuFake, ErrorsAreRecorded) {
  static char kBadPtx[] = ".version 8.0\nsyntax_error\n";
  EXPECT_EQ(mgpuModuleLoadJIT(kBadPtx, 2), nullptr);
  EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_MODULE_LOAD);
  EXPECT_NE(lastMessage().find(kFakeJitLog), std::string::npos)
      << lastMessage();
  EXPECT_EQ(fake->lastJitOptLevel, 2);
  moeClearLastError();

  static char kElf[] = "\x7f"
                       "ELF fake cubin";
  void *module = mgpuModuleLoad(kElf, sizeof(kElf));
  ASSERT_NE(module, nullptr);
  EXPECT_EQ(mgpuModuleGetFunction(module, "missing_kernel"), nullptr);
  EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_NOT_FOUND);
  EXPECT_NE(lastMessage().find("missing_kernel"), std::string::npos);
  moeClearLastError();

  void *small = mgpuModuleGetFunction(module, "small_block");
  ASSERT_NE(small, nullptr);
  mgpuLaunchKernel(small, 1, 1, 1, 256, 1, 1, 0, nullptr, nullptr, nullptr, 0);
  EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_SHAPE_MISMATCH);
  EXPECT_EQ(fake->launchCalls, 0);
  moeClearLastError();

  fake->memoryLimit = 1024;
  EXPECT_EQ(mgpuMemAlloc(4096, nullptr, false), nullptr);
  EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(lastMessage().find("CUDA_ERROR_OUT_OF_MEMORY"), std::string::npos)
      << lastMessage();
  mgpuModuleUnload(module);
}

} // namespace
