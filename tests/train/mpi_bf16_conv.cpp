// train.precision = bf16 on the cnn and resnet (issue 31): their convolutions,
// batch norms, pooling and residual adds take bfloat16 activations on the
// CPU, so the stage runs bf16 storage end to end (its activation type is
// bfloat16: checked on the stage the trainer builds from the same model
// configuration) and the run is not bitwise the fp32 run on any ISA (every
// activation is rounded to 8 significant bits). Over 40 steps the bf16 run
// follows the fp32 run of the same model and data within the 2% and learns.
#include <gtest/gtest.h>

#include <cmath>

#include "fixtures.hpp"
#include "ringtrain/parallel/stage.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
using test_fixtures::mean5;
using test_fixtures::train_losses;

namespace {

constexpr int kSteps = 40;

TrainConfig config(const std::string& data, const std::string& model, const std::string& precision) {
  TrainConfig c = test_fixtures::small_config(data);
  c.model.name = model;
  if (model == "resnet") {
    c.model.depth = 8;
    c.model.width = 16;
  }
  c.data.batch_size = 32;
  c.optimizer.name = "adamw";
  // cnn learns the synthetic set fast: at 1e-3 its loss is 0.003 after 40 steps (2e-4: 0.012),
  // where a relative difference means nothing; at 3e-5 it ends near 0.46.
  c.optimizer.lr = model == "cnn" ? 3e-5 : 1e-3;
  c.optimizer.momentum = 0;
  c.schedule.name = "constant";
  c.train.epochs = 8;  // more than enough steps at 4 ranks; max_steps stops
  c.train.max_steps = kSteps;
  c.train.precision = precision;
  return c;
}

class Bf16ConvRuns : public test_fixtures::SyntheticDataTest, public ::testing::WithParamInterface<const char*> {
 protected:
  Bf16ConvRuns() : SyntheticDataTest("bf16conv", 2048, 64) {}
};

}  // namespace

TEST_P(Bf16ConvRuns, FollowsFp32LearnsAndIsNotFp32) {
  const std::string model = GetParam();
  {  // the stage the trainer builds for this model (28x28x1 images, 10 classes) runs bf16
    ModelConfig mc;
    mc.name = model;
    mc.depth = 8;
    mc.base_width = 16;
    mc.math = MathMode::bf16;
    EXPECT_EQ(Stage(mc, Device::cpu()).activation_dtype(), DType::bf16) << model << " runs float32 activations";
  }
  TrainConfig a = config(data_, model, "fp32"), b = config(data_, model, "bf16");
  const std::vector<double> f32 = train_losses(a, world_), f16 = train_losses(b, world_);
  ASSERT_EQ(f32.size(), static_cast<std::size_t>(kSteps));
  ASSERT_EQ(f16.size(), static_cast<std::size_t>(kSteps));
  EXPECT_NE(f16, f32) << model << ": the bf16 run is bitwise the fp32 run: no bfloat16 storage ran";
  double worst = 0;
  for (int s = 0; s < kSteps; ++s) worst = std::max(worst, std::abs(f16[s] - f32[s]) / f32[s]);
  // The goal: the loss within 2% of fp32's, here at every step of 40. Measured worst
  // relative difference at np 1 / 2 / 3 / 4: cnn 0.0095 / 0.0060 / 0.0055 / 0.0057, resnet
  // 0.0084 / 0.0038 / 0.0061 / 0.0046 (bf16 rounding of every activation and activation gradient,
  // compounded over the steps); the bound is the issue's, about 2x the worst.
  EXPECT_LE(worst, 0.02) << model << ": bf16 strays from fp32";
  EXPECT_LT(mean5(f16, kSteps - 5), 0.8 * mean5(f16, 0)) << model << " in bf16 did not learn";
  if (world_.rank() == 0)
    std::printf("%s bf16 vs fp32: worst relative loss difference %.4g over %d steps (step 40: %.4g vs %.4g)\n",
                model.c_str(), worst, kSteps, f16[kSteps - 1], f32[kSteps - 1]);
}

INSTANTIATE_TEST_SUITE_P(Models, Bf16ConvRuns, ::testing::Values("cnn", "resnet"));
