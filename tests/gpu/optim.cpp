// DeviceOptimizer against the CPU optimizers (make_optimizer) on identical
// arenas for several steps: SGD (momentum, Nesterov, weight decay on decaying
// params only), Adam, AdamW, LAMB; and optimizer state moving between the CPU
// and the GPU implementation (shared checkpoints).
#include "gpu_test_util.hpp"
#include "ringtrain/cuda/context.hpp"
#include "ringtrain/cuda/optim.hpp"

using namespace ringtrain;
using namespace rt_gpu;

namespace {

struct Arenas {
  ParamArena cpu, dev;
};

void build(ParamArena& a, Device d) {
  a.add("conv.weight", {8, 3, 3, 3}, DType::f32, true, 0);
  a.add("conv.bias", {8}, DType::f32, false, 0);
  a.add("fc.weight", {10, 300}, DType::f32, true, 1);
  a.add("fc.bias", {10}, DType::f32, false, 1);
  a.finalize(d);
}

void fill_same(Arenas& A, std::uint32_t seed, bool grads_only) {
  for (std::size_t i = 0; i < A.cpu.size(); ++i) {
    Tensor g = randu(A.cpu.info(i).shape, seed + 2 * i, 0.1f);
    A.cpu.grad(i).copy_from(g);
    A.dev.grad(i).copy_from(g);
    if (grads_only) continue;
    Tensor p = randu(A.cpu.info(i).shape, seed + 2 * i + 1);
    A.cpu.param(i).copy_from(p);
    A.dev.param(i).copy_from(p);
  }
}

double max_param_err(Arenas& A) {
  double e = 0.0;
  for (std::size_t i = 0; i < A.cpu.size(); ++i)
    e = std::max(e, rel_err(host_f32(A.dev.param(i)), host_f32(A.cpu.param(i))));
  return e;
}

}  // namespace

class DeviceOptimizerTest : public ::testing::TestWithParam<const char*> {};

TEST_P(DeviceOptimizerTest, MatchesCpuOptimizer) {
  OptimizerConfig cfg;
  cfg.name = GetParam();
  cfg.weight_decay = 0.01;
  if (cfg.name == "sgd") {
    cfg.momentum = 0.9;
    cfg.nesterov = true;
  }
  if (cfg.name == "lamb") cfg.eps = 1e-6;
  Arenas A;
  build(A.cpu, Device::cpu());
  build(A.dev, gpu());
  fill_same(A, 100, false);
  auto ref = make_optimizer(A.cpu, cfg);
  cuda::CudaContext ctx(0);
  cuda::DeviceOptimizer opt(A.dev, cfg, ctx);
  for (int step = 0; step < 5; ++step) {
    fill_same(A, 200 + 17 * step, true);
    double lr = 0.05 * (step + 1);
    ref->step(lr);
    opt.step(lr);
    ctx.sync_compute();
    // Element-wise updates use the same RT_HD code: agreement to rounding
    // (LAMB: norms summed in another order).
    EXPECT_LE(max_param_err(A), cfg.name == "lamb" ? 1e-5 : 1e-6) << cfg.name << " step " << step;
  }
  EXPECT_EQ(opt.steps(), 5);
  EXPECT_EQ(ref->steps(), 5);
}

// Checkpoints are shared between devices: the CPU optimizer's state (names,
// layouts, step) loads into the CUDA one, and both continue identically.
TEST_P(DeviceOptimizerTest, StateMovesBetweenCpuAndGpu) {
  OptimizerConfig cfg;
  cfg.name = GetParam();
  cfg.momentum = 0.9;
  cfg.weight_decay = 0.01;
  Arenas A;
  build(A.cpu, Device::cpu());
  build(A.dev, gpu());
  fill_same(A, 300, false);
  auto ref = make_optimizer(A.cpu, cfg);
  cuda::CudaContext ctx(0);
  cuda::DeviceOptimizer opt(A.dev, cfg, ctx);
  for (int step = 0; step < 3; ++step) {
    fill_same(A, 400 + step, true);
    ref->step(0.05);
  }
  // The GPU optimizer has not stepped; it takes over the CPU's state and parameters.
  ASSERT_EQ(opt.state().size(), ref->state().size());
  for (std::size_t i = 0; i < opt.state().size(); ++i) EXPECT_EQ(opt.state()[i].first, ref->state()[i].first);
  opt.load_state(ref->state());
  for (std::size_t i = 0; i < A.cpu.size(); ++i) A.dev.param(i).copy_from(A.cpu.param(i));
  EXPECT_EQ(opt.steps(), 3);
  for (int step = 0; step < 2; ++step) {
    fill_same(A, 500 + step, true);
    ref->step(0.05);
    opt.step(0.05);
  }
  ctx.sync_compute();
  EXPECT_EQ(opt.steps(), 5);
  EXPECT_LE(max_param_err(A), cfg.name == "lamb" ? 1e-5 : 1e-6);
}

INSTANTIATE_TEST_SUITE_P(All, DeviceOptimizerTest, ::testing::Values("sgd", "adam", "adamw", "lamb"));

TEST(DeviceOptimizer, RejectsHostArenaAndUnknownOptimizer) {
  ParamArena a;
  build(a, Device::cpu());
  cuda::CudaContext ctx(0);
  OptimizerConfig cfg;
  EXPECT_THROW(cuda::DeviceOptimizer(a, cfg, ctx), Error);
  ParamArena d;
  build(d, gpu());
  cfg.name = "lars";
  EXPECT_THROW(cuda::DeviceOptimizer(d, cfg, ctx), Error);
}
