// How fast the tensor pipe runs m64n256k16 bf16 wgmma, with the shapes of our
// GEMM tiles: two consumer warpgroups a CTA (a 128x256 tile) against one (what
// a 64-row tile would leave), on random operands against zero rows (what
// padding multiplies), for S seconds of back-to-back work each, so the 700 W
// power cap that long bf16 work runs into is in the numbers
// (docs/gpu-kernels.md section 5.6). One CTA an SM, its operands in shared
// memory as the kernels' 128B-swizzled K-major tiles; each warpgroup issues 4
// wgmma a k-step, commits and waits for the k-step before, as kloop_ws does.
//   nvcc -gencode arch=compute_90a,code=sm_90a -O3 -o /tmp/wgmma_warpgroups \
//     test/GPU/wgmma_warpgroups.cu
//   /tmp/wgmma_warpgroups [seconds per case, default 3]
// Prints one line a case: WGMMA <case>: <TFLOP/s> over <s> (<k-steps a
// warpgroup>); and where NVML loads (libnvidia-ml.so.1, opened at run time, so
// nothing more to link): the mean power over the timed run from the energy
// counter, joules per TFLOP, and the SM clock and power limit halfway through.
// The energy says what zero rows cost under the power cap, where the time alone
// cannot (zero rows run as fast as random ones).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <thread>

namespace {

// A: 2 x 8 KiB (64 rows each), B: 32 KiB (256 rows)
constexpr int kSmemBytes = 48 * 1024;
// 128B swizzle, SBO 1024 B (the library's K-major descriptor,
// HopperDescriptors.h kDescriptorKMajor)
constexpr uint64_t kDescKMajor = 0x4000004004000000ull;

__device__ uint64_t descriptor(const void *smem) {
  uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  return kDescKMajor | ((addr & 0x3FFFF) >> 4);
}

__device__ void wgmma(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
      "%30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
      "%46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
      "%62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, "
      "%78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, "
      "%94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, "
      "%108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, "
      "%124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
        "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]),
        "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]),
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]),
        "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
        "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]),
        "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
        "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]),
        "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]),
        "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]),
        "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]),
        "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]),
        "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]),
        "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]),
        "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]),
        "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]),
        "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]),
        "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),
        "+f"(d[126]), "+f"(d[127])
      : "l"(a), "l"(b));
}

// warpgroups [0, active) run `ksteps` k-steps of 4 wgmma on their 64 rows of A
// and all of B; rows of warpgroup 1 are zero when zero_wg1 (a tile's padding),
// all operands when zeros
__global__ void __launch_bounds__(256, 1)
    wgmmaLoop(long long ksteps, int active, int zeros, int zero_wg1,
              float *sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  auto *half = reinterpret_cast<unsigned short *>(smem);
  for (int i = threadIdx.x; i < kSmemBytes / 2; i += blockDim.x) {
    bool zero = zeros ||
                (zero_wg1 && i >= 4096 && i < 8192); // bytes 8-16 KiB: wg 1's A
    // a bf16 of magnitude 2^-7 to 2^-6, sign and mantissa from a hash of the
    // index: random bits toggle like real data
    uint32_t h = (i * 2654435761u) ^ (blockIdx.x * 40503u);
    unsigned short bits = 0x3c00 | (h & 0x7f) | ((h >> 7) & 1) << 15;
    half[i] = zero ? 0 : bits;
  }
  __syncthreads();
  int wg = threadIdx.x / 128;
  if (wg >= active)
    return;
  float d[128];
  for (float &v : d)
    v = 0.f;
  uint64_t a = descriptor(smem + wg * 8192), b = descriptor(smem + 16384);
  for (long long k = 0; k < ksteps; ++k) {
    // as the generated kernels: a fence before each k-step's wgmma (without it
    // ptxas inserts its own and warns, C7519)
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    for (int kk = 0; kk < 4; ++kk) // 16 K-columns = 32 B further along each row
      wgmma(d, a + 2 * kk, b + 2 * kk);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  float sum = 0.f;
  for (float v : d)
    sum += v;
  if (sum == 12345.f) // never: keeps the accumulators live
    sink[threadIdx.x] = sum;
}

// The few NVML calls used, declared here (the toolkit on the GPU machine ships
// no nvml.h); NVML's device 0 is taken to be CUDA's (one GPU on the machine).
struct Nvml {
  using Device = void *;
  int (*init)() = nullptr;
  int (*handle)(unsigned, Device *) = nullptr;
  int (*energy)(Device, unsigned long long *) = nullptr; // mJ
  int (*clock)(Device, int, unsigned *) = nullptr;       // MHz
  int (*limit)(Device, unsigned *) = nullptr;            // mW
  Device device = nullptr;

  bool load() {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib)
      return false;
    init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    handle = reinterpret_cast<int (*)(unsigned, Device *)>(
        dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    energy = reinterpret_cast<int (*)(Device, unsigned long long *)>(
        dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption"));
    clock = reinterpret_cast<int (*)(Device, int, unsigned *)>(
        dlsym(lib, "nvmlDeviceGetClockInfo"));
    limit = reinterpret_cast<int (*)(Device, unsigned *)>(
        dlsym(lib, "nvmlDeviceGetEnforcedPowerLimit"));
    return init && handle && energy && clock && limit && init() == 0 &&
           handle(0, &device) == 0;
  }
  // millijoules since the driver loaded, or 0 when NVML cannot say
  unsigned long long millijoules() const {
    unsigned long long mj = 0;
    return device && energy(device, &mj) == 0 ? mj : 0;
  }
};

bool check(cudaError_t rc, const char *what) {
  if (rc == cudaSuccess)
    return true;
  std::printf("WGMMA error: %s: %s\n", what, cudaGetErrorString(rc));
  return false;
}

} // namespace

int main(int argc, char **argv) {
  double seconds = argc > 1 ? std::atof(argv[1]) : 3.0;
  if (!(seconds > 0)) {
    std::printf("usage: wgmma_warpgroups [seconds per case > 0]\n");
    return 2;
  }
  int sms = 0;
  float *sink = nullptr;
  if (!check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0),
             "SM count") ||
      !check(cudaFuncSetAttribute(wgmmaLoop,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  kSmemBytes),
             "shared memory") ||
      !check(cudaMalloc(&sink, 256 * sizeof(float)), "cudaMalloc"))
    return 1;
  struct Case {
    const char *name;
    int active, zeros, zeroWg1;
  } cases[] = {{"2 warpgroups, random", 2, 0, 0},
               {"1 warpgroup, random", 1, 0, 0},
               {"2 warpgroups, warpgroup 1's rows zero", 2, 0, 1},
               {"2 warpgroups, all zero", 2, 1, 0},
               {"2 warpgroups, random (again)", 2, 0, 0}};
  Nvml nvml;
  if (!nvml.load())
    std::printf("WGMMA note: NVML not loaded, no power or energy\n");
  for (const Case &c : cases) {
    // calibrate: k-steps that take about `seconds`, from a short run
    long long ksteps = 2000;
    double took = 0;
    unsigned long long mj0 = 0, mj1 = 0;
    unsigned mhz = 0, limit_mw = 0;
    for (int round = 0; round < 2; ++round) {
      mj0 = nvml.millijoules();
      auto t0 = std::chrono::steady_clock::now();
      wgmmaLoop<<<sms, 256, kSmemBytes>>>(ksteps, c.active, c.zeros, c.zeroWg1,
                                          sink);
      if (round == 1 && nvml.device) {
        // the clock halfway through the timed run, where the power cap acts
        std::this_thread::sleep_for(std::chrono::duration<double>(seconds / 2));
        nvml.clock(nvml.device, /*NVML_CLOCK_SM=*/1, &mhz);
        nvml.limit(nvml.device, &limit_mw);
      }
      if (!check(cudaDeviceSynchronize(), c.name))
        return 1;
      took =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
              .count();
      mj1 = nvml.millijoules();
      if (round == 0)
        ksteps = static_cast<long long>(ksteps * seconds / took) + 1;
    }
    double flops = 2.0 * 64 * 256 * 64 * double(ksteps) * c.active * sms;
    std::printf("WGMMA %s: %.0f TFLOP/s over %.2f s (%lld k-steps a warpgroup)",
                c.name, flops / took * 1e-12, took, ksteps);
    if (mj0 && mj1 > mj0) {
      double joules = (mj1 - mj0) * 1e-3;
      std::printf("; %.0f W, %.3f J/TFLOP, SM %u MHz halfway (limit %.0f W)",
                  joules / took, joules / (flops * 1e-12), mhz,
                  limit_mw * 1e-3);
    }
    std::printf("\n");
  }
  cudaFree(sink);
  return 0;
}
