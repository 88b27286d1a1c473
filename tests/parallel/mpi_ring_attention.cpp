// Ring attention (src/nn/ring_attention.cpp) against the CPU's 1-rank causal
// attention kernel on the gathered sequence: every rank draws the same whole
// qkv [N, T, 3d] and output gradient, runs the 1-rank kernel on them, and the
// ring over a context group of P ranks on its head-tail tokens; its output
// and input gradient must be the whole results' rows of those tokens (padding
// rows of the gradient zero). P = 2 at 2 ranks, P = 3 at 3, P = 4 and two
// groups of P = 2 at 4; T divisible by 2P and not (padding). At 1 rank: skipped.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/nn/backend.hpp"
#include "ringtrain/nn/context_parallel.hpp"

using namespace ringtrain;

namespace {

Tensor random(const Shape& s, unsigned seed) {
  Tensor t = Tensor::empty(s);
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 1.f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = d(g);
  return t;
}

struct Worst {
  double out = 0, grad = 0, pad = 0;
};

// The ring over `comm` (its ranks a context group) for a sequence of T tokens.
Worst ring_vs_whole(const Communicator& comm, std::int64_t T, bool contiguous = false) {
  const std::int64_t N = 2, H = 3, hd = 8, d = H * hd;
  AttentionSpec s;
  s.heads = H, s.head_dim = hd, s.causal = true;
  Backend& be = backend_for(DeviceKind::cpu);
  const Tensor qkv = random({N, T, 3 * d}, 11), dout = random({N, T, d}, 12);
  Tensor out = Tensor::empty({N, T, d}), dqkv = Tensor::empty({N, T, 3 * d});
  auto ref = be.attention(s);
  KernelStatePtr st;
  ref->forward(qkv, out, state_in(st, *ref));
  ref->backward(qkv, dout, dqkv, state_in(st, *ref));

  ContextGroup g = ContextGroup::of(comm, T);
  g.contiguous = contiguous;
  auto ring = ring_attention(s, g);
  const Tensor lq = context_slice(qkv, g), ldy = context_slice(dout, g);
  const Tensor want_out = context_slice(out, g), want_dx = context_slice(dqkv, g);
  Tensor lo = Tensor::empty({N, g.local(), d}), ldx = Tensor::empty({N, g.local(), 3 * d});
  KernelStatePtr rs;
  ring->forward(lq, lo, state_in(rs, *ring));
  ring->backward(lq, ldy, ldx, state_in(rs, *ring));
  Worst w;
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t i = 0; i < g.local(); ++i) {
      const bool real = g.position(g.rank, i) < T;
      for (std::int64_t k = 0; k < d; ++k) {
        const std::int64_t o = (n * g.local() + i) * d + k;
        if (real) w.out = std::max(w.out, double(std::fabs(lo.data<float>()[o] - want_out.data<float>()[o])));
      }
      for (std::int64_t k = 0; k < 3 * d; ++k) {
        const std::int64_t o = (n * g.local() + i) * 3 * d + k;
        const double got = ldx.data<float>()[o];
        if (real) w.grad = std::max(w.grad, std::fabs(got - want_dx.data<float>()[o]));
        else w.pad = std::max(w.pad, std::fabs(got));
      }
    }
  double v[3] = {w.out, w.grad, w.pad};
  MPI_Allreduce(MPI_IN_PLACE, v, 3, MPI_DOUBLE, MPI_MAX, comm.handle("test"));
  return {v[0], v[1], v[2]};
}

// Measured: at most 4.8e-7 (out) and 1.4e-6 (gradients) between the two
// kernels' float32 orders of summation over unit-normal inputs; tolerance ~10x.
constexpr double kOutTol = 5e-6, kGradTol = 1.5e-5;

void expect_equal(const Communicator& comm, std::int64_t T, bool contiguous = false) {
  const Worst w = ring_vs_whole(comm, T, contiguous);
  EXPECT_LT(w.out, kOutTol) << "P = " << comm.size() << ", T = " << T;
  EXPECT_LT(w.grad, kGradTol) << "P = " << comm.size() << ", T = " << T;
  EXPECT_EQ(w.pad, 0.0) << "padding rows of the input gradient, P = " << comm.size() << ", T = " << T;
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  if (r == 0)
    std::printf("[ring attention] P = %d, T = %lld%s: max |out - 1-rank| %.2e, max |dqkv - 1-rank| %.2e\n",
                comm.size(), static_cast<long long>(T), contiguous ? " (contiguous)" : "", w.out, w.grad);
}

}  // namespace

TEST(RingAttention, EqualsTheOneRankKernelOnTheGatheredSequence) {
  Communicator world = Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  for (std::int64_t T : {std::int64_t(8) * world.size(), std::int64_t(37), std::int64_t(130)}) expect_equal(world, T);
  expect_equal(world, 29, true);  // the benchmarks' contiguous split computes the same attention
  if (world.size() == 4) {  // two context groups of 2 side by side (data 2 x context 2)
    Communicator half = world.split(world.rank() / 2, world.rank(), "half");
    expect_equal(half, 21);
  }
}
