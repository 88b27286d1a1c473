// The trainer with parallel.tensor > 1: `mlp` and `vit` at tensor 2 x data
// w/2 and tensor 2 x pipeline w/2 follow the 1-rank data-parallel trainer
// step for step (1e-4 relative), and a checkpoint written at tensor 2
// (parameters and optimizer state stored whole) resumes at tensor w and at
// tensor 1 x pipeline w to the same losses.
#include <gtest/gtest.h>

#include <cmath>

#include "fixtures.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;

namespace {

using test_fixtures::train_losses;

void expect_follows(const std::vector<double>& got, const std::vector<double>& ref, std::size_t first,
                    const std::string& what) {
  ASSERT_EQ(got.size() + first, ref.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], ref[first + i], 1e-5) << what << " step " << first + i;  // fp32 rounding: 1e-6 seen
}

TEST(TensorTrainer, FollowsTheOneRankTrainerAndReshardsCheckpoints) {
  Communicator world = Communicator::world();
  const int w = world.size();
  if (w != 2 && w != 4) GTEST_SKIP() << "tensor 2 needs an even world (2 or 4 ranks)";
  std::string data = test_fixtures::synthetic_mnist_like(world, "tptrain", 256, 64);
  Communicator self = world.split(world.rank(), 0, "self");
  for (const char* name : {"mlp", "vit"}) {
    TrainConfig c = test_fixtures::small_config(data);
    c.model.name = name;
    c.model.width = 16;  // vit: 4 heads of 4, hidden 32, 2 blocks, 7x7 patches
    c.model.heads = 4;
    c.model.depth = 2;
    c.model.mlp_ratio = 2.0;
    c.model.patch = 7;
    c.data.batch_size = 16;
    c.train.epochs = 2;
    c.schedule.name = "constant";
    c.optimizer.lr = 0.01;
    const std::vector<double> ref = train_losses(c, self);  // 1 rank, no tensor parallelism, batch 16

    // tensor 2 x data w/2: the global batch is 16 per replica.
    TrainConfig big = c;
    big.data.batch_size = 16 * (w / 2);
    const std::vector<double> ref_big = w == 2 ? ref : train_losses(big, self);
    TrainConfig t = c;
    t.parallel.tensor = 2;
    t.train.verify_every = 1;  // at data 2 (4 ranks): each shard's replicas bitwise identical every step
    expect_follows(train_losses(t, world), ref_big, 0, std::string(name) + " tensor 2 x data w/2");

    // tensor 2 x pipeline w/2 (data 1): the whole run, then saved after epoch 1 and resumed at
    // tensor w and at tensor 1 x pipeline w (parameters and optimizer state were stored whole).
    TrainConfig tp = c;
    tp.parallel.tensor = 2;
    tp.parallel.pipeline = w / 2;
    expect_follows(train_losses(tp, world), ref, 0, std::string(name) + " tensor 2 x pipeline w/2");
    tp.checkpoint.dir = data + "/" + name + "-t2";
    tp.train.max_steps = static_cast<int>(ref.size() / 2);
    train_losses(tp, world);
    world.barrier();
    // Global-norm clipping over tensor shards and stages (replicated parameters counted once).
    TrainConfig clip = c, clip_tp = c;
    clip.optimizer.clip_norm = clip_tp.optimizer.clip_norm = 0.05;
    clip_tp.parallel.tensor = 2;
    clip_tp.parallel.pipeline = w / 2;
    const std::vector<double> ref_clip = train_losses(clip, self);
    EXPECT_GT(std::abs(ref_clip.back() - ref.back()), 1e-4 * ref.back()) << name << ": clipping must be active";
    expect_follows(train_losses(clip_tp, world), ref_clip, 0, std::string(name) + " clipped, tensor 2 x pipeline w/2");
    TrainConfig r = c;
    r.parallel.tensor = w;
    expect_follows(train_losses(r, world, tp.checkpoint.dir), ref, ref.size() / 2, std::string(name) + " resumed at tensor w");
    r.parallel.tensor = 1;
    r.parallel.pipeline = w;
    expect_follows(train_losses(r, world, tp.checkpoint.dir), ref, ref.size() / 2,
                   std::string(name) + " resumed at tensor 1 x pipeline w");
  }
}

// resnet at tensor w (data 1: BatchNorm sees the whole batch) follows the
// 1-rank trainer, and so does its evaluation, which uses the channel-sharded
// running statistics. Saved at tensor w (buffers gathered whole) and resumed
// at tensor 1 x pipeline w (one micro-batch: BatchNorm still sees the whole
// batch), the last epoch's losses and the final evaluation match again: wrong
// restored statistics would move the evaluation (0.9^8 of them remain).
TEST(TensorTrainer, ResnetFollowsAndItsShardedBatchNormStatisticsResume) {
  Communicator world = Communicator::world();
  const int w = world.size();
  if (w != 2 && w != 4) GTEST_SKIP() << "2 or 4 ranks";
  // 8 steps an epoch at a small rate: float rounding (1e-8 at first) grows
  // through BatchNorm and momentum, to 2e-4 by step 30 at lr 0.02.
  std::string data = test_fixtures::synthetic_mnist_like(world, "tpresnet", 128, 64);
  Communicator self = world.split(world.rank(), 0, "self");
  TrainConfig c = test_fixtures::small_config(data);
  c.model.name = "resnet";
  c.model.width = 4;
  c.model.depth = 8;
  c.data.batch_size = 16;
  c.train.epochs = 2;
  c.schedule.name = "constant";
  c.optimizer.lr = 0.01;
  auto fit = [](const TrainConfig& cfg, const Communicator& comm, std::vector<double>& losses,
                const std::string& resume = "") {
    TrainerHooks hooks;
    hooks.report = false;
    hooks.on_step = [&](std::int64_t, double l) { losses.push_back(l); };
    Trainer t(cfg, comm, hooks);
    if (!resume.empty()) t.resume(resume);
    return t.fit();
  };
  std::vector<double> ref, tp, saved, resumed;
  const TrainResult r1 = fit(c, self, ref);
  TrainConfig t = c;
  t.parallel.tensor = w;
  const TrainResult rt = fit(t, world, tp);
  expect_follows(tp, ref, 0, "resnet tensor w");
  ASSERT_TRUE(r1.last.evaluated && rt.last.evaluated);
  EXPECT_NEAR(rt.last.test_loss, r1.last.test_loss, 1e-4 * r1.last.test_loss) << "evaluation at tensor w";
  t.checkpoint.dir = data + "/resnet-tw";
  t.train.max_steps = static_cast<int>(ref.size() / 2);
  fit(t, world, saved);
  world.barrier();
  TrainConfig p = c;
  p.parallel.pipeline = w;
  p.parallel.micro_batches = 1;
  const TrainResult rp = fit(p, world, resumed, t.checkpoint.dir);
  expect_follows(resumed, ref, ref.size() / 2, "resnet resumed at tensor 1 x pipeline w");
  EXPECT_NEAR(rp.last.test_loss, r1.last.test_loss, 1e-4 * r1.last.test_loss) << "evaluation after the resume";
}

TEST(TensorTrainer, WidthsTheTensorSizeDoesNotDivideAreAnErrorOnEveryRank) {
  Communicator world = Communicator::world();
  if (world.size() % 2) GTEST_SKIP();
  std::string data = test_fixtures::synthetic_mnist_like(world, "tperr", 64, 32);
  TrainConfig c = test_fixtures::small_config(data);
  c.model.name = "resnet";
  c.model.width = 5;
  c.data.batch_size = 16;
  c.parallel.tensor = 2;
  TrainerHooks h;
  h.report = false;
  try {
    Trainer tr(c, world, h);
    ADD_FAILURE() << "resnet of width 5 at tensor 2 must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model 'resnet': model.width = 5 is not divisible by parallel.tensor = 2"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
