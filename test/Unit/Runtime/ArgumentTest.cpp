//===- ArgumentTest.cpp - Argument checks before the driver -----*- C++ -*-===//
//
// With no driver at all, bad arguments must still give their own status (not
// MOE_ERROR_NO_DRIVER): the checks run before the driver is touched.
//
//===----------------------------------------------------------------------===//

#include "RuntimeTestUtils.h"

using namespace moe::runtime::test;

namespace {

using RuntimeArguments = NoDriverTest;

void expectStatus(moeStatus actual, moeStatus expected, const char *what) {
  EXPECT_EQ(actual, expected) << what << ": got " << moeStatusString(actual)
                              << " (" << moeGetLastErrorMessage() << ")";
  EXPECT_EQ(moeGetLastStatus(), expected) << what;
  EXPECT_STRNE(moeGetLastErrorMessage(), "") << what;
}

TEST_F(RuntimeArguments, NullOutputs) {
  const moeStatus kInvalid = MOE_ERROR_INVALID_ARGUMENT;
  expectStatus(moeDriverGetVersion(nullptr), kInvalid, "moeDriverGetVersion");
  expectStatus(moeGetDeviceCount(nullptr), kInvalid, "moeGetDeviceCount");
  expectStatus(moeGetDevice(nullptr), kInvalid, "moeGetDevice");
  int major = 0;
  expectStatus(moeDeviceGetComputeCapability(&major, nullptr), kInvalid,
               "moeDeviceGetComputeCapability");
  expectStatus(moeStreamCreate(nullptr), kInvalid, "moeStreamCreate");
  expectStatus(moeEventCreate(nullptr), kInvalid, "moeEventCreate");
  expectStatus(moeEventCreateTiming(nullptr), kInvalid, "moeEventCreateTiming");
  expectStatus(moeMemAlloc(64, nullptr), kInvalid, "moeMemAlloc");
  size_t freeBytes = 0;
  expectStatus(moeMemGetInfo(&freeBytes, nullptr), kInvalid, "moeMemGetInfo");
  expectStatus(moeHostAlloc(64, nullptr), kInvalid, "moeHostAlloc");
  expectStatus(moeArenaCreate(1024, nullptr), kInvalid, "moeArenaCreate");
  expectStatus(moeModuleLoadPTX(".version 8.0", 4, nullptr), kInvalid,
               "moeModuleLoadPTX");
  expectStatus(moeModuleLoad("\x7f"
                             "ELF....",
                             8, nullptr),
               kInvalid, "moeModuleLoad");
}

TEST_F(RuntimeArguments, NullHandles) {
  const moeStatus kInvalid = MOE_ERROR_INVALID_ARGUMENT;
  moeModule module = nullptr;
  moeFunction function = nullptr;
  moeFunctionInfo info;
  moeArenaInfo arenaInfo;
  moeDevicePtr ptr = 0;
  float ms = 0;
  expectStatus(moeModuleLoad(nullptr, 100, &module), kInvalid,
               "moeModuleLoad(null)");
  expectStatus(moeModuleLoadPTX(nullptr, 4, &module), kInvalid,
               "moeModuleLoadPTX(null)");
  expectStatus(moeModuleUnload(nullptr), kInvalid, "moeModuleUnload");
  expectStatus(moeModuleGetFunction(nullptr, "k", &function), kInvalid,
               "moeModuleGetFunction(null module)");
  expectStatus(moeFunctionGetInfo(nullptr, &info), kInvalid,
               "moeFunctionGetInfo");
  expectStatus(moeStreamDestroy(nullptr), kInvalid, "moeStreamDestroy");
  expectStatus(moeStreamWaitEvent(nullptr, nullptr), kInvalid,
               "moeStreamWaitEvent");
  expectStatus(moeEventRecord(nullptr, nullptr), kInvalid, "moeEventRecord");
  expectStatus(moeEventSynchronize(nullptr), kInvalid, "moeEventSynchronize");
  expectStatus(moeEventElapsedMs(nullptr, nullptr, &ms), kInvalid,
               "moeEventElapsedMs");
  expectStatus(moeEventDestroy(nullptr), kInvalid, "moeEventDestroy");
  expectStatus(moeArenaAlloc(nullptr, 64, 0, &ptr), kInvalid, "moeArenaAlloc");
  expectStatus(moeArenaReset(nullptr), kInvalid, "moeArenaReset");
  expectStatus(moeArenaGetInfo(nullptr, &arenaInfo), kInvalid,
               "moeArenaGetInfo");
  expectStatus(moeArenaDestroy(nullptr), kInvalid, "moeArenaDestroy");
  expectStatus(moeLaunch(nullptr, nullptr, nullptr), kInvalid, "moeLaunch");
  expectStatus(moeTensorMapReplaceAddress(nullptr, nullptr), kInvalid,
               "moeTensorMapReplaceAddress");
}

TEST_F(RuntimeArguments, FreeingNullIsANoOp) {
  moeClearLastError();
  EXPECT_EQ(moeMemFree(0), MOE_SUCCESS);
  EXPECT_EQ(moeHostFree(nullptr), MOE_SUCCESS);
  EXPECT_EQ(moeGetLastStatus(), MOE_SUCCESS);
}

TEST_F(RuntimeArguments, ZeroSizes) {
  const moeStatus kInvalid = MOE_ERROR_INVALID_ARGUMENT;
  moeDevicePtr ptr = 0;
  void *host = nullptr;
  moeArena arena = nullptr;
  moeModule module = nullptr;
  char buffer[16] = {};
  expectStatus(moeMemAlloc(0, &ptr), kInvalid, "moeMemAlloc(0)");
  expectStatus(moeHostAlloc(0, &host), kInvalid, "moeHostAlloc(0)");
  expectStatus(moeArenaCreate(0, &arena), kInvalid, "moeArenaCreate(0)");
  expectStatus(moeMemcpyHtoDAsync(0x1000, buffer, 0, nullptr), kInvalid,
               "moeMemcpyHtoDAsync(0)");
  expectStatus(moeMemcpyDtoHAsync(buffer, 0x1000, 0, nullptr), kInvalid,
               "moeMemcpyDtoHAsync(0)");
  expectStatus(moeMemcpyDtoDAsync(0x2000, 0x1000, 0, nullptr), kInvalid,
               "moeMemcpyDtoDAsync(0)");
  expectStatus(moeMemsetD32Async(0x1000, 7, 0, nullptr), kInvalid,
               "moeMemsetD32Async(0)");
  expectStatus(moeModuleLoad("\x7f"
                             "EL",
                             3, &module),
               kInvalid, "moeModuleLoad(3 bytes)");
  expectStatus(moeModuleLoadPTX("", 4, &module), kInvalid,
               "moeModuleLoadPTX(empty)");
}

TEST_F(RuntimeArguments, NullCopyPointers) {
  const moeStatus kInvalid = MOE_ERROR_INVALID_ARGUMENT;
  char buffer[16] = {};
  expectStatus(moeMemcpyHtoDAsync(0, buffer, 16, nullptr), kInvalid,
               "HtoD null dst");
  expectStatus(moeMemcpyHtoDAsync(0x1000, nullptr, 16, nullptr), kInvalid,
               "HtoD null src");
  expectStatus(moeMemcpyDtoHAsync(nullptr, 0x1000, 16, nullptr), kInvalid,
               "DtoH null dst");
  expectStatus(moeMemcpyDtoHAsync(buffer, 0, 16, nullptr), kInvalid,
               "DtoH null src");
  expectStatus(moeMemcpyDtoDAsync(0, 0x1000, 16, nullptr), kInvalid,
               "DtoD null dst");
  expectStatus(moeMemcpyDtoDAsync(0x1000, 0, 16, nullptr), kInvalid,
               "DtoD null src");
  expectStatus(moeMemsetD32Async(0, 7, 4, nullptr), kInvalid,
               "memset null dst");
}

TEST_F(RuntimeArguments, MisalignedPointers) {
  const moeStatus kMisaligned = MOE_ERROR_MISALIGNED;
  expectStatus(moeMemsetD32Async(0x1001, 7, 4, nullptr), kMisaligned,
               "memset at +1");
  expectStatus(moeMemsetD32Async(0x1002, 7, 4, nullptr), kMisaligned,
               "memset at +2");
  alignas(64) unsigned char storage[256];
  expectStatus(moeTensorMapReplaceAddress(storage + 8, storage), kMisaligned,
               "replace address: map at +8");
  expectStatus(moeTensorMapReplaceAddress(storage, storage + 4), kMisaligned,
               "replace address: address at +4");
}

TEST_F(RuntimeArguments, BadModuleArguments) {
  const moeStatus kInvalid = MOE_ERROR_INVALID_ARGUMENT;
  moeModule module = nullptr;
  expectStatus(moeModuleLoadPTX(".version 8.0\n", -1, &module), kInvalid,
               "opt level -1");
  expectStatus(moeModuleLoadPTX(".version 8.0\n", 5, &module), kInvalid,
               "opt level 5");
  // Neither ELF nor fatbin, and no NUL within the size: not PTX either.
  const char notText[8] = {'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'};
  expectStatus(moeModuleLoad(notText, sizeof(notText), &module), kInvalid,
               "unterminated PTX");
  EXPECT_NE(lastMessage().find("NUL"), std::string::npos) << lastMessage();
}

TEST_F(RuntimeArguments, BadLaunchesNeverReachTheDriver) {
  // moeLaunchValidate is the driver-free half of moeLaunch (LaunchTest.cpp
  // has every rule); here: without a driver the codes are the same.
  moeLaunchConfig config = {};
  config.gridX = config.gridY = config.gridZ = 1;
  config.blockX = config.blockY = config.blockZ = 1;
  EXPECT_EQ(moeLaunch(nullptr, &config, nullptr), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastMessage().find("null function"), std::string::npos);

  config.gridX = 0;
  EXPECT_EQ(moeLaunchValidate(&config), MOE_ERROR_INVALID_ARGUMENT);
  config.gridX = 1;
  config.sharedMemBytes = MOE_MAX_DYNAMIC_SMEM_BYTES + 1;
  EXPECT_EQ(moeLaunchValidate(&config), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastMessage().find("dynamic shared memory"), std::string::npos)
      << lastMessage();
}

} // namespace
