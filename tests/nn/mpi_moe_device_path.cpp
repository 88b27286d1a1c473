// MoeMlp's device path (src/nn/moe_device.cpp: the Backend ops, the experts'
// blocks padded to one stride, one batched GEMM per matrix, blocking
// exchanges staged through host copies) run on host tensors with the CPU
// backend (MoeSpec::device_path), against the host path with the same weights
// and inputs: the CUDA path's bookkeeping (indices, pads, the exchange's
// staging, the gradients' accumulation, a rank whose experts get no rows)
// checked without a GPU; tests/gpu/mpi_moe.cpp runs the same path on CUDA.
// At 2 ranks at parallel.expert = 2 over the world (the host path
// overlapping its exchanges), else each rank alone. Bound 2e-6 relative, 10x
// the 1.1e-7 to 2e-7 measured at 1 and 2 ranks: the same OpenBLAS sgemm on
// whole padded blocks instead of each expert's rows, the bias gradients as GEMMs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "layer_harness.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/nn/moe.hpp"

namespace {

using namespace ringtrain;
using rt_test::random_tensor;

struct Layer1 {
  ParamArena arena;
  std::unique_ptr<MoeMlp> layer;
  Layer1(const MoeSpec& s, const ExpertGroup& g, const ParamArena* from) {
    layer = std::make_unique<MoeMlp>("moe", s, g);
    layer->register_params(arena, 0, "");
    arena.finalize();
    layer->bind(BindContext{backend_for(DeviceKind::cpu), Device::cpu(), arena, 7});
    layer->init(arena, 7);
    if (from)
      for (std::size_t i = 0; i < arena.size(); ++i) arena.param(i).copy_from(from->param(i));
  }
};

double rel(const Tensor& got, const Tensor& ref) {
  double d = 0, m = 1e-30;
  for (std::int64_t i = 0; i < ref.numel(); ++i) {
    d = std::max(d, std::fabs(double(got.data<float>()[i]) - ref.data<float>()[i]));
    m = std::max(m, std::fabs(double(ref.data<float>()[i])));
  }
  return d / m;
}

}  // namespace

TEST(MoeDevicePath, MatchesTheHostPath) {
  Communicator world = Communicator::world();
  ExpertGroup g;
  if (world.size() == 2) {
    g.comm = world;
    g.size = 2;
    g.rank = world.rank();
  }
  // Dropless; capacity drops; a bias that starves experts 2 and 3 (at expert 2: rank 1 gets no rows).
  for (int c = 0; c < 3; ++c) {
    MoeSpec s;
    s.dim = 12;
    s.hidden = 20;
    s.experts = 4;
    s.top_k = 2;
    s.capacity_factor = c == 1 ? 1.0 : 0.0;
    s.bias_update_rate = c == 2 ? 0.001 : 0.0;
    s.gemm = ExpertGemmMode::blas_loop;
    Layer1 host(s, g, nullptr);
    s.device_path = true;
    Layer1 dev(s, g, &host.arena);
    if (c == 2)
      for (MoeMlp* l : {host.layer.get(), dev.layer.get()})
        for (int e : {2, 3}) l->expert_bias().data<float>()[e] = -10.f;
    double worst = 0;
    for (int pass = 0; pass < 2; ++pass) {  // the second accumulates onto the first's gradients
      const Tensor x = random_tensor({2, 9, s.dim}, 40 + 10 * pass + world.rank(), -1.0, 1.0);
      const Tensor dy = random_tensor({2, 9, s.dim}, 60 + 10 * pass + world.rank(), -1.0, 1.0);
      const Tensor yh = host.layer->forward(x, Mode::train).clone();
      const Tensor yd = dev.layer->forward(x, Mode::train).clone();
      const Tensor dxh = host.layer->backward(dy, true, pass == 1).clone();
      const Tensor dxd = dev.layer->backward(dy, true, pass == 1).clone();
      EXPECT_LE(rel(yd, yh), 2e-6) << "y, case " << c << ", pass " << pass;
      EXPECT_LE(rel(dxd, dxh), 2e-6) << "dx, case " << c << ", pass " << pass;
      worst = std::max({worst, rel(yd, yh), rel(dxd, dxh)});
      for (std::size_t i = 0; i < host.arena.size(); ++i) {
        const double e = rel(dev.arena.grad(i), host.arena.grad(i));
        EXPECT_LE(e, 2e-6) << host.arena.info(i).name << ", case " << c << ", pass " << pass;
        worst = std::max(worst, e);
      }
    }
    if (world.rank() == 0)
      std::printf("[moe device path on the host] expert %d, case %d: worst relative difference %.2g\n", g.size, c,
                  worst);
  }
}
