//===- LaunchTest.cpp - Launch configuration checks -------------*- C++ -*-===//

#include "RuntimeTestUtils.h"

using namespace moe::runtime::test;

namespace {

uint32_t &axisOf(uint32_t &x, uint32_t &y, uint32_t &z, int axis) {
  return axis == 0 ? x : axis == 1 ? y : z;
}

moeLaunchConfig clustered(uint32_t grid, uint32_t cluster) {
  moeLaunchConfig config = plainLaunch(grid, 128);
  config.clusterX = cluster;
  config.clusterY = config.clusterZ = 1;
  return config;
}

TEST(RuntimeLaunch, ValidConfigurations) {
  moeLaunchConfig config = plainLaunch(1, 1);
  EXPECT_EQ(moeLaunchValidate(&config), MOE_SUCCESS);
  config = plainLaunch(132, 384, 200 * 1024);
  EXPECT_EQ(moeLaunchValidate(&config), MOE_SUCCESS);
  config = plainLaunch(2147483647u, 1024, MOE_MAX_DYNAMIC_SMEM_BYTES);
  EXPECT_EQ(moeLaunchValidate(&config), MOE_SUCCESS);
  config = plainLaunch(8, 32);
  config.blockY = 8;
  config.blockZ = 4;
  config.gridY = 65535;
  config.gridZ = 65535;
  EXPECT_EQ(moeLaunchValidate(&config), MOE_SUCCESS);
  config = clustered(132, 2);
  EXPECT_EQ(moeLaunchValidate(&config), MOE_SUCCESS);
  config = clustered(16, 8);
  EXPECT_EQ(moeLaunchValidate(&config), MOE_SUCCESS);
  config = clustered(4, 1);
  EXPECT_EQ(moeLaunchValidate(&config), MOE_SUCCESS);
}

TEST(RuntimeLaunch, NullConfiguration) {
  EXPECT_EQ(moeLaunchValidate(nullptr), MOE_ERROR_INVALID_ARGUMENT);
}

TEST(RuntimeLaunch, ZeroGridOrBlock) {
  for (int axis = 0; axis < 3; ++axis) {
    moeLaunchConfig config = plainLaunch(4, 64);
    axisOf(config.gridX, config.gridY, config.gridZ, axis) = 0;
    EXPECT_EQ(moeLaunchValidate(&config), MOE_ERROR_INVALID_ARGUMENT)
        << "grid axis " << axis;
    EXPECT_NE(lastMessage().find("grid"), std::string::npos);
    config = plainLaunch(4, 64);
    axisOf(config.blockX, config.blockY, config.blockZ, axis) = 0;
    EXPECT_EQ(moeLaunchValidate(&config), MOE_ERROR_INVALID_ARGUMENT)
        << "block axis " << axis;
    EXPECT_NE(lastMessage().find("block"), std::string::npos);
  }
}

TEST(RuntimeLaunch, GridLimits) {
  moeLaunchConfig config = plainLaunch(2147483648u, 32);
  EXPECT_EQ(moeLaunchValidate(&config), MOE_ERROR_INVALID_ARGUMENT);
  config = plainLaunch(1, 32);
  config.gridY = 65536;
  EXPECT_EQ(moeLaunchValidate(&config), MOE_ERROR_INVALID_ARGUMENT);
  config = plainLaunch(1, 32);
  config.gridZ = 65536;
  EXPECT_EQ(moeLaunchValidate(&config), MOE_ERROR_INVALID_ARGUMENT);
}

TEST(RuntimeLaunch, BlockLimits) {
  moeLaunchConfig config = plainLaunch(1, 1025);
  EXPECT_EQ(moeLaunchValidate(&config), MOE_ERROR_INVALID_ARGUMENT);
  config = plainLaunch(1, 1);
  config.blockY = 1025;
  EXPECT_EQ(moeLaunchValidate(&config), MOE_ERROR_INVALID_ARGUMENT);
  config = plainLaunch(1, 1);
  config.blockZ = 65;
  EXPECT_EQ(moeLaunchValidate(&config), MOE_ERROR_INVALID_ARGUMENT);
  // Each axis in range, the product over 1024.
  config = plainLaunch(1, 512);
  config.blockY = 4;
  EXPECT_EQ(moeLaunchValidate(&config), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastMessage().find("2048 threads"), std::string::npos)
      << lastMessage();
}

TEST(RuntimeLaunch, OversizedSharedMemory) {
  moeLaunchConfig config = plainLaunch(1, 128, MOE_MAX_DYNAMIC_SMEM_BYTES + 1);
  EXPECT_EQ(moeLaunchValidate(&config), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastMessage().find("232449"), std::string::npos) << lastMessage();
  config = plainLaunch(1, 128, 0xffffffffu);
  EXPECT_EQ(moeLaunchValidate(&config), MOE_ERROR_INVALID_ARGUMENT);
}

TEST(RuntimeLaunch, BadClusters) {
  // Partly zero.
  moeLaunchConfig config = clustered(4, 2);
  config.clusterY = 0;
  EXPECT_EQ(moeLaunchValidate(&config), MOE_ERROR_INVALID_ARGUMENT);
  // One axis over 8.
  config = clustered(32, 16);
  EXPECT_EQ(moeLaunchValidate(&config), MOE_ERROR_INVALID_ARGUMENT);
  // Each axis fine, 16 blocks in all.
  config = clustered(8, 4);
  config.gridY = 4;
  config.clusterY = 4;
  EXPECT_EQ(moeLaunchValidate(&config), MOE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(lastMessage().find("portable"), std::string::npos);
  // Grid not a multiple of the cluster.
  config = clustered(7, 2);
  EXPECT_EQ(moeLaunchValidate(&config), MOE_ERROR_SHAPE_MISMATCH);
  EXPECT_NE(lastMessage().find("multiple"), std::string::npos);
}

} // namespace
