// How many clusters of 1, 2 and 4 CTAs the GPU holds at once for a CTA shaped
// like the persistent GEMMs' (384 threads, one an SM by its shared memory): a
// cluster variant that launches SM-count CTAs in pairs (the 2-CTA multicast of
// docs/gpu-kernels.md, decision T13) only runs them all at once if every pair
// fits.
//   nvcc -gencode arch=compute_90a,code=sm_90a -o /tmp/cluster_occupancy \
//     test/GPU/cluster_occupancy.cu && /tmp/cluster_occupancy
// (bash scripts/gpu/session.sh tensor runs it)
#include <cstdio>
#include <cuda_runtime.h>

__global__ void shapedLikeGemm(int *out) {
  extern __shared__ int smem[];
  smem[threadIdx.x] = threadIdx.x;
  if (out)
    out[blockIdx.x] = smem[0];
}

int main() {
  int device = 0, sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int smemBytes = 200 * 1024;
  if (cudaFuncSetAttribute(shapedLikeGemm,
                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                           smemBytes) != cudaSuccess) {
    std::printf("CLUSTERS error: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  for (int size : {1, 2, 4}) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(sms, 1, 1);
    config.blockDim = dim3(384, 1, 1);
    config.dynamicSmemBytes = smemBytes;
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = size;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    int clusters = 0;
    cudaError_t rc =
        cudaOccupancyMaxActiveClusters(&clusters, shapedLikeGemm, &config);
    if (rc != cudaSuccess) {
      std::printf("CLUSTERS size %d: error %s\n", size, cudaGetErrorString(rc));
      return 1;
    }
    std::printf("CLUSTERS size %d: %d at once = %d of %d SMs busy\n", size,
                clusters, clusters * size, sms);
  }
  return 0;
}
