//===- NoDriverTest.cpp - Every call without a usable driver ----*- C++ -*-===//
//
// The library loads without libcuda; every call that needs the driver then
// returns MOE_ERROR_NO_DRIVER with a message, and nothing crashes.
//
//===----------------------------------------------------------------------===//

#include "RuntimeTestUtils.h"

#include <cuda.h>

#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace moe::runtime::test;

namespace {

using RuntimeNoDriver = NoDriverTest;

// Every entry point that needs the driver, with valid arguments.
std::vector<std::pair<const char *, std::function<moeStatus()>>> driverCalls() {
  static moeTensorMap map;
  alignas(16) static unsigned char global[4096];
  static char hostBuffer[64];
  static const char kPtx[] = ".version 8.0\n.target sm_90a\n";
  static const char kElf[] = "\x7f"
                             "ELF-not-really";
  return {
      {"moeInit", [] { return moeInit(); }},
      {"moeDriverGetVersion",
       [] {
         int version = 0;
         return moeDriverGetVersion(&version);
       }},
      {"moeGetDeviceCount",
       [] {
         int count = 0;
         return moeGetDeviceCount(&count);
       }},
      {"moeSetDevice", [] { return moeSetDevice(0); }},
      {"moeDeviceGetComputeCapability",
       [] {
         int major = 0, minor = 0;
         return moeDeviceGetComputeCapability(&major, &minor);
       }},
      {"moeDeviceSynchronize", [] { return moeDeviceSynchronize(); }},
      {"moeModuleLoad",
       [] {
         moeModule module = nullptr;
         return moeModuleLoad(kElf, sizeof(kElf), &module);
       }},
      {"moeModuleLoad(PTX)",
       [] {
         moeModule module = nullptr;
         return moeModuleLoad(kPtx, sizeof(kPtx), &module);
       }},
      {"moeModuleLoadPTX",
       [] {
         moeModule module = nullptr;
         return moeModuleLoadPTX(kPtx, 4, &module);
       }},
      {"moeStreamCreate",
       [] {
         moeStream stream = nullptr;
         return moeStreamCreate(&stream);
       }},
      {"moeStreamSynchronize", [] { return moeStreamSynchronize(nullptr); }},
      {"moeEventCreate",
       [] {
         moeEvent event = nullptr;
         return moeEventCreate(&event);
       }},
      {"moeEventCreateTiming",
       [] {
         moeEvent event = nullptr;
         return moeEventCreateTiming(&event);
       }},
      {"moeMemAlloc",
       [] {
         moeDevicePtr ptr = 0;
         return moeMemAlloc(1 << 20, &ptr);
       }},
      {"moeMemGetInfo",
       [] {
         size_t freeBytes = 0, totalBytes = 0;
         return moeMemGetInfo(&freeBytes, &totalBytes);
       }},
      {"moeHostAlloc",
       [] {
         void *host = nullptr;
         return moeHostAlloc(4096, &host);
       }},
      {"moeArenaCreate",
       [] {
         moeArena arena = nullptr;
         return moeArenaCreate(1 << 20, &arena);
       }},
      {"moeMemcpyHtoDAsync",
       [] {
         return moeMemcpyHtoDAsync(0x10000, hostBuffer, sizeof(hostBuffer),
                                   nullptr);
       }},
      {"moeMemcpyDtoHAsync",
       [] {
         return moeMemcpyDtoHAsync(hostBuffer, 0x10000, sizeof(hostBuffer),
                                   nullptr);
       }},
      {"moeMemcpyDtoDAsync",
       [] { return moeMemcpyDtoDAsync(0x20000, 0x10000, 64, nullptr); }},
      {"moeMemsetD32Async",
       [] { return moeMemsetD32Async(0x10000, 1, 16, nullptr); }},
      {"moeTensorMapEncodeTiled",
       [] {
         const uint64_t dims[2] = {64, 128};
         const uint64_t strides[1] = {128};
         const uint32_t box[2] = {64, 16};
         return moeTensorMapEncodeTiled(
             &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, global, dims, strides,
             box, nullptr, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
       }},
      {"moeTensorMapReplaceAddress",
       [] { return moeTensorMapReplaceAddress(&map, global); }},
  };
}

TEST_F(RuntimeNoDriver, EveryCallReturnsNoDriverWithAMessage) {
  for (auto &[name, call] : driverCalls()) {
    moeClearLastError();
    moeStatus status = call();
    EXPECT_EQ(status, MOE_ERROR_NO_DRIVER)
        << name << ": " << moeStatusString(status) << " "
        << moeGetLastErrorMessage();
    EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_NO_DRIVER) << name;
    std::string message = moeGetLastErrorMessage();
    EXPECT_NE(message.find(kMissingDriver), std::string::npos)
        << name << ": " << message;
    EXPECT_NE(message.find("cannot load the CUDA driver"), std::string::npos)
        << name << ": " << message;
  }
}

TEST_F(RuntimeNoDriver, FailureIsCachedAndStable) {
  EXPECT_EQ(moeInit(), MOE_ERROR_NO_DRIVER);
  std::string first = moeGetLastErrorMessage();
  moeClearLastError();
  EXPECT_EQ(moeInit(), MOE_ERROR_NO_DRIVER);
  EXPECT_EQ(first, moeGetLastErrorMessage());
}

TEST_F(RuntimeNoDriver, ResetReadsTheVariableAgain) {
  EXPECT_EQ(moeInit(), MOE_ERROR_NO_DRIVER);
  useDriver("/another/missing/libcuda.so");
  EXPECT_EQ(moeInit(), MOE_ERROR_NO_DRIVER);
  EXPECT_NE(lastMessage().find("/another/missing/libcuda.so"),
            std::string::npos)
      << lastMessage();
}

TEST_F(RuntimeNoDriver, ThreadWithoutDriver) {
  moeStatus status = MOE_SUCCESS;
  std::string message;
  std::thread other([&] {
    moeDevicePtr ptr = 0;
    status = moeMemAlloc(256, &ptr);
    message = moeGetLastErrorMessage();
  });
  other.join();
  EXPECT_EQ(status, MOE_ERROR_NO_DRIVER);
  EXPECT_NE(message.find(kMissingDriver), std::string::npos) << message;
}

TEST_F(RuntimeNoDriver, LibraryWithoutTheEntryPoints) {
  // libm loads, but has no cuInit.
  useDriver("libm.so.6");
  EXPECT_EQ(moeInit(), MOE_ERROR_NO_DRIVER);
  std::string message = moeGetLastErrorMessage();
  EXPECT_NE(message.find("has no entry point cuGetErrorName"),
            std::string::npos)
      << message;
  moeStream stream = nullptr;
  EXPECT_EQ(moeStreamCreate(&stream), MOE_ERROR_NO_DRIVER);
  EXPECT_EQ(stream, nullptr);
}

TEST_F(RuntimeNoDriver, ToolkitStubLibrary) {
  // The toolkit's stub libcuda has every entry point; each returns
  // CUDA_ERROR_STUB_LIBRARY.
  const char *stub = MOE_CUDA_STUB_PATH;
  if (!stub[0])
    GTEST_SKIP() << "no stub libcuda in this CUDA toolkit";
  useDriver(stub);
  EXPECT_EQ(moeInit(), MOE_ERROR_NO_DRIVER);
  std::string message = moeGetLastErrorMessage();
  EXPECT_NE(message.find("cuInit failed"), std::string::npos) << message;
  EXPECT_NE(message.find("CUDA_ERROR_STUB_LIBRARY"), std::string::npos)
      << message;
  moeDevicePtr ptr = 0;
  EXPECT_EQ(moeMemAlloc(64, &ptr), MOE_ERROR_NO_DRIVER);
}

} // namespace
