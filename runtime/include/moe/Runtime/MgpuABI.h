/*===- MgpuABI.h - The mgpu* functions that gpu-to-llvm calls -----*- C -*-===*\
|*                                                                            *|
|* The host ABI that MLIR 22.1's gpu-to-llvm emits calls to, with the exact   *|
|* signatures of docs/gpu-kernels.md section 6.8 (LLVM IR types in the        *|
|* comments). Re-check them with mlir-translate on every LLVM bump.           *|
|*                                                                            *|
|* These functions return void or a pointer, so failures are recorded as the *|
|* thread's last error (moeGetLastStatus / moeGetLastErrorMessage in          *|
|* Runtime.h) and the pointer results are null; nothing aborts. Set           *|
|* MOE_RUNTIME_VERBOSE=1 to also print each failure to stderr.                *|
|*                                                                            *|
|* Inside a generated call (which clears the last error first), a recorded   *|
|* failure stops later work: while moeGetLastStatus() is not MOE_SUCCESS,     *|
|* mgpuModuleGetFunction, the launches, mgpuMemcpy, mgpuMemset32 and          *|
|* mgpuMemAlloc do nothing (null results), so no kernel runs on a null        *|
|* buffer. Frees, synchronizations and destroys still run, and keep the      *|
|* first failure as the last error.                                           *|
|*                                                                            *|
|* Streams: see moeSetLaunchStream in Runtime.h. mgpuMemAlloc with a stream   *|
|* allocates stream-ordered from the device's default memory pool            *|
|* (cuMemAllocAsync; the pool keeps freed memory), mgpuMemFree of such a      *|
|* pointer frees it on the given stream (cuMemFreeAsync); without pool        *|
|* support in the driver or device, cuMemAlloc and cuMemFree.                 *|
|*                                                                            *|
|* Handles: a module is a moeModule, a function a moeFunction, an event a     *|
|* moeEvent, a stream a CUstream (as in Runtime.h).                           *|
|*                                                                            *|
\*===----------------------------------------------------------------------===*/

#ifndef MOE_RUNTIME_MGPUABI_H
#define MOE_RUNTIME_MGPUABI_H

#include "moe/Runtime/Runtime.h"

#ifndef __cplusplus
#include <stdbool.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ptr (ptr data, i64 size): cubin or fatbin (PTX is accepted too). */
MOE_RUNTIME_EXPORT void *mgpuModuleLoad(void *data, uint64_t size);
/* ptr (ptr ptx, i32 optLevel): PTX, JIT log recorded on failure. */
MOE_RUNTIME_EXPORT void *mgpuModuleLoadJIT(void *data, int32_t optLevel);
/* void (ptr) */
MOE_RUNTIME_EXPORT void mgpuModuleUnload(void *module);
/* ptr (ptr module, ptr name) */
MOE_RUNTIME_EXPORT void *mgpuModuleGetFunction(void *module, const char *name);

/* void (ptr f, i64 gx, i64 gy, i64 gz, i64 bx, i64 by, i64 bz, i32 smem,
         ptr stream, ptr params, ptr extra, i64 paramsCount): 12 args. */
MOE_RUNTIME_EXPORT void mgpuLaunchKernel(void *function, intptr_t gridX,
                                         intptr_t gridY, intptr_t gridZ,
                                         intptr_t blockX, intptr_t blockY,
                                         intptr_t blockZ, int32_t smem,
                                         void *stream, void **params,
                                         void **extra, size_t paramsCount);

/* void (ptr f, i64 cx, i64 cy, i64 cz, i64 gx, i64 gy, i64 gz, i64 bx,
         i64 by, i64 bz, i32 smem, ptr stream, ptr params, ptr extra):
   14 args, no count. The grid is in blocks, a multiple of the cluster. */
MOE_RUNTIME_EXPORT void
mgpuLaunchClusterKernel(void *function, intptr_t clusterX, intptr_t clusterY,
                        intptr_t clusterZ, intptr_t gridX, intptr_t gridY,
                        intptr_t gridZ, intptr_t blockX, intptr_t blockY,
                        intptr_t blockZ, int32_t smem, void *stream,
                        void **params, void **extra);

/* ptr () / void (ptr) / void (ptr) */
MOE_RUNTIME_EXPORT void *mgpuStreamCreate(void);
MOE_RUNTIME_EXPORT void mgpuStreamSynchronize(void *stream);
MOE_RUNTIME_EXPORT void mgpuStreamDestroy(void *stream);

/* ptr () / void (ptr ev, ptr stream) / void (ptr stream, ptr ev) /
   void (ptr) / void (ptr) */
MOE_RUNTIME_EXPORT void *mgpuEventCreate(void);
MOE_RUNTIME_EXPORT void mgpuEventRecord(void *event, void *stream);
MOE_RUNTIME_EXPORT void mgpuStreamWaitEvent(void *stream, void *event);
MOE_RUNTIME_EXPORT void mgpuEventSynchronize(void *event);
MOE_RUNTIME_EXPORT void mgpuEventDestroy(void *event);

/* ptr (i64 bytes, ptr stream, i8 hostShared): hostShared allocates managed
   memory (cuMemAllocManaged). 0 bytes gives null without an error. */
MOE_RUNTIME_EXPORT void *mgpuMemAlloc(uint64_t sizeBytes, void *stream,
                                      bool hostShared);
/* void (ptr, ptr stream); null is a no-op. */
MOE_RUNTIME_EXPORT void mgpuMemFree(void *ptr, void *stream);

/* void (ptr dst, ptr src, i64 bytes, ptr stream): cuMemcpyAsync on unified
   addresses; 0 bytes is a no-op. */
MOE_RUNTIME_EXPORT void mgpuMemcpy(void *dst, void *src, size_t sizeBytes,
                                   void *stream);
/* void (ptr, i32 value, i64 count, ptr stream); 0 words is a no-op. */
MOE_RUNTIME_EXPORT void mgpuMemset32(void *dst, uint32_t value, size_t count,
                                     void *stream);

/* void (i32): this thread's device, as moeSetDevice. */
MOE_RUNTIME_EXPORT void mgpuSetDefaultDevice(int32_t device);

/* Offload of saved tensors (moe.offload and moe.prefetch on the GPU path,
   docs/gpu-path.md), called by generated code between the launches of a
   call, on the call's stream (what its mgpuStreamCreate returned). The
   copies run on a copy stream of the device, one per device, ordered after
   the work the call enqueued so far, so they overlap the work after them.

   void (ptr host, ptr device, i64 bytes, i32 freeDevice): copies `device` to
   the pinned `host` buffer; with freeDevice, frees `device` (an mgpuMemAlloc
   buffer) on the copy stream once the copy is done. The copy stays in flight
   after the call returns; mgpuMoePrefetch of `host` waits for it. */
MOE_RUNTIME_EXPORT void mgpuMoeOffload(void *host, void *device, uint64_t bytes,
                                       int32_t freeDevice);
/* i64 (ptr host, i64 bytes): a device buffer (stream-ordered, freed with
   mgpuMemFree) into which `host` is being copied back, after the offload into
   `host` if one is in flight; 0 after a failure. The buffer and the copy
   belong to the copy stream, so the copy does not wait for the call's earlier
   work; one moePrefetchSaved started for `host` is taken over instead. Work
   that reads the buffer waits with mgpuMoeAwaitPrefetch; the work between the
   two overlaps the copy. */
MOE_RUNTIME_EXPORT uint64_t mgpuMoePrefetch(void *host, uint64_t bytes);
/* void (ptr device): the call's stream waits for the prefetch into `device`. */
MOE_RUNTIME_EXPORT void mgpuMoeAwaitPrefetch(void *device);
/* void (): the end of a call that offloaded. Without a lent stream (a call
   that returns when its work is done) waits for its copies; with one, the
   copies stay in flight (moeOffloadSynchronize waits for them). */
MOE_RUNTIME_EXPORT void mgpuMoeOffloadsFinish(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* MOE_RUNTIME_MGPUABI_H */
