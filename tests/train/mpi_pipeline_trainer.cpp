// The trainer's pipeline path: `ringtrain train --set parallel.pipeline=<world>`
// follows the 1-rank data-parallel trainer step for step (same data order,
// same global batch), evaluates, and a checkpoint written by the pipeline
// resumes to the same result as the uninterrupted run. Config errors name values.
#include <gtest/gtest.h>

#include <cmath>

#include "fixtures.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;

namespace {

using test_fixtures::train_losses;

// Relative loss difference allowed against the 1-rank trainer: measured worst
// 2.4e-5 at 2-4 stages (AMD EPYC): the 4 micro-batches' gradient sums round
// differently from one batch's, and 48 steps amplify it. About 10x.
constexpr double kRelTolerance = 2.5e-4;

TEST(PipelineTrainer, FollowsTheOneRankTrainerAndResumes) {
  Communicator world = Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs 2+ ranks for a pipeline";
  std::string data = test_fixtures::synthetic_mnist_like(world, "pipetrain", 384, 64);
  TrainConfig c = test_fixtures::small_config(data);
  c.data.batch_size = 16;
  c.train.epochs = 2;
  c.schedule.name = "constant";
  c.optimizer.lr = 0.01;  // a calm run: rounding differences must not be amplified by chaos
  // The reference: the unpipelined trainer on this rank alone.
  Communicator self = world.split(world.rank(), 0, "self");
  TrainResult ref_r;
  std::vector<double> ref = train_losses(c, self, "", &ref_r);

  TrainConfig p = c;
  p.parallel.pipeline = world.size();
  p.parallel.micro_batches = 4;
  p.parallel.schedule = "zb-h1";
  p.parallel.replan_steps = 1;  // the table changes at steps 2-5 (the replan's alternate steps, then the fastest)
  p.checkpoint.dir = data + "/pipe-full";
  TrainResult pr;
  std::vector<double> got = train_losses(p, world, "", &pr);
  ASSERT_EQ(got.size(), ref.size());
  double worst = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - ref[i]) / std::abs(ref[i]));
    EXPECT_NEAR(got[i], ref[i], kRelTolerance * std::abs(ref[i])) << "step " << i << " rel "
                                                                   << (got[i] - ref[i]) / ref[i];
  }
  if (world.rank() == 0) std::printf("worst relative loss difference: %.3g\n", worst);
  // Evaluation of the same weights to rounding: the test loss measured 5.3e-6 relative
  // apart at 2-4 ranks (a small loss, 2.6e-4: every margin is wide), so the same
  // predictions, hence the same accuracy.
  EXPECT_EQ(pr.last.test_accuracy, ref_r.last.test_accuracy);
  EXPECT_NEAR(pr.last.test_loss, ref_r.last.test_loss, 3e-5 * ref_r.last.test_loss);
  // The epoch's schedule figures: a rank's step holds all its compute, so the mean step is at
  // least the busiest rank's compute at the epoch's mean costs (with each backward at its cheaper form).
  EXPECT_GT(pr.last.schedule_busiest_s, 0);
  EXPECT_GE(pr.last.schedule_s, pr.last.schedule_busiest_s);
  EXPECT_GT(pr.last.schedule_median_s, 0);
  EXPECT_GT(pr.last.schedule_predicted_steps_median_s, 0);

  // Stop after epoch 1, resume (same pipeline), finish: the same losses as the uninterrupted run.
  TrainConfig cut = p;
  cut.checkpoint.dir = data + "/pipe-cut";
  cut.train.max_steps = static_cast<int>(ref.size() / 2);
  train_losses(cut, world);
  world.barrier();
  cut.train.max_steps = 0;
  std::vector<double> rest = train_losses(cut, world, cut.checkpoint.dir);
  ASSERT_EQ(rest.size(), ref.size() / 2);
  for (std::size_t i = 0; i < rest.size(); ++i)
    EXPECT_EQ(rest[i], got[ref.size() / 2 + i]) << "resumed step " << i;
}

// A stop signal seen by one rank only, in the middle of an epoch: every rank
// stops after the same step, the checkpoint holds the exact position, and the
// resumed run takes the remaining steps with the uninterrupted run's losses.
TEST(PipelineTrainer, SignalOnOneRankStopsAllAndResumesMidEpochExactly) {
  Communicator world = Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs 2+ ranks for a pipeline";
  std::string data = test_fixtures::synthetic_mnist_like(world, "pipesig", 384, 64);
  TrainConfig c = test_fixtures::small_config(data);
  c.data.batch_size = 16;
  c.train.epochs = 2;
  c.schedule.name = "constant";
  c.optimizer.lr = 0.01;
  c.parallel.pipeline = world.size();
  c.parallel.micro_batches = 4;
  c.checkpoint.dir = data + "/pipe-sig-full";
  const std::vector<double> full = train_losses(c, world);
  ASSERT_GT(full.size(), 6u);
  const std::int64_t stop_after = static_cast<std::int64_t>(full.size() / 2 - 3);  // inside epoch 1

  TrainConfig cut = c;
  cut.checkpoint.dir = data + "/pipe-sig-cut";
  TrainerHooks hooks;
  hooks.report = false;
  std::vector<double> first;
  std::int64_t taken = 0;
  hooks.on_step = [&](std::int64_t step, double l) { first.push_back(l); taken = step; };
  const int signaller = world.size() - 1;  // the last stage only
  hooks.stop_signal = [&] { return world.rank() == signaller && taken >= stop_after ? 10 /* SIGUSR1 */ : 0; };
  TrainResult r;
  {
    Trainer t(cut, world, hooks);
    r = t.fit();
  }
  EXPECT_NE(r.stopped_by_signal, 0);
  // The pending signal rides in the next step's all-reduce (no extra one per
  // step): every rank finishes that step, then stops, as on the data-parallel path.
  ASSERT_EQ(static_cast<std::int64_t>(first.size()), stop_after + 1);
  world.barrier();
  const std::vector<double> rest = train_losses(cut, world, cut.checkpoint.dir);
  ASSERT_EQ(first.size() + rest.size(), full.size());
  for (std::size_t i = 0; i < first.size(); ++i) EXPECT_EQ(first[i], full[i]) << "step " << i;
  for (std::size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], full[first.size() + i]) << "resumed step " << i;
}

TEST(PipelineTrainer, BadParallelConfigIsAnErrorNamingTheValues) {
  Communicator world = Communicator::world();
  std::string data = test_fixtures::synthetic_mnist_like(world, "pipeerr", 128, 32);
  TrainConfig c = test_fixtures::small_config(data);
  c.data.batch_size = 16;
  c.parallel.pipeline = 2;
  c.parallel.micro_batches = 3;
  EXPECT_THROW(c.validate(), Error);
  c.parallel.micro_batches = 4;
  c.parallel.tensor = 0;
  EXPECT_THROW(c.validate(), Error);
  c.parallel.tensor = 1;
  if (world.size() % 2 == 1) {
    TrainerHooks h;
    h.report = false;
    try {
      Trainer t(c, world, h);
      ADD_FAILURE() << "pipeline 2 on " << world.size() << " ranks must fail";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("parallel.pipeline = 2"), std::string::npos) << e.what();
    }
  }
  // More stages than top-level layers: a 2-layer model on 3 or 4 stages.
  if (world.size() >= 3) {
    c.model.name = "layers";
    c.model.layers = {LayerDesc{"flatten", {}, {}, {}}, LayerDesc{"linear", {}, {}, {}}};
    c.parallel.pipeline = world.size();
    TrainerHooks h;
    h.report = false;
    try {
      Trainer t(c, world, h);
      ADD_FAILURE() << world.size() << " stages for 2 layers must fail";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(cat("parallel.pipeline = ", world.size(), " stages, but the model has only 2")),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
