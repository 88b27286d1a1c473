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

std::vector<double> run(const TrainConfig& c, const Communicator& comm, const std::string& resume = "") {
  TrainerHooks hooks;
  hooks.report = false;
  std::vector<double> losses;
  hooks.on_step = [&](std::int64_t, double l) { losses.push_back(l); };
  Trainer t(c, comm, hooks);
  if (!resume.empty()) t.resume(resume);
  t.fit();
  return losses;
}

void expect_follows(const std::vector<double>& got, const std::vector<double>& ref, std::size_t first,
                    const std::string& what) {
  ASSERT_EQ(got.size() + first, ref.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], ref[first + i], 1e-4 * std::abs(ref[first + i])) << what << " step " << first + i;
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
    const std::vector<double> ref = run(c, self);  // 1 rank, no tensor parallelism, batch 16

    // tensor 2 x data w/2: the global batch is 16 per replica.
    TrainConfig big = c;
    big.data.batch_size = 16 * (w / 2);
    const std::vector<double> ref_big = w == 2 ? ref : run(big, self);
    TrainConfig t = c;
    t.parallel.tensor = 2;
    expect_follows(run(t, world), ref_big, 0, std::string(name) + " tensor 2 x data w/2");

    // tensor 2 x pipeline w/2 (data 1): the whole run, then saved after epoch 1 and resumed at
    // tensor w and at tensor 1 x pipeline w (parameters and optimizer state were stored whole).
    TrainConfig tp = c;
    tp.parallel.tensor = 2;
    tp.parallel.pipeline = w / 2;
    expect_follows(run(tp, world), ref, 0, std::string(name) + " tensor 2 x pipeline w/2");
    tp.checkpoint.dir = data + "/" + name + "-t2";
    tp.train.max_steps = static_cast<int>(ref.size() / 2);
    run(tp, world);
    world.barrier();
    // Global-norm clipping over tensor shards and stages (replicated parameters counted once).
    TrainConfig clip = c, clip_tp = c;
    clip.optimizer.clip_norm = clip_tp.optimizer.clip_norm = 0.05;
    clip_tp.parallel.tensor = 2;
    clip_tp.parallel.pipeline = w / 2;
    const std::vector<double> ref_clip = run(clip, self);
    EXPECT_GT(std::abs(ref_clip.back() - ref.back()), 1e-4 * ref.back()) << name << ": clipping must be active";
    expect_follows(run(clip_tp, world), ref_clip, 0, std::string(name) + " clipped, tensor 2 x pipeline w/2");
    TrainConfig r = c;
    r.parallel.tensor = w;
    expect_follows(run(r, world, tp.checkpoint.dir), ref, ref.size() / 2, std::string(name) + " resumed at tensor w");
    r.parallel.tensor = 1;
    r.parallel.pipeline = w;
    expect_follows(run(r, world, tp.checkpoint.dir), ref, ref.size() / 2,
                   std::string(name) + " resumed at tensor 1 x pipeline w");
  }
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
