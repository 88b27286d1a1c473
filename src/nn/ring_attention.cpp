// Ring attention on the CPU (nn/context_parallel.hpp): the block arithmetic
// is FlashAttention-2's on one (query block, key block) pair, float32, with
// oneDNN's sgemm on strided views; the ring is MPI_Isend/MPI_Irecv to the
// neighbours, completed by wait_bounded (a peer that never comes ends the job
// naming it). While a block's arithmetic runs, the OpenMP master thread tests
// the transfers between its heads, so MPI moves the next block meanwhile
// (Open MPI progresses a rendezvous only inside MPI calls).
#include <dnnl.h>
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <ctime>
#include <limits>
#include <vector>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/comm/flight_recorder.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/nn/context_parallel.hpp"

namespace ringtrain {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
double thread_cpu_s() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

constexpr std::int64_t kRows = 64;  // query rows per tile: a [64, block] score tile per thread
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kTagKv = 7201, kTagDkv = 7202;

// Row-major C = alpha op(A) op(B) + beta C.
void gemm(char ta, char tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  const dnnl_status_t st = dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  RT_CHECK(st == dnnl_success, "ring attention: dnnl_sgemm failed (status ", int(st), ")");
}

// One transfer around the ring: send to rank+1, receive from rank-1.
class RingStep {
 public:
  explicit RingStep(const ContextGroup& g) : g_(g) {}
  ~RingStep() {
    for (MPI_Request& r : q_)
      if (r != MPI_REQUEST_NULL) MPI_Cancel(&r), MPI_Request_free(&r);  // only after an error elsewhere
  }
  void start(const float* send, float* recv, std::int64_t n, int tag, const char* what) {
    RT_CHECK(n <= INT_MAX, "ring attention: a block of ", n, " floats exceeds MPI's int count (use a smaller "
             "data.batch_size or more parallel.micro_batches)");
    const int next = (g_.rank + 1) % g_.size, prev = (g_.rank + g_.size - 1) % g_.size;
    MPI_Comm c = g_.comm.handle("ring attention");
    check_mpi(MPI_Irecv(recv, int(n), MPI_FLOAT, prev, tag, c, &q_[0]), what, "MPI_Irecv");
    check_mpi(MPI_Isend(send, int(n), MPI_FLOAT, next, tag, c, &q_[1]), what, "MPI_Isend");
    bytes_ = std::size_t(n) * 4;
    what_ = cat(what, ": context rank ", g_.rank, " sending to context rank ", next, " and receiving from context "
                "rank ", prev);
    if (g_.stats) {
      g_.stats->bytes_sent += 4.0 * double(n);
      if (tag == kTagKv && forward_) g_.stats->fwd_bytes_sent += 4.0 * double(n);
    }
  }
  void poll() {
    int done = 0;
    if (q_[0] != MPI_REQUEST_NULL || q_[1] != MPI_REQUEST_NULL) MPI_Testall(2, q_, &done, MPI_STATUSES_IGNORE);
  }
  void wait() {
    if (q_[0] == MPI_REQUEST_NULL && q_[1] == MPI_REQUEST_NULL) return;
    const auto t0 = Clock::now();
    // The flight record shows this rank waiting on its ring neighbours (comm/flight_recorder.hpp).
    flight_recorder::Op rec(g_.comm.handle("ring attention"), g_.comm.name(), "ring attention", bytes_,
                            (g_.rank + g_.size - 1) % g_.size);
    wait_bounded(q_, 2, WaitOn(g_.comm, "ring attention"), what_.c_str());
    rec.done();
    if (g_.stats) g_.stats->wait_s += since(t0);
  }
  bool forward_ = false;

 private:
  const ContextGroup& g_;
  MPI_Request q_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  std::string what_;
  std::size_t bytes_ = 0;
};

class RingAttention final : public AttentionKernel {
 public:
  RingAttention(const AttentionSpec& s, ContextGroup g) : s_(s), g_(std::move(g)) {
    RT_CHECK(s.causal, "ring attention: only causal attention is split over parallel.context");
    // bf16/fp16 math allows 16-bit products inside kernels; this one keeps them float32.
    RT_CHECK(s.dtype == DType::f32, "ring attention: float32 activations only, got ", dtype_name(s.dtype));
    RT_CHECK(g_.size > 1 && g_.seq > 0, "ring attention: needs a context group of 2 or more ranks");
    scale_ = float(s.scale > 0 ? s.scale : 1.0 / std::sqrt(double(s.head_dim)));
  }
  KernelStatePtr make_state() const override { return std::make_unique<Saved>(); }

  void forward(const Tensor& qkv, Tensor& out, KernelState& ks) override {
    Saved& sv = state_as<Saved>(ks, "ring attention");
    const Geom G = geom(qkv, "ring attention forward");
    RT_CHECK(out.dtype() == DType::f32 && out.device().is_cpu() && out.numel() == G.n * G.L * G.d,
             "ring attention forward: out ", shape_str(out.shape()), " is not float32 [", G.n, ", ", G.L, ", ", G.d, "]");
    const std::int64_t H = s_.heads, nb = G.n * H, blk = G.n * G.L * 2 * G.d;
    grow(kv_[0], blk), grow(kv_[1], blk);
    pack_kv(qkv, G, kv_[0].data<float>());
    if (sv.lse.numel() != nb * G.L) sv.lse = Tensor::empty({nb * G.L});
    Tensor m = Tensor::empty({nb * G.L}), l = Tensor::zeros({nb * G.L});
    std::fill(m.data<float>(), m.data<float>() + m.numel(), kNegInf);
    out.zero_();
    const std::vector<std::int64_t> qpos = positions(g_.rank, G.L);
    RingStep ring(g_);
    ring.forward_ = true;
    for (int step = 0; step < g_.size; ++step) {
      const int src = (g_.rank - step + g_.size) % g_.size;
      const float* cur = kv_[step % 2].data<float>();
      if (step + 1 < g_.size) ring.start(cur, kv_[(step + 1) % 2].data<float>(), blk, kTagKv, "ring attention forward");
      const std::vector<std::int64_t> kpos = positions(src, G.L);
      const auto t0 = Clock::now();
      const double c0 = thread_cpu_s();
      const float* x = qkv.data<float>();
      float *o = out.data<float>(), *pm = m.data<float>(), *pl = l.data<float>();
      parallel_heads(nb, ring, [&](std::int64_t b, float* scratch) {
        forward_block(G, b, x, cur, qpos, kpos, o, pm + b * G.L, pl + b * G.L, scratch);
      });
      if (g_.stats) g_.stats->compute_s += since(t0), g_.stats->compute_cpu_s += thread_cpu_s() - c0;
      ring.wait();
    }
    // out = acc / l, lse = m + log l (every row sees at least itself: l > 0).
    float *o = out.data<float>(), *lse = sv.lse.data<float>();
    const float *pm = m.data<float>(), *pl = l.data<float>();
    const std::int64_t hd = s_.head_dim;
    for (std::int64_t b = 0; b < nb; ++b)
      for (std::int64_t i = 0; i < G.L; ++i) {
        const std::int64_t n = b / H, h = b % H, r = b * G.L + i;
        float* row = o + (n * G.L + i) * G.d + h * hd;
        const float inv = 1.f / pl[r];
        for (std::int64_t k = 0; k < hd; ++k) row[k] *= inv;
        lse[r] = pm[r] + std::log(pl[r]);
      }
    sv.out = out;
    if (g_.stats) ++g_.stats->forwards;
  }

  void backward(const Tensor& qkv, const Tensor& dout, Tensor& dqkv, KernelState& ks) override {
    Saved& sv = state_as<Saved>(ks, "ring attention");
    const Geom G = geom(qkv, "ring attention backward");
    const std::int64_t H = s_.heads, hd = s_.head_dim, nb = G.n * H, blk = G.n * G.L * 2 * G.d;
    RT_CHECK(sv.lse.numel() == nb * G.L && sv.out.defined() && sv.out.numel() == G.n * G.L * G.d &&
                 dout.numel() == sv.out.numel() && dout.dtype() == DType::f32 && dqkv.numel() == qkv.numel() &&
                 dqkv.dtype() == DType::f32,
             "ring attention backward: no forward of these shapes before it");
    // D = rowsum(dO * O) per (sample, head, token).
    Tensor D = Tensor::empty({nb * G.L});
    const float *o = sv.out.data<float>(), *dy = dout.data<float>();
    for (std::int64_t b = 0; b < nb; ++b)
      for (std::int64_t i = 0; i < G.L; ++i) {
        const std::int64_t off = ((b / H) * G.L + i) * G.d + (b % H) * hd;
        float s = 0;
        for (std::int64_t k = 0; k < hd; ++k) s += o[off + k] * dy[off + k];
        D.data<float>()[b * G.L + i] = s;
      }
    grow(kv_[0], blk), grow(kv_[1], blk), grow(part_, blk), grow(dsend_, blk), grow(drecv_, blk);
    pack_kv(qkv, G, kv_[0].data<float>());
    dqkv.zero_();
    const std::vector<std::int64_t> qpos = positions(g_.rank, G.L);
    RingStep kv_ring(g_), dkv_ring(g_);
    for (int step = 0; step < g_.size; ++step) {
      const int src = (g_.rank - step + g_.size) % g_.size;
      const float* cur = kv_[step % 2].data<float>();
      if (step + 1 < g_.size)
        kv_ring.start(cur, kv_[(step + 1) % 2].data<float>(), blk, kTagKv, "ring attention backward (K/V)");
      const std::vector<std::int64_t> kpos = positions(src, G.L);
      part_.zero_();
      const auto t0 = Clock::now();
      const double c0 = thread_cpu_s();
      const float *x = qkv.data<float>(), *lse = sv.lse.data<float>(), *pd = D.data<float>();
      float *dx = dqkv.data<float>(), *dkv = part_.data<float>();
      parallel_heads(nb, kv_ring, [&](std::int64_t b, float* scratch) {
        backward_block(G, b, x, cur, dy, qpos, kpos, lse + b * G.L, pd + b * G.L, dx, dkv, scratch);
      }, &dkv_ring);
      if (g_.stats) g_.stats->compute_s += since(t0), g_.stats->compute_cpu_s += thread_cpu_s() - c0;
      // Block src's dK/dV so far: what rank-1 accumulated (one step behind), plus this rank's part.
      float* acc = dsend_.data<float>();
      if (step == 0) {
        std::memcpy(acc, part_.data<float>(), std::size_t(blk) * 4);
      } else {
        dkv_ring.wait();
        const float *in = drecv_.data<float>(), *p = part_.data<float>();
        for (std::int64_t i = 0; i < blk; ++i) acc[i] = in[i] + p[i];
      }
      dkv_ring.start(acc, drecv_.data<float>(), blk, kTagDkv, "ring attention backward (dK/dV)");
      kv_ring.wait();
    }
    dkv_ring.wait();  // this rank's own block, home after P transfers
    unpack_dkv(drecv_.data<float>(), G, dx_of(dqkv));
    if (g_.stats) ++g_.stats->backwards;
  }

 private:
  struct Geom {
    std::int64_t n, L, d, ld;  // samples, local tokens, H * hd, qkv's row stride (3 d)
  };
  struct Saved final : KernelState {
    Tensor lse, out;  // the row log-sum-exp [N * H * L] and the forward's output (the caller's tensor)
  };

  Geom geom(const Tensor& qkv, const char* what) const {
    const std::int64_t d = s_.heads * s_.head_dim;
    RT_CHECK(qkv.device().is_cpu() && qkv.dtype() == DType::f32, what, ": runs on float32 CPU tensors "
             "(parallel.context > 1 needs train.device = cpu and train.precision = fp32), got ",
             dtype_name(qkv.dtype()), " on ", qkv.device().str());
    RT_CHECK(qkv.ndim() == 3 && qkv.dim(2) == 3 * d && qkv.dim(1) == g_.local(), what, ": qkv ",
             shape_str(qkv.shape()), " is not [N, ", g_.local(), " local tokens of ", g_.seq, " over ", g_.size,
             " context ranks, ", 3 * d, "]");
    return {qkv.dim(0), qkv.dim(1), d, 3 * d};
  }
  static void grow(Tensor& t, std::int64_t n) {
    if (t.numel() != n) t = Tensor::empty({n});
  }
  static float* dx_of(Tensor& t) { return t.data<float>(); }
  std::vector<std::int64_t> positions(int r, std::int64_t L) const {
    std::vector<std::int64_t> p(static_cast<std::size_t>(L));
    for (std::int64_t i = 0; i < L; ++i) p[std::size_t(i)] = g_.position(r, i);
    return p;
  }
  // K and V of every token, [N, L, 2d]: what travels.
  static void pack_kv(const Tensor& qkv, const Geom& G, float* kv) {
    const float* x = qkv.data<float>();
    for (std::int64_t t = 0; t < G.n * G.L; ++t) std::memcpy(kv + t * 2 * G.d, x + t * G.ld + G.d, std::size_t(G.d) * 8);
  }
  static void unpack_dkv(const float* dkv, const Geom& G, float* dx) {
    for (std::int64_t t = 0; t < G.n * G.L; ++t) std::memcpy(dx + t * G.ld + G.d, dkv + t * 2 * G.d, std::size_t(G.d) * 8);
  }

  // f(b, scratch) for every (sample, head) b, in parallel; the master thread
  // tests the ring's transfers between heads.
  template <class F>
  void parallel_heads(std::int64_t nb, RingStep& ring, F&& f, RingStep* also = nullptr) {
    const int nt = int(std::max<std::int64_t>(1, std::min<std::int64_t>(omp_get_max_threads(), nb)));
    const std::int64_t per = kRows * g_.local() * 2 + 2 * kRows;
    grow(scratch_, per * nt);
    float* base = scratch_.data<float>();
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
    for (std::int64_t b = 0; b < nb; ++b) {
      f(b, base + per * omp_get_thread_num());
      if (omp_get_thread_num() == 0) {
        ring.poll();
        if (also) also->poll();
      }
    }
  }

  // The visible keys of query position p in a block whose positions ascend.
  static std::int64_t visible(const std::vector<std::int64_t>& kpos, std::int64_t p) {
    return std::int64_t(std::upper_bound(kpos.begin(), kpos.end(), p) - kpos.begin());
  }

  // Head b: the queries of this rank against one K/V block, merged into the
  // running (m, l) and the unnormalised output rows.
  void forward_block(const Geom& G, std::int64_t b, const float* x, const float* kv,
                     const std::vector<std::int64_t>& qpos, const std::vector<std::int64_t>& kpos, float* o, float* m,
                     float* l, float* scratch) const {
    const std::int64_t H = s_.heads, hd = s_.head_dim, n = b / H, h = b % H, L = G.L;
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
      gemm('N', 'T', br, nmax, hd, scale_, q + r0 * G.ld, G.ld, k, 2 * G.d, 0.f, s, nmax);
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
  void backward_block(const Geom& G, std::int64_t b, const float* x, const float* kv, const float* dy,
                      const std::vector<std::int64_t>& qpos, const std::vector<std::int64_t>& kpos, const float* lse,
                      const float* D, float* dx, float* dkv, float* scratch) const {
    const std::int64_t H = s_.heads, hd = s_.head_dim, n = b / H, h = b % H, L = G.L;
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
      gemm('N', 'T', br, nmax, hd, scale_, q + r0 * G.ld, G.ld, k, 2 * G.d, 0.f, p, nmax);
      gemm('N', 'T', br, nmax, hd, 1.f, dob + r0 * G.d, G.d, v, 2 * G.d, 0.f, dp, nmax);
      for (std::int64_t i = 0; i < br; ++i) {
        float *pi = p + i * nmax, *dpi = dp + i * nmax;
        for (std::int64_t j = 0; j < nmax; ++j) {
          const float e = j < nv[i] ? std::exp(pi[j] - lse[r0 + i]) : 0.f;
          pi[j] = e;
          dpi[j] = e * (dpi[j] - D[r0 + i]);  // dS
        }
      }
      gemm('N', 'N', br, hd, nmax, scale_, dp, nmax, k, 2 * G.d, 1.f, dq + r0 * G.ld, G.ld);    // dQ += scale dS K
      gemm('T', 'N', nmax, hd, br, scale_, dp, nmax, q + r0 * G.ld, G.ld, 1.f, dk, 2 * G.d);  // dK += scale dS^T Q
      gemm('T', 'N', nmax, hd, br, 1.f, p, nmax, dob + r0 * G.d, G.d, 1.f, dv, 2 * G.d);       // dV += P^T dO
    }
  }

  AttentionSpec s_;
  ContextGroup g_;
  float scale_ = 1;
  // Buffers of one call, the group's (shared by the model's layers).
  Tensor (&kv_)[2] = g_.work->kv;
  Tensor &part_ = g_.work->part, &dsend_ = g_.work->dsend, &drecv_ = g_.work->drecv, &scratch_ = g_.work->scratch;
};

}  // namespace

ContextGroup ContextGroup::of(const Communicator& c, std::int64_t seq, std::shared_ptr<RingStats> s) {
  ContextGroup g;
  g.comm = c;
  g.size = c.size();
  g.rank = c.rank();
  g.seq = seq;
  g.stats = std::move(s);
  return g;
}

std::size_t RingWorkspace::bytes() const {
  return kv[0].nbytes() + kv[1].nbytes() + part.nbytes() + dsend.nbytes() + drecv.nbytes() + scratch.nbytes() +
         a2a[0].nbytes() + a2a[1].nbytes() + a2a[2].nbytes() + a2a[3].nbytes() + a2a_qkv.nbytes() +
         a2a_out.nbytes() + a2a_dout.nbytes() + a2a_dqkv.nbytes();
}

std::int64_t ContextGroup::real(int r) const {
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < local(); ++i) n += position(r, i) < seq ? 1 : 0;
  return n;
}

std::unique_ptr<AttentionKernel> ring_attention(const AttentionSpec& s, const ContextGroup& g) {
  return std::make_unique<RingAttention>(s, g);
}

}  // namespace ringtrain
