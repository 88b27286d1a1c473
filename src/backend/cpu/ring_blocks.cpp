// Ring attention's block arithmetic on the CPU (Backend::ring_block_*; the
// ring itself is nn/ring_attention.cpp): FlashAttention-2's on one (query
// block, key block) pair, float32, with oneDNN's sgemm on strided views, one
// (sample, head) per OpenMP thread at a time; the calling (master) thread
// calls `poll` between its heads, so that MPI moves the ring's next block
// meanwhile (Open MPI progresses a rendezvous only inside MPI calls).
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu_backend.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain {
namespace cpu {
namespace {

constexpr std::int64_t kRows = 64;  // query rows per tile: a [64, block] score tile per thread
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Row-major C = alpha op(A) op(B) + beta C.
void gemm(char ta, char tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  const dnnl_status_t st = dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  RT_CHECK(st == dnnl_success, "ring attention: dnnl_sgemm failed (status ", int(st), ")");
}

struct Geom {
  std::int64_t n, L, d, ld, H, hd;  // samples, block tokens, H * hd, qkv's row stride (3 d), heads, head width
};

Geom check(const Tensor& qkv, const Tensor& kv, const RingBlockSpec& b, const char* what) {
  const std::int64_t d = b.heads * b.head_dim;
  RT_CHECK(qkv.device().is_cpu() && kv.device().is_cpu() && qkv.dtype() == DType::f32 && kv.dtype() == DType::f32,
           what, ": float32 CPU tensors, got qkv ", dtype_name(qkv.dtype()), " on ", qkv.device().str());
  RT_CHECK(qkv.ndim() == 3 && qkv.dim(1) == 2 * b.chunk && qkv.dim(2) == 3 * d && kv.numel() == qkv.dim(0) * qkv.dim(1) * 2 * d,
           what, ": qkv ", shape_str(qkv.shape()), " and kv ", shape_str(kv.shape()), " are not [N, ", 2 * b.chunk,
           ", ", 3 * d, "] and [N, ", 2 * b.chunk, ", ", 2 * d, "]");
  return {qkv.dim(0), qkv.dim(1), d, 3 * d, b.heads, b.head_dim};
}
void expect(const Tensor& t, std::int64_t numel, const char* what, const char* name) {
  RT_CHECK(t.device().is_cpu() && t.dtype() == DType::f32 && t.numel() == numel, what, ": ", name, " ",
           shape_str(t.shape()), " is not float32 of ", numel, " elements on the CPU");
}

std::vector<std::int64_t> positions(const int (&chunks)[2], std::int64_t c) {
  std::vector<std::int64_t> p(static_cast<std::size_t>(2 * c));
  for (std::int64_t i = 0; i < 2 * c; ++i) p[std::size_t(i)] = std::int64_t(chunks[i / c]) * c + i % c;
  return p;
}

// The visible keys of query position p in a block whose positions ascend.
std::int64_t visible(const std::vector<std::int64_t>& kpos, std::int64_t p) {
  return std::int64_t(std::upper_bound(kpos.begin(), kpos.end(), p) - kpos.begin());
}

// f(b, scratch) for every (sample, head) b, in parallel; the master thread polls between heads.
template <class F>
void parallel_heads(std::int64_t nb, std::int64_t L, Tensor& work, const std::function<void()>& poll, F&& f) {
  const int nt = int(std::max<std::int64_t>(1, std::min<std::int64_t>(omp_get_max_threads(), nb)));
  const std::int64_t per = kRows * L * 2 + 2 * kRows;
  if (work.numel() != per * nt || !work.device().is_cpu() || work.dtype() != DType::f32) work = Tensor::empty({per * nt});
  float* base = work.data<float>();
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (std::int64_t b = 0; b < nb; ++b) {
    f(b, base + per * omp_get_thread_num());
    if (omp_get_thread_num() == 0 && poll) poll();
  }
}

// Head b: the queries against one K/V block, merged into the running (m, l)
// and the unnormalised output rows.
void forward_block(const Geom& G, float scale, std::int64_t b, const float* x, const float* kv,
                   const std::vector<std::int64_t>& qpos, const std::vector<std::int64_t>& kpos, float* o, float* m,
                   float* l, float* scratch) {
  const std::int64_t H = G.H, hd = G.hd, n = b / H, h = b % H, L = G.L;
  const float* q = x + n * L * G.ld + h * hd;
  const float* k = kv + n * L * 2 * G.d + h * hd;
  const float* v = k + G.d;
  float* ob = o + n * L * G.d + h * hd;
  std::int64_t nv[kRows];
  for (std::int64_t r0 = 0; r0 < L; r0 += kRows) {
    const std::int64_t br = std::min(kRows, L - r0);
    std::int64_t nmax = 0;
    for (std::int64_t i = 0; i < br; ++i) nmax = std::max(nmax, nv[i] = visible(kpos, qpos[std::size_t(r0 + i)]));
    if (nmax == 0) continue;
    float* s = scratch;
    gemm('N', 'T', br, nmax, hd, scale, q + r0 * G.ld, G.ld, k, 2 * G.d, 0.f, s, nmax);
    for (std::int64_t i = 0; i < br; ++i) {
      float* si = s + i * nmax;
      float* acc = ob + (r0 + i) * G.d;
      if (nv[i] == 0) {
        std::fill(si, si + nmax, 0.f);
        continue;
      }
      float mx = m[r0 + i];
      for (std::int64_t j = 0; j < nv[i]; ++j) mx = std::max(mx, si[j]);
      const float corr = m[r0 + i] == kNegInf ? 0.f : std::exp(m[r0 + i] - mx);
      float sum = 0;
      for (std::int64_t j = 0; j < nv[i]; ++j) sum += (si[j] = std::exp(si[j] - mx));
      std::fill(si + nv[i], si + nmax, 0.f);
      l[r0 + i] = l[r0 + i] * corr + sum;
      if (corr != 1.f)
        for (std::int64_t c = 0; c < hd; ++c) acc[c] *= corr;
      m[r0 + i] = mx;
    }
    gemm('N', 'N', br, hd, nmax, 1.f, s, nmax, v, 2 * G.d, 1.f, ob + r0 * G.d, G.d);
  }
}

// Head b of one block's backward: dQ into dx's q columns, the block's dK/dV into dkv [N, L, 2d].
void backward_block(const Geom& G, float scale, std::int64_t b, const float* x, const float* kv, const float* dy,
                    const std::vector<std::int64_t>& qpos, const std::vector<std::int64_t>& kpos, const float* lse,
                    const float* D, float* dx, float* dkv, float* scratch) {
  const std::int64_t H = G.H, hd = G.hd, n = b / H, h = b % H, L = G.L;
  const float* q = x + n * L * G.ld + h * hd;
  const float* k = kv + n * L * 2 * G.d + h * hd;
  const float* v = k + G.d;
  const float* dob = dy + n * L * G.d + h * hd;
  float* dq = dx + n * L * G.ld + h * hd;
  float* dk = dkv + n * L * 2 * G.d + h * hd;
  float* dv = dk + G.d;
  std::int64_t nv[kRows];
  for (std::int64_t r0 = 0; r0 < L; r0 += kRows) {
    const std::int64_t br = std::min(kRows, L - r0);
    std::int64_t nmax = 0;
    for (std::int64_t i = 0; i < br; ++i) nmax = std::max(nmax, nv[i] = visible(kpos, qpos[std::size_t(r0 + i)]));
    if (nmax == 0) continue;
    float *p = scratch, *dp = scratch + kRows * L;
    gemm('N', 'T', br, nmax, hd, scale, q + r0 * G.ld, G.ld, k, 2 * G.d, 0.f, p, nmax);
    gemm('N', 'T', br, nmax, hd, 1.f, dob + r0 * G.d, G.d, v, 2 * G.d, 0.f, dp, nmax);
    for (std::int64_t i = 0; i < br; ++i) {
      float *pi = p + i * nmax, *dpi = dp + i * nmax;
      for (std::int64_t j = 0; j < nmax; ++j) {
        const float e = j < nv[i] ? std::exp(pi[j] - lse[r0 + i]) : 0.f;
        pi[j] = e;
        dpi[j] = e * (dpi[j] - D[r0 + i]);  // dS
      }
    }
    gemm('N', 'N', br, hd, nmax, scale, dp, nmax, k, 2 * G.d, 1.f, dq + r0 * G.ld, G.ld);    // dQ += scale dS K
    gemm('T', 'N', nmax, hd, br, scale, dp, nmax, q + r0 * G.ld, G.ld, 1.f, dk, 2 * G.d);  // dK += scale dS^T Q
    gemm('T', 'N', nmax, hd, br, 1.f, p, nmax, dob + r0 * G.d, G.d, 1.f, dv, 2 * G.d);       // dV += P^T dO
  }
}

}  // namespace

void ring_block_forward(const Tensor& qkv, const Tensor& kv, const RingBlockSpec& b, bool first, Tensor& acc,
                        Tensor& m, Tensor& l, Tensor& work, const std::function<void()>& poll) {
  const char* what = "ring attention block forward";
  const Geom G = check(qkv, kv, b, what);
  const std::int64_t nb = G.n * G.H;
  expect(acc, G.n * G.L * G.d, what, "acc");
  expect(m, nb * G.L, what, "m");
  expect(l, nb * G.L, what, "l");
  if (first) {
    acc.zero_(), l.zero_();
    std::fill(m.data<float>(), m.data<float>() + m.numel(), kNegInf);
  }
  const std::vector<std::int64_t> qpos = positions(b.q_chunks, b.chunk), kpos = positions(b.k_chunks, b.chunk);
  const float *x = qkv.data<float>(), *cur = kv.data<float>();
  float *o = acc.data<float>(), *pm = m.data<float>(), *pl = l.data<float>();
  parallel_heads(nb, G.L, work, poll, [&](std::int64_t h, float* scratch) {
    forward_block(G, b.scale, h, x, cur, qpos, kpos, o, pm + h * G.L, pl + h * G.L, scratch);
  });
}

// out = acc / l, lse = m + log l (every row sees at least itself: l > 0).
void ring_block_finish(const Tensor& acc, const Tensor& m, const Tensor& l, std::int64_t heads, Tensor& out,
                       Tensor& lse) {
  const char* what = "ring attention finish";
  RT_CHECK(acc.ndim() == 3 && acc.dim(2) % heads == 0, what, ": acc ", shape_str(acc.shape()), " is not [N, L, ",
           heads, " heads x head width]");
  const std::int64_t n = acc.dim(0), L = acc.dim(1), d = acc.dim(2), hd = d / heads, nb = n * heads;
  expect(acc, n * L * d, what, "acc");
  expect(out, n * L * d, what, "out");
  expect(m, nb * L, what, "m");
  expect(l, nb * L, what, "l");
  expect(lse, nb * L, what, "lse");
  const float *a = acc.data<float>(), *pm = m.data<float>(), *pl = l.data<float>();
  float *o = out.data<float>(), *ls = lse.data<float>();
  for (std::int64_t b = 0; b < nb; ++b)
    for (std::int64_t i = 0; i < L; ++i) {
      const std::int64_t s = b / heads, h = b % heads, r = b * L + i, off = (s * L + i) * d + h * hd;
      const float inv = 1.f / pl[r];
      for (std::int64_t k = 0; k < hd; ++k) o[off + k] = a[off + k] * inv;
      ls[r] = pm[r] + std::log(pl[r]);
    }
}

// D = rowsum(dO * O) per (sample, head, token).
void attention_rowdot(const Tensor& out, const Tensor& dout, std::int64_t heads, Tensor& D) {
  const char* what = "attention row dot";
  RT_CHECK(out.ndim() == 3 && out.dim(2) % heads == 0, what, ": out ", shape_str(out.shape()), " is not [N, L, ",
           heads, " heads x head width]");
  const std::int64_t n = out.dim(0), L = out.dim(1), d = out.dim(2), hd = d / heads, nb = n * heads;
  expect(out, n * L * d, what, "out");
  expect(dout, n * L * d, what, "dout");
  expect(D, nb * L, what, "D");
  const float *o = out.data<float>(), *dy = dout.data<float>();
  float* pd = D.data<float>();
  for (std::int64_t b = 0; b < nb; ++b)
    for (std::int64_t i = 0; i < L; ++i) {
      const std::int64_t off = ((b / heads) * L + i) * d + (b % heads) * hd;
      float s = 0;
      for (std::int64_t k = 0; k < hd; ++k) s += o[off + k] * dy[off + k];
      pd[b * L + i] = s;
    }
}

void ring_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& dout, const Tensor& lse, const Tensor& D,
                         const RingBlockSpec& b, Tensor& dqkv, Tensor& dkv, Tensor& work,
                         const std::function<void()>& poll) {
  const char* what = "ring attention block backward";
  const Geom G = check(qkv, kv, b, what);
  const std::int64_t nb = G.n * G.H;
  expect(dout, G.n * G.L * G.d, what, "dout");
  expect(lse, nb * G.L, what, "lse");
  expect(D, nb * G.L, what, "D");
  expect(dqkv, qkv.numel(), what, "dqkv");
  expect(dkv, kv.numel(), what, "dkv");
  dkv.zero_();
  const std::vector<std::int64_t> qpos = positions(b.q_chunks, b.chunk), kpos = positions(b.k_chunks, b.chunk);
  const float *x = qkv.data<float>(), *cur = kv.data<float>(), *dy = dout.data<float>(), *ls = lse.data<float>(),
              *pd = D.data<float>();
  float *dx = dqkv.data<float>(), *dk = dkv.data<float>();
  parallel_heads(nb, G.L, work, poll, [&](std::int64_t h, float* scratch) {
    backward_block(G, b.scale, h, x, cur, dy, qpos, kpos, ls + h * G.L, pd + h * G.L, dx, dk, scratch);
  });
}

}  // namespace cpu
}  // namespace ringtrain
