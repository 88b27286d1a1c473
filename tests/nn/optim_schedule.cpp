// Learning-rate schedules at chosen steps: warm-up start and end, step
// boundaries (epochs, steps, milestones), cosine midpoint/quarter/end, the
// linear scaling rule, and the errors for bad configurations.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "ringtrain/core/error.hpp"
#include "ringtrain/optim/schedule.hpp"

using namespace ringtrain;

namespace {
constexpr double kTol = 1e-15;
}

TEST(OptimSchedule, ConstantWithLinearWarmup) {
  ScheduleConfig c;  // constant, lr 0.1
  c.warmup = 2;      // epochs
  c.warmup_start_factor = 0.1;
  LrSchedule s(c, /*steps_per_epoch=*/10, /*total_steps=*/1000);
  EXPECT_EQ(s.warmup_steps(), 20);
  EXPECT_NEAR(s.lr_at(0), 0.01, kTol);                          // 0.1 · 0.1
  EXPECT_NEAR(s.lr_at(10), 0.1 * (0.1 + 0.9 * 10 / 20.0), kTol);  // 0.055, halfway
  EXPECT_NEAR(s.lr_at(19), 0.1 * (0.1 + 0.9 * 19 / 20.0), kTol);  // 0.0955, last warm-up step
  EXPECT_DOUBLE_EQ(s.lr_at(20), 0.1);                          // end of warm-up
  EXPECT_DOUBLE_EQ(s.lr_at(999), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(5000), 0.1);  // past the end: still constant
}

TEST(OptimSchedule, StepEveryNEpochs) {
  ScheduleConfig c;
  c.name = "step";
  c.step_size = 2;  // epochs
  c.gamma = 0.1;
  LrSchedule s(c, 100, 1000);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(199), 0.1);                  // last step of epoch 1
  EXPECT_NEAR(s.lr_at(200), 0.01, kTol);                // first step of epoch 2
  EXPECT_NEAR(s.lr_at(399), 0.01, kTol);
  EXPECT_NEAR(s.lr_at(400), 0.001, kTol);
}

TEST(OptimSchedule, StepEveryNSteps) {
  ScheduleConfig c;
  c.name = "step";
  c.unit = parse_schedule_unit("steps");
  c.step_size = 50;
  c.gamma = 0.5;
  LrSchedule s(c, 1000, 1000);  // steps_per_epoch does not matter in step units
  EXPECT_DOUBLE_EQ(s.lr_at(49), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(50), 0.05);
  EXPECT_DOUBLE_EQ(s.lr_at(149), 0.025);
  EXPECT_DOUBLE_EQ(s.lr_at(150), 0.0125);
}

TEST(OptimSchedule, StepAtMilestonesWithWarmup) {
  ScheduleConfig c;
  c.name = "Step";  // case-insensitive
  c.milestones = {3, 6};  // epochs
  c.gamma = 0.1;
  c.warmup = 1;
  c.warmup_start_factor = 0.0;
  LrSchedule s(c, 100, 900);
  ASSERT_EQ(s.boundaries(), (std::vector<std::int64_t>{300, 600}));
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.0);             // warm-up from 0
  EXPECT_NEAR(s.lr_at(50), 0.05, kTol);          // 0.1 · 50/100
  EXPECT_DOUBLE_EQ(s.lr_at(100), 0.1);           // end of warm-up
  EXPECT_DOUBLE_EQ(s.lr_at(299), 0.1);
  EXPECT_NEAR(s.lr_at(300), 0.01, kTol);         // first milestone
  EXPECT_NEAR(s.lr_at(599), 0.01, kTol);
  EXPECT_NEAR(s.lr_at(600), 0.001, kTol);        // second milestone
  EXPECT_NEAR(s.lr_at(100000), 0.001, kTol);
}

TEST(OptimSchedule, CosineAfterWarmup) {
  ScheduleConfig c;
  c.name = "cosine";
  c.lr = 0.1;
  c.min_lr = 0.001;
  c.warmup = 1;  // epoch = 10 steps
  c.warmup_start_factor = 0.5;
  LrSchedule s(c, 10, 110);  // cosine over steps [10, 110]
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.05);
  EXPECT_NEAR(s.lr_at(5), 0.1 * (0.5 + 0.5 * 5 / 10.0), kTol);  // 0.075
  EXPECT_DOUBLE_EQ(s.lr_at(10), 0.1);                             // end of warm-up = top of the cosine
  // quarter: 0.001 + 0.099·(1 + cos(π/4))/2 = 0.0855018...
  EXPECT_NEAR(s.lr_at(35), 0.001 + 0.099 * 0.5 * (1 + std::sqrt(0.5)), 1e-15);
  EXPECT_NEAR(s.lr_at(35), 0.08550178, 1e-8);
  EXPECT_NEAR(s.lr_at(60), 0.0505, 1e-15);     // midpoint: (0.1 + 0.001)/2
  EXPECT_NEAR(s.lr_at(109), 0.001 + 0.099 * 0.5 * (1 + std::cos(std::numbers::pi * 99 / 100)), 1e-15);
  EXPECT_DOUBLE_EQ(s.lr_at(110), 0.001);       // end
  EXPECT_DOUBLE_EQ(s.lr_at(500), 0.001);       // past the end: min_lr
  // monotone non-increasing after warm-up
  for (std::int64_t t = 10; t < 110; ++t) EXPECT_LE(s.lr_at(t + 1), s.lr_at(t)) << t;
}

TEST(OptimSchedule, LinearScalingRule) {
  ScheduleConfig c;
  c.name = "cosine";
  c.lr = 0.1;
  c.linear_scaling = true;
  c.global_batch = 1024;  // 4 × 256
  c.warmup = 5;
  c.warmup_start_factor = 0.25;  // Goyal et al.: warm up from the single-batch lr to k·lr
  LrSchedule s(c, 10, 100);
  EXPECT_DOUBLE_EQ(s.base_lr(), 0.4);
  EXPECT_NEAR(s.lr_at(0), 0.1, kTol);   // 0.4 · 0.25
  EXPECT_DOUBLE_EQ(s.lr_at(50), 0.4);   // end of warm-up
  EXPECT_NEAR(s.lr_at(75), 0.2, 1e-15);  // cosine midpoint, min_lr = 0 (not scaled)
  EXPECT_DOUBLE_EQ(s.lr_at(100), 0.0);

  ScheduleConfig k;
  k.linear_scaling = true;
  k.global_batch = 64;
  k.reference_batch = 256;
  EXPECT_DOUBLE_EQ(LrSchedule(k, 1, 1).lr_at(0), 0.025);  // 0.1 · 64/256, constant
}

TEST(OptimSchedule, RejectsBadConfigsWithNamedErrors) {
  auto message = [](const ScheduleConfig& c, std::int64_t spe, std::int64_t total) -> std::string {
    try {
      LrSchedule s(c, spe, total);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  ScheduleConfig c;
  c.name = "linear";
  EXPECT_NE(message(c, 10, 10).find("unknown lr schedule 'linear'"), std::string::npos);
  c.name = "constant";
  EXPECT_NE(message(c, 0, 10).find("steps_per_epoch"), std::string::npos);
  c.name = "cosine";
  c.warmup = 2;
  EXPECT_NE(message(c, 10, 20).find("total_steps"), std::string::npos);  // total must exceed 20 warm-up steps
  c.warmup = 0;
  c.name = "step";
  EXPECT_NE(message(c, 10, 20).find("step_size"), std::string::npos);
  c.milestones = {5, 5};
  EXPECT_NE(message(c, 10, 20).find("milestones must increase"), std::string::npos);
  c.milestones = {5};
  c.gamma = 0;
  EXPECT_NE(message(c, 10, 20).find("gamma"), std::string::npos);
  ScheduleConfig d;
  d.warmup_start_factor = 1.5;
  EXPECT_NE(message(d, 10, 20).find("warmup_start_factor"), std::string::npos);
  d.warmup_start_factor = 0.1;
  d.lr = -1;
  EXPECT_NE(message(d, 10, 20).find("lr must be"), std::string::npos);
  EXPECT_THROW(parse_schedule_unit("hours"), Error);
  EXPECT_THROW(LrSchedule(ScheduleConfig{}, 1, 1).lr_at(-1), Error);
}
