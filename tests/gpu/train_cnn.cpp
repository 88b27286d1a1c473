// A short `cnn` training run on the GPU next to the same run on the CPU: same
// initialisation (seed), same fixed batch, SGD with momentum. The GPU losses
// must track the CPU's step by step (strict fp32 on both) and fall the same
// way (within 1%); the caching allocator must not cudaMalloc once the first step is done.
#include "gpu_test_util.hpp"
#include "nn/fixed_batch.hpp"
#include "ringtrain/cuda/context.hpp"
#include "ringtrain/cuda/memory.hpp"
#include "ringtrain/cuda/optim.hpp"
#include "ringtrain/cuda/backend.hpp"
#include "ringtrain/nn/backend.hpp"
#include "ringtrain/parallel/stage.hpp"
#include "support/whole_model.hpp"
#include "ringtrain/optim/optimizer.hpp"

using namespace ringtrain;
using namespace rt_gpu;
namespace fb = rt_fixed_batch;

TEST(GpuTraining, CnnLossTracksCpuAndFalls) {
  // The set-up of test_nn_cnn_fixed_batch, which checks on the CPU that it learns.
  ModelConfig mc = fb::model_config();
  const int N = fb::kBatch, steps = fb::kSteps;
  const double lr = fb::kLr;
  Tensor x = fb::images(), y = fb::labels();
  OptimizerConfig oc = fb::optimizer_config();

  Stage cpu_model(mc, Device::cpu());
  Stage gpu_model(mc, gpu());
  auto cpu_opt = make_optimizer(cpu_model.arena(), oc);
  auto& ctx = cuda::backend_context(0);
  cuda::DeviceOptimizer gpu_opt(gpu_model.arena(), oc, ctx);
  Tensor xg = x.to(gpu()), yg = y.to(gpu());
  Shape out = cpu_model.output_shape(N);
  Tensor dc = Tensor::empty(out), dg = Tensor::empty(out, DType::f32, gpu());

  std::vector<double> lc, lg;
  std::uint64_t mallocs_after_first = 0;
  for (int s = 0; s < steps; ++s) {
    cpu_model.zero_grads();
    Tensor zc = cpu_model.forward(0, x, Mode::train);
    lc.push_back(backend_for(DeviceKind::cpu).softmax_xent(zc, y, 0.0, dc));
    test_support::backward(cpu_model, dc);
    cpu_opt->step(lr);

    gpu_model.zero_grads();
    Tensor zg = gpu_model.forward(0, xg, Mode::train);
    lg.push_back(backend_for(DeviceKind::cuda).softmax_xent(zg, yg, 0.0, dg));
    test_support::backward(gpu_model, dg);
    gpu_opt.step(lr);
    if (s == 0) mallocs_after_first = cuda::device_allocator().stats().device_mallocs;
  }
  ctx.sync_compute();
  for (int s = 0; s < steps; ++s) EXPECT_NEAR(lg[s], lc[s], 1e-2 * std::fabs(lc[s]) + 1e-5) << "step " << s;
  EXPECT_LT(lg.back(), lg.front() - 0.1) << "the GPU run did not learn the fixed batch";
  EXPECT_LT(lc.back(), lc.front() - 0.1) << "the CPU reference did not learn either: test setup";
  EXPECT_EQ(cuda::device_allocator().stats().device_mallocs, mallocs_after_first)
      << "cudaMalloc inside a steady-state step";
}
