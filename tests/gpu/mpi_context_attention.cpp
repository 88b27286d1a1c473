// Context parallelism's all-to-all (Ulysses) attention on the GPU
// (nn/ulysses_attention.cpp, parallel.context_mode = alltoall): the packing as
// strided device copies (Backend::copy_rows), the exchange staged through
// host copies, the inner causal attention the CUDA tiled kernel. Against the
// same kernel on host tensors over the same context group (the world), on the
// same head-tail token shards: output and input gradient within
// test_gpu_attention's fp32 bound (1e-5 relative: the tiled kernels sum in
// another order), padding rows of the gradient exactly zero on both; T
// divisible by 2P and not. The attention alone: ring attention and the
// trial of "context parallelism" are mpi_context_ring.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "gpu_test_util.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/nn/backend.hpp"
#include "ringtrain/nn/context_parallel.hpp"

using namespace ringtrain;
using namespace rt_gpu;

namespace {

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

// max |a - b| / max |b| (the max-norm relative error of test_gpu_attention).
double rel(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = host_f32(a), y = host_f32(b);
  double e = 0, m = 1e-30;
  for (std::size_t i = 0; i < x.size(); ++i) {
    e = std::max(e, double(std::fabs(x[i] - y[i])));
    m = std::max(m, double(std::fabs(y[i])));
  }
  return e / m;
}

}  // namespace

TEST(GpuContextAttention, AlltoallMatchesTheHostRun) {
  Communicator world = Communicator::world();
  const int P = world.size();
  if (P < 2) GTEST_SKIP() << "a context group needs 2 or more ranks";
  for (std::int64_t T : {std::int64_t(8 * P), std::int64_t(8 * P + 3)}) {
    const std::int64_t N = 2, H = 2 * P, hd = 16, d = H * hd;
    AttentionSpec s;
    s.heads = H, s.head_dim = hd, s.causal = true;
    const Tensor qkv = randu({N, T, 3 * d}, 31), dout = randu({N, T, d}, 32);
    ContextGroup host_g = ContextGroup::of(world, T), dev_g = ContextGroup::of(world, T);
    host_g.mode = dev_g.mode = ContextMode::alltoall;
    auto host_k = context_attention(s, host_g, backend_for(DeviceKind::cpu));
    auto dev_k = context_attention(s, dev_g, backend_for(DeviceKind::cuda));
    const Tensor lq = context_slice(qkv, host_g), ldy = context_slice(dout, host_g);
    const Result h = run(*host_k, lq, ldy), g = run(*dev_k, lq.to(gpu()), ldy.to(gpu()));
    const double eo = rel(g.out, h.out), ed = rel(g.dqkv, h.dqkv);
    EXPECT_LE(eo, 1e-5) << "output, T " << T;
    EXPECT_LE(ed, 1e-5) << "dqkv, T " << T;
    const std::vector<float> dg = host_f32(g.dqkv);
    std::int64_t pad_nonzero = 0;
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t i = 0; i < host_g.local(); ++i)
        if (host_g.position(host_g.rank, i) >= T)
          for (std::int64_t k = 0; k < 3 * d; ++k)
            pad_nonzero += dg[std::size_t((n * host_g.local() + i) * 3 * d + k)] != 0.f;
    EXPECT_EQ(pad_nonzero, 0) << "padding rows of the device gradient, T " << T;
    if (world.rank() == 0)
      std::printf("[gpu context attention] alltoall, %d ranks, T %lld: output %.2e, dqkv %.2e relative to the host "
                  "run\n",
                  P, static_cast<long long>(T), eo, ed);
  }
}
