// One run across allocations (issue 22, item 1). At 4 ranks, an `mlp` + AdamW
// run with data.global_batch and comm.deterministic is cut at step 12; the
// same configuration (layout aside) continues on half the ranks with
// `--resume auto`, and its losses over the 60 remaining steps follow the
// uninterrupted 4-rank run within 1e-5 (relative): data 4 -> data 2,
// data 2 x pipeline 2 -> data 2, data 4 -> tensor 2, and data 2 -> tensor 2 at
// 2 ranks. The derived batch and accumulation follow the documented rule; a
// global batch without an exact split is an error naming the keys on every
// rank; another number of steps per epoch (a padded tail) is refused;
// `--resume auto` continues its own run at any rank count and never another's.
#include <gtest/gtest.h>

#include <filesystem>

#include "fixtures.hpp"
#include "support/error_of.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
namespace fs = std::filesystem;

namespace {

constexpr int kCut = 12, kSteps = 72;  // 8 steps per epoch: the cut is inside epoch 2

TrainerHooks quiet(std::vector<double>* losses = nullptr) {
  TrainerHooks h;
  h.report = false;
  h.evaluate = false;
  if (losses) h.on_step = [losses](std::int64_t, double l) { losses->push_back(l); };
  return h;
}

struct Layout {
  int pipeline = 1, tensor = 1;
};

// 256 samples, global batch 32, at any layout.
TrainConfig run_config(const std::string& data, Layout l, const std::string& dir) {
  TrainConfig c = test_fixtures::small_config(data);
  c.model.name = "mlp";
  c.data.global_batch = 32;
  c.data.batch_size = 5;  // ignored: derived from data.global_batch
  c.train.epochs = kSteps / 8;
  c.optimizer.name = "adamw";
  c.optimizer.lr = 1e-3;
  c.comm.deterministic = true;
  c.parallel.pipeline = l.pipeline;
  c.parallel.tensor = l.tensor;
  c.checkpoint.dir = dir;
  c.checkpoint.keep = 100;
  return c;
}

using test_support::error_of;

class ElasticResume : public test_fixtures::SyntheticDataTest {
 protected:
  ElasticResume() : SyntheticDataTest("elastic", 256, 32) {}

  // The ranks [0, n) of the world (the others get a communicator they do not use).
  Communicator first(int n) const { return world_.split(world_.rank() < n ? 0 : 1, world_.rank(), "first"); }

  // Uninterrupted on `from_ranks` at `from`, cut there at kCut, continued with
  // --resume auto on `to_ranks` at `to`: the continuation's losses follow the
  // uninterrupted ones, and its last checkpoint is the same run at the new layout.
  void check(const std::string& name, int from_ranks, Layout from, int to_ranks, Layout to) {
    const Communicator a = first(from_ranks), b = first(to_ranks);
    const std::string full_dir = data_ + "/" + name + "-full", dir = data_ + "/" + name;
    std::vector<double> full, cut, rest;
    if (world_.rank() < from_ranks) {
      Trainer(run_config(data_, from, full_dir), a, quiet(&full)).fit();
      TrainConfig c = run_config(data_, from, dir);
      c.train.max_steps = kCut;
      Trainer(c, a, quiet(&cut)).fit();
    }
    world_.barrier();
    if (world_.rank() < to_ranks) {
      Trainer t(run_config(data_, to, dir), b, quiet(&rest));
      const bool found = t.resume("auto");
      EXPECT_TRUE(found) << name << ": --resume auto finds the same run at another layout";
      if (found) t.fit();
    }
    world_.barrier();
    if (world_.rank() != 0) return;
    ASSERT_EQ(full.size(), std::size_t(kSteps)) << name;
    ASSERT_EQ(cut.size(), std::size_t(kCut)) << name;
    ASSERT_EQ(rest.size(), std::size_t(kSteps - kCut)) << name << ": the continuation takes the remaining steps";
    for (int i = 0; i < kCut; ++i) EXPECT_EQ(cut[i], full[i]) << name << ": step " << i;
    double worst = 0;
    for (int i = 0; i < kSteps - kCut; ++i) {
      const double want = full[kCut + i];
      EXPECT_NEAR(rest[i], want, 1e-5 * std::abs(want)) << name << ": resumed step " << kCut + i;
      worst = std::max(worst, std::abs(rest[i] - want) / std::abs(want));
    }
    std::printf("[ elastic  ] %s: %d steps after resuming follow the uninterrupted run, worst relative "
                "difference %.3g\n", name.c_str(), kSteps - kCut, worst);
    const CheckpointData last = find_intact_checkpoint(dir).data, uncut = find_intact_checkpoint(full_dir).data;
    EXPECT_EQ(last.scalars.at("step"), kSteps) << name;
    EXPECT_EQ(last.scalars.at("resumes"), 1) << name;
    EXPECT_EQ(last.scalars.at("pipeline"), to.pipeline) << name;
    EXPECT_EQ(last.scalars.at("tensor"), to.tensor) << name;
    EXPECT_EQ(last.scalars.at("batch_size") * last.scalars.at("data_parallel") * last.scalars.at("accumulation"), 32)
        << name << ": the global batch is kept";
    EXPECT_EQ(last.strings.at("run_identity"), uncut.strings.at("run_identity")) << name;
  }
};

TEST_F(ElasticResume, Data4ToData2) {
  if (world_.size() != 4) GTEST_SKIP() << "4 ranks, then 2";
  check("d4-d2", 4, {}, 2, {});
}

TEST_F(ElasticResume, Data2Pipeline2ToData2) {
  if (world_.size() != 4) GTEST_SKIP() << "4 ranks, then 2";
  check("d2p2-d2", 4, {2, 1}, 2, {});
}

TEST_F(ElasticResume, Data4ToTensor2) {
  if (world_.size() != 4) GTEST_SKIP() << "4 ranks, then 2";
  check("d4-t2", 4, {}, 2, {1, 2});
}

TEST_F(ElasticResume, Data2ToTensor2) {
  if (world_.size() < 2) GTEST_SKIP() << "2 ranks";
  check("d2-t2", 2, {}, 2, {1, 2});
}

// The smallest accumulation >= train.accumulation that splits the global batch
// exactly, with a per-rank batch divisible by the pipeline's micro-batches.
TEST_F(ElasticResume, GlobalBatchSplitsByTheRule) {
  const int n = world_.size();
  struct Case {
    int global, accumulation, pipeline, want_batch, want_accumulation;
  };
  // At n data-parallel ranks (pipeline 1) or n/2 (pipeline 2).
  std::vector<Case> cases = {{32 * n, 1, 1, 32, 1}, {32 * n, 3, 1, 8, 4}, {6 * n, 1, 1, 6, 1}, {6 * n, 4, 1, 1, 6}};
  // Pipeline 2 (2 micro-batches, dp n/2): 18 per replica, 9 at accumulation 2 is odd.
  if (n % 2 == 0) cases.push_back({9 * n, 2, 2, 6, 3});
  for (const Case& k : cases) {
    TrainConfig c = run_config(data_, {k.pipeline, 1}, "");
    c.data.global_batch = k.global;
    c.train.accumulation = k.accumulation;
    Trainer t(c, world_, quiet());
    EXPECT_EQ(t.config().data.batch_size, k.want_batch) << "global " << k.global << " accumulation >= " << k.accumulation;
    EXPECT_EQ(t.config().train.accumulation, k.want_accumulation) << "global " << k.global;
  }
  if (n == 1) return;
  TrainConfig c = run_config(data_, {}, "");
  c.data.global_batch = 25;  // 2, 3 and 4 ranks: no exact split
  const std::string m = error_of([&] { Trainer t(c, world_, quiet()); });
  EXPECT_NE(m.find("data.global_batch = 25 has no exact split"), std::string::npos) << m;
  EXPECT_NE(m.find("data-parallel size " + std::to_string(n)), std::string::npos) << m;
  EXPECT_NE(m.find("train.accumulation"), std::string::npos) << m;
}

// With a padded tail (data.drop_last = false) another accumulation pads
// another number of micro-batches: 256 samples in global batches of 48 are 6
// steps at accumulation 1 (ceil(256 / 48)) but 5 at accumulation 2 (11 micro-
// batches of 24): resuming is refused on every rank, saying so.
TEST_F(ElasticResume, AnotherStepCountPerEpochIsRefused) {
  const std::string dir = data_ + "/pad";
  TrainConfig c = run_config(data_, {}, dir);
  c.data.global_batch = 48;
  c.data.drop_last = false;
  c.train.max_steps = 2;
  Trainer(c, world_, quiet()).fit();
  world_.barrier();
  c.train.accumulation = 2;
  const std::string m = error_of([&] {
    Trainer t(c, world_, quiet());
    t.resume(dir);
  });
  EXPECT_NE(m.find("optimizer steps per epoch 6 -> 5"), std::string::npos) << m;
  EXPECT_NE(m.find("data.drop_last"), std::string::npos) << m;
}

// --resume auto matches the run identity alone: the 2-rank run continues at
// 1 rank; a run of another seed (another identity) starts afresh beside it,
// and so does one whose checkpoint carries no identity.
TEST_F(ElasticResume, AutoContinuesItsOwnRunOnly) {
  if (world_.size() < 2) GTEST_SKIP() << "2 ranks, then 1";
  const Communicator two = first(2), one = first(1);
  const std::string dir = data_ + "/new", bare = data_ + "/bare";
  if (world_.rank() < 2) {
    TrainConfig c = run_config(data_, {}, dir);
    c.train.max_steps = 4;
    Trainer(c, two, quiet()).fit();
  }
  world_.barrier();
  if (world_.rank() == 0) {
    FoundCheckpoint f = find_intact_checkpoint(dir);
    f.data.strings.erase("run_identity");
    fs::create_directories(bare);
    write_checkpoint(bare + "/" + fs::path(f.path).filename().string(), f.data);
    TrainConfig other = run_config(data_, {}, dir);
    other.train.seed += 1;
    EXPECT_FALSE(Trainer(other, one, quiet()).resume("auto")) << "another seed is another run";
    EXPECT_FALSE(Trainer(run_config(data_, {}, bare), one, quiet()).resume("auto")) << "no run identity";
    Trainer n(run_config(data_, {}, dir), one, quiet());
    EXPECT_TRUE(n.resume("auto")) << "the same run at another rank count";
    EXPECT_EQ(n.loaded().step, 4);
  }
  world_.barrier();
}

}  // namespace
