//===- StatusTest.cpp - Status strings and the last error -------*- C++ -*-===//

#include "RuntimeTestUtils.h"

#include <set>
#include <string>
#include <thread>

using namespace moe::runtime::test;

namespace {

TEST(RuntimeStatus, EveryCodeHasItsOwnName) {
  const std::pair<moeStatus, const char *> expected[] = {
      {MOE_SUCCESS, "MOE_SUCCESS"},
      {MOE_ERROR_NO_DRIVER, "MOE_ERROR_NO_DRIVER"},
      {MOE_ERROR_NO_DEVICE, "MOE_ERROR_NO_DEVICE"},
      {MOE_ERROR_INVALID_ARGUMENT, "MOE_ERROR_INVALID_ARGUMENT"},
      {MOE_ERROR_MISALIGNED, "MOE_ERROR_MISALIGNED"},
      {MOE_ERROR_OUT_OF_MEMORY, "MOE_ERROR_OUT_OF_MEMORY"},
      {MOE_ERROR_MODULE_LOAD, "MOE_ERROR_MODULE_LOAD"},
      {MOE_ERROR_NOT_FOUND, "MOE_ERROR_NOT_FOUND"},
      {MOE_ERROR_SHAPE_MISMATCH, "MOE_ERROR_SHAPE_MISMATCH"},
      {MOE_ERROR_CUDA, "MOE_ERROR_CUDA"},
      {MOE_ERROR_KERNEL_FAULT, "MOE_ERROR_KERNEL_FAULT"},
  };
  static_assert(sizeof(expected) / sizeof(expected[0]) == MOE_NUM_STATUS_CODES,
                "one name per status code");
  std::set<std::string> names;
  for (auto [status, name] : expected) {
    EXPECT_STREQ(moeStatusString(status), name);
    names.insert(moeStatusString(status));
  }
  EXPECT_EQ(names.size(), size_t(MOE_NUM_STATUS_CODES));
  for (int code = 0; code < MOE_NUM_STATUS_CODES; ++code)
    EXPECT_STRNE(moeStatusString(static_cast<moeStatus>(code)),
                 "MOE_ERROR_UNKNOWN");
}

TEST(RuntimeStatus, UnknownCodeIsNamedUnknown) {
  EXPECT_STREQ(moeStatusString(static_cast<moeStatus>(MOE_NUM_STATUS_CODES)),
               "MOE_ERROR_UNKNOWN");
  EXPECT_STREQ(moeStatusString(static_cast<moeStatus>(-1)),
               "MOE_ERROR_UNKNOWN");
}

TEST(RuntimeStatus, LastErrorStartsEmptyAndClears) {
  moeClearLastError();
  EXPECT_EQ(moeGetLastStatus(), MOE_SUCCESS);
  EXPECT_STREQ(moeGetLastErrorMessage(), "");
  EXPECT_EQ(moeMemAlloc(16, nullptr), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastMessage().find("moeMemAlloc"), std::string::npos)
      << lastMessage();
  moeClearLastError();
  EXPECT_EQ(moeGetLastStatus(), MOE_SUCCESS);
  EXPECT_STREQ(moeGetLastErrorMessage(), "");
}

TEST(RuntimeStatus, SuccessKeepsTheLastFailure) {
  moeClearLastError();
  EXPECT_EQ(moeHostAlloc(0, nullptr), MOE_ERROR_INVALID_ARGUMENT);
  int device = -1;
  EXPECT_EQ(moeGetDevice(&device), MOE_SUCCESS);
  EXPECT_EQ(device, 0);
  EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_INVALID_ARGUMENT);
  moeClearLastError();
}

TEST(RuntimeStatus, LastErrorIsPerThread) {
  moeClearLastError();
  EXPECT_EQ(moeMemsetD32Async(0x1002, 0, 4, nullptr), MOE_ERROR_MISALIGNED);
  moeStatus otherStatus = MOE_ERROR_CUDA;
  std::string otherMessage = "unset";
  std::thread other([&] {
    otherStatus = moeGetLastStatus();
    otherMessage = moeGetLastErrorMessage();
  });
  other.join();
  EXPECT_EQ(otherStatus, MOE_SUCCESS);
  EXPECT_EQ(otherMessage, "");
  EXPECT_EQ(moeGetLastStatus(), MOE_ERROR_MISALIGNED);
  moeClearLastError();
}

} // namespace
