//===- TensorMap.cpp - TMA descriptor validation and encoding ---*- C++ -*-===//
//
// cuTensorMapEncodeTiled answers CUDA_ERROR_INVALID_VALUE for any broken
// rule. moeTensorMapValidate checks the rules of CUDA 13's cuda.h first, on
// the host and without the driver, and names the one that fails.
// moeTensorMapDeviceBf16 keeps encoded maps in device memory for kernels
// that take them by pointer.
//
//===----------------------------------------------------------------------===//

#include "Internal.h"

#include <algorithm>
#include <array>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

using namespace moe::runtime;

static_assert(sizeof(moeTensorMap) == sizeof(CUtensorMap) &&
                  alignof(moeTensorMap) == alignof(CUtensorMap),
              "moeTensorMap must be layout-compatible with CUtensorMap");

namespace {

constexpr uint32_t kMaxRank = 5;

// Size of one element in bits; 0 for a value that is no data type.
// The packed 16U4_ALIGN16B and 16U6_ALIGN16B types hold 16 values in 16
// bytes (gaps included), so they count as 8 bits for the box width.
unsigned elementBits(uint32_t dataType) {
  switch (dataType) {
  case CU_TENSOR_MAP_DATA_TYPE_UINT8:
    return 8;
  case CU_TENSOR_MAP_DATA_TYPE_UINT16:
  case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
  case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
    return 16;
  case CU_TENSOR_MAP_DATA_TYPE_UINT32:
  case CU_TENSOR_MAP_DATA_TYPE_INT32:
  case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
  case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ:
  case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32:
  case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ:
    return 32;
  case CU_TENSOR_MAP_DATA_TYPE_UINT64:
  case CU_TENSOR_MAP_DATA_TYPE_INT64:
  case CU_TENSOR_MAP_DATA_TYPE_FLOAT64:
    return 64;
  case CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B:
    return 4;
  case CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B:
  case CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B:
    return 8;
  default:
    return 0;
  }
}

bool isPacked16B(uint32_t dataType) {
  return dataType == CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B ||
         dataType == CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B;
}

bool isFloat(uint32_t dataType) {
  switch (dataType) {
  case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
  case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
  case CU_TENSOR_MAP_DATA_TYPE_FLOAT64:
  case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
  case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ:
  case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32:
  case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ:
    return true;
  default:
    return false;
  }
}

// Bytes of the swizzle span; 0 for no swizzle.
unsigned swizzleSpan(uint32_t swizzle) {
  switch (swizzle) {
  case CU_TENSOR_MAP_SWIZZLE_32B:
    return 32;
  case CU_TENSOR_MAP_SWIZZLE_64B:
    return 64;
  case CU_TENSOR_MAP_SWIZZLE_128B:
  case CU_TENSOR_MAP_SWIZZLE_128B_ATOM_32B:
  case CU_TENSOR_MAP_SWIZZLE_128B_ATOM_32B_FLIP_8B:
  case CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B:
    return 128;
  default:
    return 0;
  }
}

moeStatus report(moeTensorMapRule rule, const char *detail,
                 moeTensorMapRule *failedRule) {
  if (failedRule)
    *failedRule = rule;
  moeStatus status = rule == MOE_TMA_RULE_MAP_ALIGNMENT ||
                             rule == MOE_TMA_RULE_ADDRESS_ALIGNMENT ||
                             rule == MOE_TMA_RULE_STRIDE_MULTIPLE
                         ? MOE_ERROR_MISALIGNED
                         : MOE_ERROR_INVALID_ARGUMENT;
  return fail(status, "tensor map: %s: %s", moeTensorMapRuleString(rule),
              detail);
}

#define MOE_TMA_FAIL(rule, ...)                                                \
  do {                                                                         \
    char detail[192];                                                          \
    std::snprintf(detail, sizeof(detail), __VA_ARGS__);                        \
    return report(rule, detail, failedRule);                                   \
  } while (false)

// Device-resident maps of moeTensorMapDeviceBf16, per device: slots of 128
// bytes in chunks that live as long as the process (a kernel in flight may
// read any slot), found by the arguments that made them.
constexpr size_t kMapsPerChunk = 512;
using MapKey = std::array<int64_t, 14>;

struct DeviceMaps {
  std::map<MapKey, CUdeviceptr> slots;
  std::vector<CUdeviceptr> chunks;
  // Pinned host copies of the chunks' maps, which a CUDA graph's upload
  // copies from at every replay.
  std::vector<moeTensorMap *> hostChunks;
  size_t used = 0; // slots handed out since the last start-over
  // The chunk the slots since the last start-over begin in, and the end of
  // the chunks that ever held a slot of a CUDA graph: those slots stay the
  // graph's (its replays refill them), so a start-over begins past them.
  size_t firstChunk = 0;
  size_t graphChunksEnd = 0;
  CUstream upload = nullptr; // non-blocking: waits for nothing else
  // The slots made while the call's stream was captured into a CUDA graph:
  // filled by the graph's replays, so never handed to an eager call.
  std::map<MapKey, CUdeviceptr> captured;
};

struct MapCache {
  std::mutex mutex;
  std::map<int, DeviceMaps> devices;
};

MapCache &mapCache() {
  static MapCache *cache = new MapCache;
  return *cache;
}

// A free slot of `maps`; at the cache limit, waits for the device (kernels
// may still read the old maps) and starts over.
/// Allocates the next chunk of slots and its pinned host copy.
moeStatus growChunks(const DriverApi *api, DeviceMaps &maps) {
  CUdeviceptr memory = 0;
  if (CUresult result =
          api->cuMemAlloc(&memory, kMapsPerChunk * sizeof(moeTensorMap)))
    return failCuda(result, "cuMemAlloc", "tensor map cache");
  void *host = nullptr;
  if (CUresult result =
          api->cuMemHostAlloc(&host, kMapsPerChunk * sizeof(moeTensorMap), 0)) {
    (void)api->cuMemFree(memory);
    return failCuda(result, "cuMemHostAlloc", "tensor map cache");
  }
  maps.chunks.push_back(memory);
  maps.hostChunks.push_back(static_cast<moeTensorMap *>(host));
  return MOE_SUCCESS;
}

/// A free slot of `maps` and its pinned host copy; at the cache limit, waits
/// for the device (kernels may still read the old maps) and starts over.
/// During a capture (`capturing`) neither may happen: the next chunk is
/// allocated ahead, when the current one is taken, and a full cache is an
/// error that says to run the step once before capturing it.
moeStatus takeSlot(const DriverApi *api, DeviceMaps &maps, bool capturing,
                   CUdeviceptr &slot, moeTensorMap *&host) {
  if (maps.slots.size() + maps.captured.size() >= MOE_TENSOR_MAP_CACHE_LIMIT) {
    if (capturing)
      return fail(MOE_ERROR_CUDA,
                  "tensor map cache: full while a CUDA graph is being "
                  "captured (%d maps); run the step once before capturing it",
                  MOE_TENSOR_MAP_CACHE_LIMIT);
    if (CUresult result = api->cuCtxSynchronize())
      return failCuda(result, "cuCtxSynchronize",
                      "before the tensor map cache starts over");
    maps.firstChunk = maps.graphChunksEnd;
    maps.slots.clear();
    maps.captured.clear();
    maps.used = 0;
  }
  size_t chunk = maps.firstChunk + maps.used / kMapsPerChunk;
  if (chunk == maps.chunks.size()) {
    if (capturing)
      return fail(MOE_ERROR_CUDA,
                  "tensor map cache: no free slot while a CUDA graph is being "
                  "captured; run the step once before capturing it");
    if (moeStatus status = growChunks(api, maps))
      return status;
  }
  // One chunk ahead outside captures, which cannot allocate.
  if (!capturing && chunk + 1 == maps.chunks.size() &&
      maps.used % kMapsPerChunk == kMapsPerChunk / 2)
    if (moeStatus status = growChunks(api, maps))
      return status;
  if (capturing)
    maps.graphChunksEnd = std::max(maps.graphChunksEnd, chunk + 1);
  size_t index = maps.used % kMapsPerChunk;
  slot = maps.chunks[chunk] + index * sizeof(moeTensorMap);
  host = maps.hostChunks[chunk] + index;
  ++maps.used;
  return MOE_SUCCESS;
}

/// Whether the call's stream is being captured into a CUDA graph.
bool callStreamCapturing(const DriverApi *api) {
  auto stream = static_cast<CUstream>(moe::runtime::callStream());
  if (!stream || !api->cuStreamIsCapturing)
    return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return api->cuStreamIsCapturing(stream, &status) == CUDA_SUCCESS &&
         status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

} // namespace

void moe::runtime::resetTensorMapsForTesting() {
  MapCache &cache = mapCache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  // The driver is about to be reset: give its memory and streams back first.
  if (const DriverApi *api = loadedDriver())
    for (auto &entry : cache.devices) {
      for (CUdeviceptr chunk : entry.second.chunks)
        (void)api->cuMemFree(chunk);
      for (moeTensorMap *host : entry.second.hostChunks)
        (void)api->cuMemFreeHost(host);
      if (entry.second.upload)
        (void)api->cuStreamDestroy(entry.second.upload);
    }
  cache.devices.clear();
}

extern "C" {

const char *moeTensorMapRuleString(moeTensorMapRule rule) {
  switch (rule) {
  case MOE_TMA_RULE_OK:
    return "no rule broken";
  case MOE_TMA_RULE_NULL_POINTER:
    return "tensorMap, globalAddress, globalDim, boxDim and (rank > 1) "
           "globalStrides must not be null";
  case MOE_TMA_RULE_MAP_ALIGNMENT:
    return "tensorMap must be 64-byte aligned";
  case MOE_TMA_RULE_DATA_TYPE:
    return "tensorDataType must be a CUtensorMapDataType";
  case MOE_TMA_RULE_RANK:
    return "tensorRank must be 1..5 (3..5 when interleaved)";
  case MOE_TMA_RULE_ADDRESS_ALIGNMENT:
    return "globalAddress must be 16-byte aligned (32-byte with 32B "
           "interleave or a 16U*_ALIGN16B type)";
  case MOE_TMA_RULE_GLOBAL_DIM:
    return "globalDim must be 1..2^32 (dim 0 a multiple of 128 for "
           "16U*_ALIGN16B, of 2 for 16U4_ALIGN8B)";
  case MOE_TMA_RULE_STRIDE_MULTIPLE:
    return "globalStrides must be multiples of 16 (of 32 with 32B "
           "interleave or a 16U*_ALIGN16B type)";
  case MOE_TMA_RULE_STRIDE_RANGE:
    return "globalStrides must be less than 2^40";
  case MOE_TMA_RULE_BOX_DIM:
    return "boxDim must be 1..256 (boxDim[0] 128 for 16U*_ALIGN16B)";
  case MOE_TMA_RULE_BOX_INNER_BYTES:
    return "boxDim[0] * element size must be a multiple of 16 bytes without "
           "interleave";
  case MOE_TMA_RULE_SWIZZLE_SPAN:
    return "with swizzle and no interleave, boxDim[0] * element size must "
           "not exceed the swizzle span (32, 64 or 128 bytes)";
  case MOE_TMA_RULE_ELEMENT_STRIDE:
    return "elementStrides must be 1..8";
  case MOE_TMA_RULE_INTERLEAVE:
    return "interleave must be a CUtensorMapInterleave; 32B interleave "
           "needs 32B swizzle; 16U6_ALIGN16B needs no interleave";
  case MOE_TMA_RULE_SWIZZLE:
    return "swizzle must be a CUtensorMapSwizzle allowed for the data type";
  case MOE_TMA_RULE_L2_PROMOTION:
    return "l2Promotion must be a CUtensorMapL2promotion";
  case MOE_TMA_RULE_OOB_FILL:
    return "oobFill must be a CUtensorMapFloatOOBfill; NaN fill needs a "
           "floating-point, unpacked data type";
  }
  return "unknown tensor map rule";
}

moeStatus
moeTensorMapValidate(const void *tensorMap, uint32_t dataType, uint32_t rank,
                     const void *globalAddress, const uint64_t *globalDim,
                     const uint64_t *globalStrides, const uint32_t *boxDim,
                     const uint32_t *elementStrides, uint32_t interleave,
                     uint32_t swizzle, uint32_t l2Promotion, uint32_t oobFill,
                     moeTensorMapRule *failedRule) {
  if (failedRule)
    *failedRule = MOE_TMA_RULE_OK;
  if (!tensorMap || !globalAddress || !globalDim || !boxDim ||
      (rank > 1 && !globalStrides))
    MOE_TMA_FAIL(MOE_TMA_RULE_NULL_POINTER, "%s is null",
                 !tensorMap       ? "tensorMap"
                 : !globalAddress ? "globalAddress"
                 : !globalDim     ? "globalDim"
                 : !boxDim        ? "boxDim"
                                  : "globalStrides");
  uintptr_t mapAddress = reinterpret_cast<uintptr_t>(tensorMap);
  if (mapAddress % 64 != 0)
    MOE_TMA_FAIL(MOE_TMA_RULE_MAP_ALIGNMENT,
                 "tensorMap %p is %u bytes past "
                 "a 64-byte boundary",
                 tensorMap, unsigned(mapAddress % 64));
  unsigned bits = elementBits(dataType);
  if (bits == 0)
    MOE_TMA_FAIL(MOE_TMA_RULE_DATA_TYPE, "data type %u", dataType);
  if (interleave > CU_TENSOR_MAP_INTERLEAVE_32B)
    MOE_TMA_FAIL(MOE_TMA_RULE_INTERLEAVE, "interleave %u", interleave);
  if (swizzle > CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B)
    MOE_TMA_FAIL(MOE_TMA_RULE_SWIZZLE, "swizzle %u", swizzle);
  if (l2Promotion > CU_TENSOR_MAP_L2_PROMOTION_L2_256B)
    MOE_TMA_FAIL(MOE_TMA_RULE_L2_PROMOTION, "l2Promotion %u", l2Promotion);
  if (oobFill > CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA)
    MOE_TMA_FAIL(MOE_TMA_RULE_OOB_FILL, "oobFill %u", oobFill);

  bool interleaved = interleave != CU_TENSOR_MAP_INTERLEAVE_NONE;
  if (rank < 1 || rank > kMaxRank || (interleaved && rank < 3))
    MOE_TMA_FAIL(MOE_TMA_RULE_RANK, "rank %u%s", rank,
                 interleaved ? " with interleave" : "");

  bool needs32 =
      interleave == CU_TENSOR_MAP_INTERLEAVE_32B || isPacked16B(dataType);
  unsigned addressAlignment = needs32 ? 32 : 16;
  uintptr_t address = reinterpret_cast<uintptr_t>(globalAddress);
  if (address % addressAlignment != 0)
    MOE_TMA_FAIL(MOE_TMA_RULE_ADDRESS_ALIGNMENT,
                 "globalAddress %p is not %u-byte aligned", globalAddress,
                 addressAlignment);

  for (uint32_t i = 0; i < rank; ++i)
    if (globalDim[i] == 0 || globalDim[i] > (uint64_t(1) << 32))
      MOE_TMA_FAIL(MOE_TMA_RULE_GLOBAL_DIM, "globalDim[%u] = %" PRIu64, i,
                   globalDim[i]);
  if (isPacked16B(dataType) && globalDim[0] % 128 != 0)
    MOE_TMA_FAIL(MOE_TMA_RULE_GLOBAL_DIM,
                 "globalDim[0] = %" PRIu64 " is not a multiple of 128",
                 globalDim[0]);
  if (dataType == CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B && globalDim[0] % 2)
    MOE_TMA_FAIL(MOE_TMA_RULE_GLOBAL_DIM,
                 "globalDim[0] = %" PRIu64 " is not a multiple of 2",
                 globalDim[0]);

  unsigned strideMultiple = needs32 ? 32 : 16;
  for (uint32_t i = 0; i + 1 < rank; ++i) {
    if (globalStrides[i] % strideMultiple != 0)
      MOE_TMA_FAIL(MOE_TMA_RULE_STRIDE_MULTIPLE,
                   "globalStrides[%u] = %" PRIu64 " is not a multiple of %u", i,
                   globalStrides[i], strideMultiple);
    if (globalStrides[i] >= (uint64_t(1) << 40))
      MOE_TMA_FAIL(MOE_TMA_RULE_STRIDE_RANGE, "globalStrides[%u] = %" PRIu64, i,
                   globalStrides[i]);
  }

  for (uint32_t i = 0; i < rank; ++i)
    if (boxDim[i] == 0 || boxDim[i] > 256)
      MOE_TMA_FAIL(MOE_TMA_RULE_BOX_DIM, "boxDim[%u] = %u", i, boxDim[i]);
  if (isPacked16B(dataType) && boxDim[0] != 128)
    MOE_TMA_FAIL(MOE_TMA_RULE_BOX_DIM, "boxDim[0] = %u, not 128", boxDim[0]);
  uint64_t innerBits = uint64_t(boxDim[0]) * bits;
  if (!interleaved && innerBits % (16 * 8) != 0)
    MOE_TMA_FAIL(MOE_TMA_RULE_BOX_INNER_BYTES,
                 "boxDim[0] = %u elements of %u bits is %" PRIu64
                 " bits, not a whole multiple of 16 bytes",
                 boxDim[0], bits, innerBits);
  unsigned span = swizzleSpan(swizzle);
  if (!interleaved && span && innerBits > uint64_t(span) * 8)
    MOE_TMA_FAIL(MOE_TMA_RULE_SWIZZLE_SPAN,
                 "boxDim[0] = %u is %" PRIu64 " bytes, over the %u-byte span",
                 boxDim[0], innerBits / 8, span);

  if (elementStrides)
    for (uint32_t i = 0; i < rank; ++i)
      if (elementStrides[i] == 0 || elementStrides[i] > 8)
        MOE_TMA_FAIL(MOE_TMA_RULE_ELEMENT_STRIDE, "elementStrides[%u] = %u", i,
                     elementStrides[i]);

  if (interleave == CU_TENSOR_MAP_INTERLEAVE_32B &&
      swizzle != CU_TENSOR_MAP_SWIZZLE_32B)
    MOE_TMA_FAIL(MOE_TMA_RULE_INTERLEAVE,
                 "32B interleave with swizzle %u instead of 32B", swizzle);
  if (dataType == CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B && interleaved)
    MOE_TMA_FAIL(MOE_TMA_RULE_INTERLEAVE, "16U6_ALIGN16B with interleave %u",
                 interleave);
  if (isPacked16B(dataType) && swizzle != CU_TENSOR_MAP_SWIZZLE_NONE &&
      swizzle != CU_TENSOR_MAP_SWIZZLE_128B &&
      swizzle != CU_TENSOR_MAP_SWIZZLE_128B_ATOM_32B &&
      !(dataType == CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B &&
        swizzle == CU_TENSOR_MAP_SWIZZLE_128B_ATOM_64B))
    MOE_TMA_FAIL(MOE_TMA_RULE_SWIZZLE, "swizzle %u for packed type %u", swizzle,
                 dataType);
  if (oobFill == CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA &&
      !isFloat(dataType))
    MOE_TMA_FAIL(MOE_TMA_RULE_OOB_FILL, "NaN fill with data type %u", dataType);
  return MOE_SUCCESS;
}

moeStatus moeTensorMapEncodeTiled(
    void *tensorMap, uint32_t dataType, uint32_t rank, void *globalAddress,
    const uint64_t *globalDim, const uint64_t *globalStrides,
    const uint32_t *boxDim, const uint32_t *elementStrides, uint32_t interleave,
    uint32_t swizzle, uint32_t l2Promotion, uint32_t oobFill) {
  if (moeStatus status = moeTensorMapValidate(
          tensorMap, dataType, rank, globalAddress, globalDim, globalStrides,
          boxDim, elementStrides, interleave, swizzle, l2Promotion, oobFill,
          nullptr))
    return status;
  static const cuuint32_t kUnitStrides[kMaxRank] = {1, 1, 1, 1, 1};
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  if (CUresult result = api->cuTensorMapEncodeTiled(
          static_cast<CUtensorMap *>(tensorMap),
          static_cast<CUtensorMapDataType>(dataType), rank, globalAddress,
          reinterpret_cast<const cuuint64_t *>(globalDim),
          reinterpret_cast<const cuuint64_t *>(globalStrides),
          reinterpret_cast<const cuuint32_t *>(boxDim),
          elementStrides ? reinterpret_cast<const cuuint32_t *>(elementStrides)
                         : kUnitStrides,
          static_cast<CUtensorMapInterleave>(interleave),
          static_cast<CUtensorMapSwizzle>(swizzle),
          static_cast<CUtensorMapL2promotion>(l2Promotion),
          static_cast<CUtensorMapFloatOOBfill>(oobFill)))
    return failCuda(result, "cuTensorMapEncodeTiled");
  return MOE_SUCCESS;
}

moeStatus moeTensorMapReplaceAddress(void *tensorMap, void *globalAddress) {
  if (!tensorMap)
    return fail(MOE_ERROR_INVALID_ARGUMENT,
                "moeTensorMapReplaceAddress: null tensorMap");
  if (reinterpret_cast<uintptr_t>(tensorMap) % 64 != 0)
    return fail(MOE_ERROR_MISALIGNED,
                "moeTensorMapReplaceAddress: tensorMap %p is not 64-byte "
                "aligned",
                tensorMap);
  if (reinterpret_cast<uintptr_t>(globalAddress) % 16 != 0)
    return fail(MOE_ERROR_MISALIGNED,
                "moeTensorMapReplaceAddress: globalAddress %p is not 16-byte "
                "aligned",
                globalAddress);
  const DriverApi *api;
  if (moeStatus status = getContext(api))
    return status;
  if (CUresult result = api->cuTensorMapReplaceAddress(
          static_cast<CUtensorMap *>(tensorMap), globalAddress))
    return failCuda(result, "cuTensorMapReplaceAddress");
  return MOE_SUCCESS;
}

void *moeTensorMapDeviceBf16(void *globalAddress, int64_t rank, int64_t dim0,
                             int64_t dim1, int64_t dim2, int64_t dim3,
                             int64_t stride1, int64_t stride2, int64_t stride3,
                             int64_t box0, int64_t box1, int64_t box2,
                             int64_t box3) {
  if (moeGetLastStatus() != MOE_SUCCESS)
    return nullptr;
  if (rank < 1 || rank > 4) {
    fail(MOE_ERROR_INVALID_ARGUMENT,
         "moeTensorMapDeviceBf16: rank %" PRId64 " is not 1..4", rank);
    return nullptr;
  }
  const int64_t dims[4] = {dim0, dim1, dim2, dim3};
  const int64_t strides[3] = {stride1, stride2, stride3};
  const int64_t boxes[4] = {box0, box1, box2, box3};
  MapKey key = {int64_t(currentDevice()),
                int64_t(reinterpret_cast<uintptr_t>(globalAddress)), rank};
  uint64_t globalDim[4], globalStrides[3];
  uint32_t boxDim[4];
  for (int64_t i = 0; i < rank; ++i) {
    // Negative values would wrap to sizes the rules then accept.
    if (dims[i] < 0 || boxes[i] < 0 || (i + 1 < rank && strides[i] < 0)) {
      fail(MOE_ERROR_INVALID_ARGUMENT,
           "moeTensorMapDeviceBf16: dim, stride or box %" PRId64 " is negative",
           i);
      return nullptr;
    }
    globalDim[i] = uint64_t(dims[i]);
    boxDim[i] = boxes[i] > 256 ? 0 : uint32_t(boxes[i]); // 0 fails the rule
    key[3 + i] = dims[i];
    key[7 + i] = boxes[i];
    if (i + 1 < rank)
      key[11 + i] = globalStrides[i] = uint64_t(strides[i]);
  }

  const DriverApi *api;
  if (getContext(api))
    return nullptr;
  // Captured into a CUDA graph, the map is uploaded by the graph (from its
  // pinned host copy, on the call's stream) at every replay, before the
  // kernels that read it; eager calls get slots of their own.
  bool capturing = callStreamCapturing(api);
  MapCache &cache = mapCache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  DeviceMaps &maps = cache.devices[currentDevice()];
  auto &slots = capturing ? maps.captured : maps.slots;
  auto found = slots.find(key);
  if (found != slots.end())
    return reinterpret_cast<void *>(found->second);

  moeTensorMap map;
  if (moeTensorMapEncodeTiled(
          &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, uint32_t(rank), globalAddress,
          globalDim, globalStrides, boxDim, nullptr,
          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
          CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
    return nullptr;
  CUdeviceptr slot = 0;
  moeTensorMap *host = nullptr;
  if (takeSlot(api, maps, capturing, slot, host))
    return nullptr;
  *host = map;
  if (capturing) {
    if (CUresult result = api->cuMemcpyHtoDAsync(
            slot, host, sizeof(map),
            static_cast<CUstream>(moe::runtime::callStream()))) {
      failCuda(result, "cuMemcpyHtoDAsync", "tensor map upload into a graph");
      return nullptr;
    }
    maps.captured.emplace(key, slot);
    return reinterpret_cast<void *>(slot);
  }
  if (!maps.upload &&
      createStream(CU_STREAM_NON_BLOCKING, &maps.upload) != MOE_SUCCESS)
    return nullptr;
  // The upload completes before any later launch is queued: kernels that
  // read the slot come after it on every stream.
  if (CUresult result =
          api->cuMemcpyHtoDAsync(slot, host, sizeof(map), maps.upload)) {
    failCuda(result, "cuMemcpyHtoDAsync", "tensor map upload");
    return nullptr;
  }
  if (CUresult result = api->cuStreamSynchronize(maps.upload)) {
    failCuda(result, "cuStreamSynchronize", "tensor map upload");
    return nullptr;
  }
  maps.slots.emplace(key, slot);
  return reinterpret_cast<void *>(slot);
}

size_t moeTensorMapDeviceCacheSize(void) {
  MapCache &cache = mapCache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  auto found = cache.devices.find(currentDevice());
  return found == cache.devices.end() ? 0 : found->second.slots.size();
}

} // extern "C"
