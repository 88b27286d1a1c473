// The mixture-of-experts layer's loops on the device (Backend::moe_route,
// moe_gather_rows, moe_combine, moe_combine_backward, moe_router_backward;
// the CPU's are src/backend/cpu/moe_ops.cpp). Every sum runs in the CPU
// loop's order and type (double where the CPU's is double), so the device
// routes as the CPU does (the same top-k, ties to the lower expert) and its
// gates and combines differ from the CPU's by rounding only: one thread per
// token for the router (E and k are small), one block per row for the row
// copies and the combine, the combine backward's dot product in a fixed tree.
// No atomics: every run gives the same bits. Blocks of kMoeThreads threads
// and no blockDim/gridDim, so tests/gpu/emulate/run.sh runs them on the CPU.
#include <cstdint>

#include "kernels/launch.cuh"
#include "ringtrain/cuda/kernels.hpp"

namespace ringtrain::cuda {
namespace {

constexpr int kMoeThreads = 128;  // a power of two: the tree reduction halves it

// Token t's softmax in place (the row maximum subtracted, in double), its
// top-k of p + bias (ties: the lower expert) and the renormalised gates.
__global__ void moe_route_kernel(MoeRoute a) {
  const std::int64_t t = std::int64_t(blockIdx.x) * kMoeThreads + threadIdx.x;
  if (t >= a.n) return;
  float* pr = a.probs + t * a.E;
  float mx = pr[0];
  for (int e = 1; e < a.E; ++e) mx = pr[e] > mx ? pr[e] : mx;
  double z = 0;
  for (int e = 0; e < a.E; ++e) z += exp(double(pr[e]) - mx);
  for (int e = 0; e < a.E; ++e) pr[e] = static_cast<float>(exp(double(pr[e]) - mx) / z);
  int* ex = a.expert + t * a.k;
  for (int j = 0; j < a.k; ++j) {  // selection: the best not yet taken (a strict order: score, then index)
    int best = -1;
    float bs = 0;
    for (int e = 0; e < a.E; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken = taken || ex[i] == e;
      if (taken) continue;
      const float sc = a.bias ? pr[e] + a.bias[e] : pr[e];
      if (best < 0 || sc > bs) best = e, bs = sc;  // ascending e: an equal score keeps the lower index
    }
    ex[j] = best;
  }
  double sum = 0;
  for (int j = 0; j < a.k; ++j) sum += pr[ex[j]];
  for (int j = 0; j < a.k; ++j) a.gate[t * a.k + j] = static_cast<float>(pr[ex[j]] / sum);
}

// psum[e] = the sum of column e of p in token order (the CPU's order).
__global__ void moe_psum_kernel(MoeRoute a) {
  const int e = blockIdx.x * kMoeThreads + threadIdx.x;
  if (e >= a.E) return;
  double s = 0;
  for (std::int64_t t = 0; t < a.n; ++t) s += a.probs[t * a.E + e];
  a.psum[e] = s;
}

// dst row i (block i) := src row idx[i], or zeros.
__global__ void moe_gather_kernel(const float* src, const std::int64_t* idx, float* dst, std::int64_t D) {
  const std::int64_t i = blockIdx.x, r = idx[i];
  float* d = dst + i * D;
  for (std::int64_t c = threadIdx.x; c < D; c += kMoeThreads) d[c] = r < 0 ? 0.f : src[r * D + c];
}

// Block i: token t = tokens[i] (or i); y[t] (+)= sum_j gate * rows[row], in j order.
__global__ void moe_combine_kernel(MoeCombine a) {
  const std::int64_t t = a.tokens ? a.tokens[blockIdx.x] : std::int64_t(blockIdx.x);
  float* yt = a.y + t * a.D;
  for (std::int64_t c = threadIdx.x; c < a.D; c += kMoeThreads) {
    float v = a.accumulate ? yt[c] : 0.f;
    for (std::int64_t q = t * a.k; q < (t + 1) * a.k; ++q) {
      const std::int64_t r = a.row[q];
      if (r < 0) continue;
      v += a.gate ? a.gate[q] * a.rows[r * a.D + c] : a.rows[r * a.D + c];
    }
    yt[c] = v;
  }
}

// Block a (one assignment): drows[row] = gate dy[t]; dgate = dy[t] . rows[row] (double, a fixed tree).
__global__ void moe_combine_backward_kernel(MoeCombine a, const float* dy, float* dgate, float* drows) {
  __shared__ double sh[kMoeThreads];
  const std::int64_t q = blockIdx.x, r = a.row[q];
  if (r < 0) {  // uniform over the block: no barrier is skipped by some threads only
    if (threadIdx.x == 0) dgate[q] = 0.f;
    return;
  }
  const float* d = dy + (q / a.k) * a.D;
  const float* o = a.rows + r * a.D;
  float* dd = drows + r * a.D;
  const float g = a.gate[q];
  double dot = 0;
  for (std::int64_t c = threadIdx.x; c < a.D; c += kMoeThreads) {
    dot += double(d[c]) * o[c];
    dd[c] = g * d[c];
  }
  sh[threadIdx.x] = dot;
  __syncthreads();
  for (int s = kMoeThreads / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) dgate[q] = static_cast<float>(sh[0]);
}

// Token t: dlogit = p (dp - p . dp), dp = aux_g f + (dgate - sum gate dgate) / sum p at the chosen experts.
// The chosen experts are distinct, so each dp[e] is the CPU's one or two terms, added in its order.
__global__ void moe_router_backward_kernel(MoeRouterBackward a) {
  const std::int64_t t = std::int64_t(blockIdx.x) * kMoeThreads + threadIdx.x;
  if (t >= a.n) return;
  const float* pr = a.probs + t * a.E;
  const int* ex = a.expert + t * a.k;
  const float* g = a.gate + t * a.k;
  const float* dg = a.dgate + t * a.k;
  double sum = 0, gd = 0;
  for (int j = 0; j < a.k; ++j) {
    sum += pr[ex[j]];
    gd += double(g[j]) * dg[j];
  }
  double pdp = 0;
  for (int pass = 0; pass < 2; ++pass)
    for (int e = 0; e < a.E; ++e) {
      double dp = a.aux_g * a.f[e];
      for (int j = 0; j < a.k; ++j)
        if (ex[j] == e) dp += (dg[j] - gd) / sum;
      if (pass == 0) pdp += double(pr[e]) * dp;
      else a.dlogit[t * a.E + e] = static_cast<float>(pr[e] * (dp - pdp));
    }
}

}  // namespace

// ---- launchers (not emulated) ----
void moe_route(const MoeRoute& a, cudaStream_t s) {
  RT_CHECK(a.probs && a.expert && a.gate && a.psum && a.E >= 1 && a.k >= 1 && a.k <= a.E && a.n >= 0 &&
               a.n / kMoeThreads < INT32_MAX,
           "moe_route: ", a.n, " tokens over ", a.E, " experts with top ", a.k, " do not fit");
  if (a.n > 0) {
    moe_route_kernel<<<unsigned((a.n + kMoeThreads - 1) / kMoeThreads), kMoeThreads, 0, s>>>(a);
    RT_CUDA_LAUNCHED("moe_route");
  }
  moe_psum_kernel<<<unsigned((a.E + kMoeThreads - 1) / kMoeThreads), kMoeThreads, 0, s>>>(a);
  RT_CUDA_LAUNCHED("moe_route psum");
}

void moe_gather_rows(const float* src, const std::int64_t* idx, float* dst, std::int64_t rows, std::int64_t D,
                     cudaStream_t s) {
  RT_CHECK(rows >= 0 && rows <= INT32_MAX && D > 0, "moe_gather_rows: ", rows, " rows of ", D, " do not fit");
  if (rows == 0) return;
  moe_gather_kernel<<<unsigned(rows), kMoeThreads, 0, s>>>(src, idx, dst, D);
  RT_CUDA_LAUNCHED("moe_gather_rows");
}

void moe_combine(const MoeCombine& a, std::int64_t count, cudaStream_t s) {
  RT_CHECK(count >= 0 && count <= INT32_MAX && a.D > 0 && a.k >= 1, "moe_combine: ", count, " tokens of ", a.D,
           " do not fit");
  if (count == 0) return;
  moe_combine_kernel<<<unsigned(count), kMoeThreads, 0, s>>>(a);
  RT_CUDA_LAUNCHED("moe_combine");
}

void moe_combine_backward(const MoeCombine& a, std::int64_t n, const float* dy, float* dgate, float* drows,
                          cudaStream_t s) {
  const std::int64_t q = n * a.k;
  RT_CHECK(q >= 0 && q <= INT32_MAX && a.D > 0, "moe_combine_backward: ", q, " assignments do not fit");
  if (q == 0) return;
  moe_combine_backward_kernel<<<unsigned(q), kMoeThreads, 0, s>>>(a, dy, dgate, drows);
  RT_CUDA_LAUNCHED("moe_combine_backward");
}

void moe_router_backward(const MoeRouterBackward& a, cudaStream_t s) {
  RT_CHECK(a.n >= 0 && a.n / kMoeThreads < INT32_MAX, "moe_router_backward: ", a.n, " tokens do not fit");
  if (a.n == 0) return;
  moe_router_backward_kernel<<<unsigned((a.n + kMoeThreads - 1) / kMoeThreads), kMoeThreads, 0, s>>>(a);
  RT_CUDA_LAUNCHED("moe_router_backward");
}

}  // namespace ringtrain::cuda
