// 16-bit storage of convolutions on the GPU (issue 45, item 2): a cnn in bf16
// and in fp16 (dynamic loss scaling) trains on CUDA with its Conv2d, BatchNorm2d
// and pooling activations stored in the 16-bit type (cuda/nn/conv.cpp,
// bn_pool.cpp), as a trial past the GPU validation gate
// (TrainerHooks::gpu_trial = {"bf16|fp16 activation storage of convolutions"}),
// against the gated job of the same configuration: the verified path, float32
// storage with 16-bit arithmetic. Over 20 steps at 1-4 ranks the trial follows
// it within 4u relative per step (u = 2^-8 bf16, 2^-11 fp16: the bound the
// vit storage tests hold; an estimate before a GPU run, the test prints the
// worst difference) and is not bitwise equal to it (the storage really ran).
// A small resnet (batch norm, residual adds, global average pooling) the same way.
// Written and compiled without a GPU (cuDNN has no emulator); not yet run on one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "ringtrain/train/gpu_gate.hpp"
#include "train/fixtures.hpp"
#include "vit_trainer.hpp"

using namespace ringtrain;
using rt_gpu::trial_losses;
using test_fixtures::train_losses;

namespace {

constexpr int kSteps = 20;

// cnn, or a small resnet (width 8, depth 8: every block kind, a projection shortcut, global average pooling).
TrainConfig image_config(const std::string& data, const std::string& model, const std::string& precision) {
  TrainConfig c = test_fixtures::small_config(data);
  c.model.name = model;
  // A steady descent: at small_config's lr 0.05 with momentum 0.9 the cnn's loss spikes in its first steps on
  // any device, so rounding decides the trajectory (the first H200 run: relative 24; at lr 0.005 with momentum
  // 0.34 bf16 and 0.093 fp16, both runs learning alike). CPU bf16 arithmetic against float32 on this set-up, as
  // a stand-in for the amplification: lr 0.005/0.002/0.001 with momentum 0.9 -> 0.13/0.12/0.068; without
  // momentum 0.52/0.013/0.0043 (docs/data/gpu/17-*). lr 0.001 without momentum amplifies a rounding about 1x.
  c.optimizer.lr = 0.001;
  c.optimizer.momentum = 0;
  if (model == "resnet") {
    c.model.width = 8;
    c.model.depth = 8;
    c.optimizer.lr = 0.01;
  }
  c.train.device = "cuda";
  c.train.precision = precision;
  c.data.batch_size = 32;
  c.train.epochs = 8;  // more than enough steps at 4 ranks; max_steps stops
  c.train.max_steps = kSteps;
  c.schedule.name = "constant";
  return c;
}

class GpuHalfCnn : public test_fixtures::SyntheticDataTest {
 protected:
  GpuHalfCnn() : SyntheticDataTest("gpu-half-cnn", 2048, 64) {}

  void follows(const std::string& model, const std::string& precision, double u) {
    const std::string feature = precision + " activation storage of convolutions";
    TrainConfig gated = image_config(data_, model, precision), trial = gated;
    gated.checkpoint.dir = data_ + "/ck-" + model + precision + "-f32";
    trial.checkpoint.dir = data_ + "/ck-" + model + precision + "-16";
    ASSERT_EQ(gpu_storage16_feature(gated), feature);
    ASSERT_FALSE(gpu_storage16_allowed(gated)) << feature << " is on the list: the gated job is no longer float32";
    const std::vector<double> f32 = train_losses(gated, world_), h16 = trial_losses(trial, world_, {feature});
    ASSERT_EQ(f32.size(), static_cast<std::size_t>(kSteps));
    ASSERT_EQ(h16.size(), static_cast<std::size_t>(kSteps));
    EXPECT_NE(h16, f32) << "the " << feature << " trial is bitwise the float32-storage run: no 16-bit storage ran";
    double worst = 0;
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_TRUE(std::isfinite(h16[s])) << "step " << s;
      worst = std::max(worst, std::abs(h16[s] - f32[s]) / f32[s]);
    }
    EXPECT_LE(worst, 4 * u) << feature << " strays from float32 storage";
    if (world_.rank() == 0)
      for (int s = 0; s < kSteps; ++s) std::printf("  step %2d: float32 storage %.6f, %s storage %.6f\n", s + 1, f32[s],
                                                   precision.c_str(), h16[s]);
    if (world_.rank() == 0)
      std::printf("GPU %s %s storage vs float32 storage: worst relative loss difference %.4g over %d steps "
                  "(bound %.4g)\n",
                  model.c_str(), precision.c_str(), worst, kSteps, 4 * u);
  }
};

}  // namespace

TEST_F(GpuHalfCnn, Bf16StorageFollowsFloat32Storage) { follows("cnn", "bf16", std::ldexp(1.0, -8)); }
TEST_F(GpuHalfCnn, Fp16StorageFollowsFloat32Storage) { follows("cnn", "fp16", std::ldexp(1.0, -11)); }
TEST_F(GpuHalfCnn, ResnetBf16StorageFollowsFloat32Storage) { follows("resnet", "bf16", std::ldexp(1.0, -8)); }
TEST_F(GpuHalfCnn, ResnetFp16StorageFollowsFloat32Storage) { follows("resnet", "fp16", std::ldexp(1.0, -11)); }
