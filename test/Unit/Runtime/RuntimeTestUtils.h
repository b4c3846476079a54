//===- RuntimeTestUtils.h - Fixtures for the runtime unit tests -*- C++ -*-===//
//
// Each fixture points MOE_LIBCUDA at a driver (none, a library without the
// entry points, the toolkit's stub, or the fake of FakeCuda.h) and resets
// the runtime, so tests are independent in one process and under ctest.
//
//===----------------------------------------------------------------------===//

#ifndef MOE_TEST_UNIT_RUNTIME_RUNTIMETESTUTILS_H
#define MOE_TEST_UNIT_RUNTIME_RUNTIMETESTUTILS_H

#include "FakeCuda.h"
#include "moe/Runtime/Runtime.h"

#include "gtest/gtest.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

namespace moe::runtime::test {

constexpr const char *kMissingDriver = "/nonexistent/libcuda.so.1";

/// Makes the runtime load `path` as the driver on its next use.
inline void useDriver(const char *path) {
  setenv("MOE_LIBCUDA", path, /*overwrite=*/1);
  moeRuntimeResetForTesting();
}

/// The last error message as a string.
inline std::string lastMessage() { return moeGetLastErrorMessage(); }

/// A one-dimensional launch without a cluster: `grid` blocks of `block`
/// threads.
inline moeLaunchConfig plainLaunch(uint32_t grid, uint32_t block,
                                   uint32_t smem = 0,
                                   moeStream stream = nullptr) {
  moeLaunchConfig config = {};
  config.gridX = grid;
  config.gridY = config.gridZ = 1;
  config.blockX = block;
  config.blockY = config.blockZ = 1;
  config.sharedMemBytes = smem;
  config.stream = stream;
  return config;
}

/// No driver: MOE_LIBCUDA names a file that does not exist.
class NoDriverTest : public ::testing::Test {
protected:
  void SetUp() override { useDriver(kMissingDriver); }
  void TearDown() override {
    moeRuntimeResetForTesting();
    unsetenv("MOE_LIBCUDA");
  }
};

/// The fake driver, reset to its defaults.
class FakeDriverTest : public ::testing::Test {
protected:
  /// The fake library to load; the _nopool build for an old driver.
  virtual const char *fakePath() const { return MOE_FAKE_CUDA_PATH; }

  void SetUp() override {
    handle = dlopen(fakePath(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(handle, nullptr) << dlerror();
    auto *stateFn =
        reinterpret_cast<FakeCudaState *(*)()>(dlsym(handle, "fakeCudaState"));
    auto *resetFn =
        reinterpret_cast<void (*)()>(dlsym(handle, "fakeCudaReset"));
    ASSERT_NE(stateFn, nullptr);
    ASSERT_NE(resetFn, nullptr);
    resetFn();
    fake = stateFn();
    useDriver(fakePath());
    moeClearLastError();
  }
  void TearDown() override {
    moeRuntimeResetForTesting();
    unsetenv("MOE_LIBCUDA");
    if (handle)
      dlclose(handle);
  }

  void *handle = nullptr;
  FakeCudaState *fake = nullptr;
};

} // namespace moe::runtime::test

#endif // MOE_TEST_UNIT_RUNTIME_RUNTIMETESTUTILS_H
