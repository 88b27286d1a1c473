// All-to-all (DeepSpeed-Ulysses) attention over a context group
// (nn/context_parallel.hpp): the tokens stay split for every other layer; the
// attention trades the split for one of the heads. Rank r holds its 2c
// head-tail tokens of all H heads; after the all-to-all, rank j holds all
// P·2c tokens of heads [j·H/P, (j+1)·H/P), each at its global position, so the
// backend's ordinary causal kernel applies (the padding, positions >= T, sits
// at the end, where no real query sees it). The exchanges are our own
// all-to-all (comm/alltoall.cpp: every wait bounded, a missing peer named).
// On a device (CUDA) the packing is Backend::copy_rows on the device's stream,
// the inner kernel the backend's causal attention, and the exchange is staged
// through host copies (Open MPI here is not CUDA-aware; the device all-reduce
// stages likewise); the arithmetic and the gathered buffers stay on the device.
//
// Per rank per layer, with n samples of L = 2c local tokens of width d:
//   forward : qkv (3·n·L·d floats) and the output (n·L·d) cross, each rank
//             keeping 1/P of both: 4·n·L·d·(P−1)/P floats sent;
//   backward: dO (n·L·d) and dQKV (3·n·L·d): the same again, plus qkv and
//             the output gathered again (another 4·n·L·d·(P−1)/P) where
//             another forward used the group's buffers since (see Saved).
// The ring sends 2·n·L·d·(P−1) forward (K and V to P−1 neighbours), so the
// all-to-all sends 2/P of the ring's bytes forward. Keeping the gathered
// tensors instead would double the attention's share of the activations
// (the layer keeps its local qkv and output anyway).
#include <chrono>
#include <climits>
#include <cstring>
#include <ctime>

#include "ringtrain/comm/alltoall.hpp"
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

class AlltoallAttention final : public AttentionKernel {
 public:
  AlltoallAttention(const AttentionSpec& s, ContextGroup g, Backend& be) : s_(s), g_(std::move(g)) {
    RT_CHECK(s.causal, "all-to-all attention: only causal attention is split over parallel.context");
    RT_CHECK(s.dtype == DType::f32, "all-to-all attention: float32 activations only, got ", dtype_name(s.dtype));
    RT_CHECK(g_.size > 1 && g_.seq > 0, "all-to-all attention: needs a context group of 2 or more ranks");
    RT_CHECK(s.heads % g_.size == 0, "parallel.context_mode = alltoall: this rank's ", s.heads, " attention heads "
             "are not divisible by parallel.context = ", g_.size, " (each context rank takes heads / context of them)");
    RT_CHECK(!g_.contiguous, "all-to-all attention: the contiguous split is the ring benchmark's only");
    AttentionSpec in = s;
    in.heads = s.heads / g_.size;
    in.math = MathMode::fp32;  // the core in float32 at any train.precision, as the ring's
    inner_ = be.attention(in);
  }
  KernelStatePtr make_state() const override { return std::make_unique<Saved>(); }

  void forward(const Tensor& qkv, Tensor& out, KernelState& ks) override {
    Saved& sv = state_as<Saved>(ks, "all-to-all attention");
    const Geom G = geom(qkv, "all-to-all attention forward");
    RT_CHECK(out.dtype() == DType::f32 && out.device() == G.dev && out.numel() == G.n * G.L * G.d,
             "all-to-all attention forward: out ", shape_str(out.shape()), " is not float32 [", G.n, ", ", G.L, ", ",
             G.d, "]");
    RingWorkspace& w = *g_.work;
    ensure(w.a2a_qkv, {G.n, G.T, 3 * G.dp}, G.dev);
    ensure(w.a2a_out, {G.n, G.T, G.dp}, G.dev);
    // Tokens of all heads -> all tokens of this rank's heads: q, k and v in one exchange.
    exchange_to_heads(G, qkv, 3, w.a2a_qkv, true, "all-to-all attention forward (q, k, v)");
    compute([&] { inner_->forward(w.a2a_qkv, w.a2a_out, state_in(sv.inner, *inner_)); });
    exchange_to_tokens(G, w.a2a_out, 1, out, true, "all-to-all attention forward (output)");
    sv.out = out;  // the caller's: it holds these values until the backward (AttentionKernel's contract)
    sv.fill = ++w.a2a_fill;
    if (g_.stats) ++g_.stats->forwards;
  }

  void backward(const Tensor& qkv, const Tensor& dout, Tensor& dqkv, KernelState& ks) override {
    Saved& sv = state_as<Saved>(ks, "all-to-all attention");
    const Geom G = geom(qkv, "all-to-all attention backward");
    RT_CHECK(sv.inner && sv.out.defined() && sv.out.numel() == G.n * G.L * G.d && dout.numel() == G.n * G.L * G.d &&
                 dout.dtype() == DType::f32 && dqkv.numel() == qkv.numel() && dqkv.dtype() == DType::f32 &&
                 dout.device() == G.dev && dqkv.device() == G.dev,
             "all-to-all attention backward: no forward of these shapes before it");
    RingWorkspace& w = *g_.work;
    if (w.a2a_fill != sv.fill) {
      // Another layer (or micro-batch) gathered since: this one's q/k/v and output again, not kept per layer.
      ensure(w.a2a_qkv, {G.n, G.T, 3 * G.dp}, G.dev);
      ensure(w.a2a_out, {G.n, G.T, G.dp}, G.dev);
      exchange_to_heads(G, qkv, 3, w.a2a_qkv, false, "all-to-all attention backward (q, k, v again)");
      exchange_to_heads(G, sv.out, 1, w.a2a_out, false, "all-to-all attention backward (output again)");
      sv.fill = ++w.a2a_fill;
      // The inner kernel's state reads the output buffer its forward wrote:
      // this one, or, where another shape reallocated it since, the old
      // buffer, which that state alone still holds and nothing wrote since.
    }
    // The gradients of the gathered sequence live within this call: the group's buffers too.
    ensure(w.a2a_dout, {G.n, G.T, G.dp}, G.dev);
    ensure(w.a2a_dqkv, {G.n, G.T, 3 * G.dp}, G.dev);
    exchange_to_heads(G, dout, 1, w.a2a_dout, false, "all-to-all attention backward (dO)");
    compute([&] { inner_->backward(w.a2a_qkv, w.a2a_dout, w.a2a_dqkv, state_in(sv.inner, *inner_)); });
    exchange_to_tokens(G, w.a2a_dqkv, 3, dqkv, false, "all-to-all attention backward (dq, dk, dv)");
    if (g_.stats) ++g_.stats->backwards;
  }

 private:
  struct Geom {
    std::int64_t n, L, T, d, dp;  // samples, local tokens, P·L gathered tokens, H·hd, (H/P)·hd
    Device dev;                   // qkv's: every buffer of the call is there
  };
  // Per micro-batch: the inner kernel's state (the row log-sum-exp of this
  // rank's heads; it reads the group's gathered output buffer), the caller's
  // output, and which fill of the group's gathered buffers was this one's.
  // The gathered q/k/v and output themselves are the group's, not kept: a
  // layer's backward gathers them again unless no other forward ran since
  // (the last layer; every layer under train.recompute = attention).
  struct Saved final : KernelState {
    KernelStatePtr inner;
    Tensor out;
    std::uint64_t fill = 0;
  };

  Geom geom(const Tensor& qkv, const char* what) const {
    const std::int64_t d = s_.heads * s_.head_dim;
    RT_CHECK(qkv.dtype() == DType::f32, what, ": runs on float32 tensors (parallel.context > 1 needs "
             "train.precision = fp32), got ", dtype_name(qkv.dtype()), " on ", qkv.device().str());
    RT_CHECK(qkv.ndim() == 3 && qkv.dim(2) == 3 * d && qkv.dim(1) == g_.local(), what, ": qkv ",
             shape_str(qkv.shape()), " is not [N, ", g_.local(), " local tokens of ", g_.seq, " over ", g_.size,
             " context ranks, ", 3 * d, "]");
    return {qkv.dim(0), g_.local(), g_.size * g_.local(), d, d / g_.size, qkv.device()};
  }
  static void ensure(Tensor& t, const Shape& s, Device dev) {
    if (t.shape() != s || t.device() != dev) t = Tensor::empty(s, DType::f32, dev);
  }
  // The group's send and receive buffers (i = 0, 1) on dev, and host copies
  // (2, 3) that stage a device's exchange: live within a call.
  char* buffer(int i, std::int64_t n, Device dev) {
    Tensor& t = g_.work->a2a[i];
    if (t.numel() < n || t.device() != dev) t = Tensor::empty({n}, DType::f32, dev);
    return static_cast<char*>(t.raw());
  }
  // `rows` runs of `width` floats between pitched buffers on dev (the device's strided copy, or memcpy).
  void copy(Device dev, char* dst, std::int64_t dst_pitch, const char* src, std::int64_t src_pitch,
            std::int64_t width, std::int64_t rows) {
    const std::size_t w = std::size_t(width) * 4, dp = std::size_t(dst_pitch) * 4, sp = std::size_t(src_pitch) * 4;
    if (!dev.is_cpu()) return backend_for(dev).copy_rows(dev, dst, dp, src, sp, w, std::size_t(rows));
    for (std::int64_t r = 0; r < rows; ++r) std::memcpy(dst + std::size_t(r) * dp, src + std::size_t(r) * sp, w);
  }
  template <class F>
  void compute(F&& f) {
    const auto t0 = Clock::now();
    const double c0 = thread_cpu_s();
    f();
    if (g_.stats) g_.stats->compute_s += since(t0), g_.stats->compute_cpu_s += thread_cpu_s() - c0;
  }
  void exchange(Device dev, char* send, char* recv, std::int64_t count, bool fwd, const char* what) {
    RT_CHECK(count * 4 <= std::int64_t(INT_MAX), what, ": a block of ", count, " floats exceeds MPI's int count of "
             "bytes (use a smaller data.batch_size or more parallel.micro_batches)");
    const auto t0 = Clock::now();
    if (dev.is_cpu()) {
      alltoall(send, recv, std::size_t(count), DType::f32, g_.comm);  // bounded: a missing peer ends the job, named
    } else {  // staged: the packing's kernels finish, the blocks cross on the host, come back
      const std::int64_t n = g_.size * count;
      const std::size_t bytes = std::size_t(n) * 4;
      backend_for(dev).synchronize();
      char *hs = buffer(2, n, Device::cpu()), *hr = buffer(3, n, Device::cpu());
      copy_bytes(hs, Device::cpu(), send, dev, bytes);
      alltoall(hs, hr, std::size_t(count), DType::f32, g_.comm);
      copy_bytes(recv, dev, hr, Device::cpu(), bytes);
    }
    if (g_.stats) {
      const double b = 4.0 * double(count) * double(g_.size - 1);
      g_.stats->wait_s += since(t0), g_.stats->bytes_sent += b;
      if (fwd) g_.stats->fwd_bytes_sent += b;
    }
  }

  // x [n, L, parts·d] (parts: 3 for q/k/v, 1 for dO) -> y [n, T, parts·dp]:
  // block j of the send buffer is this rank's tokens of head group j; rank i's
  // block received holds its tokens, placed at their global positions (its two
  // chunks of c tokens, each a run per sample).
  void exchange_to_heads(const Geom& G, const Tensor& xt, int parts, Tensor& yt, bool fwd, const char* what) {
    const std::int64_t row = parts * G.dp, count = G.n * G.L * row, P = g_.size, c = g_.chunk();
    const char* x = static_cast<const char*>(xt.raw());
    char* y = static_cast<char*>(yt.raw());
    char *send = buffer(0, P * count, G.dev), *recv = buffer(1, P * count, G.dev);
    for (std::int64_t j = 0; j < P; ++j)
      for (int k = 0; k < parts; ++k)
        copy(G.dev, send + 4 * (j * count + k * G.dp), row, x + 4 * (k * G.d + j * G.dp), parts * G.d, G.dp,
             G.n * G.L);
    exchange(G.dev, send, recv, count, fwd, what);
    for (int i = 0; i < P; ++i)
      for (int h = 0; h < 2; ++h)
        copy(G.dev, y + 4 * (g_.position(i, h * c) * row), G.T * row, recv + 4 * (i * count + h * c * row), G.L * row,
             c * row, G.n);
  }
  // The inverse: y [n, T, parts·dp] of this rank's heads -> x [n, L, parts·d]
  // of this rank's tokens (block i sent: rank i's tokens of these heads).
  void exchange_to_tokens(const Geom& G, const Tensor& yt, int parts, Tensor& xt, bool fwd, const char* what) {
    const std::int64_t row = parts * G.dp, count = G.n * G.L * row, P = g_.size, c = g_.chunk();
    const char* y = static_cast<const char*>(yt.raw());
    char* x = static_cast<char*>(xt.raw());
    char *send = buffer(0, P * count, G.dev), *recv = buffer(1, P * count, G.dev);
    for (int i = 0; i < P; ++i)
      for (int h = 0; h < 2; ++h)
        copy(G.dev, send + 4 * (i * count + h * c * row), G.L * row, y + 4 * (g_.position(i, h * c) * row), G.T * row,
             c * row, G.n);
    exchange(G.dev, send, recv, count, fwd, what);
    for (std::int64_t j = 0; j < P; ++j)
      for (int k = 0; k < parts; ++k)
        copy(G.dev, x + 4 * (k * G.d + j * G.dp), parts * G.d, recv + 4 * (j * count + k * G.dp), row, G.dp,
             G.n * G.L);
  }

  AttentionSpec s_;
  ContextGroup g_;
  std::unique_ptr<AttentionKernel> inner_;
};

}  // namespace

ContextMode parse_context_mode(const std::string& s) {
  if (s == "ring") return ContextMode::ring;
  if (s == "alltoall") return ContextMode::alltoall;
  RT_FAIL("configuration key 'parallel.context_mode' must be ring or alltoall, got '", s, "'");
}

std::unique_ptr<AttentionKernel> alltoall_attention(const AttentionSpec& s, const ContextGroup& g, Backend& be) {
  return std::make_unique<AlltoallAttention>(s, g, be);
}

std::unique_ptr<AttentionKernel> context_attention(const AttentionSpec& s, const ContextGroup& g, Backend& be) {
  return g.mode == ContextMode::alltoall ? alltoall_attention(s, g, be) : ring_attention(s, g);
}

}  // namespace ringtrain
