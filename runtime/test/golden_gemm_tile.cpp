//===- golden_gemm_tile.cpp - The golden wgmma kernel on the GPU ----------===//
//
// Runs the kernel of test/Target/NVPTX/Inputs/gemm-tile-sm90a.mlir, compiled
// by `moe-opt --moe-lower-to-nvvm-pipeline` to PTX, through the runtime:
// TMA descriptors for A [128, 64] (K contiguous) and B [64, 128] (N
// contiguous), one 128-thread block, C [128, 128] f32 = A * B. Inputs are
// multiples of 1/4 in [-2, 2], so every product and sum is exact in f32 and
// the result must equal the host reference bit for bit.
//
//   golden_gemm_tile path/to/moe_kernels.ptx
//
// Prints one line per check and "N passed, M failed"; exit code 1 on failure.
//
//===----------------------------------------------------------------------===//

#include "moe/Runtime/Runtime.h"

#include <cuda.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace {

int passed = 0, failed = 0;

void check(bool ok, const std::string &what) {
  std::printf("%s: %s\n", ok ? "PASS" : "FAIL", what.c_str());
  (ok ? passed : failed)++;
}

bool ok(moeStatus status, const char *what) {
  if (status == MOE_SUCCESS)
    return true;
  std::printf("FAIL: %s: %s (%s)\n", what, moeStatusString(status),
              moeGetLastErrorMessage());
  failed++;
  return false;
}

/// f32 -> f16 bits for the exactly representable values used here.
uint16_t toHalf(float value) {
  if (value == 0.0f)
    return std::signbit(value) ? 0x8000 : 0;
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  uint32_t sign = (bits >> 16) & 0x8000;
  int exponent = static_cast<int>((bits >> 23) & 0xff) - 127 + 15;
  uint32_t mantissa = (bits >> 13) & 0x3ff;
  return static_cast<uint16_t>(sign | (exponent << 10) | mantissa);
}

} // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s moe_kernels.ptx\n", argv[0]);
    return 2;
  }
  std::ifstream file(argv[1]);
  std::stringstream text;
  text << file.rdbuf();
  std::string ptx = text.str();
  check(!ptx.empty(), std::string("read PTX from ") + argv[1]);
  if (ptx.empty())
    return 1;

  constexpr int M = 128, N = 128, K = 64;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> quarter(-8, 8);
  std::vector<float> a(M * K), b(K * N);
  std::vector<uint16_t> aHalf(M * K), bHalf(K * N);
  for (int i = 0; i < M * K; ++i) {
    a[i] = quarter(rng) / 4.0f;
    aHalf[i] = toHalf(a[i]);
  }
  for (int i = 0; i < K * N; ++i) {
    b[i] = quarter(rng) / 4.0f;
    bHalf[i] = toHalf(b[i]);
  }
  std::vector<float> expected(M * N, 0.0f);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      float sum = 0.0f;
      for (int k = 0; k < K; ++k)
        sum += a[m * K + k] * b[k * N + n];
      expected[m * N + n] = sum;
    }

  moeModule module;
  moeFunction function;
  if (!ok(moeModuleLoadPTX(ptx.c_str(), 4, &module), "load the PTX") ||
      !ok(moeModuleGetFunction(module, "gemm_tile", &function),
          "find gemm_tile"))
    return 1;
  moeFunctionInfo info;
  if (ok(moeFunctionGetInfo(function, &info), "function info"))
    std::printf("gemm_tile: %d registers, %d B static smem, %d B local\n",
                info.numRegs, info.staticSmemBytes, info.localBytes);

  moeDevicePtr aDev, bDev, cDev, mapsDev;
  if (!ok(moeMemAlloc(aHalf.size() * 2, &aDev), "alloc A") ||
      !ok(moeMemAlloc(bHalf.size() * 2, &bDev), "alloc B") ||
      !ok(moeMemAlloc(M * N * 4, &cDev), "alloc C") ||
      !ok(moeMemAlloc(2 * sizeof(moeTensorMap), &mapsDev), "alloc maps"))
    return 1;

  // A: inner dimension K (64 halves = 128 B, the 128B swizzle span), 128 rows.
  moeTensorMap maps[2];
  uint64_t aDims[2] = {K, M}, aStrides[1] = {K * 2};
  uint32_t aBox[2] = {64, 128}, unit[2] = {1, 1};
  // B: inner dimension N, two 64-column boxes of 64 rows (K).
  uint64_t bDims[2] = {N, K}, bStrides[1] = {N * 2};
  uint32_t bBox[2] = {64, 64};
  if (!ok(moeTensorMapEncodeTiled(
              &maps[0], CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
              reinterpret_cast<void *>(aDev), aDims, aStrides, aBox, unit,
              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
              CU_TENSOR_MAP_L2_PROMOTION_NONE,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
          "encode the A tensor map") ||
      !ok(moeTensorMapEncodeTiled(
              &maps[1], CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
              reinterpret_cast<void *>(bDev), bDims, bStrides, bBox, unit,
              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
              CU_TENSOR_MAP_L2_PROMOTION_NONE,
              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
          "encode the B tensor map"))
    return 1;

  moeStream stream;
  if (!ok(moeStreamCreate(&stream), "stream") ||
      !ok(moeMemcpyHtoDAsync(aDev, aHalf.data(), aHalf.size() * 2, stream),
          "copy A") ||
      !ok(moeMemcpyHtoDAsync(bDev, bHalf.data(), bHalf.size() * 2, stream),
          "copy B") ||
      !ok(moeMemcpyHtoDAsync(mapsDev, maps, sizeof(maps), stream),
          "copy the tensor maps"))
    return 1;

  // The kernel takes the maps by (global) pointer, then C.
  moeDevicePtr aMap = mapsDev, bMap = mapsDev + sizeof(moeTensorMap);
  void *params[] = {&aMap, &bMap, &cDev};
  moeLaunchConfig config = {};
  config.gridX = config.gridY = config.gridZ = 1;
  config.blockX = 128;
  config.blockY = config.blockZ = 1;
  config.sharedMemBytes = 64 * 1024;
  config.stream = stream;
  std::vector<float> c(M * N, -1.0f);
  if (!ok(moeLaunch(function, &config, params), "launch gemm_tile") ||
      !ok(moeStreamSynchronize(stream), "kernel completes") ||
      !ok(moeMemcpyDtoHAsync(c.data(), cDev, c.size() * 4, stream),
          "copy C back") ||
      !ok(moeStreamSynchronize(stream), "copy completes"))
    return 1;

  int wrong = 0;
  double maxError = 0.0;
  for (int i = 0; i < M * N; ++i) {
    double error = std::fabs(static_cast<double>(c[i]) - expected[i]);
    maxError = std::max(maxError, error);
    wrong += c[i] != expected[i];
  }
  char line[160];
  std::snprintf(line, sizeof(line),
                "C == A * B exactly (%d of %d entries differ, max |error| %g)",
                wrong, M * N, maxError);
  check(wrong == 0, line);
  if (wrong) {
    // The first rows help tell a layout mix-up from a synchronisation bug.
    for (int m = 0; m < 2; ++m)
      std::printf("row %d: got %g %g %g %g, expected %g %g %g %g\n", m,
                  c[m * N], c[m * N + 1], c[m * N + 64], c[m * N + 127],
                  expected[m * N], expected[m * N + 1], expected[m * N + 64],
                  expected[m * N + 127]);
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
