//===- OffloadTest.cpp - mgpuMoeOffload and mgpuMoePrefetch on the fake ---===//
//
// What the generated entry points of an offloading layer rely on: the copies
// run on a copy stream of their own after the call's work so far, the
// offloaded device buffer is freed there, a prefetch waits for the offload of
// its host buffer and the call's stream waits for the prefetch only where
// asked, a call without a lent stream waits for its copies, and failures free
// what they must and say why.
//
//===----------------------------------------------------------------------===//

#include "RuntimeTestUtils.h"
#include "moe/Runtime/MgpuABI.h"

#include <cuda.h>

#include <numeric>
#include <vector>

using namespace moe::runtime::test;

namespace {

using RuntimeOffload = FakeDriverTest;

class RuntimeOffloadOldDriver : public FakeDriverTest {
protected:
  const char *fakePath() const override { return MOE_FAKE_CUDA_NOPOOL_PATH; }
};

int callerStreamStorage = 0;
void *const kCallerStream = &callerStreamStorage;

constexpr size_t kWords = 1024;
constexpr size_t kBytes = kWords * sizeof(uint32_t);

/// A device buffer of the call's stream holding 0, 1, 2, ...
void *filledDeviceBuffer(void *stream) {
  void *device = mgpuMemAlloc(kBytes, stream, false);
  if (device)
    std::iota(static_cast<uint32_t *>(device),
              static_cast<uint32_t *>(device) + kWords, 0u);
  return device;
}

bool holdsSequence(const void *buffer) {
  const auto *words = static_cast<const uint32_t *>(buffer);
  for (size_t i = 0; i < kWords; ++i)
    if (words[i] != i)
      return false;
  return true;
}

TEST_F(RuntimeOffload, ForwardThenBackwardRoundTrip) {
  void *host = nullptr;
  ASSERT_EQ(moeHostAlloc(kBytes, &host), MOE_SUCCESS) << lastMessage();

  // Forward: a call of its own (no lent stream).
  void *call = mgpuStreamCreate();
  ASSERT_NE(call, nullptr) << lastMessage();
  void *device = filledDeviceBuffer(call);
  ASSERT_NE(device, nullptr) << lastMessage();
  int waits = fake->streamWaitEventCalls;
  mgpuMoeOffload(host, device, kBytes, /*freeDevice=*/1);
  ASSERT_EQ(moeGetLastStatus(), MOE_SUCCESS) << lastMessage();
  EXPECT_TRUE(holdsSequence(host));
  void *copy = fake->lastMemcpyStream;
  EXPECT_NE(copy, call) << "the copy runs on the copy stream";
  EXPECT_EQ(fake->lastWaitStream, copy)
      << "the copy stream waits for the call's work so far";
  EXPECT_EQ(fake->streamWaitEventCalls, waits + 1);
  EXPECT_EQ(fake->lastStreamFlags, unsigned(CU_STREAM_NON_BLOCKING));
  EXPECT_EQ(fake->memFreeAsyncCalls, 1);
  EXPECT_EQ(fake->lastFreeStream, copy) << "freed after the copy";
  EXPECT_EQ(fake->liveDeviceAllocations, 0);
  int syncs = fake->streamSynchronizeCalls;
  mgpuMoeOffloadsFinish();
  EXPECT_EQ(fake->streamSynchronizeCalls, syncs + 1)
      << "a call of its own returns when its copies are done";
  mgpuStreamSynchronize(call);
  mgpuStreamDestroy(call);

  // Backward: prefetch at the start, the wait right before the first reader.
  call = mgpuStreamCreate();
  waits = fake->streamWaitEventCalls;
  int asyncAllocs = fake->memAllocAsyncCalls;
  void *back = reinterpret_cast<void *>(mgpuMoePrefetch(host, kBytes));
  ASSERT_NE(back, nullptr) << lastMessage();
  EXPECT_EQ(fake->memAllocAsyncCalls, asyncAllocs + 1);
  EXPECT_EQ(fake->lastAllocStream, copy) << "allocated on the copy stream";
  EXPECT_EQ(fake->memcpyHtoDCalls, 1);
  EXPECT_EQ(fake->lastMemcpyStream, copy);
  EXPECT_EQ(fake->streamWaitEventCalls, waits)
      << "the copy does not wait for the call's earlier work";
  EXPECT_TRUE(holdsSequence(back));
  mgpuMoeAwaitPrefetch(back);
  EXPECT_EQ(fake->streamWaitEventCalls, waits + 1);
  EXPECT_EQ(fake->lastWaitStream, call);
  // Awaited once: a second await has nothing to wait for.
  mgpuMoeAwaitPrefetch(back);
  EXPECT_EQ(fake->streamWaitEventCalls, waits + 1);
  // Freed like a temporary of the call: stream-ordered, on the call's stream.
  int asyncFrees = fake->memFreeAsyncCalls;
  mgpuMemFree(back, call);
  EXPECT_EQ(fake->memFreeAsyncCalls, asyncFrees + 1);
  EXPECT_EQ(fake->lastFreeStream, call);
  EXPECT_EQ(fake->liveDeviceAllocations, 0);
  mgpuStreamSynchronize(call);
  mgpuStreamDestroy(call);
  EXPECT_EQ(moeGetLastStatus(), MOE_SUCCESS) << lastMessage();
  EXPECT_EQ(fake->eventCreateCalls, fake->eventDestroyCalls)
      << "every event of the round trip is destroyed";
  EXPECT_EQ(moeHostFree(host), MOE_SUCCESS);
}

TEST_F(RuntimeOffload, LentStreamLeavesCopiesInFlight) {
  void *host = nullptr;
  ASSERT_EQ(moeHostAlloc(kBytes, &host), MOE_SUCCESS) << lastMessage();
  moeSetLaunchStream(kCallerStream);
  void *call = mgpuStreamCreate();
  EXPECT_EQ(call, kCallerStream);
  void *device = filledDeviceBuffer(call);
  ASSERT_NE(device, nullptr) << lastMessage();
  mgpuMoeOffload(host, device, kBytes, 1);
  EXPECT_EQ(fake->lastWaitStream, fake->lastMemcpyStream);
  int syncs = fake->streamSynchronizeCalls;
  mgpuMoeOffloadsFinish();
  EXPECT_EQ(fake->streamSynchronizeCalls, syncs)
      << "the caller's stream goes on; the copy overlaps its next work";
  mgpuStreamSynchronize(call);
  mgpuStreamDestroy(call);
  moeSetLaunchStream(nullptr);
  EXPECT_EQ(moeOffloadSynchronize(), MOE_SUCCESS) << lastMessage();
  EXPECT_EQ(fake->streamSynchronizeCalls, syncs + 1);
  EXPECT_TRUE(holdsSequence(host));
  EXPECT_EQ(fake->eventCreateCalls, fake->eventDestroyCalls);
  EXPECT_EQ(moeHostFree(host), MOE_SUCCESS);
}

TEST_F(RuntimeOffload, ForwardsWithoutBackwardHoldNoEvents) {
  std::vector<std::vector<uint32_t>> hosts(5, std::vector<uint32_t>(kWords));
  moeSetLaunchStream(kCallerStream);
  for (auto &host : hosts) {
    void *call = mgpuStreamCreate();
    mgpuMoeOffload(host.data(), filledDeviceBuffer(call), kBytes, 1);
    mgpuMoeOffloadsFinish();
    mgpuStreamDestroy(call);
  }
  moeSetLaunchStream(nullptr);
  ASSERT_EQ(moeGetLastStatus(), MOE_SUCCESS) << lastMessage();
  EXPECT_GT(fake->eventQueryCalls, 0);
  // Done copies are forgotten at the next offload: only the last is kept.
  EXPECT_EQ(fake->eventCreateCalls - fake->eventDestroyCalls, 1);
  EXPECT_EQ(fake->liveDeviceAllocations, 0);
  EXPECT_EQ(moeOffloadSynchronize(), MOE_SUCCESS);
  EXPECT_EQ(fake->eventCreateCalls, fake->eventDestroyCalls);
}

TEST_F(RuntimeOffload, KeepsTheDeviceBufferWhenAsked) {
  std::vector<uint32_t> host(kWords);
  void *call = mgpuStreamCreate();
  void *device = filledDeviceBuffer(call);
  mgpuMoeOffload(host.data(), device, kBytes, /*freeDevice=*/0);
  EXPECT_EQ(fake->memFreeAsyncCalls, 0);
  EXPECT_EQ(fake->liveDeviceAllocations, 1);
  mgpuMemFree(device, call);
  mgpuMoeOffloadsFinish();
  mgpuStreamDestroy(call);
  EXPECT_EQ(moeGetLastStatus(), MOE_SUCCESS) << lastMessage();
  EXPECT_TRUE(holdsSequence(host.data()));
}

TEST_F(RuntimeOffload, OutsideACallFailsAndStillFrees) {
  std::vector<uint32_t> host(kWords);
  void *device = mgpuMemAlloc(kBytes, kCallerStream, false);
  ASSERT_NE(device, nullptr);
  mgpuMoeOffload(host.data(), device, kBytes, 1);
  EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastMessage().find("mgpuMoeOffload: no generated call in "
                               "progress"),
            std::string::npos)
      << lastMessage();
  EXPECT_EQ(fake->memcpyCalls, 0);
  EXPECT_EQ(fake->liveDeviceAllocations, 0);
  moeClearLastError();
}

TEST_F(RuntimeOffload, NullBuffersAreRefused) {
  void *call = mgpuStreamCreate();
  void *device = filledDeviceBuffer(call);
  mgpuMoeOffload(nullptr, device, kBytes, 1);
  EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastMessage().find("null host buffer"), std::string::npos)
      << lastMessage();
  EXPECT_EQ(fake->liveDeviceAllocations, 0) << "freed all the same";
  moeClearLastError();
  EXPECT_EQ(mgpuMoePrefetch(nullptr, kBytes), 0u);
  EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastMessage().find("null host buffer"), std::string::npos);
  moeClearLastError();
  EXPECT_EQ(moePrefetchSaved(nullptr, kBytes), MOE_ERROR_INVALID_ARGUMENT);
  moeClearLastError();
  mgpuStreamDestroy(call);
}

TEST_F(RuntimeOffload, PendingFailureCopiesNothingButFrees) {
  std::vector<uint32_t> host(kWords, 0);
  void *call = mgpuStreamCreate();
  void *device = filledDeviceBuffer(call);
  moeSetErrorMessage(MOE_ERROR_INVALID_ARGUMENT, "first failure");
  mgpuMoeOffload(host.data(), device, kBytes, 1);
  EXPECT_EQ(mgpuMoePrefetch(host.data(), kBytes), 0u);
  mgpuMoeAwaitPrefetch(device);
  mgpuMoeOffloadsFinish();
  EXPECT_EQ(fake->memcpyCalls, 0);
  EXPECT_EQ(fake->liveDeviceAllocations, 0);
  EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(lastMessage(), "first failure");
  moeClearLastError();
  mgpuStreamDestroy(call);
}

TEST_F(RuntimeOffload, PrefetchWaitsForTheOffloadInFlight) {
  std::vector<uint32_t> host(kWords);
  moeSetLaunchStream(kCallerStream);
  void *call = mgpuStreamCreate();
  mgpuMoeOffload(host.data(), filledDeviceBuffer(call), kBytes, 1);
  void *copy = fake->lastMemcpyStream;
  mgpuMoeOffloadsFinish(); // lent: the copy stays in flight
  // The backward's prefetch of the same buffer waits for that copy's event
  // (in order on one device's copy stream anyway; needed across devices).
  int waits = fake->streamWaitEventCalls;
  void *back = reinterpret_cast<void *>(mgpuMoePrefetch(host.data(), kBytes));
  ASSERT_NE(back, nullptr) << lastMessage();
  EXPECT_EQ(fake->streamWaitEventCalls, waits + 1);
  EXPECT_EQ(fake->lastWaitStream, copy);
  mgpuMoeAwaitPrefetch(back);
  mgpuMemFree(back, call);
  mgpuStreamDestroy(call);
  moeSetLaunchStream(nullptr);
  EXPECT_EQ(moeGetLastStatus(), MOE_SUCCESS) << lastMessage();
  EXPECT_EQ(fake->eventCreateCalls, fake->eventDestroyCalls);
}

TEST_F(RuntimeOffload, EarlyPrefetchIsTakenOver) {
  std::vector<uint32_t> host(kWords);
  void *call = mgpuStreamCreate();
  mgpuMoeOffload(host.data(), filledDeviceBuffer(call), kBytes, 1);
  mgpuMoeOffloadsFinish();
  mgpuStreamDestroy(call);

  // Started before the backward (during the layer after's backward) ...
  ASSERT_EQ(moePrefetchSaved(host.data(), kBytes), MOE_SUCCESS)
      << lastMessage();
  EXPECT_EQ(moePrefetchSaved(host.data(), kBytes), MOE_SUCCESS);
  EXPECT_EQ(fake->memcpyHtoDCalls, 1) << "started once";
  // ... and the backward takes its buffer instead of copying again.
  call = mgpuStreamCreate();
  void *back = reinterpret_cast<void *>(mgpuMoePrefetch(host.data(), kBytes));
  ASSERT_NE(back, nullptr) << lastMessage();
  EXPECT_EQ(fake->memcpyHtoDCalls, 1);
  EXPECT_TRUE(holdsSequence(back));
  mgpuMoeAwaitPrefetch(back);
  EXPECT_EQ(fake->lastWaitStream, call);
  mgpuMemFree(back, call);
  mgpuStreamDestroy(call);
  EXPECT_EQ(fake->liveDeviceAllocations, 0);
  EXPECT_EQ(moeGetLastStatus(), MOE_SUCCESS) << lastMessage();
  EXPECT_EQ(fake->eventCreateCalls, fake->eventDestroyCalls);
}

TEST_F(RuntimeOffload, EarlyPrefetchOfAnotherSizeIsRefused) {
  std::vector<uint32_t> host(kWords, 7);
  ASSERT_EQ(moePrefetchSaved(host.data(), kBytes / 2), MOE_SUCCESS);
  void *call = mgpuStreamCreate();
  EXPECT_EQ(mgpuMoePrefetch(host.data(), kBytes), 0u);
  EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastMessage().find("moePrefetchSaved was given 2048 bytes for this "
                               "host buffer, the backward reads 4096"),
            std::string::npos)
      << lastMessage();
  EXPECT_EQ(fake->liveDeviceAllocations, 0) << "the early buffer is freed";
  moeClearLastError();
  mgpuStreamDestroy(call);
}

TEST_F(RuntimeOffloadOldDriver, FreesWithCuMemFreeAfterTheCopy) {
  std::vector<uint32_t> host(kWords);
  void *call = mgpuStreamCreate();
  void *device = filledDeviceBuffer(call);
  ASSERT_NE(device, nullptr) << lastMessage();
  int syncs = fake->streamSynchronizeCalls;
  mgpuMoeOffload(host.data(), device, kBytes, 1);
  ASSERT_EQ(moeGetLastStatus(), MOE_SUCCESS) << lastMessage();
  EXPECT_EQ(fake->streamSynchronizeCalls, syncs + 1);
  EXPECT_EQ(fake->memFreeCalls, 1);
  EXPECT_EQ(fake->liveDeviceAllocations, 0);
  EXPECT_TRUE(holdsSequence(host.data()));
  mgpuMoeOffloadsFinish();
  mgpuStreamDestroy(call);
}

} // namespace
