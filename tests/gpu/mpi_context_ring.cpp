// Context parallelism on the GPU (issue 45, item 2): ring attention's block
// arithmetic as Backend ops (CUDA: kernels/ring_attention.cu; CPU: the host
// loops, backend/cpu/ring_blocks.cpp), the ring's transfers staged through
// host copies, the context embedding and loss through copy_rows and axpy.
//  - The block ops against the CPU backend on the same inputs (each rank
//    alone): two blocks merged into the running state (causal-diagonal and a
//    block of later keys, head-tail chunks), the finish, the row dot, and the
//    backward (dQ added to a non-zero dqkv, dK/dV written); 3 tiles of 32,
//    head widths 16 and 40; fp32 within 1e-5 relative (test_gpu_attention's
//    bound: the tiles sum in another order than oneDNN's sgemm).
//  - Ring attention over the world as the context group on device tensors
//    against the same call on host tensors (2-4 ranks; T divisible by 2P and
//    not, one and two tiles per rank): output and dqkv within 1e-5, the
//    padding rows of the gradient zero on both.
//  - gpt at parallel.context = 2 (2 ranks; 4: data 2 x context 2), ring and
//    alltoall, as a trial past the gate of "context parallelism", against the
//    1-rank CPU fp32 run as mpi_gpt.cpp does. The bound is an estimate before
//    a GPU run: the GPU's context-1 gpt measured 1.3e-7 relative
//    (mpi_gpt.cpp), the CPU's context-2 run of this very flow (the device set
//    to cpu, 2 and 4 ranks) 1.3e-8 (ring) and 9.1e-9 (alltoall);
//    the ring merges blocks in another order, so 1e-5 relative (vocabulary
//    parallelism's); bf16 (float32 activations, bf16 projections) 2e-3, as
//    vocabulary parallelism's bf16 (the GPU's context-1 bf16 measured 9.3e-5).
//    The test prints the worst difference; when it passes on a GPU, "context
//    parallelism" can join the gate's list.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "gpu_test_util.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/nn/backend.hpp"
#include "ringtrain/nn/context_parallel.hpp"
#include "ringtrain/train/gpu_gate.hpp"
#include "train/gpt_fixtures.hpp"
#include "vit_trainer.hpp"

using namespace ringtrain;
using namespace rt_gpu;

namespace {

Backend& cpu() { return backend_for(DeviceKind::cpu); }
Backend& cuda_be() { return backend_for(DeviceKind::cuda); }

// max |a - b| / max |b| (the max-norm relative error of test_gpu_attention).
double rel(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = host_f32(a), y = host_f32(b);
  if (x.size() != y.size()) return INFINITY;
  double e = 0, m = 1e-30;
  for (std::size_t i = 0; i < x.size(); ++i) {
    e = std::max(e, double(std::fabs(x[i] - y[i])));
    m = std::max(m, double(std::fabs(y[i])));
  }
  return e / m;
}

// The ring's state and gradients of one pair of blocks on one backend.
struct Blocks {
  Tensor acc, m, l, out, lse, D, dqkv, dkv;
};
Blocks run_blocks(Backend& be, Device dev, const Tensor& qkv, const Tensor& kv0, const Tensor& kv1,
                  const Tensor& dout, const Tensor& dqkv0, const RingBlockSpec& b0, const RingBlockSpec& b1) {
  const std::int64_t n = qkv.dim(0), L = qkv.dim(1), d = b0.heads * b0.head_dim, rows = n * b0.heads * L;
  Blocks r{Tensor::empty({n, L, d}, DType::f32, dev), Tensor::empty({rows}, DType::f32, dev),
           Tensor::empty({rows}, DType::f32, dev),    Tensor::empty({n, L, d}, DType::f32, dev),
           Tensor::empty({rows}, DType::f32, dev),    Tensor::empty({rows}, DType::f32, dev),
           dqkv0.to(dev),                             Tensor::empty(kv0.shape(), DType::f32, dev)};
  Tensor work;
  const Tensor x = qkv.to(dev), k0 = kv0.to(dev), k1 = kv1.to(dev), dy = dout.to(dev);
  be.ring_block_forward(x, k0, b0, true, r.acc, r.m, r.l, work, {});
  be.ring_block_forward(x, k1, b1, false, r.acc, r.m, r.l, work, {});
  be.ring_block_finish(r.acc, r.m, r.l, b0.heads, r.out, r.lse);
  be.attention_rowdot(r.out, dy, b0.heads, r.D);
  be.ring_block_backward(x, k1, dy, r.lse, r.D, b1, r.dqkv, r.dkv, work, {});
  return r;
}

struct Result {
  Tensor out, dqkv;
};

Result run(AttentionKernel& k, const Tensor& qkv, const Tensor& dout) {
  Result r{Tensor::empty({qkv.dim(0), qkv.dim(1), dout.dim(2)}, DType::f32, qkv.device()),
           Tensor::empty(qkv.shape(), DType::f32, qkv.device())};
  KernelStatePtr st;
  k.forward(qkv, r.out, state_in(st, k));
  k.backward(qkv, dout, r.dqkv, state_in(st, k));
  return r;
}

}  // namespace

TEST(GpuContextRing, BlockOpsMatchTheCpuBackend) {
  const std::int64_t n = 2, c = 37, L = 2 * c, H = 3;  // 3 query tiles of 32, the last partial
  for (std::int64_t hd : {16, 40}) {
    const std::int64_t d = H * hd;
    RingBlockSpec b0, b1;
    b0.heads = b1.heads = H, b0.head_dim = b1.head_dim = hd, b0.chunk = b1.chunk = c;
    b0.scale = b1.scale = float(1.0 / std::sqrt(double(hd)));
    b0.q_chunks[0] = b1.q_chunks[0] = 1, b0.q_chunks[1] = b1.q_chunks[1] = 4;  // rank 1 of 3 (head-tail)
    b0.k_chunks[0] = 1, b0.k_chunks[1] = 4;                                    // its own block: causal diagonal
    b1.k_chunks[0] = 2, b1.k_chunks[1] = 3;                                    // rank 2's: the tail sees all of it
    const Tensor qkv = randu({n, L, 3 * d}, 41), kv0 = randu({n, L, 2 * d}, 42), kv1 = randu({n, L, 2 * d}, 43),
                 dout = randu({n, L, d}, 44), dqkv0 = randu({n, L, 3 * d}, 45);
    const Blocks h = run_blocks(cpu(), Device::cpu(), qkv, kv0, kv1, dout, dqkv0, b0, b1);
    const Blocks g = run_blocks(cuda_be(), gpu(), qkv, kv0, kv1, dout, dqkv0, b0, b1);
    const double ea = rel(g.acc, h.acc), em = rel(g.m, h.m), el = rel(g.l, h.l), eo = rel(g.out, h.out),
                 es = rel(g.lse, h.lse), ed = rel(g.D, h.D), eq = rel(g.dqkv, h.dqkv), ek = rel(g.dkv, h.dkv);
    for (double e : {ea, em, el, eo, es, ed, eq, ek}) EXPECT_LE(e, 1e-5) << "head width " << hd;
    std::printf("[gpu ring blocks] head width %lld: acc %.1e, m %.1e, l %.1e, out %.1e, lse %.1e, D %.1e, dqkv %.1e, "
                "dkv %.1e relative to the CPU backend\n",
                static_cast<long long>(hd), ea, em, el, eo, es, ed, eq, ek);
  }
}

TEST(GpuContextRing, RingMatchesTheHostRun) {
  Communicator world = Communicator::world();
  const int P = world.size();
  if (P < 2) GTEST_SKIP() << "a context group needs 2 or more ranks";
  for (std::int64_t T : {std::int64_t(8 * P), std::int64_t(8 * P + 3), std::int64_t(40 * P + 5)}) {
    const std::int64_t N = 2, H = 2, hd = 16, d = H * hd;
    AttentionSpec s;
    s.heads = H, s.head_dim = hd, s.causal = true;
    const Tensor qkv = randu({N, T, 3 * d}, 51), dout = randu({N, T, d}, 52);
    ContextGroup host_g = ContextGroup::of(world, T), dev_g = ContextGroup::of(world, T);
    auto host_k = context_attention(s, host_g, cpu());
    auto dev_k = context_attention(s, dev_g, cuda_be());
    const Tensor lq = context_slice(qkv, host_g), ldy = context_slice(dout, host_g);
    // The device's slice of the whole tensors (copy_rows on the device) is the host's.
    EXPECT_EQ(rel(context_slice(qkv.to(gpu()), dev_g), lq), 0.0) << "context_slice, T " << T;
    const Result h = run(*host_k, lq, ldy), g = run(*dev_k, lq.to(gpu()), ldy.to(gpu()));
    const double eo = rel(g.out, h.out), ed = rel(g.dqkv, h.dqkv);
    EXPECT_LE(eo, 1e-5) << "output, T " << T;
    EXPECT_LE(ed, 1e-5) << "dqkv, T " << T;
    const std::vector<float> dg = host_f32(g.dqkv), dh = host_f32(h.dqkv);
    std::int64_t pad_nonzero = 0;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t i = 0; i < host_g.local(); ++i)
        if (host_g.position(host_g.rank, i) >= T)
          for (std::int64_t k = 0; k < 3 * d; ++k) {
            const std::size_t at = std::size_t((n * host_g.local() + i) * 3 * d + k);
            pad_nonzero += (dg[at] != 0.f) + (dh[at] != 0.f);
          }
    EXPECT_EQ(pad_nonzero, 0) << "padding rows of the gradients, T " << T;
    if (world.rank() == 0)
      std::printf("[gpu context ring] %d ranks, T %lld: output %.2e, dqkv %.2e relative to the host run\n", P,
                  static_cast<long long>(T), eo, ed);
  }
}

TEST(GpuContextRing, GptContextTwoTrialFollowsTheCpuRun) {
  Communicator world = Communicator::world();
  const int w = world.size();
  if (w != 2 && w != 4) GTEST_SKIP() << "context 2 needs 2 or 4 ranks";
  const std::string data = test_fixtures::gpt_text_corpus(world, "gpu-context");
  const test_fixtures::GptCleanup cleanup{world, std::filesystem::path(data).parent_path()};
  constexpr int kSteps = 20;
  TrainConfig c = test_fixtures::gpt_test_config(data);
  c.model.width = 32;
  c.model.heads = 2;  // alltoall: one head per context rank
  c.data.seq_len = 40;
  c.train.max_steps = kSteps;
  Communicator self = world.split(world.rank(), 0, "self");
  TrainConfig ref_cfg = c;
  ref_cfg.train.device = "cpu";
  const std::vector<double> ref = test_fixtures::train_losses(ref_cfg, self);
  ASSERT_EQ(ref.size(), std::size_t(kSteps));

  TrainConfig g = c;
  g.train.device = "cuda";
  g.parallel.context = 2;
  g.data.batch_size = 4 / (w / 2);
  g.train.verify_every = 5;  // the data-parallel replicas hold bitwise-identical parameters
  // It passed this trial on an H200 (docs/data/gpu/18-*) and is on the gate's list: the job passes without it.
  EXPECT_EQ(gpu_gate_refusal(g, {}), "");
  for (const char* precision : {"fp32", "bf16"})
    for (const char* mode : {"ring", "alltoall"}) {
      g.train.precision = precision;
      g.parallel.context_mode = mode;
      const std::vector<double> got = trial_losses(g, world, {"context parallelism"});
      ASSERT_EQ(got.size(), ref.size()) << precision << " " << mode;
      const double bound = std::string(precision) == "fp32" ? 1e-5 : 2e-3;  // relative (the header says why)
      double worst = 0;
      for (int s = 0; s < kSteps; ++s) {
        EXPECT_NEAR(got[s], ref[s], bound * std::abs(ref[s]))
            << precision << " " << mode << " context 2 at " << w << " ranks, step " << s + 1;
        worst = std::max(worst, std::abs(got[s] - ref[s]) / std::abs(ref[s]));
      }
      EXPECT_LT(test_fixtures::mean5(got, kSteps - 5), test_fixtures::mean5(got, 0))
          << precision << " " << mode << ": no learning";
      if (world.rank() == 0)
        std::printf("[gpu gpt context 2] %s %s, %d ranks: worst relative loss difference to the 1-rank CPU fp32 run "
                    "%.3g over %d steps, bound %.1e (first %.4f, last %.4f)\n",
                    precision, mode, w, worst, kSteps, bound, got.front(), got.back());
    }
}
