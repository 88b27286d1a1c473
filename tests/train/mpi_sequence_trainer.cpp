// The trainer with sequence parallelism (parallel.sequence, on by default at
// parallel.tensor > 1 for vit): vit with dropout at tensor 2 (2 ranks) and at
// tensor 2 x pipeline 2 (4 ranks; the stages pass token shards) follows the
// 1-rank trainer and the same layout without sequence parallelism, with
// global-norm clipping active (LayerNorm gradients summed over the tensor
// group are counted once). A checkpoint written with sequence parallelism
// resumes without it and one written without resumes with it, to the same
// losses: the parameters are layout-independent. Other rank counts skip.
#include <gtest/gtest.h>

#include <cmath>

#include "fixtures.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;

namespace {

using test_fixtures::train_losses;

// Measured: 3.9e-8 at most between any two of the runs (losses ~2.3, 10 steps); about 10x.
constexpr double kTolerance = 4e-7;

double expect_follows(const std::vector<double>& got, const std::vector<double>& ref, std::size_t first,
                      const std::string& what) {
  EXPECT_EQ(got.size() + first, ref.size()) << what;
  double worst = 0;
  for (std::size_t i = 0; i < got.size() && first + i < ref.size(); ++i) {
    worst = std::max(worst, std::abs(got[i] - ref[first + i]));
    EXPECT_NEAR(got[i], ref[first + i], kTolerance) << what << " step " << first + i;
  }
  if (Communicator::world().rank() == 0) std::printf("%s: worst loss difference %.3g\n", what.c_str(), worst);
  return worst;
}

TEST(SequenceTrainer, VitFollowsTheOneRankTrainerAndCheckpointsResumeEitherWay) {
  Communicator world = Communicator::world();
  const int w = world.size();
  if (w != 2 && w != 4) GTEST_SKIP() << "tensor 2 (x pipeline 2) needs 2 or 4 ranks";
  std::string data = test_fixtures::synthetic_mnist_like(world, "seqtrain", 160, 32);
  Communicator self = world.split(world.rank(), 0, "self");
  TrainConfig c = test_fixtures::small_config(data);
  c.model.name = "vit";
  c.model.width = 16;  // 4 heads of 4, hidden 32, 2 blocks, 16 tokens (7x7 patches of 28x28)
  c.model.heads = 4;
  c.model.depth = 2;
  c.model.mlp_ratio = 2.0;
  c.model.patch = 7;
  c.model.dropout = 0.2;
  c.data.batch_size = 16;
  c.train.epochs = 1;  // 10 steps
  c.schedule.name = "constant";
  c.optimizer.lr = 0.01;
  c.optimizer.clip_norm = 0.05;
  const std::vector<double> ref = train_losses(c, self);
  ASSERT_EQ(ref.size(), 10u);
  TrainConfig noclip = c;
  noclip.optimizer.clip_norm = 0;
  EXPECT_GT(std::abs(train_losses(noclip, self).back() - ref.back()), 1e-4) << "clipping must be active";

  TrainConfig sp = c;
  sp.parallel.tensor = 2;
  sp.parallel.pipeline = w / 2;
  sp.parallel.partition = "list";  // pipeline 2: cut between blocks.0 and blocks.1, so the stages pass token shards
  sp.parallel.balance = "[2, 4]";
  if (w == 2) sp.parallel.partition = "uniform";
  const std::string layout = w == 2 ? "tensor 2" : "tensor 2 x pipeline 2";
  TrainConfig plain = sp;
  plain.parallel.sequence = false;
  const std::vector<double> got = train_losses(sp, world), without = train_losses(plain, world);
  expect_follows(got, ref, 0, layout + " with sequence parallelism vs 1 rank");
  expect_follows(got, without, 0, layout + " with vs without sequence parallelism");

  // Saved after 5 steps with sequence parallelism, resumed without it (and the other way round).
  for (bool save_with : {true, false}) {
    TrainConfig save = save_with ? sp : plain;
    save.checkpoint.dir = data + (save_with ? "/with" : "/without");
    save.train.max_steps = 5;
    train_losses(save, world);
    world.barrier();
    TrainConfig resume = save_with ? plain : sp;
    expect_follows(train_losses(resume, world, save.checkpoint.dir), ref, 5,
                   cat(layout, save_with ? ": saved with sequence parallelism, resumed without"
                                         : ": saved without sequence parallelism, resumed with"));
  }
}

}  // namespace
