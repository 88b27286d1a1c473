// Transformer kernels: LayerNorm and row softmax (one warp per row, float
// accumulation, fixed reduction order: deterministic), column sums (a fixed
// tree per column, no atomics), and the vision transformer's token ops.
// Each is one template over its storage types: activations T (f32, f64, or
// 16-bit) and LayerNorm parameters P (T, or float32 beside 16-bit activations);
// every sum is in float whatever the storage, each result rounded once.
#include <cfloat>

#include "kernels/launch.cuh"
#include "ringtrain/cuda/element_math.hpp"
#include "ringtrain/cuda/kernels.hpp"

namespace ringtrain::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;  // rows per block in the one-warp-per-row kernels

__device__ float wsum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ float wmax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

unsigned row_blocks(std::int64_t rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

template <typename T, typename P>
__global__ void ln_fwd_kernel(const T* x, const P* g, const P* b, T* y, float* mean, float* rstd, std::int64_t rows,
                              std::int64_t d, float eps) {
  const std::int64_t r = blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const T* xr = x + r * d;
  float s = 0;
  for (std::int64_t j = lane; j < d; j += 32) s += static_cast<float>(to_acc(xr[j]));
  const float m = wsum(s) / static_cast<float>(d);
  float v = 0;
  for (std::int64_t j = lane; j < d; j += 32) {
    const float c = static_cast<float>(to_acc(xr[j])) - m;
    v += c * c;
  }
  const float rs = rsqrtf(wsum(v) / static_cast<float>(d) + eps);
  if (lane == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
  for (std::int64_t j = lane; j < d; j += 32) {
    const float xh = (static_cast<float>(to_acc(xr[j])) - m) * rs;
    y[r * d + j] = from_acc<T>(static_cast<acc_t<T>>(xh * static_cast<float>(to_acc(g[j])) +
                                                     static_cast<float>(to_acc(b[j]))));
  }
}

// dx (optional) and dy * xhat (for dgamma's column sum) per row.
template <typename T, typename P>
__global__ void ln_bwd_kernel(const T* x, const P* g, const T* dy, const float* mean, const float* rstd, T* dx,
                              float* dyxh, std::int64_t rows, std::int64_t d) {
  const std::int64_t r = blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const float m = mean[r], rs = rstd[r];
  float a = 0, c = 0;
  for (std::int64_t j = lane; j < d; j += 32) {
    const float xh = (static_cast<float>(to_acc(x[r * d + j])) - m) * rs;
    const float gy = static_cast<float>(to_acc(dy[r * d + j]));
    const float gd = gy * static_cast<float>(to_acc(g[j]));
    a += gd;
    c += gd * xh;
    dyxh[r * d + j] = gy * xh;
  }
  if (!dx) return;
  a = wsum(a) / static_cast<float>(d);
  c = wsum(c) / static_cast<float>(d);
  for (std::int64_t j = lane; j < d; j += 32) {
    const float xh = (static_cast<float>(to_acc(x[r * d + j])) - m) * rs;
    const float gd = static_cast<float>(to_acc(dy[r * d + j])) * static_cast<float>(to_acc(g[j]));
    dx[r * d + j] = from_acc<T>(static_cast<acc_t<T>>(rs * (gd - a - xh * c)));
  }
}

// out[c] (+)= sum over r of in[r * cols + c]; block (32, 8) covers 32 columns.
template <typename TI, typename TO>
__global__ void colsum_kernel(const TI* in, TO* out, std::int64_t rows, std::int64_t cols, bool accumulate) {
  __shared__ float sh[8][33];
  const std::int64_t c = blockIdx.x * 32ll + threadIdx.x;
  float s = 0;
  if (c < cols)
    for (std::int64_t r = threadIdx.y; r < rows; r += 8) s += static_cast<float>(to_acc(in[r * cols + c]));
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0;
    for (int k = 0; k < 8; ++k) t += sh[k][threadIdx.x];  // fixed order: deterministic
    out[c] = from_acc<TO>(static_cast<acc_t<TO>>(accumulate ? static_cast<float>(to_acc(out[c])) + t : t));
  }
}

// p = softmax(s) per row: scores S (float for 16-bit probabilities P, else
// S = P's type and p may alias s: each element is read before its own write).
template <typename S, typename T>
__global__ void softmax_fwd_kernel(const S* s, T* p, std::int64_t rows, std::int64_t cols) {
  const std::int64_t r = blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const S* row = s + r * cols;
  T* out = p + r * cols;
  float m = -FLT_MAX;
  for (std::int64_t j = lane; j < cols; j += 32) m = fmaxf(m, static_cast<float>(to_acc(row[j])));
  m = wmax(m);  // subtracted before exp: no overflow whatever the logits
  float z = 0;
  for (std::int64_t j = lane; j < cols; j += 32) z += expf(static_cast<float>(to_acc(row[j])) - m);
  const float inv = 1.0f / wsum(z);
  for (std::int64_t j = lane; j < cols; j += 32)
    out[j] = from_acc<T>(static_cast<acc_t<T>>(expf(static_cast<float>(to_acc(row[j])) - m) * inv));
}

// ds := p * (dp - sum(dp * p)) per row: P and dS in the activation type T,
// dP in D (float for 16-bit T; else D = T and ds may alias dp).
template <typename T, typename D>
__global__ void softmax_bwd_kernel(const T* p, const D* dp, T* ds, std::int64_t rows, std::int64_t cols) {
  const std::int64_t r = blockIdx.x * static_cast<std::int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const T* pr = p + r * cols;
  const D* dr = dp + r * cols;
  T* out = ds + r * cols;
  float s = 0;
  for (std::int64_t j = lane; j < cols; j += 32) s += static_cast<float>(to_acc(pr[j])) * static_cast<float>(to_acc(dr[j]));
  s = wsum(s);
  for (std::int64_t j = lane; j < cols; j += 32) {
    const float pj = static_cast<float>(to_acc(pr[j]));
    out[j] = from_acc<T>(static_cast<acc_t<T>>(pj * (static_cast<float>(to_acc(dr[j])) - s)));
  }
}

// One thread per token element; patches do not overlap, so both directions are plain copies.
template <typename T>
__global__ void patch_kernel(T* img, T* tok, std::int64_t c, std::int64_t h, std::int64_t w, std::int64_t p,
                             std::size_t n, bool to_tokens) {
  const std::int64_t wp = w / p, hp = h / p, k = c * p * p;
  RT_GRID_STRIDE(i, n) {
    const std::int64_t f = static_cast<std::int64_t>(i) % k, t = (static_cast<std::int64_t>(i) / k) % (hp * wp),
                       s = static_cast<std::int64_t>(i) / (k * hp * wp);
    const std::int64_t ch = f / (p * p), a = (f / p) % p, b = f % p, pi = t / wp, pj = t % wp;
    const std::size_t o = static_cast<std::size_t>(((s * c + ch) * h + pi * p + a) * w + pj * p + b);
    if (to_tokens) tok[i] = img[o];
    else img[o] = tok[i];
  }
}

template <typename T>
__global__ void token_mean_kernel(const T* x, T* y, std::int64_t t, std::int64_t d, std::size_t n) {
  RT_GRID_STRIDE(i, n) {  // i = sample * d + feature
    const std::int64_t s = static_cast<std::int64_t>(i) / d, f = static_cast<std::int64_t>(i) % d;
    float acc = 0;
    for (std::int64_t k = 0; k < t; ++k) acc += static_cast<float>(to_acc(x[(s * t + k) * d + f]));
    y[i] = from_acc<T>(static_cast<acc_t<T>>(acc / static_cast<float>(t)));
  }
}

template <typename T>
__global__ void token_mean_bwd_kernel(const T* dy, T* dx, std::int64_t t, std::int64_t d, std::size_t n) {
  RT_GRID_STRIDE(i, n) {  // i over dx [N, T, D]
    const std::int64_t s = static_cast<std::int64_t>(i) / (t * d), f = static_cast<std::int64_t>(i) % d;
    dx[i] = from_acc<T>(static_cast<acc_t<T>>(static_cast<float>(to_acc(dy[s * d + f])) / static_cast<float>(t)));
  }
}

}  // namespace

void layernorm_forward(const void* x, const void* gamma, const void* beta, void* y, float* mean, float* rstd,
                       std::int64_t rows, std::int64_t d, float eps, DType dt, DType param_dt, cudaStream_t s) {
  RT_CHECK(rows >= 0 && d > 0, "layernorm_forward: bad shape [", rows, ", ", d, "]");
  if (rows == 0) return;
  detail::dispatch_act_param(dt, param_dt, "cuda::layernorm_forward", [&](auto tag, auto ptag) {
    using T = decltype(tag);
    using P = decltype(ptag);
    ln_fwd_kernel<T, P><<<row_blocks(rows), 32 * kWarpsPerBlock, 0, s>>>(
        static_cast<const T*>(x), static_cast<const P*>(gamma), static_cast<const P*>(beta), static_cast<T*>(y), mean,
        rstd, rows, d, eps);
  });
  RT_CUDA_LAUNCHED("layernorm_forward");
}

std::size_t layernorm_scratch_bytes(std::int64_t rows, std::int64_t d) {
  return static_cast<std::size_t>(rows * d) * sizeof(float);
}

void layernorm_backward(const void* x, const void* gamma, const void* dy, const float* mean, const float* rstd,
                        void* dx, void* dgamma, void* dbeta, std::int64_t rows, std::int64_t d, bool accumulate,
                        DType dt, DType param_dt, void* scratch, cudaStream_t s) {
  RT_CHECK(rows >= 0 && d > 0, "layernorm_backward: bad shape [", rows, ", ", d, "]");
  auto* dyxh = static_cast<float*>(scratch);
  detail::dispatch_act_param(dt, param_dt, "cuda::layernorm_backward", [&](auto tag, auto ptag) {
    using T = decltype(tag);
    using P = decltype(ptag);
    if (rows > 0)
      ln_bwd_kernel<T, P><<<row_blocks(rows), 32 * kWarpsPerBlock, 0, s>>>(
          static_cast<const T*>(x), static_cast<const P*>(gamma), static_cast<const T*>(dy), mean, rstd,
          static_cast<T*>(dx), dyxh, rows, d);
    const dim3 blk(32, 8), grid(static_cast<unsigned>((d + 31) / 32));
    colsum_kernel<float, P><<<grid, blk, 0, s>>>(dyxh, static_cast<P*>(dgamma), rows, d, accumulate);
    colsum_kernel<T, P><<<grid, blk, 0, s>>>(static_cast<const T*>(dy), static_cast<P*>(dbeta), rows, d, accumulate);
  });
  RT_CUDA_LAUNCHED("layernorm_backward");
}

void column_sum(const void* in, void* out, std::int64_t rows, std::int64_t cols, bool accumulate, DType dt,
                DType out_dt, cudaStream_t s) {
  RT_CHECK(rows >= 0 && cols > 0, "column_sum: bad shape [", rows, ", ", cols, "]");
  detail::dispatch_act_param(dt, out_dt, "cuda::column_sum", [&](auto tag, auto otag) {
    using T = decltype(tag);
    using O = decltype(otag);
    colsum_kernel<T, O><<<static_cast<unsigned>((cols + 31) / 32), dim3(32, 8), 0, s>>>(
        static_cast<const T*>(in), static_cast<O*>(out), rows, cols, accumulate);
  });
  RT_CUDA_LAUNCHED("column_sum");
}

void softmax_rows(const void* scores, DType scores_dt, void* p, DType dt, std::int64_t rows, std::int64_t cols,
                  cudaStream_t s) {
  RT_CHECK(rows >= 0 && cols > 0, "softmax_rows: bad shape [", rows, ", ", cols, "]");
  if (rows == 0) return;
  detail::dispatch_act_param(dt, scores_dt, "cuda::softmax_rows", [&](auto tag, auto stag) {
    using T = decltype(tag);
    using S = decltype(stag);
    softmax_fwd_kernel<S, T><<<row_blocks(rows), 32 * kWarpsPerBlock, 0, s>>>(static_cast<const S*>(scores),
                                                                             static_cast<T*>(p), rows, cols);
  });
  RT_CUDA_LAUNCHED("softmax_rows");
}

void softmax_rows_backward(const void* p, const void* dp, DType dp_dt, void* ds, DType dt, std::int64_t rows,
                           std::int64_t cols, cudaStream_t s) {
  RT_CHECK(rows >= 0 && cols > 0, "softmax_rows_backward: bad shape [", rows, ", ", cols, "]");
  if (rows == 0) return;
  detail::dispatch_act_param(dt, dp_dt, "cuda::softmax_rows_backward", [&](auto tag, auto dtag) {
    using T = decltype(tag);
    using D = decltype(dtag);
    softmax_bwd_kernel<T, D><<<row_blocks(rows), 32 * kWarpsPerBlock, 0, s>>>(
        static_cast<const T*>(p), static_cast<const D*>(dp), static_cast<T*>(ds), rows, cols);
  });
  RT_CUDA_LAUNCHED("softmax_rows_backward");
}

void patch_copy(void* img, void* tokens, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                std::int64_t p, bool to_tokens, DType dt, cudaStream_t s) {
  RT_CHECK(p > 0 && h % p == 0 && w % p == 0, "patch_copy: ", h, "x", w, " is not divisible into ", p, "x", p,
           " patches");
  const std::size_t total = static_cast<std::size_t>(n * c * h * w);
  if (total == 0) return;
  detail::dispatch_float(dt, "cuda::patch_copy", [&](auto tag) {
    using T = decltype(tag);
    patch_kernel<T><<<detail::blocks_for(total), detail::kThreads, 0, s>>>(static_cast<T*>(img),
                                                                          static_cast<T*>(tokens), c, h, w, p, total,
                                                                          to_tokens);
  });
  RT_CUDA_LAUNCHED("patch_copy");
}

void token_mean(const void* x, void* y, std::int64_t n, std::int64_t t, std::int64_t d, DType dt, cudaStream_t s) {
  const std::size_t total = static_cast<std::size_t>(n * d);
  if (total == 0) return;
  detail::dispatch_float(dt, "cuda::token_mean", [&](auto tag) {
    using T = decltype(tag);
    token_mean_kernel<T><<<detail::blocks_for(total), detail::kThreads, 0, s>>>(static_cast<const T*>(x),
                                                                               static_cast<T*>(y), t, d, total);
  });
  RT_CUDA_LAUNCHED("token_mean");
}

void token_mean_backward(const void* dy, void* dx, std::int64_t n, std::int64_t t, std::int64_t d, DType dt,
                         cudaStream_t s) {
  const std::size_t total = static_cast<std::size_t>(n * t * d);
  if (total == 0) return;
  detail::dispatch_float(dt, "cuda::token_mean_backward", [&](auto tag) {
    using T = decltype(tag);
    token_mean_bwd_kernel<T><<<detail::blocks_for(total), detail::kThreads, 0, s>>>(static_cast<const T*>(dy),
                                                                                   static_cast<T*>(dx), t, d, total);
  });
  RT_CUDA_LAUNCHED("token_mean_backward");
}

}  // namespace ringtrain::cuda
