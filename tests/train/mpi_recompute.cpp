// train.recompute: `attention` and `block` train bitwise like `none` (every
// step's loss, and every parameter, optimizer state and BatchNorm running
// statistic of the final checkpoint) with dropout on, for vit, cnn and resnet
// (BatchNorm), at 1 rank (any rank count: data parallel), pipeline 2 with 4
// micro-batches under 1f1b and zb-h1, and tensor 2. A bad value names the key.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "fixtures.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
namespace fs = std::filesystem;

namespace {

struct Layout {
  int pipeline, tensor;
  const char* schedule;
};

std::vector<Layout> layouts(int w) {
  std::vector<Layout> v = {{1, 1, "1f1b"}};
  if (w % 2 == 0) v.insert(v.end(), {{2, 1, "1f1b"}, {2, 1, "zb-h1"}, {1, 2, "1f1b"}});
  return v;
}

TrainConfig model(const std::string& data, const std::string& name) {
  TrainConfig c = test_fixtures::small_config(data);
  c.model.name = name;
  c.model.dropout = 0.2;
  if (name == "vit") {
    c.model.width = 32;
    c.model.depth = 2;
    c.model.heads = 2;
    c.model.mlp_ratio = 2.0;
    c.model.patch = 7;
  } else if (name == "resnet") {
    c.model.depth = 8;
    c.model.width = 4;
  }
  c.optimizer.name = "adamw";
  c.optimizer.lr = 1e-3;
  c.optimizer.weight_decay = 0.01;
  c.schedule.name = "constant";
  c.train.max_steps = 10;
  c.train.epochs = 10;
  return c;
}

std::vector<double> train(const TrainConfig& c, const Communicator& world) {
  TrainerHooks h = test_fixtures::quiet_hooks();
  std::vector<double> out;
  h.on_step = [&](std::int64_t, double l) { out.push_back(l); };
  Trainer t(c, world, h);
  t.fit();
  return out;
}

}  // namespace

TEST(Recompute, AttentionAndBlockAreBitwiseTheSameTraining) {
  Communicator world = Communicator::world();
  const int w = world.size();
  if (w == 3) GTEST_SKIP() << "3 ranks: data parallel only, as 1 rank";
  std::string data = test_fixtures::synthetic_mnist_like(world, "recompute", 256, 32);
  for (const char* name : {"vit", "resnet", "cnn"})
    for (const Layout& l : layouts(w)) {
      const int dp = w / (l.pipeline * l.tensor);
      TrainConfig c = model(data, name);
      c.parallel.pipeline = l.pipeline;
      c.parallel.tensor = l.tensor;
      c.parallel.schedule = l.schedule;
      c.parallel.micro_batches = l.pipeline > 1 ? 4 : 1;
      c.data.batch_size = 16 / dp;
      const std::string what = cat(name, ": pipeline ", l.pipeline, " (", l.schedule, ") x tensor ", l.tensor,
                                   " x data ", dp);
      std::vector<double> ref;
      CheckpointData ref_ckpt;
      for (const char* mode : {"none", "attention", "block"}) {
        TrainConfig r = c;
        r.train.recompute = mode;
        r.checkpoint.dir = cat(data, "/", name, l.pipeline, l.tensor, l.schedule, "-", mode);
        const std::vector<double> got = train(r, world);
        world.barrier();
        ASSERT_EQ(got.size(), 10u) << what;
        CheckpointData ck;
        if (world.rank() == 0) ck = find_intact_checkpoint(r.checkpoint.dir).data;
        if (std::string(mode) == "none") {
          if (world.rank() == 0) ASSERT_GT(ck.tensors.size(), 0u) << what;
          ref = got;
          ref_ckpt = std::move(ck);
          continue;
        }
        for (std::size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(got[i], ref[i]) << what << ", " << mode << ", step " << i;
        if (world.rank() != 0) continue;
        ASSERT_EQ(ck.tensors.size(), ref_ckpt.tensors.size()) << what;
        int differ = 0;
        for (std::size_t i = 0; i < ck.tensors.size(); ++i) {
          ASSERT_EQ(ck.tensors[i].first, ref_ckpt.tensors[i].first) << what;
          ASSERT_EQ(ck.tensors[i].second.nbytes(), ref_ckpt.tensors[i].second.nbytes()) << what;
          const bool same = std::memcmp(ck.tensors[i].second.raw(), ref_ckpt.tensors[i].second.raw(),
                                        ck.tensors[i].second.nbytes()) == 0;
          differ += !same;
          EXPECT_TRUE(same) << what << ", " << mode << ": " << ck.tensors[i].first << " differs";
        }
        EXPECT_EQ(differ, 0) << what << ", " << mode;
      }
    }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(data);
}

TEST(Recompute, BadValueIsAnErrorNamingTheKey) {
  TrainConfig c;
  c.train.recompute = "full";
  try {
    c.validate();
    FAIL() << "train.recompute = full was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.recompute"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("full"), std::string::npos) << e.what();
  }
  c.train.recompute = "block";
  EXPECT_NO_THROW(c.validate());
}
