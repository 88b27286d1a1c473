// Ring attention's block arithmetic on the device (Backend::ring_block_*,
// context parallelism; the ring is nn/ring_attention.cpp, the CPU's loops
// backend/cpu/ring_blocks.cpp). attention.cu's FlashAttention-2 schedule (one
// block of 4 warps per tile of 32 query rows or keys and (sample, head); a
// warp owns 8 rows, a lane one key of a score tile or one of every 32 head
// columns of a product), float32 only, with three changes:
//  - queries come from this rank's qkv [n, L, 3d], keys and values from the
//    block in hand, kv [n, L, 2d] (another rank's, arrived over the ring);
//  - the causal mask compares global positions: local token i of a side sits
//    at chunks[i / c] * c + i % c (RingBlockSpec); positions ascend within a
//    block, so a query's visible keys are a prefix and the key tiles past the
//    last query's prefix are skipped;
//  - the forward starts from the running state (unnormalised output, row
//    maximum m and sum l) of the blocks before and stores it back; a finish
//    kernel normalises and writes lse = m + log l. The backward starts from
//    that lse and D = rowsum(dO * O): dK/dV of the block per key tile (written,
//    not added) and dQ per query tile (added to dqkv's q columns), each
//    element by exactly one block (no atomics).
// tests/gpu/emulate/run.sh runs these kernels on the CPU against the CPU
// backend's loops (ring_emu.cpp).
#include <cfloat>
#include <climits>
#include <cmath>

#include "kernels/launch.cuh"
#include "ringtrain/cuda/kernels.hpp"

namespace ringtrain::cuda {
namespace {

constexpr int kRB = 32;           // query rows and keys per tile
constexpr int kRW = 4;            // warps per block
constexpr int kRR = kRB / kRW;    // rows (or keys) of a tile per warp
constexpr int kRT = kRW * 32;     // threads per block
constexpr int kRP = kRB + 4;      // row stride of the 32x32 score tiles (float4 rows, 16-byte aligned)

__device__ __forceinline__ float rb_wsum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float rb_wmax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Tiles hold hd rounded up to 4 columns (zeros past hd) at a row stride of that + 4 (attention.cu's layout).
__host__ __device__ __forceinline__ int rb_width4(int hd) { return (hd + 3) & ~3; }
__host__ __device__ __forceinline__ int rb_stride4(int hd) { return rb_width4(hd) + 4; }
__device__ __forceinline__ float4 rb_ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float rb_fma4(float4 x, float4 y, float a) {
  return fmaf(x.w, y.w, fmaf(x.z, y.z, fmaf(x.y, y.y, fmaf(x.x, y.x, a))));
}

// Rows [r0, r0 + kRB) of one head's columns (base: token 0 of that head, row
// stride ld) into s (row stride hp); zeros past token t and from column hd on.
__device__ void rb_load(const float* base, std::int64_t ld, std::int64_t r0, std::int64_t t, int hd, float* s, int hp) {
  const int hd4 = rb_width4(hd);
  for (int e = threadIdx.x; e < kRB * hd4; e += kRT) {
    const int r = e / hd4, c = e % hd4;
    s[r * hp + c] = r0 + r < t && c < hd ? base[(r0 + r) * ld + c] : 0.f;
  }
}

// The global position of local token i (< L) of a side with these chunks.
__device__ __forceinline__ std::int64_t rb_pos(const int* ch, std::int64_t c, std::int64_t i) {
  return std::int64_t(ch[i / c]) * c + i % c;
}
// Whether query i sees key j (both local indices).
__device__ __forceinline__ bool rb_sees(const RingBlockArgs& a, std::int64_t i, std::int64_t j) {
  return i < a.L && j < a.L && rb_pos(a.kc, a.chunk, j) <= rb_pos(a.qc, a.chunk, i);
}
// The keys query i sees: a prefix of the block (its positions ascend).
__device__ std::int64_t rb_visible(const RingBlockArgs& a, std::int64_t i) {
  const std::int64_t p = rb_pos(a.qc, a.chunk, i);
  std::int64_t n = 0;
  for (int k = 0; k < 2; ++k) {
    const std::int64_t v = p - std::int64_t(a.kc[k]) * a.chunk + 1;
    n += v < 0 ? 0 : v > a.chunk ? a.chunk : v;
  }
  return n;
}
// The last query row of the tile at i0.
__device__ __forceinline__ std::int64_t rb_last(const RingBlockArgs& a, std::int64_t i0) {
  return (i0 + kRB < a.L ? i0 + kRB : a.L) - 1;
}

template <int NC>
__global__ void __launch_bounds__(kRT) rb_forward(RingBlockArgs a, bool first, float* acc, float* mg, float* lg) {
  extern __shared__ float sm[];
  const int hd = static_cast<int>(a.hd), hd4 = rb_width4(hd), hp = rb_stride4(hd);
  float *qs = sm, *ks = qs + kRB * hp, *vs = ks + kRB * hp, *ps = vs + kRB * hp;
  const std::int64_t d = a.heads * a.hd, nh = blockIdx.x, n = nh / a.heads, h = nh % a.heads;
  const std::int64_t i0 = std::int64_t(blockIdx.y) * kRB;
  const float* q = a.qkv + n * a.L * 3 * d + h * a.hd;
  const float* k = a.kv + n * a.L * 2 * d + h * a.hd;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  rb_load(q, 3 * d, i0, a.L, hd, qs, hp);
  float o[kRR][NC], m[kRR], l[kRR];
#pragma unroll
  for (int r = 0; r < kRR; ++r) {
    const std::int64_t i = i0 + w * kRR + r, row = nh * a.L + i;
    const bool load = !first && i < a.L;
    m[r] = load ? mg[row] : -INFINITY;
    l[r] = load ? lg[row] : 0.f;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = lane + 32 * c;
      o[r][c] = load && col < hd ? acc[(n * a.L + i) * d + h * a.hd + col] : 0.f;
    }
  }
  const std::int64_t kend = rb_visible(a, rb_last(a, i0));
  for (std::int64_t j0 = 0; j0 < kend; j0 += kRB) {
    __syncthreads();  // the last tile's readers are done (and qs is loaded)
    rb_load(k, 2 * d, j0, a.L, hd, ks, hp);
    rb_load(k + d, 2 * d, j0, a.L, hd, vs, hp);
    __syncthreads();
    float s[kRR];
#pragma unroll
    for (int r = 0; r < kRR; ++r) s[r] = 0.f;
#pragma unroll 2
    for (int c = 0; c < hd4; c += 4) {
      const float4 kv = rb_ld4(ks + lane * hp + c);
#pragma unroll
      for (int r = 0; r < kRR; ++r) s[r] = rb_fma4(rb_ld4(qs + (w * kRR + r) * hp + c), kv, s[r]);
    }
    float alpha[kRR];
#pragma unroll
    for (int r = 0; r < kRR; ++r) {
      const bool ok = rb_sees(a, i0 + w * kRR + r, j0 + lane);
      const float sv = ok ? s[r] * a.scale : -INFINITY;
      const float mn = fmaxf(m[r], rb_wmax(sv));
      const float base = mn == -INFINITY ? 0.f : mn;  // a row with no key yet
      const float p = ok ? expf(sv - base) : 0.f;
      alpha[r] = m[r] == -INFINITY ? 0.f : expf(m[r] - base);
      l[r] = l[r] * alpha[r] + rb_wsum(p);
      m[r] = mn;
      ps[(w * kRR + r) * kRP + lane] = p;
    }
    __syncwarp();
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = lane + 32 * c;
      if (col >= hd) break;
#pragma unroll
      for (int r = 0; r < kRR; ++r) o[r][c] *= alpha[r];
#pragma unroll 2
      for (int j = 0; j < kRB; j += 4) {
        const float4 v = {vs[j * hp + col], vs[(j + 1) * hp + col], vs[(j + 2) * hp + col], vs[(j + 3) * hp + col]};
#pragma unroll
        for (int r = 0; r < kRR; ++r) o[r][c] = rb_fma4(rb_ld4(ps + (w * kRR + r) * kRP + j), v, o[r][c]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRR; ++r) {
    const std::int64_t i = i0 + w * kRR + r;
    if (i >= a.L) continue;
    float* orow = acc + (n * a.L + i) * d + h * a.hd;
#pragma unroll
    for (int c = 0; c < NC; ++c)
      if (lane + 32 * c < hd) orow[lane + 32 * c] = o[r][c];
    if (lane == 0) mg[nh * a.L + i] = m[r], lg[nh * a.L + i] = l[r];
  }
}

// out = acc / l, lse = m + log l; `blocks` blocks of kRT threads stride over the elements.
__global__ void rb_finish(const float* acc, const float* m, const float* l, std::int64_t n, std::int64_t L,
                          std::int64_t heads, std::int64_t hd, float* out, float* lse, unsigned blocks) {
  const std::int64_t d = heads * hd, total = n * L * d, rows = n * heads * L;
  for (std::int64_t e = std::int64_t(blockIdx.x) * kRT + threadIdx.x; e < total; e += std::int64_t(blocks) * kRT) {
    const std::int64_t col = e % d, t = e / d, s = t / L, i = t % L, r = (s * heads + col / hd) * L + i;
    out[e] = acc[e] * (1.f / l[r]);
    if (e < rows) lse[e] = m[e] + logf(l[e]);
  }
}

// D[row] = sum over the head's columns of out * dout (one warp per (sample, head, token) row).
__global__ void rb_rowdot(const float* out, const float* dout, std::int64_t n, std::int64_t L, std::int64_t heads,
                          std::int64_t hd, float* dd) {
  const std::int64_t row = std::int64_t(blockIdx.x) * kRW + threadIdx.x / 32, d = heads * hd;
  const int lane = threadIdx.x % 32;
  if (row >= n * heads * L) return;  // whole warps leave together
  const std::int64_t nh = row / L, i = row % L, s = nh / heads, h = nh % heads;
  const std::int64_t off = (s * L + i) * d + h * hd;
  float v = 0.f;
  for (std::int64_t c = lane; c < hd; c += 32) v = fmaf(out[off + c], dout[off + c], v);
  v = rb_wsum(v);
  if (lane == 0) dd[row] = v;
}

// Per key tile of the block: dK = scale dS^T Q and dV = P^T dO over the query tiles that see it.
template <int NC>
__global__ void __launch_bounds__(kRT)
    rb_backward_kv(RingBlockArgs a, const float* dout, const float* lse, const float* dd, float* dkv) {
  extern __shared__ float sm[];
  const int hd = static_cast<int>(a.hd), hd4 = rb_width4(hd), hp = rb_stride4(hd);
  float *ks = sm, *vs = ks + kRB * hp, *qs = vs + kRB * hp, *dos = qs + kRB * hp, *ls = dos + kRB * hp, *ds = ls + kRB,
        *pt = ds + kRB, *dst = pt + kRB * kRP;
  const std::int64_t d = a.heads * a.hd, nh = blockIdx.x, n = nh / a.heads, h = nh % a.heads;
  const std::int64_t j0 = std::int64_t(blockIdx.y) * kRB;
  const float* q = a.qkv + n * a.L * 3 * d + h * a.hd;
  const float* k = a.kv + n * a.L * 2 * d + h * a.hd;
  const float* dob = dout + n * a.L * d + h * a.hd;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  rb_load(k, 2 * d, j0, a.L, hd, ks, hp);
  rb_load(k + d, 2 * d, j0, a.L, hd, vs, hp);
  float dk[kRR][NC], dv[kRR][NC];
#pragma unroll
  for (int r = 0; r < kRR; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) dk[r][c] = dv[r][c] = 0.f;
  const std::int64_t kp0 = rb_pos(a.kc, a.chunk, j0);  // the tile's first key
  for (std::int64_t i0 = 0; i0 < a.L; i0 += kRB) {
    if (rb_pos(a.qc, a.chunk, rb_last(a, i0)) < kp0) continue;  // no query of this tile sees a key of ours
    __syncthreads();
    rb_load(q, 3 * d, i0, a.L, hd, qs, hp);
    rb_load(dob, d, i0, a.L, hd, dos, hp);
    if (threadIdx.x < kRB) {
      const bool in = i0 + threadIdx.x < a.L;
      ls[threadIdx.x] = in ? lse[nh * a.L + i0 + threadIdx.x] : 0.f;
      ds[threadIdx.x] = in ? dd[nh * a.L + i0 + threadIdx.x] : 0.f;
    }
    __syncthreads();
    // lane: query i0 + lane; the warp's keys j0 + w*kRR + r
    float s[kRR], dp[kRR];
#pragma unroll
    for (int r = 0; r < kRR; ++r) s[r] = dp[r] = 0.f;
#pragma unroll 2
    for (int c = 0; c < hd4; c += 4) {
      const float4 qv = rb_ld4(qs + lane * hp + c), ov = rb_ld4(dos + lane * hp + c);
#pragma unroll
      for (int r = 0; r < kRR; ++r) {
        s[r] = rb_fma4(qv, rb_ld4(ks + (w * kRR + r) * hp + c), s[r]);
        dp[r] = rb_fma4(ov, rb_ld4(vs + (w * kRR + r) * hp + c), dp[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRR; ++r) {
      const float p = rb_sees(a, i0 + lane, j0 + w * kRR + r) ? expf(s[r] * a.scale - ls[lane]) : 0.f;
      pt[(w * kRR + r) * kRP + lane] = p;
      dst[(w * kRR + r) * kRP + lane] = p * (dp[r] - ds[lane]);
    }
    __syncwarp();
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = lane + 32 * c;
      if (col >= hd) break;
#pragma unroll 2
      for (int i = 0; i < kRB; i += 4) {
        const float4 ov = {dos[i * hp + col], dos[(i + 1) * hp + col], dos[(i + 2) * hp + col], dos[(i + 3) * hp + col]};
        const float4 qv = {qs[i * hp + col], qs[(i + 1) * hp + col], qs[(i + 2) * hp + col], qs[(i + 3) * hp + col]};
#pragma unroll
        for (int r = 0; r < kRR; ++r) {
          dv[r][c] = rb_fma4(rb_ld4(pt + (w * kRR + r) * kRP + i), ov, dv[r][c]);
          dk[r][c] = rb_fma4(rb_ld4(dst + (w * kRR + r) * kRP + i), qv, dk[r][c]);
        }
      }
    }
  }
  float* out = dkv + n * a.L * 2 * d + h * a.hd;
#pragma unroll
  for (int r = 0; r < kRR; ++r) {
    const std::int64_t j = j0 + w * kRR + r;
    if (j >= a.L) continue;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = lane + 32 * c;
      if (col >= hd) break;
      out[j * 2 * d + col] = dk[r][c] * a.scale;
      out[j * 2 * d + d + col] = dv[r][c];
    }
  }
}

// Per query tile: dQ += scale dS K over the key tiles it sees.
template <int NC>
__global__ void __launch_bounds__(kRT)
    rb_backward_q(RingBlockArgs a, const float* dout, const float* lse, const float* dd, float* dqkv) {
  extern __shared__ float sm[];
  const int hd = static_cast<int>(a.hd), hd4 = rb_width4(hd), hp = rb_stride4(hd);
  float *qs = sm, *dos = qs + kRB * hp, *ks = dos + kRB * hp, *vs = ks + kRB * hp, *ls = vs + kRB * hp, *ds = ls + kRB,
        *dss = ds + kRB;
  const std::int64_t d = a.heads * a.hd, nh = blockIdx.x, n = nh / a.heads, h = nh % a.heads;
  const std::int64_t i0 = std::int64_t(blockIdx.y) * kRB;
  const float* q = a.qkv + n * a.L * 3 * d + h * a.hd;
  const float* k = a.kv + n * a.L * 2 * d + h * a.hd;
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  rb_load(q, 3 * d, i0, a.L, hd, qs, hp);
  rb_load(dout + n * a.L * d + h * a.hd, d, i0, a.L, hd, dos, hp);
  if (threadIdx.x < kRB) {
    const bool in = i0 + threadIdx.x < a.L;
    ls[threadIdx.x] = in ? lse[nh * a.L + i0 + threadIdx.x] : 0.f;
    ds[threadIdx.x] = in ? dd[nh * a.L + i0 + threadIdx.x] : 0.f;
  }
  float dq[kRR][NC];
#pragma unroll
  for (int r = 0; r < kRR; ++r)
#pragma unroll
    for (int c = 0; c < NC; ++c) dq[r][c] = 0.f;
  const std::int64_t kend = rb_visible(a, rb_last(a, i0));
  for (std::int64_t j0 = 0; j0 < kend; j0 += kRB) {
    __syncthreads();
    rb_load(k, 2 * d, j0, a.L, hd, ks, hp);
    rb_load(k + d, 2 * d, j0, a.L, hd, vs, hp);
    __syncthreads();
    // lane: key j0 + lane; the warp's queries i0 + w*kRR + r
    float s[kRR], dp[kRR];
#pragma unroll
    for (int r = 0; r < kRR; ++r) s[r] = dp[r] = 0.f;
#pragma unroll 2
    for (int c = 0; c < hd4; c += 4) {
      const float4 kv = rb_ld4(ks + lane * hp + c), vv = rb_ld4(vs + lane * hp + c);
#pragma unroll
      for (int r = 0; r < kRR; ++r) {
        s[r] = rb_fma4(rb_ld4(qs + (w * kRR + r) * hp + c), kv, s[r]);
        dp[r] = rb_fma4(rb_ld4(dos + (w * kRR + r) * hp + c), vv, dp[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRR; ++r) {
      const int ri = w * kRR + r;
      const float p = rb_sees(a, i0 + ri, j0 + lane) ? expf(s[r] * a.scale - ls[ri]) : 0.f;
      dss[ri * kRP + lane] = p * (dp[r] - ds[ri]);
    }
    __syncwarp();
#pragma unroll
    for (int c = 0; c < NC; ++c) {
      const int col = lane + 32 * c;
      if (col >= hd) break;
#pragma unroll 2
      for (int j = 0; j < kRB; j += 4) {
        const float4 kv = {ks[j * hp + col], ks[(j + 1) * hp + col], ks[(j + 2) * hp + col], ks[(j + 3) * hp + col]};
#pragma unroll
        for (int r = 0; r < kRR; ++r) dq[r][c] = rb_fma4(rb_ld4(dss + (w * kRR + r) * kRP + j), kv, dq[r][c]);
      }
    }
  }
  float* dx = dqkv + n * a.L * 3 * d + h * a.hd;
#pragma unroll
  for (int r = 0; r < kRR; ++r) {
    const std::int64_t i = i0 + w * kRR + r;
    if (i >= a.L) continue;
#pragma unroll
    for (int c = 0; c < NC; ++c)
      if (lane + 32 * c < hd) dx[i * 3 * d + lane + 32 * c] += dq[r][c] * a.scale;
  }
}

std::size_t rb_fwd_smem(int hd) { return sizeof(float) * (3 * kRB * rb_stride4(hd) + kRB * kRP); }
std::size_t rb_kv_smem(int hd) { return sizeof(float) * (4 * kRB * rb_stride4(hd) + 2 * kRB + 2 * kRB * kRP); }
std::size_t rb_q_smem(int hd) { return sizeof(float) * (4 * kRB * rb_stride4(hd) + 2 * kRB + kRB * kRP); }

}  // namespace

// ---- launchers (not emulated) ----
namespace {

template <typename K, typename... A>
void rb_launch(K kernel, dim3 grid, std::size_t smem, cudaStream_t s, A... args) {
  if (smem > 48 * 1024)
    RT_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<grid, kRT, smem, s>>>(args...);
  RT_CUDA(cudaGetLastError());
}

// f(std::integral_constant<int, NC>{}): the head columns per lane, a power of two (hd <= 256).
template <typename F>
void rb_dispatch(std::int64_t hd, const char* what, F&& f) {
  RT_CHECK(hd >= 1 && hd <= 256, what, ": head width ", hd, " is not in [1, 256]");
  if (hd <= 32) f(std::integral_constant<int, 1>{});
  else if (hd <= 64) f(std::integral_constant<int, 2>{});
  else if (hd <= 128) f(std::integral_constant<int, 4>{});
  else f(std::integral_constant<int, 8>{});
}

dim3 rb_tiles(const RingBlockArgs& a, const char* what) {
  RT_CHECK(a.qkv && a.kv && a.n > 0 && a.heads > 0 && a.chunk > 0 && a.L == 2 * a.chunk, what, ": ", a.n,
           " samples of ", a.L, " tokens (2 chunks of ", a.chunk, "), ", a.heads, " heads do not fit");
  RT_CHECK(a.n * a.heads <= INT_MAX && (a.L + kRB - 1) / kRB <= 65535, what, ": ", a.n * a.heads, " heads x ", a.L,
           " tokens is more than one grid holds");
  return dim3(static_cast<unsigned>(a.n * a.heads), static_cast<unsigned>((a.L + kRB - 1) / kRB));
}

}  // namespace

void ring_block_forward(const RingBlockArgs& a, bool first, float* acc, float* m, float* l, cudaStream_t s) {
  const dim3 grid = rb_tiles(a, "ring attention block forward");
  rb_dispatch(a.hd, "ring attention block forward", [&](auto nc) {
    rb_launch(rb_forward<decltype(nc)::value>, grid, rb_fwd_smem(int(a.hd)), s, a, first, acc, m, l);
  });
}

void ring_block_finish(const float* acc, const float* m, const float* l, std::int64_t n, std::int64_t L,
                       std::int64_t heads, std::int64_t hd, float* out, float* lse, cudaStream_t s) {
  const std::int64_t total = n * L * heads * hd;
  if (total == 0) return;
  const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>((total + kRT - 1) / kRT, 132 * 16));
  rb_finish<<<blocks, kRT, 0, s>>>(acc, m, l, n, L, heads, hd, out, lse, blocks);
  RT_CUDA(cudaGetLastError());
}

void attention_rowdot(const float* out, const float* dout, std::int64_t n, std::int64_t L, std::int64_t heads,
                      std::int64_t hd, float* D, cudaStream_t s) {
  const std::int64_t rows = n * heads * L;
  if (rows == 0) return;
  RT_CHECK((rows + kRW - 1) / kRW <= INT_MAX, "attention row dot: ", rows, " rows is more than one grid holds");
  rb_rowdot<<<static_cast<unsigned>((rows + kRW - 1) / kRW), kRT, 0, s>>>(out, dout, n, L, heads, hd, D);
  RT_CUDA(cudaGetLastError());
}

void ring_block_backward(const RingBlockArgs& a, const float* dout, const float* lse, const float* D, float* dqkv,
                         float* dkv, cudaStream_t s) {
  const dim3 grid = rb_tiles(a, "ring attention block backward");
  rb_dispatch(a.hd, "ring attention block backward", [&](auto nc) {
    constexpr int NC = decltype(nc)::value;
    rb_launch(rb_backward_kv<NC>, grid, rb_kv_smem(int(a.hd)), s, a, dout, lse, D, dkv);
    rb_launch(rb_backward_q<NC>, grid, rb_q_smem(int(a.hd)), s, a, dout, lse, D, dqkv);
  });
}

}  // namespace ringtrain::cuda
