//===- Offload.cpp - Saved tensors to pinned host memory and back -*- C++
//-*-===//
//
// The copies of moe.offload and moe.prefetch on the GPU path (MgpuABI.h).
// Each device has one copy stream (non-blocking, so the legacy default
// stream does not order it). A copy starts after an event recorded on the
// call's stream, and the events of the copies in flight are kept by buffer:
// the offload's by its host buffer, which the backward's prefetch waits for,
// and the prefetch's by its device buffer, which the call's stream waits for
// right before the first kernel that reads it.
//
//===----------------------------------------------------------------------===//

#include "Internal.h"
#include "moe/Runtime/MgpuABI.h"

#include <cstdio>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

using namespace moe::runtime;

namespace {

struct OffloadState {
  std::mutex mutex;
  /// By device ordinal; null until the device's first copy.
  std::vector<CUstream> copyStreams;
  /// Host buffer -> the event after the offload into it.
  std::unordered_map<uintptr_t, CUevent> offloads;
  /// Device buffer -> the event after the prefetch into it.
  std::unordered_map<uintptr_t, CUevent> prefetches;
  /// Host buffer -> the device buffer moePrefetchSaved is copying it into.
  std::unordered_map<uintptr_t, std::pair<uintptr_t, uint64_t>> early;
};

// Never destroyed: generated destructors may still call in at exit.
OffloadState &offloadState() {
  static OffloadState *state = new OffloadState;
  return *state;
}

/// This thread's device's copy stream, created on first use.
moeStatus getCopyStream(const DriverApi *api, CUstream *stream) {
  OffloadState &state = offloadState();
  std::lock_guard<std::mutex> lock(state.mutex);
  size_t device = static_cast<size_t>(currentDevice());
  if (state.copyStreams.size() <= device)
    state.copyStreams.resize(device + 1, nullptr);
  if (!state.copyStreams[device]) {
    if (CUresult result = api->cuStreamCreate(&state.copyStreams[device],
                                              CU_STREAM_NON_BLOCKING))
      return failCuda(result, "cuStreamCreate", "the offload copy stream");
  }
  *stream = state.copyStreams[device];
  return MOE_SUCCESS;
}

/// An event recorded on `stream` now.
moeStatus recordEvent(const DriverApi *api, CUstream stream, CUevent *event) {
  if (CUresult result = api->cuEventCreate(event, CU_EVENT_DISABLE_TIMING))
    return failCuda(result, "cuEventCreate");
  if (CUresult result = api->cuEventRecord(*event, stream)) {
    (void)api->cuEventDestroy(*event);
    return failCuda(result, "cuEventRecord");
  }
  return MOE_SUCCESS;
}

/// `waiter` waits for the work enqueued on `stream` so far.
moeStatus follow(const DriverApi *api, CUstream waiter, CUstream stream) {
  CUevent event;
  if (moeStatus status = recordEvent(api, stream, &event))
    return status;
  CUresult result = api->cuStreamWaitEvent(waiter, event, 0);
  // The wait is enqueued: the event may go (the driver keeps what it needs).
  (void)api->cuEventDestroy(event);
  return result ? failCuda(result, "cuStreamWaitEvent") : MOE_SUCCESS;
}

/// Destroys the events of offloads that are done, so a forward called again
/// and again without its backward holds no more than its copies in flight.
void forgetFinishedOffloads(const DriverApi *api, OffloadState &state) {
  for (auto it = state.offloads.begin(); it != state.offloads.end();) {
    if (api->cuEventQuery(it->second) == CUDA_SUCCESS) {
      (void)api->cuEventDestroy(it->second);
      it = state.offloads.erase(it);
    } else {
      ++it;
    }
  }
}

/// Stores `event` as `map`'s entry for `key`, destroying one it replaces.
void remember(const DriverApi *api, std::unordered_map<uintptr_t, CUevent> &map,
              void *key, CUevent event) {
  auto [it, inserted] =
      map.try_emplace(reinterpret_cast<uintptr_t>(key), event);
  if (!inserted) {
    (void)api->cuEventDestroy(it->second);
    it->second = event;
  }
}

/// The body of mgpuMoeOffload. `*handedOver` says whether `device` is freed
/// (or will be, on the copy stream) whatever the status.
moeStatus offload(const DriverApi *api, CUstream call, void *host, void *device,
                  uint64_t bytes, bool freeDevice, bool *handedOver) {
  *handedOver = false;
  CUstream copy;
  if (moeStatus status = getCopyStream(api, &copy))
    return status;
  if (moeStatus status = follow(api, copy, call))
    return status;
  if (CUresult result = api->cuMemcpyDtoHAsync(
          host, reinterpret_cast<CUdeviceptr>(device), bytes, copy))
    return failCuda(result, "cuMemcpyDtoHAsync", "offload of a saved tensor");
  if (freeDevice) {
    *handedOver = true;
    CUdeviceptr ptr = reinterpret_cast<CUdeviceptr>(device);
    if (releasePoolPointer(device) && api->cuMemFreeAsync) {
      if (CUresult result = api->cuMemFreeAsync(ptr, copy))
        return failCuda(result, "cuMemFreeAsync");
    } else {
      // Not stream-ordered memory: free it once the copy is done.
      if (CUresult result = api->cuStreamSynchronize(copy))
        return failCuda(result, "cuStreamSynchronize");
      if (CUresult result = api->cuMemFree(ptr))
        return failCuda(result, "cuMemFree");
    }
  }
  CUevent done;
  if (moeStatus status = recordEvent(api, copy, &done))
    return status;
  OffloadState &state = offloadState();
  std::lock_guard<std::mutex> lock(state.mutex);
  forgetFinishedOffloads(api, state);
  remember(api, state.offloads, host, done);
  return MOE_SUCCESS;
}

/// Allocates a device buffer on the copy stream and starts copying `host`
/// into it there (after the offload into `host`: the copy stream runs in
/// order); the event after the copy is kept by the buffer.
moeStatus prefetch(const DriverApi *api, void *host, uint64_t bytes,
                   CUdeviceptr *device) {
  *device = 0;
  CUstream copy;
  if (moeStatus status = getCopyStream(api, &copy))
    return status;
  char detail[96];
  std::snprintf(detail, sizeof(detail), "%llu bytes for a prefetched tensor",
                static_cast<unsigned long long>(bytes));
  bool pooled = streamOrderedAllocSupported(api);
  CUresult result = pooled ? api->cuMemAllocAsync(device, bytes, copy)
                           : api->cuMemAlloc(device, bytes);
  if (result)
    return failCuda(result, pooled ? "cuMemAllocAsync" : "cuMemAlloc", detail);
  if (pooled)
    adoptPoolPointer(reinterpret_cast<void *>(*device));
  // After the offload into `host`: in order on this copy stream, and through
  // its event when another device's copy stream made it.
  OffloadState &state = offloadState();
  moeStatus status = MOE_SUCCESS;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    auto it = state.offloads.find(reinterpret_cast<uintptr_t>(host));
    if (it != state.offloads.end()) {
      if (CUresult waited = api->cuStreamWaitEvent(copy, it->second, 0))
        status = failCuda(waited, "cuStreamWaitEvent", "the offload's copy");
      (void)api->cuEventDestroy(it->second);
      state.offloads.erase(it);
    }
  }
  CUevent done = nullptr;
  if (!status) {
    if (CUresult copied = api->cuMemcpyHtoDAsync(*device, host, bytes, copy))
      status =
          failCuda(copied, "cuMemcpyHtoDAsync", "prefetch of a saved tensor");
    else
      status = recordEvent(api, copy, &done);
  }
  if (status) {
    KeepFirstFailure keep;
    (void)api->cuStreamSynchronize(copy);
    mgpuMemFree(reinterpret_cast<void *>(*device), nullptr);
    *device = 0;
    return status;
  }
  std::lock_guard<std::mutex> lock(state.mutex);
  remember(api, state.prefetches, reinterpret_cast<void *>(*device), done);
  return MOE_SUCCESS;
}

/// Waits for this thread's device's copy stream, then forgets its offloads.
moeStatus synchronizeCopies(const DriverApi *api) {
  OffloadState &state = offloadState();
  CUstream copy = nullptr;
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    size_t device = static_cast<size_t>(currentDevice());
    if (device < state.copyStreams.size())
      copy = state.copyStreams[device];
  }
  if (!copy)
    return MOE_SUCCESS;
  if (CUresult result = api->cuStreamSynchronize(copy))
    return failCuda(result, "cuStreamSynchronize", "the offload copy stream");
  std::lock_guard<std::mutex> lock(state.mutex);
  forgetFinishedOffloads(api, state);
  return MOE_SUCCESS;
}

/// The call's stream, or a failure outside a generated call.
moeStatus getCallStream(const char *function, CUstream *stream) {
  *stream = static_cast<CUstream>(callStream());
  if (!*stream)
    return fail(MOE_ERROR_INVALID_ARGUMENT,
                "%s: no generated call in progress on this thread (no "
                "mgpuStreamCreate before it)",
                function);
  return MOE_SUCCESS;
}

} // namespace

extern "C" {

void mgpuMoeOffload(void *host, void *device, uint64_t bytes,
                    int32_t freeDevice) {
  if (failurePending() || bytes == 0 || !host || !device) {
    // The call is failing (or there is nothing to copy): still free.
    if (freeDevice && device) {
      KeepFirstFailure keep;
      mgpuMemFree(device, callStream());
    }
    if (!failurePending() && bytes && (!host || !device))
      check(fail(MOE_ERROR_INVALID_ARGUMENT, "mgpuMoeOffload: null %s",
                 host ? "device buffer" : "host buffer"),
            "mgpuMoeOffload");
    return;
  }
  const DriverApi *api;
  CUstream call;
  bool handedOver = false;
  moeStatus status = getContext(api);
  if (!status)
    status = getCallStream("mgpuMoeOffload", &call);
  if (!status)
    status =
        offload(api, call, host, device, bytes, freeDevice != 0, &handedOver);
  if (status) {
    check(status, "mgpuMoeOffload");
    if (freeDevice && !handedOver) {
      // A copy may have been enqueued before the failure.
      KeepFirstFailure keep;
      if (const DriverApi *loaded = loadedDriver())
        (void)synchronizeCopies(loaded);
      mgpuMemFree(device, callStream());
    }
  }
}

uint64_t mgpuMoePrefetch(void *host, uint64_t bytes) {
  if (failurePending() || bytes == 0)
    return 0;
  if (!host) {
    check(fail(MOE_ERROR_INVALID_ARGUMENT, "mgpuMoePrefetch: null host buffer"),
          "mgpuMoePrefetch");
    return 0;
  }
  // One moePrefetchSaved started already: its buffer.
  uintptr_t early = 0;
  uint64_t earlyBytes = 0;
  {
    OffloadState &state = offloadState();
    std::lock_guard<std::mutex> lock(state.mutex);
    auto it = state.early.find(reinterpret_cast<uintptr_t>(host));
    if (it != state.early.end()) {
      std::tie(early, earlyBytes) = it->second;
      state.early.erase(it);
    }
  }
  if (early && earlyBytes == bytes)
    return early;
  if (early) {
    // Started for another tensor in the same buffer: let it finish, drop it.
    mgpuMoeAwaitPrefetch(reinterpret_cast<void *>(early));
    mgpuMemFree(reinterpret_cast<void *>(early), callStream());
    check(fail(MOE_ERROR_INVALID_ARGUMENT,
               "mgpuMoePrefetch: moePrefetchSaved was given %llu bytes for "
               "this host buffer, the backward reads %llu",
               static_cast<unsigned long long>(earlyBytes),
               static_cast<unsigned long long>(bytes)),
          "mgpuMoePrefetch");
    return 0;
  }
  const DriverApi *api;
  CUdeviceptr device = 0;
  moeStatus status = getContext(api);
  if (!status)
    status = prefetch(api, host, bytes, &device);
  check(status, "mgpuMoePrefetch");
  return device;
}

void mgpuMoeAwaitPrefetch(void *device) {
  // Runs even after a failure: the device buffer is freed on the call's
  // stream next, and must not be while the copy may still write it.
  const DriverApi *api = loadedDriver();
  if (!api)
    return;
  CUevent done = nullptr;
  {
    OffloadState &state = offloadState();
    std::lock_guard<std::mutex> lock(state.mutex);
    auto it = state.prefetches.find(reinterpret_cast<uintptr_t>(device));
    if (it == state.prefetches.end())
      return; // never started (an earlier failure)
    done = it->second;
    state.prefetches.erase(it);
  }
  KeepFirstFailure keep;
  CUstream call = static_cast<CUstream>(callStream());
  CUresult result = call ? api->cuStreamWaitEvent(call, done, 0)
                         : api->cuEventSynchronize(done);
  (void)api->cuEventDestroy(done);
  if (result)
    check(failCuda(result, call ? "cuStreamWaitEvent" : "cuEventSynchronize",
                   "the prefetch of a saved tensor"),
          "mgpuMoeAwaitPrefetch");
}

void mgpuMoeOffloadsFinish(void) {
  if (callStreamIsLent())
    return;
  const DriverApi *api = loadedDriver();
  if (!api)
    return;
  KeepFirstFailure keep;
  check(synchronizeCopies(api), "mgpuMoeOffloadsFinish");
}

moeStatus moePrefetchSaved(void *host, size_t bytes) {
  if (!host || bytes == 0)
    return fail(MOE_ERROR_INVALID_ARGUMENT, "moePrefetchSaved: %s",
                host ? "0 bytes" : "null host buffer");
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  {
    OffloadState &state = offloadState();
    std::lock_guard<std::mutex> lock(state.mutex);
    if (state.early.count(reinterpret_cast<uintptr_t>(host)))
      return MOE_SUCCESS; // on its way already
  }
  CUdeviceptr device;
  if (moeStatus status = prefetch(api, host, bytes, &device))
    return status;
  OffloadState &state = offloadState();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.early[reinterpret_cast<uintptr_t>(host)] = {device, bytes};
  return MOE_SUCCESS;
}

moeStatus moeOffloadSynchronize(void) {
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  return synchronizeCopies(api);
}

} // extern "C"

void moe::runtime::resetOffloadForTesting() {
  OffloadState &state = offloadState();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.copyStreams.clear();
  state.offloads.clear();
  state.prefetches.clear();
  state.early.clear();
}
