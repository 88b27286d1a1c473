// Tiled attention (FlashAttention-2's schedule, Dao 2023), causal or not: no
// [T, T] matrix is ever stored. One block of 4 warps per (tile of 32 rows,
// sample x head); each warp owns 8 rows of the tile, a lane one key column of
// the 32-key tile (scores) or one of every 32 head columns (products):
//  - forward: per query tile, the key tiles in order (causal: up to the
//    diagonal one, masked there) with an online softmax (running row maximum m
//    and sum l, the output accumulator rescaled when m grows); writes the
//    output and the row log-sum-exp L = m + log l (float32) for the backward.
//  - backward, in two kernels so that every gradient is written by exactly one
//    block (no atomics: deterministic, the same bits on every run): per key
//    tile dK and dV over the query tiles (causal: from the diagonal on), and
//    per query tile dQ over the key tiles; both recompute P = exp(S - L) and
//    dS = P (dP - D), D = rowsum(dO * O) from a small kernel before them.
// Tiles are widened to float32 in shared memory; scores, softmax and every
// accumulator are float32. With 16-bit activations P and dS are rounded to the
// activation type before their products, as the CPU kernel and the cuBLAS
// attention round them (attention_tiled.cpp, nn/transformer.cpp). The
// products run on CUDA cores (FMA from shared memory, read as float4s: a
// quarter of the shared-memory instructions of scalar reads), not tensor
// cores. The loops over a tile unroll twice only: fully unrolled, ptxas
// spilled the accumulators at every head width. tests/gpu/emulate/run.sh runs
// these kernels on the CPU against attention in double (no GPU needed).
#include <cfloat>

#include "kernels/launch.cuh"
#include "ringtrain/cuda/element_math.hpp"
#include "ringtrain/cuda/kernels.hpp"

namespace ringtrain::cuda {
namespace {

constexpr int kB = 32;                  // query rows and keys per tile
constexpr int kWarps = 4;               // warps per block
constexpr int kR = kB / kWarps;         // rows (or keys) of a tile per warp
constexpr int kThreadsA = kWarps * 32;  // threads per block
constexpr int kP = kB + 4;              // row stride of the 32x32 score tiles (float4 rows, 16-byte aligned)

struct Geo {
  std::int64_t t, h, hd, d, ld;  // tokens, heads, head width, h*hd, qkv's row stride 3d
  float scale;
  bool causal;
};

template <typename T>
__device__ __forceinline__ float ldf(T v) {
  return static_cast<float>(to_acc(v));
}
template <typename T>
__device__ __forceinline__ T stf(float v) {
  return from_acc<T>(static_cast<acc_t<T>>(v));
}
template <typename T>
__device__ __forceinline__ float round_to(float v) {  // v as the activation type would store it
  return ldf(stf<T>(v));
}
__device__ __forceinline__ float wsum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float wmax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Shared-memory tiles hold hd4 = hd rounded up to 4 columns (zeros past hd),
// so that the dot products over the head's columns read float4s, at a row
// stride of hd4 + 4 floats: 16-byte aligned rows, and a quarter-warp's float4
// loads of 8 rows hit distinct banks where hd4 is a multiple of 8.
__host__ __device__ __forceinline__ int width4(int hd) { return (hd + 3) & ~3; }
__host__ __device__ __forceinline__ int stride4(int hd) { return width4(hd) + 4; }

// Rows [r0, r0 + kB) of one head's columns (base: token 0 of that head, row
// stride ld) as float32 into s (row stride hp); zeros past the last token t
// and in the columns from hd to hd4.
template <typename T>
__device__ void load_tile(const T* base, std::int64_t ld, std::int64_t r0, std::int64_t t, int hd, float* s, int hp) {
  const int hd4 = width4(hd);
  for (int e = threadIdx.x; e < kB * hd4; e += kThreadsA) {
    const int r = e / hd4, c = e % hd4;
    s[r * hp + c] = r0 + r < t && c < hd ? ldf(base[(r0 + r) * ld + c]) : 0.f;
  }
}
__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
// a += x . y over four lanes of a float4, in order.
__device__ __forceinline__ float fma4(float4 x, float4 y, float a) {
  return fmaf(x.w, y.w, fmaf(x.z, y.z, fmaf(x.y, y.y, fmaf(x.x, y.x, a))));
}
// Whether query i attends key j.
__device__ __forceinline__ bool sees(const Geo& g, std::int64_t i, std::int64_t j) {
  return i < g.t && j < g.t && (!g.causal || j <= i);
}

template <typename T, int NC>
__global__ void __launch_bounds__(kThreadsA) fa_forward(const T* qkv, T* out, float* lse, Geo g) {
  extern __shared__ float sm[];
  const int hd = static_cast<int>(g.hd), hd4 = width4(hd), hp = stride4(hd);
  float *qs = sm, *ks = qs + kB * hp, *vs = ks + kB * hp, *ps = vs + kB * hp;
  const std::int64_t nh = blockIdx.x, n = nh / g.h, h = nh % g.h, i0 = std::int64_t(blockIdx.y) * kB;
  const T* q = qkv + n * g.t * g.ld + h * g.hd;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_tile(q, g.ld, i0, g.t, hd, qs, hp);
  float o[kR][NC], m[kR], l[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < NC; ++c) o[r][c] = 0.f;
  }
  const std::int64_t kend = g.causal ? min(g.t, i0 + kB) : g.t;
  for (std::int64_t j0 = 0; j0 < kend; j0 += kB) {
    __syncthreads();  // the last tile's readers are done (and qs is loaded)
    load_tile(q + g.d, g.ld, j0, g.t, hd, ks, hp);
    load_tile(q + 2 * g.d, g.ld, j0, g.t, hd, vs, hp);
    __syncthreads();
    float s[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) s[r] = 0.f;
#pragma unroll 2
    for (int k = 0; k < hd4; k += 4) {
      const float4 kv = ld4(ks + lane * hp + k);
#pragma unroll
      for (int r = 0; r < kR; ++r) s[r] = fma4(ld4(qs + (w * kR + r) * hp + k), kv, s[r]);
    }
    float alpha[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const bool ok = sees(g, i0 + w * kR + r, j0 + lane);
      const float sv = ok ? s[r] * g.scale : -INFINITY;
      const float mn = fmaxf(m[r], wmax(sv));
      const float base = mn == -INFINITY ? 0.f : mn;  // a row with no key yet (past the last token)
      const float p = ok ? expf(sv - base) : 0.f;
      alpha[r] = m[r] == -INFINITY ? 0.f : expf(m[r] - base);
      l[r] = l[r] * alpha[r] + wsum(p);
      m[r] = mn;
      ps[(w * kR + r) * kP + lane] = round_to<T>(p);
    }
    __syncwarp();
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = lane + 32 * c;
      if (col >= hd) break;
#pragma unroll
      for (int r = 0; r < kR; ++r) o[r][c] *= alpha[r];
#pragma unroll 2
      for (int j = 0; j < kB; j += 4) {
        const float4 v = {vs[j * hp + col], vs[(j + 1) * hp + col], vs[(j + 2) * hp + col], vs[(j + 3) * hp + col]};
#pragma unroll
        for (int r = 0; r < kR; ++r) o[r][c] = fma4(ld4(ps + (w * kR + r) * kP + j), v, o[r][c]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const std::int64_t i = i0 + w * kR + r;
    if (i >= g.t) continue;
    const float inv = 1.f / l[r];
    T* orow = out + (n * g.t + i) * g.d + h * g.hd;
#pragma unroll
    for (int c = 0; c < NC; ++c)
      if (lane + 32 * c < hd) orow[lane + 32 * c] = stf<T>(o[r][c] * inv);
    if (lane == 0) lse[nh * g.t + i] = m[r] + logf(l[r]);
  }
}

// dd[nh, i] = sum over the head's columns of dO * O (one warp per row, float32).
template <typename T>
__global__ void fa_rowdot(const T* out, const T* dout, float* dd, std::int64_t rows, Geo g) {
  const std::int64_t row = std::int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const std::int64_t nh = row / g.t, i = row % g.t, n = nh / g.h, h = nh % g.h;
  const std::int64_t off = (n * g.t + i) * g.d + h * g.hd;
  float s = 0.f;
  for (std::int64_t c = lane; c < g.hd; c += 32) s = fmaf(ldf(out[off + c]), ldf(dout[off + c]), s);
  s = wsum(s);
  if (lane == 0) dd[row] = s;
}

// Per key tile: dK = scale dS^T Q and dV = P^T dO over the query tiles.
template <typename T, int NC>
__global__ void __launch_bounds__(kThreadsA)
    fa_backward_kv(const T* qkv, const T* dout, const float* lse, const float* dd, T* dqkv, Geo g) {
  extern __shared__ float sm[];
  const int hd = static_cast<int>(g.hd), hd4 = width4(hd), hp = stride4(hd);
  float *ks = sm, *vs = ks + kB * hp, *qs = vs + kB * hp, *dos = qs + kB * hp, *ls = dos + kB * hp, *ds = ls + kB,
        *pt = ds + kB, *dst = pt + kB * kP;
  const std::int64_t nh = blockIdx.x, n = nh / g.h, h = nh % g.h, j0 = std::int64_t(blockIdx.y) * kB;
  const T* q = qkv + n * g.t * g.ld + h * g.hd;
  const T* dob = dout + n * g.t * g.d + h * g.hd;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_tile(q + g.d, g.ld, j0, g.t, hd, ks, hp);
  load_tile(q + 2 * g.d, g.ld, j0, g.t, hd, vs, hp);
  float dk[kR][NC], dv[kR][NC];
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) dk[r][c] = dv[r][c] = 0.f;
  for (std::int64_t i0 = g.causal ? j0 : 0; i0 < g.t; i0 += kB) {
    __syncthreads();
    load_tile(q, g.ld, i0, g.t, hd, qs, hp);
    load_tile(dob, g.d, i0, g.t, hd, dos, hp);
    if (threadIdx.x < kB) {
      const bool in = i0 + threadIdx.x < g.t;
      ls[threadIdx.x] = in ? lse[nh * g.t + i0 + threadIdx.x] : 0.f;
      ds[threadIdx.x] = in ? dd[nh * g.t + i0 + threadIdx.x] : 0.f;
    }
    __syncthreads();
    // lane: query i0 + lane; the warp's keys j0 + w*kR + r
    float s[kR], dp[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) s[r] = dp[r] = 0.f;
#pragma unroll 2
    for (int k = 0; k < hd4; k += 4) {
      const float4 qv = ld4(qs + lane * hp + k), ov = ld4(dos + lane * hp + k);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        s[r] = fma4(qv, ld4(ks + (w * kR + r) * hp + k), s[r]);
        dp[r] = fma4(ov, ld4(vs + (w * kR + r) * hp + k), dp[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const float p = sees(g, i0 + lane, j0 + w * kR + r) ? expf(s[r] * g.scale - ls[lane]) : 0.f;
      pt[(w * kR + r) * kP + lane] = round_to<T>(p);
      dst[(w * kR + r) * kP + lane] = round_to<T>(p * (dp[r] - ds[lane]));
    }
    __syncwarp();
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = lane + 32 * c;
      if (col >= hd) break;
#pragma unroll 2
      for (int i = 0; i < kB; i += 4) {
        const float4 ov = {dos[i * hp + col], dos[(i + 1) * hp + col], dos[(i + 2) * hp + col], dos[(i + 3) * hp + col]};
        const float4 qv = {qs[i * hp + col], qs[(i + 1) * hp + col], qs[(i + 2) * hp + col], qs[(i + 3) * hp + col]};
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          dv[r][c] = fma4(ld4(pt + (w * kR + r) * kP + i), ov, dv[r][c]);
          dk[r][c] = fma4(ld4(dst + (w * kR + r) * kP + i), qv, dk[r][c]);
        }
      }
    }
  }
  T* dx = dqkv + n * g.t * g.ld + h * g.hd;
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const std::int64_t j = j0 + w * kR + r;
    if (j >= g.t) continue;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = lane + 32 * c;
      if (col >= hd) break;
      dx[j * g.ld + g.d + col] = stf<T>(dk[r][c] * g.scale);
      dx[j * g.ld + 2 * g.d + col] = stf<T>(dv[r][c]);
    }
  }
}

// Per query tile: dQ = scale dS K over the key tiles (causal: up to the diagonal).
template <typename T, int NC>
__global__ void __launch_bounds__(kThreadsA)
    fa_backward_q(const T* qkv, const T* dout, const float* lse, const float* dd, T* dqkv, Geo g) {
  extern __shared__ float sm[];
  const int hd = static_cast<int>(g.hd), hd4 = width4(hd), hp = stride4(hd);
  float *qs = sm, *dos = qs + kB * hp, *ks = dos + kB * hp, *vs = ks + kB * hp, *ls = vs + kB * hp, *ds = ls + kB,
        *dss = ds + kB;
  const std::int64_t nh = blockIdx.x, n = nh / g.h, h = nh % g.h, i0 = std::int64_t(blockIdx.y) * kB;
  const T* q = qkv + n * g.t * g.ld + h * g.hd;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_tile(q, g.ld, i0, g.t, hd, qs, hp);
  load_tile(dout + n * g.t * g.d + h * g.hd, g.d, i0, g.t, hd, dos, hp);
  if (threadIdx.x < kB) {
    const bool in = i0 + threadIdx.x < g.t;
    ls[threadIdx.x] = in ? lse[nh * g.t + i0 + threadIdx.x] : 0.f;
    ds[threadIdx.x] = in ? dd[nh * g.t + i0 + threadIdx.x] : 0.f;
  }
  float dq[kR][NC];
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) dq[r][c] = 0.f;
  const std::int64_t kend = g.causal ? min(g.t, i0 + kB) : g.t;
  for (std::int64_t j0 = 0; j0 < kend; j0 += kB) {
    __syncthreads();
    load_tile(q + g.d, g.ld, j0, g.t, hd, ks, hp);
    load_tile(q + 2 * g.d, g.ld, j0, g.t, hd, vs, hp);
    __syncthreads();
    // lane: key j0 + lane; the warp's queries i0 + w*kR + r
    float s[kR], dp[kR];
#pragma unroll
    for (int r = 0; r < kR; ++r) s[r] = dp[r] = 0.f;
#pragma unroll 2
    for (int k = 0; k < hd4; k += 4) {
      const float4 kv = ld4(ks + lane * hp + k), vv = ld4(vs + lane * hp + k);
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        s[r] = fma4(ld4(qs + (w * kR + r) * hp + k), kv, s[r]);
        dp[r] = fma4(ld4(dos + (w * kR + r) * hp + k), vv, dp[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      const int ri = w * kR + r;
      const float p = sees(g, i0 + ri, j0 + lane) ? expf(s[r] * g.scale - ls[ri]) : 0.f;
      dss[ri * kP + lane] = round_to<T>(p * (dp[r] - ds[ri]));
    }
    __syncwarp();
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = lane + 32 * c;
      if (col >= hd) break;
#pragma unroll 2
      for (int j = 0; j < kB; j += 4) {
        const float4 kv = {ks[j * hp + col], ks[(j + 1) * hp + col], ks[(j + 2) * hp + col], ks[(j + 3) * hp + col]};
#pragma unroll
        for (int r = 0; r < kR; ++r) dq[r][c] = fma4(ld4(dss + (w * kR + r) * kP + j), kv, dq[r][c]);
      }
    }
  }
  T* dx = dqkv + n * g.t * g.ld + h * g.hd;
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    const std::int64_t i = i0 + w * kR + r;
    if (i >= g.t) continue;
#pragma unroll
    for (int c = 0; c < NC; ++c)
      if (lane + 32 * c < hd) dx[i * g.ld + lane + 32 * c] = stf<T>(dq[r][c] * g.scale);
  }
}

std::size_t fwd_smem(int hd) { return sizeof(float) * (3 * kB * stride4(hd) + kB * kP); }
std::size_t kv_smem(int hd) { return sizeof(float) * (4 * kB * stride4(hd) + 2 * kB + 2 * kB * kP); }
std::size_t q_smem(int hd) { return sizeof(float) * (4 * kB * stride4(hd) + 2 * kB + kB * kP); }

// Launches kernel with `smem` dynamic shared bytes, opting in above the 48 KiB default.
template <typename K, typename... A>
void launch(K kernel, dim3 grid, std::size_t smem, cudaStream_t s, A... args) {
  if (smem > 48 * 1024)
    RT_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<grid, kThreadsA, smem, s>>>(args...);
  RT_CUDA(cudaGetLastError());
}

// Calls f(T{}, std::integral_constant<int, NC>{}) for the activation type and
// the head columns per lane, rounded up to a power of two (hd <= 256).
template <typename F>
void dispatch(DType dt, std::int64_t hd, const char* what, F&& f) {
  RT_CHECK(hd >= 1 && hd <= 256, what, ": head width ", hd, " is not in [1, 256]");
  auto by_width = [&](auto t) {
    if (hd <= 32) f(t, std::integral_constant<int, 1>{});
    else if (hd <= 64) f(t, std::integral_constant<int, 2>{});
    else if (hd <= 128) f(t, std::integral_constant<int, 4>{});
    else f(t, std::integral_constant<int, 8>{});
  };
  switch (dt) {
    case DType::f32: return by_width(float{});
    case DType::bf16: return by_width(bfloat16{});
    case DType::f16: return by_width(float16{});
    default: RT_FAIL(what, ": dtype ", dtype_name(dt), " is not supported (float32, bfloat16, float16)");
  }
}

Geo geo(std::int64_t t, std::int64_t h, std::int64_t hd, float scale, bool causal) {
  return {t, h, hd, h * hd, 3 * h * hd, scale, causal};
}
dim3 tiles(std::int64_t n, std::int64_t t, std::int64_t h) {
  return dim3(static_cast<unsigned>(n * h), static_cast<unsigned>((t + kB - 1) / kB));  // y: at most 65535 tiles
}

}  // namespace

void flash_attention_forward(const void* qkv, void* out, float* lse, std::int64_t n, std::int64_t t, std::int64_t h,
                             std::int64_t hd, float scale, bool causal, DType dt, cudaStream_t stream) {
  if (n * t * h == 0) return;
  RT_CHECK((t + kB - 1) / kB <= 65535, "flash attention: ", t, " tokens is more than one grid holds");
  const Geo g = geo(t, h, hd, scale, causal);
  dispatch(dt, hd, "flash attention forward", [&](auto z, auto nc) {
    using T = decltype(z);
    launch(fa_forward<T, decltype(nc)::value>, tiles(n, t, h), fwd_smem(int(hd)), stream, static_cast<const T*>(qkv),
           static_cast<T*>(out), lse, g);
  });
}

std::size_t flash_attention_scratch_bytes(std::int64_t n, std::int64_t t, std::int64_t h) {
  return static_cast<std::size_t>(n * h * t) * sizeof(float);
}

void flash_attention_backward(const void* qkv, const void* out, const void* dout, const float* lse, void* dqkv,
                              void* scratch, std::int64_t n, std::int64_t t, std::int64_t h, std::int64_t hd,
                              float scale, bool causal, DType dt, cudaStream_t stream) {
  if (n * t * h == 0) return;
  const Geo g = geo(t, h, hd, scale, causal);
  auto* dd = static_cast<float*>(scratch);
  const std::int64_t rows = n * h * t;
  dispatch(dt, hd, "flash attention backward", [&](auto z, auto nc) {
    using T = decltype(z);
    constexpr int NC = decltype(nc)::value;
    const T *x = static_cast<const T*>(qkv), *o = static_cast<const T*>(out), *dy = static_cast<const T*>(dout);
    T* dx = static_cast<T*>(dqkv);
    fa_rowdot<T><<<static_cast<unsigned>((rows + kWarps - 1) / kWarps), kThreadsA, 0, stream>>>(o, dy, dd, rows, g);
    RT_CUDA(cudaGetLastError());
    launch(fa_backward_kv<T, NC>, tiles(n, t, h), kv_smem(int(hd)), stream, x, dy, lse,
           static_cast<const float*>(dd), dx, g);
    launch(fa_backward_q<T, NC>, tiles(n, t, h), q_smem(int(hd)), stream, x, dy, lse, static_cast<const float*>(dd),
           dx, g);
  });
}

}  // namespace ringtrain::cuda
