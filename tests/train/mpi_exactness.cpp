// Data parallelism is exact: p ranks × batch 64/p follow the same loss
// trajectory as 1 rank × batch 64 (same seed and data order) for `cnn`, which
// has no batch norm. The reference runs on every rank over MPI_COMM_SELF.
// Data: the real Fashion-MNIST, so the trajectory is a real learning curve.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "fixtures.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;

TEST(Exactness, RanksTimesBatchEqualsOneRankWithTheGlobalBatch) {
  Communicator world = Communicator::world();
  const int p = world.size();
  if (p == 1) GTEST_SKIP() << "1 rank: the run would be compared with itself";
  if (64 % p != 0) GTEST_SKIP() << "64 is not divisible by " << p << " ranks";
  const int steps = 50;
  std::string dir = test_fixtures::fashion_mnist(world, "exact");

  auto run = [&](const Communicator& comm, int batch) {
    TrainConfig c = test_fixtures::small_config(dir);
    c.data.batch_size = batch;
    c.train.max_steps = steps;
    c.train.epochs = 1;
    // Plain SGD at lr 0.05. The 1-rank and p-rank runs differ by float rounding
    // only (a sum over 64 samples vs two sums over 32), ~1e-7 per step. In a ReLU
    // network such a difference stays that small until it flips the sign of some
    // pre-activation near zero; after a flip the two gradients differ by a finite
    // amount and the trajectories separate. How soon that happens depends on the
    // setting (with momentum 0.9 or lr 0.01 it came within 10–40 steps here), so
    // the test pins a setting where 50 steps stay at rounding level (~2e-7 at
    // 2 and 4 ranks): it tests the all-reduce, not the optimizer's sensitivity.
    c.optimizer.lr = 0.05;
    c.optimizer.momentum = 0.0;
    c.optimizer.nesterov = false;
    TrainerHooks hooks;
    hooks.evaluate = false;
    hooks.report = false;
    std::vector<double> losses;
    hooks.on_step = [&](std::int64_t, double loss) { losses.push_back(loss); };
    Trainer t(c, comm, hooks);
    t.fit();
    return losses;
  };
  std::vector<double> dp = run(world, 64 / p);
  std::vector<double> ref = run(Communicator::dup_of(MPI_COMM_SELF, "self"), 64);
  ASSERT_EQ(dp.size(), static_cast<std::size_t>(steps));
  ASSERT_EQ(ref.size(), static_cast<std::size_t>(steps));
  double worst = 0;
  for (int i = 0; i < steps; ++i) {
    double rel = std::abs(dp[i] - ref[i]) / std::abs(ref[i]);
    worst = std::max(worst, rel);
    // Measured worst 2.7e-7 (2 ranks) and 1.0e-7 (4 ranks) on an AMD EPYC, 2.2e-7 on an
    // Intel Xeon: about 10x that.
    EXPECT_LT(rel, 3e-6) << "step " << i + 1 << ": " << p << " ranks loss " << dp[i] << ", 1 rank " << ref[i];
  }
  // The run learned something (the check above is not comparing two constants).
  EXPECT_LT(ref.back(), 0.8 * ref.front());
  if (world.rank() == 0) std::printf("worst relative loss difference over %d steps: %.3g\n", steps, worst);
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}
