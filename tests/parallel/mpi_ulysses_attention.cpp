// All-to-all (Ulysses) attention (src/nn/ulysses_attention.cpp) against the
// CPU's 1-rank causal attention kernel on the gathered sequence and against
// ring attention on the same shards: every rank draws the same whole qkv
// [N, T, 3d] and output gradient; the 1-rank kernel runs on the whole, ring and
// all-to-all over a context group of P ranks on the head-tail tokens. Output
// and input gradient must be the whole results' rows of those tokens (padding
// rows of the gradient exactly zero). P = world size (2, 3, 4), and two groups
// of P = 2 side by side at 4 ranks; T divisible by 2P and not (padding: the
// gathered sequence must put every chunk at its true position or the causal
// mask would be wrong). A head count P does not divide is refused by name on
// every rank, before any exchange. At 1 rank: skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "support/error_of.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/nn/backend.hpp"
#include "ringtrain/nn/context_parallel.hpp"

using namespace ringtrain;
using test_support::error_of;

namespace {

Tensor random(const Shape& s, unsigned seed) {
  Tensor t = Tensor::empty(s);
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(g);
  return t;
}

struct Result {
  Tensor out, dqkv;  // this rank's rows [N, L, d], [N, L, 3d]
};

Result run(AttentionKernel& k, const Tensor& qkv, const Tensor& dout) {
  Result r{Tensor::empty({qkv.dim(0), qkv.dim(1), dout.dim(2)}), Tensor::empty(qkv.shape())};
  KernelStatePtr st;
  k.forward(qkv, r.out, state_in(st, k));
  k.backward(qkv, dout, r.dqkv, state_in(st, k));
  return r;
}

struct Worst {
  double out = 0, grad = 0, pad = 0, ring_out = 0, ring_grad = 0;
};

Worst alltoall_vs_whole(const Communicator& comm, std::int64_t T, std::int64_t H) {
  const std::int64_t N = 2, hd = 8, d = H * hd;
  AttentionSpec s;
  s.heads = H, s.head_dim = hd, s.causal = true;
  Backend& be = backend_for(DeviceKind::cpu);
  const Tensor qkv = random({N, T, 3 * d}, 21), dout = random({N, T, d}, 22);
  auto ref = be.attention(s);
  const Result whole = run(*ref, qkv, dout);

  ContextGroup g = ContextGroup::of(comm, T);
  g.mode = ContextMode::alltoall;
  auto a2a = context_attention(s, g, be);
  auto ring = ring_attention(s, g);
  const Tensor lq = context_slice(qkv, g), ldy = context_slice(dout, g);
  const Result a = run(*a2a, lq, ldy), r = run(*ring, lq, ldy);
  const Tensor want_out = context_slice(whole.out, g), want_dx = context_slice(whole.dqkv, g);
  Worst w;
  auto diff = [](const Tensor& x, const Tensor& y, std::int64_t o) {
    return double(std::fabs(x.data<float>()[o] - y.data<float>()[o]));
  };
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t i = 0; i < g.local(); ++i) {
      const bool real = g.position(g.rank, i) < T;
      for (std::int64_t k = 0; k < d && real; ++k) {
        const std::int64_t o = (n * g.local() + i) * d + k;
        w.out = std::max(w.out, diff(a.out, want_out, o));
        w.ring_out = std::max(w.ring_out, diff(a.out, r.out, o));
      }
      for (std::int64_t k = 0; k < 3 * d; ++k) {
        const std::int64_t o = (n * g.local() + i) * 3 * d + k;
        if (real) {
          w.grad = std::max(w.grad, diff(a.dqkv, want_dx, o));
          w.ring_grad = std::max(w.ring_grad, diff(a.dqkv, r.dqkv, o));
        } else {
          w.pad = std::max(w.pad, double(std::fabs(a.dqkv.data<float>()[o])));
        }
      }
    }
  double v[5] = {w.out, w.grad, w.pad, w.ring_out, w.ring_grad};
  MPI_Allreduce(MPI_IN_PLACE, v, 5, MPI_DOUBLE, MPI_MAX, comm.handle("test"));
  return {v[0], v[1], v[2], v[3], v[4]};
}

// Against the 1-rank kernel: bitwise equal (measured 0 at every P and T).
// All-to-all runs that very kernel per head on the same rows, and the
// gathered sequence only appends padding after the last real token, which no
// real row sees; a differing bit means a token landed at a wrong position.
// Against the ring (another float32 merge order): measured at most 5.96e-7
// (out) and 1.67e-6 (gradients); the tolerances are ~10x that, the ring test's.
constexpr double kOutTol = 5e-6, kGradTol = 1.5e-5;

void expect_equal(const Communicator& comm, std::int64_t T, std::int64_t H) {
  const Worst w = alltoall_vs_whole(comm, T, H);
  EXPECT_EQ(w.out, 0.0) << "P = " << comm.size() << ", T = " << T;
  EXPECT_EQ(w.grad, 0.0) << "P = " << comm.size() << ", T = " << T;
  EXPECT_LT(w.ring_out, kOutTol) << "against the ring, P = " << comm.size() << ", T = " << T;
  EXPECT_LT(w.ring_grad, kGradTol) << "against the ring, P = " << comm.size() << ", T = " << T;
  EXPECT_EQ(w.pad, 0.0) << "padding rows of the input gradient, P = " << comm.size() << ", T = " << T;
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  if (r == 0)
    std::printf("[all-to-all attention] P = %d, T = %lld, H = %lld: max |out - 1-rank| %.2e, max |dqkv - 1-rank| "
                "%.2e; against the ring %.2e, %.2e\n",
                comm.size(), static_cast<long long>(T), static_cast<long long>(H), w.out, w.grad, w.ring_out,
                w.ring_grad);
}

}  // namespace

TEST(AlltoallAttention, EqualsTheOneRankKernelAndTheRing) {
  Communicator world = Communicator::world();
  const int P = world.size();
  if (P < 2) GTEST_SKIP() << "needs 2 or more ranks";
  for (std::int64_t T : {std::int64_t(8) * P, std::int64_t(37), std::int64_t(130)}) expect_equal(world, T, P);
  expect_equal(world, 29, 2 * P);  // two heads per context rank
  if (P == 4) {  // two context groups of 2 side by side (data 2 x context 2)
    Communicator half = world.split(world.rank() / 2, world.rank(), "half");
    expect_equal(half, 21, 2);
  }
}

// The gathered q/k/v and output are the group's buffers, not kept per layer:
// a layer whose forward was followed by another's gathers them again in its
// backward (where another shape reallocated them, its inner kernel reads the
// old output buffer, which only its state still holds). Two layers on one group, interleaved as a model's forward and
// backward run them, give each one's results alone, bitwise.
TEST(AlltoallAttention, LayersSharingTheGroupsBuffersGatherAgain) {
  Communicator world = Communicator::world();
  const int P = world.size();
  if (P < 2) GTEST_SKIP() << "needs 2 or more ranks";
  const std::int64_t T = 37, H = P, hd = 8, d = H * hd;
  AttentionSpec s;
  s.heads = H, s.head_dim = hd, s.causal = true;
  Backend& be = backend_for(DeviceKind::cpu);
  ContextGroup g = ContextGroup::of(world, T);
  g.mode = ContextMode::alltoall;
  auto alone = [&](std::int64_t n, unsigned seed) {
    ContextGroup own = g;
    own.work = std::make_shared<RingWorkspace>();
    auto k = context_attention(s, own, be);
    return run(*k, context_slice(random({n, T, 3 * d}, seed), own), context_slice(random({n, T, d}, seed + 1), own));
  };
  for (const std::int64_t nb : {std::int64_t(2), std::int64_t(3)}) {  // 3: the second layer reallocates the buffers
    auto a = context_attention(s, g, be), b = context_attention(s, g, be);
    const Tensor qa = context_slice(random({2, T, 3 * d}, 31), g), da = context_slice(random({2, T, d}, 32), g);
    const Tensor qb = context_slice(random({nb, T, 3 * d}, 33), g), db = context_slice(random({nb, T, d}, 34), g);
    Result ra{Tensor::empty({2, g.local(), d}), Tensor::empty(qa.shape())};
    Result rb{Tensor::empty({nb, g.local(), d}), Tensor::empty(qb.shape())};
    KernelStatePtr sa, sb;
    a->forward(qa, ra.out, state_in(sa, *a));
    b->forward(qb, rb.out, state_in(sb, *b));
    b->backward(qb, db, rb.dqkv, state_in(sb, *b));
    a->backward(qa, da, ra.dqkv, state_in(sa, *a));  // gathers again
    const Result wa = alone(2, 31), wb = alone(nb, 33);
    auto same = [](const Tensor& x, const Tensor& y) {
      return x.numel() == y.numel() && std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
    };
    EXPECT_TRUE(same(ra.out, wa.out) && same(rb.out, wb.out)) << "second layer of " << nb << " samples";
    EXPECT_TRUE(same(ra.dqkv, wa.dqkv)) << "the first layer's gradient, gathered again, second layer of " << nb;
    EXPECT_TRUE(same(rb.dqkv, wb.dqkv)) << "second layer of " << nb << " samples";
  }
}

TEST(AlltoallAttention, RefusesHeadsNotDivisibleByTheContextSize) {
  Communicator world = Communicator::world();
  const int P = world.size();
  if (P < 2) GTEST_SKIP() << "needs 2 or more ranks";
  AttentionSpec s;
  s.heads = P + 1, s.head_dim = 8, s.causal = true;
  ContextGroup g = ContextGroup::of(world, 16);
  g.mode = ContextMode::alltoall;
  // Raised in the constructor, from the heads alone: on every rank, before any exchange.
  const std::string e = error_of([&] { context_attention(s, g, backend_for(DeviceKind::cpu)); });
  EXPECT_NE(e.find(cat("this rank's ", P + 1, " attention heads are not divisible by parallel.context = ", P)),
            std::string::npos)
      << e;
  world.barrier();  // every rank got here without waiting on another
}
