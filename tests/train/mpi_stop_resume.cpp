// Nothing lost: a run stopped in the middle of an epoch — by train.max_steps,
// or by a signal that reached one rank or every rank — and resumed ends with
// the same parameters and optimizer state, bit for bit, as the uninterrupted
// run; metrics.jsonl never counts an epoch twice; runs sharing a directory stay
// apart; `--resume auto` picks up this configuration's checkpoint only.
#include <gtest/gtest.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/train/signals.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
namespace fs = std::filesystem;

namespace {

constexpr std::int64_t kSamples = 768, kBatch = 16;

TrainConfig base_config(const std::string& data) {
  TrainConfig c = test_fixtures::small_config(data);
  c.data.batch_size = kBatch;
  c.train.epochs = 2;
  c.model.dropout = 0.25;  // the dropout masks' position is run state too
  c.optimizer.name = "adamw";
  c.optimizer.lr = 1e-3;
  c.schedule.warmup_epochs = 0.5;
  // Static buckets: bitwise reproducible at any rank count (see mpi_resume.cpp).
  c.comm.deterministic = true;
  c.comm.bucket_bytes = 256 << 10;
  c.log.format = "plain";
  return c;
}

TrainerHooks quiet_hooks() {
  TrainerHooks h;
  h.evaluate = false;
  h.report = true;  // the metrics file is part of what is checked
  return h;
}

std::int64_t steps_per_epoch(const Communicator& w) { return kSamples / (kBatch * w.size()); }

// Compares the newest intact checkpoints of two directories byte for byte.
void expect_same_final_state(const std::string& a, const std::string& b) {
  CheckpointData x = find_intact_checkpoint(a).data, y = find_intact_checkpoint(b).data;
  EXPECT_EQ(x.scalars.at("epochs_done"), 2);
  EXPECT_EQ(y.scalars.at("epochs_done"), 2);
  EXPECT_EQ(x.scalars.at("step"), y.scalars.at("step"));
  ASSERT_EQ(x.tensors.size(), y.tensors.size());
  for (std::size_t i = 0; i < x.tensors.size(); ++i) {
    ASSERT_EQ(x.tensors[i].first, y.tensors[i].first);
    ASSERT_EQ(x.tensors[i].second.nbytes(), y.tensors[i].second.nbytes());
    EXPECT_EQ(std::memcmp(x.tensors[i].second.raw(), y.tensors[i].second.raw(), x.tensors[i].second.nbytes()), 0)
        << "tensor " << x.tensors[i].first << " differs after the stop and resume";
  }
}

// Epoch numbers recorded for each run id in a metrics file.
std::map<std::string, std::vector<int>> epochs_by_run(const std::string& file) {
  std::map<std::string, std::vector<int>> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    EXPECT_TRUE(j.contains("run")) << line;
    EXPECT_TRUE(j.contains("resume")) << line;
    if (j["event"] == "epoch") out[j["run"].get<std::string>()].push_back(j["epoch"].get<int>());
  }
  return out;
}

// The uninterrupted reference, shared by the tests of this binary.
const std::string& reference_dir(const Communicator& world, const std::string& data) {
  static std::string dir;
  if (dir.empty()) {
    dir = data + "/ckpt-full";
    TrainConfig c = base_config(data);
    c.checkpoint.dir = dir;
    Trainer t(c, world, quiet_hooks());
    t.fit();
    world.barrier();
  }
  return dir;
}

class StopResume : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    world_ = new Communicator(Communicator::world());
    data_ = test_fixtures::synthetic_mnist_like(*world_, "stopresume", kSamples, 64);
  }
  static void TearDownTestSuite() {
    world_->barrier();
    if (world_->rank() == 0) fs::remove_all(data_);
    delete world_;
  }
  static Communicator* world_;
  static std::string data_;
};
Communicator* StopResume::world_ = nullptr;
std::string StopResume::data_;

}  // namespace

// train.max_steps in the middle of epoch 2: the checkpoint holds the exact
// position, and the resumed run finishes epoch 2 from there.
TEST_F(StopResume, MaxStepsMidEpochResumesExactly) {
  Communicator& world = *world_;
  const std::string full = reference_dir(world, data_), cut = data_ + "/ckpt-maxsteps";
  const std::int64_t spe = steps_per_epoch(world), stop = spe + spe / 2 + 1;
  {
    TrainConfig c = base_config(data_);
    c.checkpoint.dir = cut;
    c.train.max_steps = static_cast<int>(stop);
    Trainer t(c, world, quiet_hooks());
    TrainResult r = t.fit();
    EXPECT_EQ(r.steps, stop);
    EXPECT_EQ(r.stopped_by_signal, 0);
  }
  world.barrier();
  if (world.rank() == 0) {
    CheckpointData ck = find_intact_checkpoint(cut).data;
    EXPECT_EQ(ck.scalars.at("epochs_done"), 1) << "a mid-epoch stop is not a finished epoch";
    EXPECT_EQ(ck.scalars.at("step_in_epoch"), stop - spe);
  }
  {
    TrainConfig c = base_config(data_);
    c.checkpoint.dir = cut;
    Trainer t(c, world, quiet_hooks());
    EXPECT_TRUE(t.resume(cut));
    EXPECT_EQ(t.fit().steps, 2 * spe);
  }
  world.barrier();
  if (world.rank() == 0) {
    expect_same_final_state(full, cut);
    auto runs = epochs_by_run(cut + "/metrics.jsonl");
    ASSERT_EQ(runs.size(), 1u) << "one run, resumed once";
    EXPECT_EQ(runs.begin()->second, (std::vector<int>{1, 2}));
  }
  world.barrier();
}

// A signal that reaches ONE rank (the last) mid-epoch: every rank stops after
// the same step, the checkpoint is at that exact position, and resuming gives
// the uninterrupted run's state bit for bit. Then the same with every rank
// signalled, in the first epoch.
TEST_F(StopResume, SignalOnOneRankOrAllStopsEveryRankAndResumesExactly) {
  Communicator& world = *world_;
  StopSignals::install();
  const std::string full = reference_dir(world, data_);
  const std::int64_t spe = steps_per_epoch(world);
  struct Case {
    const char* dir;
    bool one_rank;
    std::int64_t at;  // the step after which the signal arrives
  };
  for (Case k : {Case{"ckpt-sig-one", true, spe + 2}, Case{"ckpt-sig-all", false, 3}}) {
    const std::string cut = data_ + "/" + k.dir;
    StopSignals::clear();
    TrainResult r;
    {
      TrainConfig c = base_config(data_);
      c.checkpoint.dir = cut;
      TrainerHooks h = quiet_hooks();
      h.stop_signal = &StopSignals::pending;
      h.on_step = [&](std::int64_t step, double) {
        if (step == k.at && (!k.one_rank || world.rank() == world.size() - 1)) std::raise(SIGUSR1);
      };
      Trainer t(c, world, h);
      r = t.fit();
    }
    // The flag is read by the next step, whose end all ranks agree on.
    EXPECT_NE(r.stopped_by_signal, 0) << k.dir;
    EXPECT_EQ(r.steps, k.at + 1) << k.dir << ": every rank stops after the same step";
    EXPECT_FALSE(world.rank() == 0 && r.checkpoint.empty()) << "rank 0 wrote the checkpoint";
    StopSignals::clear();
    world.barrier();
    if (world.rank() == 0) {
      CheckpointData ck = find_intact_checkpoint(cut).data;
      EXPECT_EQ(ck.scalars.at("step"), k.at + 1) << k.dir;
      EXPECT_EQ(ck.scalars.at("epochs_done") * spe + ck.scalars.at("step_in_epoch"), k.at + 1) << k.dir;
    }
    {
      TrainConfig c = base_config(data_);
      c.checkpoint.dir = cut;
      Trainer t(c, world, quiet_hooks());
      EXPECT_TRUE(t.resume("auto")) << "--resume auto finds this configuration's checkpoint";
      TrainResult r2 = t.fit();
      EXPECT_EQ(r2.steps, 2 * spe);
      EXPECT_EQ(r2.stopped_by_signal, 0);
    }
    world.barrier();
    if (world.rank() == 0) {
      expect_same_final_state(full, cut);
      auto runs = epochs_by_run(cut + "/metrics.jsonl");
      ASSERT_EQ(runs.size(), 1u);
      EXPECT_EQ(runs.begin()->second, (std::vector<int>{1, 2})) << k.dir << ": each epoch exactly once";
    }
    world.barrier();
  }
}

// metrics.jsonl of a run resumed from an older checkpoint (the newest was lost)
// drops the epoch records it will write again.
TEST_F(StopResume, ResumeFromAnOlderCheckpointTruncatesMetrics) {
  Communicator& world = *world_;
  const std::string dir = data_ + "/ckpt-trunc";
  TrainConfig c = base_config(data_);
  c.checkpoint.dir = dir;
  c.checkpoint.keep = 5;
  {
    Trainer t(c, world, quiet_hooks());
    t.fit();
  }
  world.barrier();
  if (world.rank() == 0) {
    // Lose the newest checkpoint (epoch 2): the run continues from epoch 1.
    fs::remove(CheckpointDir(dir, 1).latest());
  }
  world.barrier();
  {
    Trainer t(c, world, quiet_hooks());
    EXPECT_TRUE(t.resume(dir));
    t.fit();
  }
  world.barrier();
  if (world.rank() == 0) {
    auto runs = epochs_by_run(dir + "/metrics.jsonl");
    ASSERT_EQ(runs.size(), 1u);
    EXPECT_EQ(runs.begin()->second, (std::vector<int>{1, 2}));
  }
  world.barrier();
}

// A fresh run into a directory holding another run's checkpoints: neither
// deletes nor is shadowed by the other; --resume auto with another
// configuration starts fresh, with this one resumes.
TEST_F(StopResume, RunsSharingADirectoryStayApart) {
  Communicator& world = *world_;
  const std::string dir = data_ + "/ckpt-shared";
  TrainConfig a = base_config(data_);
  a.checkpoint.dir = dir;
  a.checkpoint.keep = 1;
  a.train.epochs = 1;
  std::string run_a, run_b;
  {
    Trainer t(a, world, quiet_hooks());
    t.fit();
    run_a = t.run_id();
  }
  TrainConfig b = a;
  b.optimizer.lr = 2e-3;  // another configuration
  b.train.epochs = 2;
  {
    Trainer t(b, world, quiet_hooks());
    EXPECT_FALSE(t.resume("auto")) << "run A's checkpoint is of another configuration";
    t.fit();
    run_b = t.run_id();
  }
  world.barrier();
  EXPECT_NE(run_a, run_b);
  if (world.rank() == 0) {
    int files_a = 0, files_b = 0;
    for (auto& e : CheckpointDir(dir, 1).list()) (e.run_id == run_a ? files_a : files_b) += e.run_id == run_a || e.run_id == run_b;
    EXPECT_EQ(files_a, 1) << "run B's rotation (keep = 1) must not delete run A's checkpoint";
    EXPECT_EQ(files_b, 1);
    // The newest checkpoint is run B's: eval and --resume DIR use it, not A's.
    EXPECT_EQ(find_intact_checkpoint(dir).data.strings.at("run_id"), run_b);
  }
  {
    Trainer t(a, world, quiet_hooks());
    EXPECT_TRUE(t.resume("auto")) << "run A's configuration finds run A's checkpoint";
    EXPECT_EQ(t.run_id(), run_a);
  }
  world.barrier();
}
