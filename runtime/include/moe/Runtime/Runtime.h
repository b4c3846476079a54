/*===- Runtime.h - moe-mlir CUDA driver-API runtime (C API) -------*- C -*-===*\
|*                                                                            *|
|* The thin runtime that runs generated kernels on NVIDIA Hopper: lazy        *|
|* driver loading, primary contexts, a module and function cache, launches    *|
|* (clusters too), streams, events, a device arena, pinned host buffers,      *|
|* async copies and TMA descriptors. The mgpu* ABI that MLIR's gpu-to-llvm    *|
|* emits is declared in MgpuABI.h and built on the same internals.            *|
|*                                                                            *|
|* Conventions:                                                               *|
|* - Every function returns a moeStatus; nothing aborts or exits.             *|
|* - A failure also records, for the calling thread, the status and a         *|
|*   message (the failing CUDA call, its error name and string, the JIT log   *|
|*   for a failed PTX load). Read them with moeGetLastStatus and              *|
|*   moeGetLastErrorMessage; they stay until the next failure or until        *|
|*   moeClearLastError. Successful calls leave them alone.                    *|
|* - Argument checks run before the driver is touched, so they give the same  *|
|*   status with or without a GPU.                                            *|
|* - libcuda.so.1 is dlopen'ed on the first call that needs it (MOE_LIBCUDA   *|
|*   overrides the path). Without it those calls return MOE_ERROR_NO_DRIVER.  *|
|* - Contexts: the primary context of the calling thread's device (0 unless   *|
|*   moeSetDevice says otherwise) is made current once per thread.            *|
|*                                                                            *|
|* This header needs no CUDA header. Integer enums that cuda.h defines        *|
|* (CUtensorMapDataType, ...) are passed as uint32_t with cuda.h's values.    *|
|*                                                                            *|
\*===----------------------------------------------------------------------===*/

#ifndef MOE_RUNTIME_RUNTIME_H
#define MOE_RUNTIME_RUNTIME_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define MOE_RUNTIME_EXPORT __declspec(dllexport)
#else
#define MOE_RUNTIME_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/*===----------------------------------------------------------------------===*/
/* Status and errors                                                          */
/*===----------------------------------------------------------------------===*/

typedef enum moeStatus {
  MOE_SUCCESS = 0,
  /* libcuda.so.1 (or MOE_LIBCUDA) could not be opened, lacks an entry point,
     or is the toolkit's stub library. */
  MOE_ERROR_NO_DRIVER = 1,
  /* The driver loaded but sees no (such) device. */
  MOE_ERROR_NO_DEVICE = 2,
  MOE_ERROR_INVALID_ARGUMENT = 3,
  /* A pointer, size or stride violates an alignment rule. */
  MOE_ERROR_MISALIGNED = 4,
  /* Device, pinned host or arena memory exhausted. */
  MOE_ERROR_OUT_OF_MEMORY = 5,
  /* cuModuleLoadData(Ex) rejected the image; PTX loads add the JIT log. */
  MOE_ERROR_MODULE_LOAD = 6,
  /* A kernel name that the module does not define. */
  MOE_ERROR_NOT_FOUND = 7,
  /* Launch shape vs kernel (block > .maxntid, grid not a multiple of the
     cluster), or sizes that do not fit together. */
  MOE_ERROR_SHAPE_MISMATCH = 8,
  /* Any other CUresult; the message has its name and string. */
  MOE_ERROR_CUDA = 9,
  /* A kernel faulted (illegal address, trap, ...). The context is unusable
     from then on, as CUDA specifies. */
  MOE_ERROR_KERNEL_FAULT = 10,
} moeStatus;

/* Number of moeStatus values; they are 0 .. MOE_NUM_STATUS_CODES - 1. */
#define MOE_NUM_STATUS_CODES 11

/* "MOE_SUCCESS", "MOE_ERROR_NO_DRIVER", ...; "MOE_ERROR_UNKNOWN" for a value
   outside the enum. Never null. */
MOE_RUNTIME_EXPORT const char *moeStatusString(moeStatus status);

/* The status of this thread's last failure (MOE_SUCCESS if none). */
MOE_RUNTIME_EXPORT moeStatus moeGetLastStatus(void);

/* The message of this thread's last failure ("" if none). Valid until this
   thread's next runtime call. Never null. */
MOE_RUNTIME_EXPORT const char *moeGetLastErrorMessage(void);

MOE_RUNTIME_EXPORT void moeClearLastError(void);

/* Records `status` and `message` (null reads as "") as this thread's last
   error and returns `status`. The generated entry points use it to refuse
   bad pointer arguments (docs/gpu-path.md section 2). */
MOE_RUNTIME_EXPORT moeStatus moeSetErrorMessage(moeStatus status,
                                                const char *message);

/* The caller's stream for the mgpu* calls of a generated entry point (a
   CUstream; thread-local). While it is non-null, mgpuStreamCreate returns it
   (borrowed) and mgpuStreamSynchronize/mgpuStreamDestroy on it do nothing,
   so the generated code enqueues its work there and returns without
   waiting. NULL (the default) restores: create a stream, wait, destroy.
   Always returns MOE_SUCCESS. */
MOE_RUNTIME_EXPORT moeStatus moeSetLaunchStream(void *stream);
MOE_RUNTIME_EXPORT void *moeGetLaunchStream(void);

/*===----------------------------------------------------------------------===*/
/* Driver, devices, contexts                                                  */
/*===----------------------------------------------------------------------===*/

/* Loads the driver and calls cuInit(0). Other calls do this on demand. */
MOE_RUNTIME_EXPORT moeStatus moeInit(void);

/* CUDA driver version (e.g. 13000), from cuDriverGetVersion. */
MOE_RUNTIME_EXPORT moeStatus moeDriverGetVersion(int *version);

MOE_RUNTIME_EXPORT moeStatus moeGetDeviceCount(int *count);

/* Selects the device used by this thread's later calls (default 0). */
MOE_RUNTIME_EXPORT moeStatus moeSetDevice(int ordinal);
MOE_RUNTIME_EXPORT moeStatus moeGetDevice(int *ordinal);

MOE_RUNTIME_EXPORT moeStatus moeDeviceGetComputeCapability(int *major,
                                                           int *minor);

/* cuCtxSynchronize on this thread's device. */
MOE_RUNTIME_EXPORT moeStatus moeDeviceSynchronize(void);

/* Test hook: drops every cached module, context and the driver itself, so
   that the next call loads the driver again (reading MOE_LIBCUDA again).
   Handles obtained before are invalid afterwards. Not thread-safe with
   other runtime calls. */
MOE_RUNTIME_EXPORT void moeRuntimeResetForTesting(void);

/*===----------------------------------------------------------------------===*/
/* Modules and functions                                                      */
/*===----------------------------------------------------------------------===*/

typedef struct moeModule_st *moeModule;
typedef struct moeFunction_st *moeFunction;

/* Loads a cubin, fatbin or PTX image (told apart by its first bytes: ELF
   and fatbin magic load with cuModuleLoadData, anything else is taken as
   NUL-terminated PTX and JIT-compiled at optimization level 4 with the
   error log captured). `size` is the image size in bytes (>= 4).
   Modules are cached by (image pointer, device): loading the same image
   again returns the same module and counts a reference. The image must stay
   alive and unchanged while the module is loaded. */
MOE_RUNTIME_EXPORT moeStatus moeModuleLoad(const void *image, size_t size,
                                           moeModule *module);

/* JIT-compiles NUL-terminated PTX with CU_JIT_OPTIMIZATION_LEVEL = optLevel
   (0..4). On failure the last error message holds the JIT error log.
   Cached like moeModuleLoad. */
MOE_RUNTIME_EXPORT moeStatus moeModuleLoadPTX(const char *ptx, int optLevel,
                                              moeModule *module);

/* Drops one reference; the last one unloads the module and invalidates its
   functions. */
MOE_RUNTIME_EXPORT moeStatus moeModuleUnload(moeModule module);

/* Looks a kernel up by name, cached per module. The first lookup queries its
   attributes and sets CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES once,
   to the most the device allows beside the kernel's static shared memory,
   so launches may ask for more than 48 KB without further calls. */
MOE_RUNTIME_EXPORT moeStatus moeModuleGetFunction(moeModule module,
                                                  const char *name,
                                                  moeFunction *function);

typedef struct moeFunctionInfo {
  int numRegs;             /* CU_FUNC_ATTRIBUTE_NUM_REGS */
  int staticSmemBytes;     /* CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES */
  int localBytes;          /* CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES */
  int maxThreadsPerBlock;  /* CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK */
  int maxDynamicSmemBytes; /* the value set at lookup */
} moeFunctionInfo;

MOE_RUNTIME_EXPORT moeStatus moeFunctionGetInfo(moeFunction function,
                                                moeFunctionInfo *info);

/*===----------------------------------------------------------------------===*/
/* Streams and events                                                         */
/*===----------------------------------------------------------------------===*/

/* A CUstream. Null is the legacy default stream. */
typedef struct moeStream_st *moeStream;
typedef struct moeEvent_st *moeEvent;

/* cuStreamCreate(CU_STREAM_NON_BLOCKING). */
MOE_RUNTIME_EXPORT moeStatus moeStreamCreate(moeStream *stream);
MOE_RUNTIME_EXPORT moeStatus moeStreamDestroy(moeStream stream);
MOE_RUNTIME_EXPORT moeStatus moeStreamSynchronize(moeStream stream);
MOE_RUNTIME_EXPORT moeStatus moeStreamWaitEvent(moeStream stream,
                                                moeEvent event);

/* A dependency event (CU_EVENT_DISABLE_TIMING): cheap, cannot be timed. */
MOE_RUNTIME_EXPORT moeStatus moeEventCreate(moeEvent *event);
/* A timing event, for moeEventElapsedMs. */
MOE_RUNTIME_EXPORT moeStatus moeEventCreateTiming(moeEvent *event);
MOE_RUNTIME_EXPORT moeStatus moeEventRecord(moeEvent event, moeStream stream);
MOE_RUNTIME_EXPORT moeStatus moeEventSynchronize(moeEvent event);
/* Milliseconds between two recorded timing events. */
MOE_RUNTIME_EXPORT moeStatus moeEventElapsedMs(moeEvent start, moeEvent end,
                                               float *milliseconds);
MOE_RUNTIME_EXPORT moeStatus moeEventDestroy(moeEvent event);

/*===----------------------------------------------------------------------===*/
/* Launch                                                                     */
/*===----------------------------------------------------------------------===*/

/* Most dynamic shared memory one block may use on sm_90 (227 KB). */
#define MOE_MAX_DYNAMIC_SMEM_BYTES (227u * 1024u)
#define MOE_MAX_THREADS_PER_BLOCK 1024u
/* Largest portable cluster (blocks). */
#define MOE_MAX_CLUSTER_BLOCKS 8u

typedef struct moeLaunchConfig {
  /* Grid in blocks (with clusters too: a multiple of the cluster dims). */
  uint32_t gridX, gridY, gridZ;
  uint32_t blockX, blockY, blockZ;
  /* All zero: a plain cuLaunchKernel. Otherwise each >= 1, at most
     MOE_MAX_CLUSTER_BLOCKS blocks, launched with cuLaunchKernelEx and
     CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION. */
  uint32_t clusterX, clusterY, clusterZ;
  uint32_t sharedMemBytes; /* dynamic shared memory per block */
  moeStream stream;
} moeLaunchConfig;

/* Checks a configuration without the driver: grid and block non-zero and
   within CUDA's limits (grid x < 2^31, y and z <= 65535; block x, y <= 1024,
   z <= 64, x*y*z <= 1024), smem <= MOE_MAX_DYNAMIC_SMEM_BYTES, cluster dims
   as above and dividing the grid. */
MOE_RUNTIME_EXPORT moeStatus moeLaunchValidate(const moeLaunchConfig *config);

/* Validates (also against the function: block <= its max threads, smem <=
   its max dynamic smem), then launches. `params` is the cuLaunchKernel
   array of pointers to each argument (null for a kernel without any). */
MOE_RUNTIME_EXPORT moeStatus moeLaunch(moeFunction function,
                                       const moeLaunchConfig *config,
                                       void **params);

/*===----------------------------------------------------------------------===*/
/* Memory                                                                     */
/*===----------------------------------------------------------------------===*/

/* A CUdeviceptr. */
typedef uint64_t moeDevicePtr;

/* cuMemAlloc; bytes > 0. */
MOE_RUNTIME_EXPORT moeStatus moeMemAlloc(size_t bytes, moeDevicePtr *ptr);
MOE_RUNTIME_EXPORT moeStatus moeMemFree(moeDevicePtr ptr);
MOE_RUNTIME_EXPORT moeStatus moeMemGetInfo(size_t *freeBytes,
                                           size_t *totalBytes);

/* Pinned host memory (cuMemHostAlloc, CU_MEMHOSTALLOC_PORTABLE); bytes > 0. */
MOE_RUNTIME_EXPORT moeStatus moeHostAlloc(size_t bytes, void **ptr);
MOE_RUNTIME_EXPORT moeStatus moeHostFree(void *ptr);

/* Async copies on `stream`. Pointers must be non-null and bytes > 0. Host
   memory must be pinned for the copy to be asynchronous. */
MOE_RUNTIME_EXPORT moeStatus moeMemcpyHtoDAsync(moeDevicePtr dst,
                                                const void *src, size_t bytes,
                                                moeStream stream);
MOE_RUNTIME_EXPORT moeStatus moeMemcpyDtoHAsync(void *dst, moeDevicePtr src,
                                                size_t bytes, moeStream stream);
MOE_RUNTIME_EXPORT moeStatus moeMemcpyDtoDAsync(moeDevicePtr dst,
                                                moeDevicePtr src, size_t bytes,
                                                moeStream stream);
/* Sets `count` 32-bit words; dst must be 4-byte aligned and count > 0. */
MOE_RUNTIME_EXPORT moeStatus moeMemsetD32Async(moeDevicePtr dst, uint32_t value,
                                               size_t count, moeStream stream);

/* Waits until every offload copy of a saved tensor (a layer compiled with
   policy=offload, docs/memory.md) that this thread's device has in flight is
   done: the pinned host buffers its forward entry points wrote may then be
   read or freed. A backward entry point waits for its own saved tensors; a
   forward called without a lent stream waits before it returns. */
MOE_RUNTIME_EXPORT moeStatus moeOffloadSynchronize(void);

/* Starts bringing the offloaded saved tensor in the pinned buffer `host`
   (`bytes` long, as the manifest gives it) back to the device now, on the
   copy stream, for the backward entry point that takes `host` next: called
   before the backward of the layer after it, the copy overlaps that backward.
   The backward takes the buffer over; without that backward, the device
   memory stays held. */
MOE_RUNTIME_EXPORT moeStatus moePrefetchSaved(void *host, size_t bytes);

/*===----------------------------------------------------------------------===*/
/* Device arena: one cuMemAlloc block, bump allocation                        */
/*===----------------------------------------------------------------------===*/

typedef struct moeArena_st *moeArena;

typedef struct moeArenaInfo {
  moeDevicePtr base;
  size_t capacity;  /* bytes */
  size_t used;      /* bytes since the last reset, alignment padding included */
  size_t highWater; /* largest `used` since creation */
  size_t allocations; /* since the last reset */
} moeArenaInfo;

/* Default alignment of moeArenaAlloc (the cuMemAlloc guarantee). */
#define MOE_ARENA_DEFAULT_ALIGNMENT 256u

MOE_RUNTIME_EXPORT moeStatus moeArenaCreate(size_t capacity, moeArena *arena);
/* bytes > 0; alignment a power of two (0 = MOE_ARENA_DEFAULT_ALIGNMENT).
   MOE_ERROR_OUT_OF_MEMORY when it does not fit; the arena is unchanged. */
MOE_RUNTIME_EXPORT moeStatus moeArenaAlloc(moeArena arena, size_t bytes,
                                           size_t alignment, moeDevicePtr *ptr);
/* Frees every allocation at once (the high-water mark is kept). The caller
   orders this after the work that uses the memory. */
MOE_RUNTIME_EXPORT moeStatus moeArenaReset(moeArena arena);
MOE_RUNTIME_EXPORT moeStatus moeArenaGetInfo(moeArena arena,
                                             moeArenaInfo *info);
MOE_RUNTIME_EXPORT moeStatus moeArenaDestroy(moeArena arena);

/*===----------------------------------------------------------------------===*/
/* TMA descriptors                                                            */
/*===----------------------------------------------------------------------===*/

/* A CUtensorMap: 128 bytes, 128-byte aligned like CUDA 13's cuda.h (the
   driver itself requires 64). */
typedef struct moeTensorMap {
  __attribute__((aligned(128))) uint64_t opaque[16];
} moeTensorMap;

/* The rule of cuda.h's cuTensorMapEncodeTiled (CUDA 13) that a descriptor
   breaks. */
typedef enum moeTensorMapRule {
  MOE_TMA_RULE_OK = 0,
  MOE_TMA_RULE_NULL_POINTER,      /* map, address, dims, box, strides */
  MOE_TMA_RULE_MAP_ALIGNMENT,     /* tensorMap 64-B aligned */
  MOE_TMA_RULE_DATA_TYPE,         /* a CUtensorMapDataType value */
  MOE_TMA_RULE_RANK,              /* 1..5, >= 3 when interleaved */
  MOE_TMA_RULE_ADDRESS_ALIGNMENT, /* 16 B (32 B: 32B interleave,
                                     16U*_ALIGN16B)*/
  MOE_TMA_RULE_GLOBAL_DIM,        /* 1..2^32, packed-type multiples */
  MOE_TMA_RULE_STRIDE_MULTIPLE,   /* multiple of 16 (32 as for the address) */
  MOE_TMA_RULE_STRIDE_RANGE,      /* < 2^40 */
  MOE_TMA_RULE_BOX_DIM,           /* 1..256; 128 for 16U*_ALIGN16B */
  MOE_TMA_RULE_BOX_INNER_BYTES,   /* boxDim[0] * elemsize multiple of 16 */
  MOE_TMA_RULE_SWIZZLE_SPAN,      /* inner box bytes <= swizzle span */
  MOE_TMA_RULE_ELEMENT_STRIDE,    /* 1..8 */
  MOE_TMA_RULE_INTERLEAVE,        /* a CUtensorMapInterleave; 32B needs 32B
                                     swizzle */
  MOE_TMA_RULE_SWIZZLE,           /* a CUtensorMapSwizzle, allowed for type */
  MOE_TMA_RULE_L2_PROMOTION,      /* a CUtensorMapL2promotion */
  MOE_TMA_RULE_OOB_FILL,          /* a CUtensorMapFloatOOBfill; NaN fill needs
                                     a float type */
} moeTensorMapRule;

#define MOE_NUM_TMA_RULES 17

/* A one-line statement of the rule ("tensorMap must be 64-byte aligned"). */
MOE_RUNTIME_EXPORT const char *moeTensorMapRuleString(moeTensorMapRule rule);

/* Checks the arguments of cuTensorMapEncodeTiled against cuda.h's rules
   without the driver. The enums take cuda.h's values. globalStrides has
   rank - 1 entries (may be null for rank 1); elementStrides may be null
   (all 1). On failure returns MOE_ERROR_MISALIGNED (alignment rules) or
   MOE_ERROR_INVALID_ARGUMENT, stores the rule in *failedRule if given, and
   records a message naming the rule and the offending value. */
MOE_RUNTIME_EXPORT moeStatus moeTensorMapValidate(
    const void *tensorMap, uint32_t dataType, uint32_t rank,
    const void *globalAddress, const uint64_t *globalDim,
    const uint64_t *globalStrides, const uint32_t *boxDim,
    const uint32_t *elementStrides, uint32_t interleave, uint32_t swizzle,
    uint32_t l2Promotion, uint32_t oobFill, moeTensorMapRule *failedRule);

/* moeTensorMapValidate, then cuTensorMapEncodeTiled. */
MOE_RUNTIME_EXPORT moeStatus moeTensorMapEncodeTiled(
    void *tensorMap, uint32_t dataType, uint32_t rank, void *globalAddress,
    const uint64_t *globalDim, const uint64_t *globalStrides,
    const uint32_t *boxDim, const uint32_t *elementStrides, uint32_t interleave,
    uint32_t swizzle, uint32_t l2Promotion, uint32_t oobFill);

/* cuTensorMapReplaceAddress: re-point an encoded map (per expert), 16-B
   aligned address. */
MOE_RUNTIME_EXPORT moeStatus moeTensorMapReplaceAddress(void *tensorMap,
                                                        void *globalAddress);

/* The device address of a CUtensorMap for a dense bf16 tensor, for kernels
   that take their map by pointer (the generated GEMMs load their weight
   operand by TMA this way). dims[0..rank) run innermost first; strides[i] is
   the byte stride of dim i + 1 (i < rank - 1); unused entries are ignored.
   The map has 128B swizzle, 256B L2 promotion and zero fill, is encoded and
   uploaded once, and is cached per device by its arguments: a training loop
   that passes the same weights every step finds its maps without touching
   the driver. A cache that reaches MOE_TENSOR_MAP_CACHE_LIMIT maps waits for
   the device and starts over. Like the mgpu* functions it does nothing
   while a failure is pending. Returns null on failure, with the status and
   a message (the broken rule of moeTensorMapValidate) as the last error. */
#define MOE_TENSOR_MAP_CACHE_LIMIT 4096
MOE_RUNTIME_EXPORT void *
moeTensorMapDeviceBf16(void *globalAddress, int64_t rank, int64_t dim0,
                       int64_t dim1, int64_t dim2, int64_t dim3,
                       int64_t stride1, int64_t stride2, int64_t stride3,
                       int64_t box0, int64_t box1, int64_t box2, int64_t box3);

/* Maps moeTensorMapDeviceBf16 holds on this thread's device (for tests). */
MOE_RUNTIME_EXPORT size_t moeTensorMapDeviceCacheSize(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MOE_RUNTIME_RUNTIME_H */
