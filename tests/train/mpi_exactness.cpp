// Data parallelism is exact: p ranks × batch 64/p follow the same loss
// trajectory as 1 rank × batch 64 (same seed and data order) for `cnn`, which
// has no batch norm. The reference runs on every rank over MPI_COMM_SELF.
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
  if (64 % p != 0) GTEST_SKIP() << "64 is not divisible by " << p << " ranks";
  const int steps = 50;
  std::string dir = testing::synthetic_mnist_like(world, "exact", 64 * steps, 64);

  auto run = [&](const Communicator& comm, int batch) {
    TrainConfig c = testing::small_config(dir);
    c.data.batch_size = batch;
    c.train.max_steps = steps;
    c.train.epochs = 1;
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
    EXPECT_LT(rel, 1e-4) << "step " << i + 1 << ": " << p << " ranks loss " << dp[i] << ", 1 rank " << ref[i];
  }
  // The run learned something (the check above is not comparing two constants).
  EXPECT_LT(ref.back(), 0.8 * ref.front());
  if (world.rank() == 0) std::printf("worst relative loss difference over %d steps: %.3g\n", steps, worst);
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}
