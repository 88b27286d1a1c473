// 16-bit storage of convolutions on the GPU (issue 45, item 2): a cnn in bf16
// and in fp16 (dynamic loss scaling) trains on CUDA with its Conv2d, BatchNorm2d
// and pooling activations stored in the 16-bit type (cuda/nn/conv.cpp,
// bn_pool.cpp), as a trial past the GPU validation gate
// (TrainerHooks::gpu_trial = {"bf16|fp16 activation storage of convolutions"}),
// against the same job with float32 storage and 16-bit arithmetic (the gate's
// fallback, TrainerHooks::gpu_float32_storage). Both features passed this test
// on an H200 on 2026-11-28 and are on the gate's list since: the job without
// the trial stores 16-bit activations too (asserted bitwise). Over 20 steps at 1-4 ranks the trial follows
// it within a relative bound per step and is not bitwise equal to it (the
// storage really ran). A small resnet (batch norm, residual adds, global average
// pooling) the same way. Bounds ~10x the worst of 1-4 ranks on an H200
// (docs/data/gpu/18-*): cnn bf16 4.8e-3 (1.2u, u = 2^-8), fp16 2.1e-3 (4.3u,
// u = 2^-11: loss scaling's steps add to the rounding); resnet bf16 7.9e-4,
// fp16 1.3e-4. The first estimate, 4u, failed only cnn fp16 (at 1-2 ranks).
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

  void follows(const std::string& model, const std::string& precision, double bound) {
    const std::string feature = precision + " activation storage of convolutions";
    TrainConfig wide = image_config(data_, model, precision), trial = wide, plain = wide;
    wide.checkpoint.dir = data_ + "/ck-" + model + precision + "-f32";
    trial.checkpoint.dir = data_ + "/ck-" + model + precision + "-16";
    plain.checkpoint.dir = data_ + "/ck-" + model + precision + "-16-plain";
    ASSERT_EQ(gpu_storage16_feature(wide), feature);
    ASSERT_TRUE(gpu_storage16_allowed(wide)) << feature << " ran on an H200 and is on the gate's list";
    TrainerHooks keep32;  // the gate's fallback for storage it does not list: float32 activations
    keep32.report = false;
    keep32.gpu_float32_storage = true;
    std::vector<double> f32;
    keep32.on_step = [&](std::int64_t, double l) { f32.push_back(l); };
    Trainer(wide, world_, keep32).fit();
    const std::vector<double> h16 = trial_losses(trial, world_, {feature});
    // On the list, the job stores 16-bit activations without a trial: bitwise the trial.
    EXPECT_EQ(train_losses(plain, world_), h16) << "the job without the trial did not store " << precision;
    ASSERT_EQ(f32.size(), static_cast<std::size_t>(kSteps));
    ASSERT_EQ(h16.size(), static_cast<std::size_t>(kSteps));
    EXPECT_NE(h16, f32) << "the " << feature << " trial is bitwise the float32-storage run: no 16-bit storage ran";
    double worst = 0;
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_TRUE(std::isfinite(h16[s])) << "step " << s;
      worst = std::max(worst, std::abs(h16[s] - f32[s]) / f32[s]);
    }
    EXPECT_LE(worst, bound) << feature << " strays from float32 storage";
    if (world_.rank() == 0)
      for (int s = 0; s < kSteps; ++s) std::printf("  step %2d: float32 storage %.6f, %s storage %.6f\n", s + 1, f32[s],
                                                   precision.c_str(), h16[s]);
    if (world_.rank() == 0)
      std::printf("GPU %s %s storage vs float32 storage: worst relative loss difference %.4g over %d steps "
                  "(bound %.4g)\n",
                  model.c_str(), precision.c_str(), worst, kSteps, bound);
  }
};

}  // namespace

TEST_F(GpuHalfCnn, Bf16StorageFollowsFloat32Storage) { follows("cnn", "bf16", 0.05); }
TEST_F(GpuHalfCnn, Fp16StorageFollowsFloat32Storage) { follows("cnn", "fp16", 0.02); }
TEST_F(GpuHalfCnn, ResnetBf16StorageFollowsFloat32Storage) { follows("resnet", "bf16", 8e-3); }
TEST_F(GpuHalfCnn, ResnetFp16StorageFollowsFloat32Storage) { follows("resnet", "fp16", 1.5e-3); }
