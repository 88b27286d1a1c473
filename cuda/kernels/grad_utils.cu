// Whole-arena gradient kernels for the trainer's step: unscaling for dynamic
// loss scaling (optim/loss_scale.hpp has the policy, on the host) and the sum
// of squares behind global-norm clipping.
#include "kernels/launch.cuh"
#include "ringtrain/cuda/element_math.hpp"
#include "ringtrain/cuda/kernels.hpp"

namespace ringtrain::cuda {
namespace {

// Fixed, so the summation order never depends on the device: 1024 blocks of
// 256 threads fill an H100 (8 blocks per SM) where 256 blocks read at 22% of
// its copy bandwidth (bench_gpu_kernels).
constexpr unsigned kNormBlocks = 1024;

template <typename T>
__global__ void unscale_kernel(T* g, std::size_t n, float inv, int* flag) {
  bool bad = false;
  RT_GRID_STRIDE(i, n) {
    auto v = to_acc(g[i]) * static_cast<acc_t<T>>(inv);
    bad |= !isfinite(v);
    g[i] = from_acc<T>(v);
  }
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *flag = 1;
}

__device__ double block_sum(double v) {
  __shared__ double sh[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
  __syncthreads();
  double s = 0.0;
  if (threadIdx.x == 0)
    for (unsigned w = 0; w < (blockDim.x >> 5); ++w) s += sh[w];
  return s;  // valid in thread 0
}

// Four independent accumulators per thread (elements i, i+G, i+2G, i+3G of a
// grid of G threads): four loads in flight and no single dependent chain of
// fp64 adds. The order is still a function of n alone.
template <typename T>
__global__ void sum_squares_partial(const T* x, std::size_t n, double* partial) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  const std::size_t g = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  for (; i + 3 * g < n; i += 4 * g) {
    const double a = to_acc(x[i]), b = to_acc(x[i + g]), c = to_acc(x[i + 2 * g]), d = to_acc(x[i + 3 * g]);
    s0 += a * a;
    s1 += b * b;
    s2 += c * c;
    s3 += d * d;
  }
  for (; i < n; i += g) {
    const double a = to_acc(x[i]);
    s0 += a * a;
  }
  double s = block_sum((s0 + s1) + (s2 + s3));
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_partials(const double* partial, unsigned blocks, double* out, bool accumulate) {
  double s = 0.0;
  for (unsigned b = threadIdx.x; b < blocks; b += blockDim.x) s += partial[b];
  s = block_sum(s);
  if (threadIdx.x == 0) *out = accumulate ? *out + s : s;
}

}  // namespace

void unscale_and_check(void* grads, std::size_t n, DType dt, float inv_scale, int* flag, cudaStream_t s) {
  if (n == 0) return;
  detail::dispatch_float(dt, "unscale_and_check", [&](auto tag) {
    using T = decltype(tag);
    unscale_kernel<T><<<detail::blocks_for(n), detail::kThreads, 0, s>>>(static_cast<T*>(grads), n, inv_scale, flag);
  });
  RT_CUDA_LAUNCHED("unscale_and_check");
}

std::size_t sum_squares_scratch_bytes() { return kNormBlocks * sizeof(double); }

void sum_squares(const void* x, std::size_t n, DType dt, double* out, bool accumulate, void* scratch,
                 cudaStream_t s) {
  auto* partial = static_cast<double*>(scratch);
  detail::dispatch_float(dt, "sum_squares", [&](auto tag) {
    using T = decltype(tag);
    sum_squares_partial<T><<<kNormBlocks, detail::kThreads, 0, s>>>(static_cast<const T*>(x), n, partial);
  });
  sum_partials<<<1, detail::kThreads, 0, s>>>(partial, kNormBlocks, out, accumulate);
  RT_CUDA_LAUNCHED("sum_squares");
}

}  // namespace ringtrain::cuda
