//===- MgpuGeneratedCallTest.cpp - The mgpu* ABI in generated calls -------===//
//
// What the generated entry points (docs/gpu-path.md section 2) rely on: the
// caller's stream lent through moeSetLaunchStream, moeSetErrorMessage,
// stream-ordered temporaries with a fallback for old drivers, and a recorded
// failure stopping later launches, copies and allocations while keeping the
// first message.
//
//===----------------------------------------------------------------------===//

#include "RuntimeTestUtils.h"
#include "moe/Runtime/MgpuABI.h"

#include <cuda.h>

#include <string>
#include <thread>
#include <vector>

using namespace moe::runtime::test;

namespace {

using RuntimeGeneratedCall = FakeDriverTest;

/// The fake without cuMemAllocAsync and friends, like a pre-11.2 driver.
class RuntimeGeneratedCallOldDriver : public FakeDriverTest {
protected:
  const char *fakePath() const override { return MOE_FAKE_CUDA_NOPOOL_PATH; }
};

// A stream handle of the caller; the fake never dereferences it.
int callerStreamStorage = 0;
void *const kCallerStream = &callerStreamStorage;

const char kElf[] = "\x7f"
                    "ELF fake cubin";

TEST(RuntimeLaunchStream, IsThreadLocalAndStartsNull) {
  EXPECT_EQ(moeGetLaunchStream(), nullptr);
  EXPECT_EQ(moeSetLaunchStream(kCallerStream), MOE_SUCCESS);
  EXPECT_EQ(moeGetLaunchStream(), kCallerStream);
  void *seen = kCallerStream;
  std::thread other([&] { seen = moeGetLaunchStream(); });
  other.join();
  EXPECT_EQ(seen, nullptr);
  EXPECT_EQ(moeSetLaunchStream(nullptr), MOE_SUCCESS);
  EXPECT_EQ(moeGetLaunchStream(), nullptr);
}

TEST(RuntimeSetErrorMessage, RecordsAndReturnsTheStatus) {
  moeClearLastError();
  EXPECT_EQ(moeSetErrorMessage(MOE_ERROR_INVALID_ARGUMENT,
                               "layer_forward: arg0 is null"),
            MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lastMessage(), "layer_forward: arg0 is null");
  EXPECT_EQ(moeSetErrorMessage(MOE_ERROR_MISALIGNED, nullptr),
            MOE_ERROR_MISALIGNED);
  EXPECT_EQ(lastMessage(), "");
  // Percent signs are text, not a format.
  moeSetErrorMessage(MOE_ERROR_MISALIGNED, "100%s %d");
  EXPECT_EQ(lastMessage(), "100%s %d");
  moeClearLastError();
}

TEST_F(RuntimeGeneratedCall, LaunchStreamIsBorrowed) {
  moeSetLaunchStream(kCallerStream);
  void *stream = mgpuStreamCreate();
  EXPECT_EQ(stream, kCallerStream);
  EXPECT_EQ(fake->streamCreateCalls, 0);
  void *args[] = {&stream};
  void *module = mgpuModuleLoad(const_cast<char *>(kElf), sizeof(kElf));
  void *function = mgpuModuleGetFunction(module, "scale");
  ASSERT_NE(function, nullptr) << lastMessage();
  mgpuLaunchKernel(function, 1, 1, 1, 128, 1, 1, 0, stream, args, nullptr, 1);
  EXPECT_EQ(fake->lastStream, kCallerStream);
  mgpuStreamSynchronize(stream);
  mgpuStreamDestroy(stream);
  EXPECT_EQ(fake->streamSynchronizeCalls, 0);
  EXPECT_EQ(fake->streamDestroyCalls, 0);

  // Another stream is still waited for and destroyed.
  moeSetLaunchStream(nullptr);
  void *own = mgpuStreamCreate();
  ASSERT_NE(own, nullptr);
  EXPECT_NE(own, kCallerStream);
  EXPECT_EQ(fake->streamCreateCalls, 1);
  moeSetLaunchStream(kCallerStream);
  mgpuStreamSynchronize(own);
  mgpuStreamDestroy(own);
  EXPECT_EQ(fake->streamSynchronizeCalls, 1);
  EXPECT_EQ(fake->streamDestroyCalls, 1);
  moeSetLaunchStream(nullptr);
  mgpuModuleUnload(module);
  EXPECT_EQ(moeGetLastStatus(), MOE_SUCCESS) << lastMessage();
}

TEST_F(RuntimeGeneratedCall, NullLaunchStreamCreatesWaitsDestroys) {
  moeSetLaunchStream(nullptr);
  void *stream = mgpuStreamCreate();
  ASSERT_NE(stream, nullptr);
  EXPECT_EQ(fake->streamCreateCalls, 1);
  EXPECT_EQ(fake->lastStreamFlags, unsigned(CU_STREAM_DEFAULT))
      << "a blocking stream waits for the legacy default stream";
  mgpuStreamSynchronize(stream);
  mgpuStreamDestroy(stream);
  EXPECT_EQ(fake->streamSynchronizeCalls, 1);
  EXPECT_EQ(fake->streamDestroyCalls, 1);
}

TEST_F(RuntimeGeneratedCall, TemporariesAreStreamOrdered) {
  moeSetLaunchStream(kCallerStream);
  void *stream = mgpuStreamCreate();
  void *a = mgpuMemAlloc(4096, stream, false);
  void *b = mgpuMemAlloc(64, stream, false);
  ASSERT_NE(a, nullptr) << lastMessage();
  ASSERT_NE(b, nullptr) << lastMessage();
  EXPECT_EQ(fake->memAllocAsyncCalls, 2);
  EXPECT_EQ(fake->memAllocCalls, 0);
  EXPECT_EQ(fake->lastAllocStream, kCallerStream);
  // The default pool keeps what is freed: its threshold is raised once.
  EXPECT_EQ(fake->poolSetAttributeCalls, 1);
  EXPECT_EQ(fake->lastReleaseThreshold, ~0ull);
  mgpuMemFree(a, stream);
  mgpuMemFree(b, stream);
  EXPECT_EQ(fake->memFreeAsyncCalls, 2);
  EXPECT_EQ(fake->memFreeCalls, 0);
  EXPECT_EQ(fake->lastFreeStream, kCallerStream);
  EXPECT_EQ(fake->liveDeviceAllocations, 0);
  moeSetLaunchStream(nullptr);
  EXPECT_EQ(moeGetLastStatus(), MOE_SUCCESS) << lastMessage();
}

TEST_F(RuntimeGeneratedCall, WithoutAStreamAllocationsAreSynchronous) {
  void *plain = mgpuMemAlloc(256, nullptr, false);
  void *managed = mgpuMemAlloc(256, kCallerStream, true);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(managed, nullptr);
  EXPECT_EQ(fake->memAllocAsyncCalls, 0);
  EXPECT_EQ(fake->managedAllocCalls, 1);
  mgpuMemFree(plain, kCallerStream);
  mgpuMemFree(managed, kCallerStream);
  EXPECT_EQ(fake->memFreeAsyncCalls, 0);
  EXPECT_EQ(fake->memFreeCalls, 2);
  // A pool allocation freed without a stream goes through cuMemFree.
  void *pooled = mgpuMemAlloc(256, kCallerStream, false);
  ASSERT_NE(pooled, nullptr);
  mgpuMemFree(pooled, nullptr);
  EXPECT_EQ(fake->memFreeAsyncCalls, 0);
  EXPECT_EQ(fake->memFreeCalls, 3);
  EXPECT_EQ(fake->liveDeviceAllocations, 0);
}

TEST_F(RuntimeGeneratedCall, DeviceWithoutPoolsFallsBack) {
  fake->memoryPoolsSupported = 0;
  void *ptr = mgpuMemAlloc(256, kCallerStream, false);
  ASSERT_NE(ptr, nullptr) << lastMessage();
  EXPECT_EQ(fake->memAllocAsyncCalls, 0);
  EXPECT_EQ(fake->memAllocCalls, 1);
  EXPECT_EQ(fake->poolSetAttributeCalls, 0);
  mgpuMemFree(ptr, kCallerStream);
  EXPECT_EQ(fake->memFreeCalls, 1);
  EXPECT_EQ(fake->memFreeAsyncCalls, 0);
  EXPECT_EQ(moeGetLastStatus(), MOE_SUCCESS) << lastMessage();
}

TEST_F(RuntimeGeneratedCallOldDriver, LoadsAndFallsBackToCuMemAlloc) {
  EXPECT_EQ(moeInit(), MOE_SUCCESS) << lastMessage();
  void *ptr = mgpuMemAlloc(256, kCallerStream, false);
  ASSERT_NE(ptr, nullptr) << lastMessage();
  EXPECT_EQ(fake->memAllocCalls, 1);
  mgpuMemFree(ptr, kCallerStream);
  EXPECT_EQ(fake->memFreeCalls, 1);
  EXPECT_EQ(fake->liveDeviceAllocations, 0);
  EXPECT_EQ(moeGetLastStatus(), MOE_SUCCESS) << lastMessage();
}

TEST_F(RuntimeGeneratedCall, PendingFailureStopsLaterWork) {
  void *module = mgpuModuleLoad(const_cast<char *>(kElf), sizeof(kElf));
  void *function = mgpuModuleGetFunction(module, "scale");
  ASSERT_NE(function, nullptr) << lastMessage();
  std::vector<uint32_t> host(64, 7);
  void *buffer = mgpuMemAlloc(host.size() * 4, kCallerStream, false);
  ASSERT_NE(buffer, nullptr);
  int allocations = fake->memAllocAsyncCalls + fake->memAllocCalls;

  moeSetErrorMessage(MOE_ERROR_INVALID_ARGUMENT, "first failure");
  void *args[] = {&buffer};
  mgpuLaunchKernel(function, 1, 1, 1, 128, 1, 1, 0, kCallerStream, args,
                   nullptr, 1);
  mgpuLaunchClusterKernel(function, 2, 1, 1, 2, 1, 1, 128, 1, 1, 0,
                          kCallerStream, args, nullptr);
  mgpuMemcpy(buffer, host.data(), host.size() * 4, kCallerStream);
  mgpuMemset32(buffer, 0, host.size(), kCallerStream);
  EXPECT_EQ(mgpuMemAlloc(256, kCallerStream, false), nullptr);
  EXPECT_EQ(mgpuModuleGetFunction(module, "other"), nullptr);
  EXPECT_EQ(fake->launchCalls, 0);
  EXPECT_EQ(fake->launchExCalls, 0);
  EXPECT_EQ(fake->memcpyCalls, 0);
  EXPECT_EQ(fake->memsetCalls, 0);
  EXPECT_EQ(fake->memAllocAsyncCalls + fake->memAllocCalls, allocations);

  // Frees and teardown still run, and do not replace the first failure even
  // when they fail themselves.
  mgpuMemFree(buffer, kCallerStream);
  EXPECT_EQ(fake->liveDeviceAllocations, 0);
  mgpuStreamDestroy(nullptr);
  mgpuEventDestroy(nullptr);
  EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lastMessage(), "first failure");

  // The next call clears the error first and runs normally.
  moeClearLastError();
  mgpuLaunchKernel(function, 1, 1, 1, 128, 1, 1, 0, kCallerStream, args,
                   nullptr, 1);
  EXPECT_EQ(fake->launchCalls, 1);
  mgpuModuleUnload(module);
  EXPECT_EQ(moeGetLastStatus(), MOE_SUCCESS) << lastMessage();
}

TEST_F(RuntimeGeneratedCall, FailedAllocationSkipsTheLaunchesAfterIt) {
  void *module = mgpuModuleLoad(const_cast<char *>(kElf), sizeof(kElf));
  void *function = mgpuModuleGetFunction(module, "scale");
  ASSERT_NE(function, nullptr);
  moeSetLaunchStream(kCallerStream);
  moeClearLastError(); // as the entry point does
  void *stream = mgpuStreamCreate();
  fake->memoryLimit = 1024;
  void *big = mgpuMemAlloc(4096, stream, false);
  EXPECT_EQ(big, nullptr);
  void *args[] = {&big};
  mgpuLaunchKernel(function, 1, 1, 1, 128, 1, 1, 0, stream, args, nullptr, 1);
  mgpuMemFree(big, stream);
  mgpuStreamSynchronize(stream);
  mgpuStreamDestroy(stream);
  EXPECT_EQ(fake->launchCalls, 0);
  EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_OUT_OF_MEMORY);
  EXPECT_NE(lastMessage().find("cuMemAllocAsync"), std::string::npos)
      << lastMessage();
  EXPECT_NE(lastMessage().find("4096 bytes"), std::string::npos)
      << lastMessage();
  moeSetLaunchStream(nullptr);
  moeClearLastError();
  mgpuModuleUnload(module);
}

TEST_F(RuntimeGeneratedCall, MissingModuleSaysWhyItDidNotLoad) {
  static char kCorrupt[] = "\x7f"
                           "ELF corrupt cubin";
  // Modules load in a global constructor; the entry point clears the error
  // later, and the lookup on the null module reports the original cause.
  EXPECT_EQ(mgpuModuleLoad(kCorrupt, sizeof(kCorrupt)), nullptr);
  moeClearLastError();
  EXPECT_EQ(mgpuModuleGetFunction(nullptr, "moe_router"), nullptr);
  EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_MODULE_LOAD);
  EXPECT_NE(lastMessage().find("moe_router"), std::string::npos)
      << lastMessage();
  EXPECT_NE(lastMessage().find("did not load"), std::string::npos);
  EXPECT_NE(lastMessage().find("CUDA_ERROR_INVALID_IMAGE"), std::string::npos)
      << lastMessage();
  moeClearLastError();
}

// Captured into a CUDA graph (the call's stream capturing), a weight map is
// uploaded on that stream from its pinned host copy, without waiting for
// anything: the graph holds the copy and every replay refills the slot, which
// eager calls never get; they keep their own, uploaded and waited for.
TEST_F(RuntimeGeneratedCall, TensorMapsUploadIntoACapturedStream) {
  alignas(16) static uint16_t weights[4 * 64 * 256];
  auto mapOf = [] {
    return moeTensorMapDeviceBf16(weights, 3, 256, 64, 4, 0, 512, 64 * 512, 0,
                                  64, 64, 1, 0);
  };
  void *eager = mapOf();
  ASSERT_NE(eager, nullptr) << lastMessage();
  int synchronizations = fake->streamSynchronizeCalls;

  moeSetLaunchStream(kCallerStream);
  void *stream = mgpuStreamCreate();
  fake->capturingStream = kCallerStream;
  void *captured = mapOf();
  ASSERT_NE(captured, nullptr) << lastMessage();
  EXPECT_NE(captured, eager);
  EXPECT_EQ(fake->lastMemcpyStream, kCallerStream);
  EXPECT_EQ(fake->streamSynchronizeCalls, synchronizations);
  EXPECT_EQ(static_cast<const uint8_t *>(captured)[127], 0xab);
  EXPECT_EQ(mapOf(), captured); // found again within captures

  fake->capturingStream = nullptr;
  EXPECT_EQ(mapOf(), eager);
  mgpuStreamDestroy(stream);
  moeSetLaunchStream(nullptr);
}

// A graph's slot is never handed to another map, not even when the cache
// starts over at its limit: the graph's replays still write it.
TEST_F(RuntimeGeneratedCall, GraphSlotsOutliveACacheStartOver) {
  alignas(16) static uint16_t weights[64 * 64];
  auto mapOf = [](int64_t rows) {
    return moeTensorMapDeviceBf16(weights, 2, 64, rows, 0, 0, 128, 0, 0, 64, 1,
                                  0, 0);
  };
  ASSERT_NE(mapOf(1), nullptr) << lastMessage(); // a chunk exists
  moeSetLaunchStream(kCallerStream);
  void *stream = mgpuStreamCreate();
  fake->capturingStream = kCallerStream;
  void *graphSlot = mapOf(2);
  ASSERT_NE(graphSlot, nullptr) << lastMessage();
  fake->capturingStream = nullptr;
  for (int64_t i = 0; i <= 2 * MOE_TENSOR_MAP_CACHE_LIMIT; ++i) {
    void *slot = mapOf(3 + i);
    ASSERT_NE(slot, nullptr) << i << ": " << lastMessage();
    ASSERT_NE(slot, graphSlot) << i;
  }
  mgpuStreamDestroy(stream);
  moeSetLaunchStream(nullptr);
}

} // namespace
