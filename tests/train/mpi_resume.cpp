// Resume: a run stopped after epoch 1 and resumed from its checkpoint ends with
// the same parameters and optimizer state, bit for bit, as an uninterrupted
// 2-epoch run at the same rank count. Also: bad checkpoints are errors on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "fixtures.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
namespace fs = std::filesystem;

namespace {
CheckpointData final_state(const std::string& dir) { return find_intact_checkpoint(dir).data; }

// A new trainer continues from the newest checkpoint in `dir` and finishes the run.
void resume_and_finish(TrainConfig c, const std::string& dir, const Communicator& world, const TrainerHooks& hooks) {
  c.checkpoint.dir = dir;
  Trainer t(c, world, hooks);
  t.resume(dir);
  t.fit();
}

// Rank 0: the newest checkpoints of two runs hold the same step and the same
// bytes in every tensor.
void expect_same_final_state(const std::string& a, const std::string& b, const std::string& what) {
  CheckpointData x = final_state(a), y = final_state(b);
  EXPECT_EQ(x.scalars.at("step"), y.scalars.at("step")) << what;
  ASSERT_EQ(x.tensors.size(), y.tensors.size()) << what;
  for (std::size_t i = 0; i < x.tensors.size(); ++i) {
    EXPECT_EQ(x.tensors[i].first, y.tensors[i].first) << what;
    ASSERT_EQ(x.tensors[i].second.nbytes(), y.tensors[i].second.nbytes()) << what;
    EXPECT_EQ(std::memcmp(x.tensors[i].second.raw(), y.tensors[i].second.raw(), x.tensors[i].second.nbytes()), 0)
        << what << ": tensor " << x.tensors[i].first << " differs after resume";
  }
}

// Runs 2 epochs straight, and 1 epoch + resume + 1 epoch; compares the final
// checkpoints (parameters, optimizer state, step) byte for byte.
void check_resume_is_bitwise(bool deterministic) {
  Communicator world = Communicator::world();
  std::string data = test_fixtures::synthetic_mnist_like(world, "resume", 768, 64);
  TrainConfig c = test_fixtures::small_config(data);
  c.data.batch_size = 16;
  c.train.epochs = 2;
  c.optimizer.name = "adamw";  // optimizer state (two moments + step) must round-trip too
  c.optimizer.lr = 1e-3;
  c.schedule.warmup_epochs = 0.5;
  c.comm.deterministic = deterministic;
  c.comm.bucket_bytes = 256 << 10;
  TrainerHooks hooks;
  hooks.evaluate = false;
  hooks.report = false;

  std::string full = data + "/ckpt-full", cut = data + "/ckpt-cut";
  {
    TrainConfig a = c;
    a.checkpoint.dir = full;
    Trainer t(a, world, hooks);
    t.fit();
  }
  // Stop after the first epoch, as an interrupted job would; then resume in a new trainer.
  const std::int64_t spe = 768 / (16 * world.size());
  {
    TrainConfig b = c;
    b.checkpoint.dir = cut;
    b.train.max_steps = static_cast<int>(spe);
    Trainer t(b, world, hooks);
    t.fit();
  }
  world.barrier();
  resume_and_finish(c, cut, world, hooks);
  world.barrier();
  if (world.rank() == 0) {
    EXPECT_EQ(final_state(full).scalars.at("epochs_done"), 2);
    EXPECT_EQ(final_state(cut).scalars.at("epochs_done"), 2);
    expect_same_final_state(full, cut, "resumed after epoch 1");
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(data);
}

}  // namespace

// Static buckets: the same all-reduces every step, so bit-exact at any rank count.
TEST(Resume, DeterministicBucketsAreBitwiseAtAnyRankCount) { check_resume_is_bitwise(true); }

// Dynamic (Horovod-style) fusion fuses whatever is ready in a cycle, so which
// tensors share a fusion buffer, and hence each element's position in the ring,
// depends on timing. A sum of two values is commutative, so at 1–2 ranks the
// result is still bitwise reproducible; at 3+ ranks it is not, and the engine's
// guarantee is "identical on every rank", not "identical across runs".
TEST(Resume, DynamicFusionIsBitwiseAtUpToTwoRanks) {
  if (Communicator::world().size() > 2) GTEST_SKIP() << "float addition of 3+ partial sums is not associative";
  check_resume_is_bitwise(false);
}

// checkpoint.every_steps: checkpoints at the exact position inside an epoch;
// resuming from the mid-epoch one ends bit for bit where the uninterrupted run
// ended (static buckets, so at any rank count), on the data-parallel path and,
// at an even rank count, at pipeline 2.
TEST(Resume, EveryStepsCheckpointsResumeExactlyFromInsideAnEpoch) {
  Communicator world = Communicator::world();
  std::string data = test_fixtures::synthetic_mnist_like(world, "everysteps", 384, 64);
  std::vector<std::pair<int, const char*>> layouts = {{1, "data"}};
  if (world.size() % 2 == 0) layouts.push_back({2, "pipeline 2"});
  for (auto [pp, what] : layouts) {
    TrainConfig c = test_fixtures::small_config(data);
    c.data.batch_size = 16;  // per replica
    c.train.epochs = 2;
    c.comm.deterministic = pp == 1;
    c.parallel.pipeline = pp;
    c.checkpoint.every_steps = 5;
    c.checkpoint.keep = 100;
    TrainerHooks hooks;
    hooks.evaluate = false;
    hooks.report = false;
    const std::int64_t spe = 384 / (16 * (world.size() / pp));
    const std::string full = data + "/every-" + std::to_string(pp);
    {
      TrainConfig a = c;
      a.checkpoint.dir = full;
      Trainer t(a, world, hooks);
      t.fit();
    }
    world.barrier();
    std::vector<std::int64_t> steps;
    std::string mid;
    if (world.rank() == 0) {
      for (const auto& e : CheckpointDir(full, 1).list()) {
        steps.push_back(e.step);
        if (e.step == 5) mid = e.path;
      }
      std::sort(steps.begin(), steps.end());
      std::vector<std::int64_t> want;
      for (std::int64_t s = 5; s <= 2 * spe; s += 5) want.push_back(s);
      for (std::int64_t e : {spe, 2 * spe})
        if (e % 5) want.push_back(e);
      std::sort(want.begin(), want.end());
      EXPECT_EQ(steps, want) << what << ": a checkpoint every 5 steps and at each epoch's end";
      ASSERT_FALSE(mid.empty());
    }
    // Resume from step 5 (inside epoch 1) in a new directory; finish; compare the final states.
    const std::string cut = data + "/every-cut-" + std::to_string(pp);
    if (world.rank() == 0) {
      fs::create_directories(cut);
      for (const auto& f : checkpoint_files(mid)) fs::copy_file(f, cut + "/" + fs::path(f).filename().string());
    }
    world.barrier();
    resume_and_finish(c, cut, world, hooks);
    world.barrier();
    if (world.rank() == 0) expect_same_final_state(full, cut, std::string(what) + ", resumed from step 5");
    world.barrier();
  }
  if (world.rank() == 0) fs::remove_all(data);
}

// checkpoint.every_s: rank 0's clock decides and the step's all-reduce carries
// the decision, so every rank writes (collectively) after the same steps. With
// a limit far below a step's time, that is after every step, on both paths.
TEST(Resume, EverySecondsCheckpointsAfterTheSameStepsOnEveryRank) {
  Communicator world = Communicator::world();
  std::string data = test_fixtures::synthetic_mnist_like(world, "everys", 256, 64);
  std::vector<int> pipelines = {1};
  if (world.size() % 2 == 0) pipelines.push_back(2);
  for (int pp : pipelines) {
    TrainConfig c = test_fixtures::small_config(data);
    c.data.batch_size = 16;
    c.train.epochs = 1;
    c.parallel.pipeline = pp;
    c.checkpoint.every_s = 1e-9;
    c.checkpoint.keep = 1000;
    c.checkpoint.dir = data + "/every-s-" + std::to_string(pp);
    TrainerHooks hooks;
    hooks.evaluate = false;
    hooks.report = false;
    {
      Trainer t(c, world, hooks);
      t.fit();
    }
    world.barrier();
    if (world.rank() == 0) {
      const std::int64_t spe = 256 / (16 * (world.size() / pp));
      const std::int64_t n = static_cast<std::int64_t>(CheckpointDir(c.checkpoint.dir, 1).list().size());
      EXPECT_EQ(n, spe) << "pipeline " << pp << ": one checkpoint after each of the " << spe << " steps";
    }
    world.barrier();
  }
  if (world.rank() == 0) fs::remove_all(data);
}

TEST(Resume, MissingOrCorruptCheckpointIsAnErrorOnEveryRank) {
  Communicator world = Communicator::world();
  std::string data = test_fixtures::synthetic_mnist_like(world, "badckpt", 256, 64);
  TrainConfig c = test_fixtures::small_config(data);
  c.data.batch_size = 16;
  TrainerHooks hooks;
  hooks.evaluate = false;
  hooks.report = false;
  Trainer t(c, world, hooks);
  try {
    t.resume(data + "/no-such-dir");
    FAIL() << "resume from a missing directory did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-dir"), std::string::npos) << e.what();
  }
  if (world.rank() == 0) {
    fs::create_directories(data + "/bad");
    std::FILE* f = std::fopen((data + "/bad/ckpt-20250101-000000-aaaaaa-s000000001.h5").c_str(), "w");
    std::fputs("not an HDF5 file", f);
    std::fclose(f);
  }
  world.barrier();
  try {
    t.resume(data + "/bad");
    FAIL() << "resume from a corrupt checkpoint did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt-20250101-000000-aaaaaa-s000000001.h5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not a readable HDF5 file"), std::string::npos) << e.what();
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(data);
}
