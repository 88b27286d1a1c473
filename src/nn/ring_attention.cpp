// Ring attention (nn/context_parallel.hpp): the ring is MPI_Isend/MPI_Irecv to
// the neighbours, completed by wait_bounded (a peer that never comes ends the
// job naming it); the block arithmetic is the backend's (Backend::ring_block_*:
// the CPU's FlashAttention-2 loops with oneDNN's sgemm, backend/cpu/
// ring_blocks.cpp; CUDA's tiled kernels, cuda/kernels/ring_attention.cu), on
// the device of qkv. CPU: while a block's arithmetic runs, the OpenMP master
// thread tests the transfers between its heads (the op's poll), so MPI moves
// the next block meanwhile (Open MPI progresses a rendezvous only inside MPI
// calls). A device: the blocks are staged through host copies (Open MPI here
// is not CUDA-aware; the all-to-all and the device all-reduce stage
// likewise): a block is copied to the host, its transfer started, the block's
// kernels launched, and the wait on the host overlaps them.
#include <mpi.h>

#include <chrono>
#include <climits>
#include <cmath>
#include <ctime>
#include <vector>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/comm/flight_recorder.hpp"
#include "ringtrain/core/allocator.hpp"
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

constexpr int kTagKv = 7201, kTagDkv = 7202;

// `t` as float32 [n] on dev (reallocated when it is not).
void grow(Tensor& t, std::int64_t n, Device dev) {
  if (t.numel() != n || t.device() != dev) t = Tensor::empty({n}, DType::f32, dev);
}

// One transfer around the ring: send to rank+1, receive from rank-1. On a
// device through two host copies (`host`: send, receive), the received block
// copied to the device in wait().
class RingStep {
 public:
  RingStep(const ContextGroup& g, Device dev, Tensor* host) : g_(g), dev_(dev), host_(host) {}
  ~RingStep() {
    for (MPI_Request& r : q_)
      if (r != MPI_REQUEST_NULL) MPI_Cancel(&r), MPI_Request_free(&r);  // only after an error elsewhere
  }
  void start(const Tensor& send, Tensor& recv, int tag, const char* what) {
    const std::int64_t n = send.numel();
    RT_CHECK(n <= INT_MAX, "ring attention: a block of ", n, " floats exceeds MPI's int count (use a smaller "
             "data.batch_size or more parallel.micro_batches)");
    const int next = (g_.rank + 1) % g_.size, prev = (g_.rank + g_.size - 1) % g_.size;
    bytes_ = std::size_t(n) * 4;
    const void* sbuf = send.raw();
    void* rbuf = recv.raw();
    if (!dev_.is_cpu()) {  // the block's kernels finish, it crosses on the host
      grow(host_[0], n, Device::cpu()), grow(host_[1], n, Device::cpu());
      backend_for(dev_).synchronize();
      copy_bytes(host_[0].raw(), Device::cpu(), sbuf, dev_, bytes_);
      sbuf = host_[0].raw(), rbuf = host_[1].raw(), dst_ = recv.raw();
    }
    MPI_Comm c = g_.comm.handle("ring attention");
    check_mpi(MPI_Irecv(rbuf, int(n), MPI_FLOAT, prev, tag, c, &q_[0]), what, "MPI_Irecv");
    check_mpi(MPI_Isend(sbuf, int(n), MPI_FLOAT, next, tag, c, &q_[1]), what, "MPI_Isend");
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
    if (q_[0] == MPI_REQUEST_NULL && q_[1] == MPI_REQUEST_NULL && !dst_) return;
    const auto t0 = Clock::now();
    // The flight record shows this rank waiting on its ring neighbours (comm/flight_recorder.hpp).
    flight_recorder::Op rec(g_.comm.handle("ring attention"), g_.comm.name(), "ring attention", bytes_,
                            (g_.rank + g_.size - 1) % g_.size);
    wait_bounded(q_, 2, WaitOn(g_.comm, "ring attention"), what_.c_str());
    rec.done();
    if (dst_) copy_bytes(dst_, dev_, host_[1].raw(), Device::cpu(), bytes_), dst_ = nullptr;
    if (g_.stats) g_.stats->wait_s += since(t0);
  }
  bool forward_ = false;

 private:
  const ContextGroup& g_;
  Device dev_;
  Tensor* host_;
  void* dst_ = nullptr;  // a device's receive buffer, written in wait()
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
    RT_CHECK(out.dtype() == DType::f32 && out.device() == G.dev && out.numel() == G.n * G.L * G.d,
             "ring attention forward: out ", shape_str(out.shape()), " is not float32 [", G.n, ", ", G.L, ", ", G.d,
             "] on ", G.dev.str());
    Backend& be = backend_for(G.dev);
    RingWorkspace& w = *g_.work;
    const std::int64_t nb = G.n * s_.heads, blk = G.n * G.L * 2 * G.d;
    grow(kv_[0], blk, G.dev), grow(kv_[1], blk, G.dev), grow(w.ring_m, nb * G.L, G.dev), grow(w.ring_l, nb * G.L, G.dev);
    pack_kv(be, qkv, G, kv_[0]);
    if (sv.lse.numel() != nb * G.L || sv.lse.device() != G.dev) sv.lse = Tensor::empty({nb * G.L}, DType::f32, G.dev);
    RingStep ring(g_, G.dev, w.ring_host);
    ring.forward_ = true;
    for (int step = 0; step < g_.size; ++step) {
      const int src = (g_.rank - step + g_.size) % g_.size;
      const Tensor& cur = kv_[step % 2];
      if (step + 1 < g_.size) ring.start(cur, kv_[(step + 1) % 2], kTagKv, "ring attention forward");
      const auto t0 = Clock::now();
      const double c0 = thread_cpu_s();
      // out accumulates the unnormalised output (the online softmax's).
      be.ring_block_forward(qkv, cur, block(src), step == 0, out, w.ring_m, w.ring_l, scratch_, [&] { ring.poll(); });
      if (g_.stats) g_.stats->compute_s += since(t0), g_.stats->compute_cpu_s += thread_cpu_s() - c0;
      ring.wait();
    }
    be.ring_block_finish(out, w.ring_m, w.ring_l, s_.heads, out, sv.lse);
    sv.out = out;
    if (g_.stats) ++g_.stats->forwards;
  }

  void backward(const Tensor& qkv, const Tensor& dout, Tensor& dqkv, KernelState& ks) override {
    Saved& sv = state_as<Saved>(ks, "ring attention");
    const Geom G = geom(qkv, "ring attention backward");
    const std::int64_t nb = G.n * s_.heads, blk = G.n * G.L * 2 * G.d;
    RT_CHECK(sv.lse.numel() == nb * G.L && sv.out.defined() && sv.out.numel() == G.n * G.L * G.d &&
                 dout.numel() == sv.out.numel() && dout.dtype() == DType::f32 && dqkv.numel() == qkv.numel() &&
                 dqkv.dtype() == DType::f32 && sv.lse.device() == G.dev && dout.device() == G.dev &&
                 dqkv.device() == G.dev,
             "ring attention backward: no forward of these shapes before it");
    Backend& be = backend_for(G.dev);
    RingWorkspace& w = *g_.work;
    grow(w.ring_d, nb * G.L, G.dev);
    be.attention_rowdot(sv.out, dout, s_.heads, w.ring_d);  // D = rowsum(dO * O) per (sample, head, token)
    grow(kv_[0], blk, G.dev), grow(kv_[1], blk, G.dev), grow(part_, blk, G.dev), grow(dsend_, blk, G.dev),
        grow(drecv_, blk, G.dev);
    pack_kv(be, qkv, G, kv_[0]);
    dqkv.zero_();
    RingStep kv_ring(g_, G.dev, w.ring_host), dkv_ring(g_, G.dev, w.ring_host + 2);
    for (int step = 0; step < g_.size; ++step) {
      const int src = (g_.rank - step + g_.size) % g_.size;
      const Tensor& cur = kv_[step % 2];
      if (step + 1 < g_.size) kv_ring.start(cur, kv_[(step + 1) % 2], kTagKv, "ring attention backward (K/V)");
      const auto t0 = Clock::now();
      const double c0 = thread_cpu_s();
      be.ring_block_backward(qkv, cur, dout, sv.lse, w.ring_d, block(src), dqkv, part_, scratch_, [&] {
        kv_ring.poll();
        dkv_ring.poll();
      });
      if (g_.stats) g_.stats->compute_s += since(t0), g_.stats->compute_cpu_s += thread_cpu_s() - c0;
      // Block src's dK/dV so far: what rank-1 accumulated (one step behind), plus this rank's part.
      if (step == 0) {
        dsend_.copy_from(part_);
      } else {
        dkv_ring.wait();
        be.add(drecv_, part_, dsend_);
      }
      dkv_ring.start(dsend_, drecv_, kTagDkv, "ring attention backward (dK/dV)");
      kv_ring.wait();
    }
    dkv_ring.wait();  // this rank's own block, home after P transfers
    // dK/dV into dqkv's k and v columns.
    be.copy_rows(G.dev, static_cast<char*>(dqkv.raw()) + 4 * G.d, std::size_t(G.ld) * 4, drecv_.raw(),
                 std::size_t(2 * G.d) * 4, std::size_t(2 * G.d) * 4, std::size_t(G.n * G.L));
    if (g_.stats) ++g_.stats->backwards;
  }

 private:
  struct Geom {
    std::int64_t n, L, d, ld;  // samples, local tokens, H * hd, qkv's row stride (3 d)
    Device dev;                // qkv's: every buffer of the call is there
  };
  struct Saved final : KernelState {
    Tensor lse, out;  // the row log-sum-exp [N * H * L] and the forward's output (the caller's tensor)
  };

  Geom geom(const Tensor& qkv, const char* what) const {
    const std::int64_t d = s_.heads * s_.head_dim;
    RT_CHECK(qkv.dtype() == DType::f32, what, ": runs on float32 tensors (parallel.context > 1 needs "
             "train.precision = fp32 or bf16, whose attention core stays float32), got ", dtype_name(qkv.dtype()),
             " on ", qkv.device().str());
    RT_CHECK(qkv.ndim() == 3 && qkv.dim(2) == 3 * d && qkv.dim(1) == g_.local(), what, ": qkv ",
             shape_str(qkv.shape()), " is not [N, ", g_.local(), " local tokens of ", g_.seq, " over ", g_.size,
             " context ranks, ", 3 * d, "]");
    return {qkv.dim(0), qkv.dim(1), d, 3 * d, qkv.device()};
  }
  // This rank's queries against rank src's block.
  RingBlockSpec block(int src) const {
    RingBlockSpec b;
    b.heads = s_.heads, b.head_dim = s_.head_dim, b.chunk = g_.chunk(), b.scale = scale_;
    for (int k = 0; k < 2; ++k) b.q_chunks[k] = g_.chunk_of(g_.rank, k), b.k_chunks[k] = g_.chunk_of(src, k);
    return b;
  }
  // K and V of every token, [N, L, 2d]: what travels.
  static void pack_kv(Backend& be, const Tensor& qkv, const Geom& G, Tensor& kv) {
    be.copy_rows(G.dev, kv.raw(), std::size_t(2 * G.d) * 4, static_cast<const char*>(qkv.raw()) + 4 * G.d,
                 std::size_t(G.ld) * 4, std::size_t(2 * G.d) * 4, std::size_t(G.n * G.L));
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
         ring_m.nbytes() + ring_l.nbytes() + ring_d.nbytes() + ring_host[0].nbytes() + ring_host[1].nbytes() +
         ring_host[2].nbytes() + ring_host[3].nbytes() +
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
