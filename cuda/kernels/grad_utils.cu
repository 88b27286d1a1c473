// Whole-arena gradient kernels for the trainer's step: unscaling for dynamic
// loss scaling (optim/loss_scale.hpp has the policy, on the host) and the sum
// of squares behind global-norm clipping.
#include "kernels/launch.cuh"
#include "ringtrain/cuda/element_math.hpp"
#include "ringtrain/cuda/kernels.hpp"

namespace ringtrain::cuda {
namespace {

constexpr unsigned kNormBlocks = 256;  // fixed: the summation order never depends on the device

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

template <typename T>
__global__ void sum_squares_partial(const T* x, std::size_t n, double* partial) {
  double s = 0.0;
  RT_GRID_STRIDE(i, n) {
    double v = static_cast<double>(to_acc(x[i]));
    s += v * v;
  }
  s = block_sum(s);
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
