//===- smoke_kernels.cu - Kernels of the runtime's GPU smoke test ---------===//
//
// Built at build time with `nvcc -ptx -arch=sm_90a` and `nvcc -cubin
// -arch=sm_90a` and embedded in moe-runtime-smoke. extern "C" keeps the
// symbol names plain, as MLIR's gpu.func names are.
//
//===----------------------------------------------------------------------===//

#include <cooperative_groups.h>
#include <cuda.h>
#include <cuda/barrier>

#include <cstdint>

namespace cg = cooperative_groups;

// y = a * x + b.
extern "C" __global__ void __launch_bounds__(256)
    axpb(float *y, const float *x, float a, float b, unsigned n) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n)
    y[i] = a * x[i] + b;
}

// Each block reverses its n words through dynamic shared memory (launched
// with more than 48 KB).
extern "C" __global__ void __launch_bounds__(256)
    smem_reverse(const unsigned *in, unsigned *out, unsigned n) {
  extern __shared__ unsigned buffer[];
  const unsigned *src = in + size_t(blockIdx.x) * n;
  unsigned *dst = out + size_t(blockIdx.x) * n;
  for (unsigned i = threadIdx.x; i < n; i += blockDim.x)
    buffer[i] = src[i];
  __syncthreads();
  for (unsigned i = threadIdx.x; i < n; i += blockDim.x)
    dst[i] = buffer[n - 1 - i];
}

// Clusters of 2: each block reads its peer's shared memory (distributed
// shared memory), which only works when the launch really formed clusters.
// out[2b] = peer's value (peer block index * 10 + 1), out[2b+1] = blocks in
// the cluster.
extern "C" __global__ void cluster_exchange(unsigned *out) {
  __shared__ unsigned value;
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0)
    value = blockIdx.x * 10 + 1;
  cluster.sync();
  unsigned *peer = cluster.map_shared_rank(&value, cluster.block_rank() ^ 1);
  if (threadIdx.x == 0) {
    out[2 * blockIdx.x] = *peer;
    out[2 * blockIdx.x + 1] = cluster.num_blocks();
  }
  cluster.sync();
}

// One TMA load of a 128 x 64 bf16 box (128B swizzle) at (x, y), through a
// tensor map passed by value (__grid_constant__), copied out raw: the host
// checks the swizzled layout.
using Barrier = cuda::barrier<cuda::thread_scope_block>;
namespace cde = cuda::device::experimental;

extern "C" __global__ void __launch_bounds__(128)
    tma_load_tile(const __grid_constant__ CUtensorMap map, int x, int y,
                  uint4 *out) {
  __shared__ alignas(1024) unsigned char tile[128 * 128];
#pragma nv_diag_suppress static_var_with_dynamic_init
  __shared__ Barrier bar;
  if (threadIdx.x == 0) {
    init(&bar, blockDim.x);
    cde::fence_proxy_async_shared_cta();
  }
  __syncthreads();
  Barrier::arrival_token token;
  if (threadIdx.x == 0) {
    cde::cp_async_bulk_tensor_2d_global_to_shared(tile, &map, x, y, bar);
    token = cuda::device::barrier_arrive_tx(bar, 1, sizeof(tile));
  } else {
    token = bar.arrive();
  }
  bar.wait(cuda::std::move(token));
  const uint4 *words = reinterpret_cast<const uint4 *>(tile);
  for (unsigned i = threadIdx.x; i < sizeof(tile) / 16; i += blockDim.x)
    out[i] = words[i];
}
