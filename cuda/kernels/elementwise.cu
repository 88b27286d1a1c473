// Element-wise layers (axpby, ReLU, GELU, dropout) and the non-finite check.
// All compute in float (double for f64) and store in the tensor's dtype.
#include <cmath>

#include "kernels/launch.cuh"
#include "ringtrain/cuda/element_math.hpp"
#include "ringtrain/cuda/kernels.hpp"

namespace ringtrain::cuda {
namespace {

constexpr int kThreadsPerBlock = 256;  // bias_grad's block (power of two for the tree)

template <typename T>
__global__ void axpby_kernel(T* d, const T* a, const T* b, float alpha, float beta, std::size_t n) {
  RT_GRID_STRIDE(i, n) {
    using A = acc_t<T>;
    d[i] = from_acc<T>(static_cast<A>(alpha) * to_acc(a[i]) + static_cast<A>(beta) * to_acc(b[i]));
  }
}

template <typename T>
__global__ void relu_fwd_kernel(T* y, const T* x, std::size_t n) {
  RT_GRID_STRIDE(i, n) {
    auto v = to_acc(x[i]);
    y[i] = v > 0 ? x[i] : from_acc<T>(0);
  }
}

template <typename T>
__global__ void relu_bwd_kernel(T* dx, const T* dy, const T* y, std::size_t n) {
  RT_GRID_STRIDE(i, n) { dx[i] = to_acc(y[i]) > 0 ? dy[i] : from_acc<T>(0); }
}

template <typename T>
__global__ void gelu_fwd_kernel(T* y, const T* x, std::size_t n, bool approx_tanh) {
  RT_GRID_STRIDE(i, n) {
    const float v = static_cast<float>(to_acc(x[i]));
    y[i] = from_acc<T>(static_cast<acc_t<T>>(approx_tanh ? gelu_tanh(v) : gelu(v)));
  }
}

template <typename T>
__global__ void gelu_bwd_kernel(T* dx, const T* dy, const T* x, std::size_t n, bool approx_tanh) {
  RT_GRID_STRIDE(i, n) {
    const float v = static_cast<float>(to_acc(x[i]));
    float g = approx_tanh ? gelu_tanh_grad(v) : gelu_grad(v);
    dx[i] = from_acc<T>(static_cast<acc_t<T>>(g * static_cast<float>(to_acc(dy[i]))));
  }
}

template <typename T>
__global__ void dropout_fwd_kernel(T* y, std::uint8_t* mask, const T* x, std::size_t n, float p, float inv_keep,
                                   std::uint64_t seed, std::uint64_t offset, std::uint64_t first) {
  RT_GRID_STRIDE(i, n) {
    bool keep = dropout_keep(seed, offset, first + i, p);
    mask[i] = keep;
    y[i] = from_acc<T>(keep ? to_acc(x[i]) * static_cast<acc_t<T>>(inv_keep) : static_cast<acc_t<T>>(0));
  }
}

template <typename T>
__global__ void dropout_bwd_kernel(T* dx, const T* dy, const std::uint8_t* mask, std::size_t n, float inv_keep) {
  RT_GRID_STRIDE(i, n) {
    dx[i] = from_acc<T>(mask[i] ? to_acc(dy[i]) * static_cast<acc_t<T>>(inv_keep) : static_cast<acc_t<T>>(0));
  }
}

template <typename T>
__global__ void finite_kernel(const T* x, std::size_t n, int* flag) {
  bool bad = false;
  RT_GRID_STRIDE(i, n) {
    auto v = to_acc(x[i]);
    bad |= !isfinite(v);
  }
  // One write per warp that saw a bad value; no atomics needed (any 1 wins).
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *flag = 1;
}

// B: the bias's type (T, or float32 for 16-bit activations); the sum in T's accumulator, rounded once.
template <typename T, typename B>
__global__ void bias_add_kernel(T* y, const B* b, std::int64_t channels, std::int64_t inner, std::size_t n,
                                bool relu) {
  RT_GRID_STRIDE(i, n) {
    std::int64_t c = static_cast<std::int64_t>(i / static_cast<std::size_t>(inner)) % channels;
    auto v = to_acc(y[i]) + static_cast<acc_t<T>>(to_acc(b[c]));
    if (relu && !(v > 0)) v = 0;
    y[i] = from_acc<T>(v);
  }
}

// P: the gradient's type (T, or float32 for 16-bit activations); sums in P's accumulator.
template <typename T, typename P>
__global__ void bias_grad_kernel(P* db, const T* dy, std::int64_t outer, std::int64_t channels, std::int64_t inner,
                                 bool accumulate) {
  using A = acc_t<P>;
  const std::int64_t c = blockIdx.x;
  A s = 0;
  for (std::int64_t n = 0; n < outer; ++n) {
    const T* row = dy + (n * channels + c) * inner;
    for (std::int64_t i = threadIdx.x; i < inner; i += blockDim.x) s += static_cast<A>(to_acc(row[i]));
  }
  __shared__ A sh[kThreadsPerBlock];
  sh[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {  // fixed-shape tree: deterministic
    if (threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[c] = from_acc<P>(accumulate ? to_acc(db[c]) + sh[0] : sh[0]);
}

}  // namespace

void bias_add(void* y, const void* b, std::int64_t outer, std::int64_t channels, std::int64_t inner, bool relu,
              DType dt, DType b_dt, cudaStream_t s) {
  RT_CHECK(outer >= 0 && channels > 0 && inner > 0, "bias_add: bad shape [", outer, ", ", channels, ", ", inner, "]");
  std::size_t n = static_cast<std::size_t>(outer * channels * inner);
  if (n == 0) return;
  detail::dispatch_act_param(dt, b_dt, "cuda::bias_add", [&](auto tag, auto btag) {
    using T = decltype(tag);
    using B = decltype(btag);
    bias_add_kernel<T, B><<<detail::blocks_for(n), detail::kThreads, 0, s>>>(
        static_cast<T*>(y), static_cast<const B*>(b), channels, inner, n, relu);
  });
  RT_CUDA_LAUNCHED("bias_add");
}

void bias_grad(void* db, const void* dy, std::int64_t outer, std::int64_t channels, std::int64_t inner,
               bool accumulate, DType dt, DType db_dt, cudaStream_t s) {
  RT_CHECK(outer >= 0 && channels > 0 && inner > 0, "bias_grad: bad shape [", outer, ", ", channels, ", ", inner, "]");
  RT_CHECK(channels < (1ll << 31), "bias_grad: too many channels");
  detail::dispatch_act_param(dt, db_dt, "cuda::bias_grad", [&](auto tag, auto ptag) {
    using T = decltype(tag);
    using P = decltype(ptag);
    bias_grad_kernel<T, P><<<static_cast<unsigned>(channels), kThreadsPerBlock, 0, s>>>(
        static_cast<P*>(db), static_cast<const T*>(dy), outer, channels, inner, accumulate);
  });
  RT_CUDA_LAUNCHED("bias_grad");
}

void axpby(void* dst, const void* a, const void* b, float alpha, float beta, std::size_t n, DType dt,
           cudaStream_t s) {
  if (n == 0) return;
  detail::dispatch_float(dt, "cuda::axpby", [&](auto tag) {
    using T = decltype(tag);
    axpby_kernel<T><<<detail::blocks_for(n), detail::kThreads, 0, s>>>(
        static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), alpha, beta, n);
  });
  RT_CUDA_LAUNCHED("axpby");
}

void relu_forward(void* y, const void* x, std::size_t n, DType dt, cudaStream_t s) {
  if (n == 0) return;
  detail::dispatch_float(dt, "cuda::relu_forward", [&](auto tag) {
    using T = decltype(tag);
    relu_fwd_kernel<T><<<detail::blocks_for(n), detail::kThreads, 0, s>>>(static_cast<T*>(y),
                                                                          static_cast<const T*>(x), n);
  });
  RT_CUDA_LAUNCHED("relu_forward");
}

void relu_backward(void* dx, const void* dy, const void* y, std::size_t n, DType dt, cudaStream_t s) {
  if (n == 0) return;
  detail::dispatch_float(dt, "cuda::relu_backward", [&](auto tag) {
    using T = decltype(tag);
    relu_bwd_kernel<T><<<detail::blocks_for(n), detail::kThreads, 0, s>>>(
        static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(y), n);
  });
  RT_CUDA_LAUNCHED("relu_backward");
}

void gelu_forward(void* y, const void* x, std::size_t n, DType dt, bool approx_tanh, cudaStream_t s) {
  if (n == 0) return;
  detail::dispatch_float(dt, "cuda::gelu_forward", [&](auto tag) {
    using T = decltype(tag);
    gelu_fwd_kernel<T><<<detail::blocks_for(n), detail::kThreads, 0, s>>>(static_cast<T*>(y),
                                                                          static_cast<const T*>(x), n, approx_tanh);
  });
  RT_CUDA_LAUNCHED("gelu_forward");
}

void gelu_backward(void* dx, const void* dy, const void* x, std::size_t n, DType dt, bool approx_tanh, cudaStream_t s) {
  if (n == 0) return;
  detail::dispatch_float(dt, "cuda::gelu_backward", [&](auto tag) {
    using T = decltype(tag);
    gelu_bwd_kernel<T><<<detail::blocks_for(n), detail::kThreads, 0, s>>>(
        static_cast<T*>(dx), static_cast<const T*>(dy), static_cast<const T*>(x), n, approx_tanh);
  });
  RT_CUDA_LAUNCHED("gelu_backward");
}

void dropout_forward(void* y, std::uint8_t* mask, const void* x, std::size_t n, DType dt, float p,
                     std::uint64_t seed, std::uint64_t offset, std::uint64_t first, cudaStream_t s) {
  RT_CHECK(p >= 0.0f && p < 1.0f, "dropout: probability ", p, " must be in [0, 1)");
  if (n == 0) return;
  float inv_keep = 1.0f / (1.0f - p);
  detail::dispatch_float(dt, "cuda::dropout_forward", [&](auto tag) {
    using T = decltype(tag);
    dropout_fwd_kernel<T><<<detail::blocks_for(n), detail::kThreads, 0, s>>>(
        static_cast<T*>(y), mask, static_cast<const T*>(x), n, p, inv_keep, seed, offset, first);
  });
  RT_CUDA_LAUNCHED("dropout_forward");
}

void dropout_backward(void* dx, const void* dy, const std::uint8_t* mask, std::size_t n, DType dt, float p,
                      cudaStream_t s) {
  RT_CHECK(p >= 0.0f && p < 1.0f, "dropout: probability ", p, " must be in [0, 1)");
  if (n == 0) return;
  float inv_keep = 1.0f / (1.0f - p);
  detail::dispatch_float(dt, "cuda::dropout_backward", [&](auto tag) {
    using T = decltype(tag);
    dropout_bwd_kernel<T><<<detail::blocks_for(n), detail::kThreads, 0, s>>>(
        static_cast<T*>(dx), static_cast<const T*>(dy), mask, n, inv_keep);
  });
  RT_CUDA_LAUNCHED("dropout_backward");
}

void check_finite(const void* x, std::size_t n, DType dt, int* flag, cudaStream_t s) {
  if (n == 0) return;
  detail::dispatch_float(dt, "cuda::check_finite", [&](auto tag) {
    using T = decltype(tag);
    finite_kernel<T><<<detail::blocks_for(n), detail::kThreads, 0, s>>>(static_cast<const T*>(x), n, flag);
  });
  RT_CUDA_LAUNCHED("check_finite");
}

}  // namespace ringtrain::cuda
