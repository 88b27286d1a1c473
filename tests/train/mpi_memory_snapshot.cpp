// In-memory snapshots with a buddy (checkpoint.memory_every_steps, issue 46
// item 1), every rank its own emulated node (checkpoint.memory_node_ranks = 1,
// each with its own directory under /dev/shm). An `mlp` + AdamW run with
// comm.deterministic is cut at step kCut with a snapshot every step; its disk
// checkpoint of that step is deleted (the write in flight lost with the node),
// and so is one emulated node's directory. Then `--resume auto`:
//  (a) at the same rank count continues from step kCut, and its final
//      parameters and optimizer state are bitwise those of the uninterrupted run;
//  (b) at one rank fewer reshards, its losses following the uninterrupted
//      run's (sums in another order: within 1e-5 relative, as the disk resume
//      of mpi_elastic_resume.cpp);
//  (c) a corrupt newest snapshot (part 0's two copies: one truncated, one with
//      a flipped byte) is skipped with a warning naming the file, and the run
//      continues from the previous step, bitwise;
//  (d) a part lost on its owner and its buddy: the resume says which part and
//      falls back to the newest disk checkpoint.
// Every test removes its /dev/shm directory.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "fixtures.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
namespace fs = std::filesystem;

namespace {

constexpr int kCut = 12, kSteps = 20;  // 8 steps per epoch: the cut is inside epoch 2

TrainerHooks quiet(std::vector<double>* losses = nullptr) {
  TrainerHooks h;
  h.report = false;
  h.evaluate = false;
  if (losses) h.on_step = [losses](std::int64_t, double l) { losses->push_back(l); };
  return h;
}

class MemorySnapshot : public test_fixtures::SyntheticDataTest {
 protected:
  MemorySnapshot() : SyntheticDataTest("memsnap", 384, 32) {}

  void SetUp() override {
    SyntheticDataTest::SetUp();
    shm_ = "/dev/shm/" + fs::path(data_).filename().string();  // rt-memsnap-<pid>: one per test process
  }
  void TearDown() override {
    world_.barrier();
    if (world_.rank() == 0) fs::remove_all(shm_);
    SyntheticDataTest::TearDown();
  }

  Communicator first(int n) const { return world_.split(world_.rank() < n ? 0 : 1, world_.rank(), "first"); }

  TrainConfig config(const std::string& dir, int memory_every) const {
    TrainConfig c = test_fixtures::small_config(data_);
    c.model.name = "mlp";
    c.data.global_batch = 48;  // splits at 1 to 4 ranks
    c.train.epochs = 3;
    c.train.max_steps = kSteps;
    c.optimizer.name = "adamw";
    c.optimizer.lr = 1e-3;
    c.comm.deterministic = true;
    c.checkpoint.dir = dir;
    c.checkpoint.keep = 100;
    c.checkpoint.every_epochs = 100;  // disk checkpoints only where a test asks
    c.checkpoint.memory_every_steps = memory_every;
    c.checkpoint.memory_dir = shm_;
    c.checkpoint.memory_node_ranks = 1;
    return c;
  }

  // The uninterrupted run's losses and final checkpoint; the cut run (snapshots
  // every step, disk checkpoints every `disk_every` steps) stopped at kCut with
  // its disk checkpoint of that step deleted.
  void full_and_cut(const std::string& name, int disk_every = 0) {
    full_dir_ = data_ + "/" + name + "-full";
    dir_ = data_ + "/" + name;
    Trainer(config(full_dir_, 0), world_, quiet(&full_)).fit();
    TrainConfig c = config(dir_, 1);
    c.train.max_steps = kCut;
    c.checkpoint.every_steps = disk_every;
    std::vector<double> cut;
    const TrainResult r = Trainer(c, world_, quiet(&cut)).fit();
    EXPECT_EQ(r.memory_stalls_s.size(), std::size_t(kCut)) << "a snapshot after every step";
    EXPECT_GT(r.memory_bytes, 0u);
    world_.barrier();
    if (world_.rank() == 0)
      for (const auto& e : CheckpointDir(dir_, 1).list())
        if (e.step == kCut)
          for (const auto& f : checkpoint_files(e.path)) fs::remove(f);
    world_.barrier();
  }

  // The snapshot files of part `part` at `step` (-1: any), in every node's directory.
  std::vector<std::string> files_of(int part, std::int64_t step) const {
    std::vector<std::string> out;
    char tail[64];
    std::snprintf(tail, sizeof tail, ".part-%05d-of-%05d.h5", part, world_.size());
    char s[32];
    std::snprintf(s, sizeof s, "-s%09lld.", static_cast<long long>(step));
    for (const auto& node : fs::directory_iterator(shm_))
      for (const auto& e : fs::directory_iterator(node.path())) {
        const std::string n = e.path().filename().string();
        if (n.size() > std::strlen(tail) && n.compare(n.size() - std::strlen(tail), std::string::npos, tail) == 0 &&
            (step < 0 || n.find(s) != std::string::npos))
          out.push_back(e.path().string());
      }
    return out;
  }

  // Resumes on the first `ranks` ranks; returns the step it continued from (-1: none), the losses in `rest`.
  std::int64_t resume(int ranks, std::vector<double>& rest, std::string* log = nullptr) {
    const Communicator b = first(ranks);
    std::int64_t from = -1;
    if (world_.rank() < ranks) {
      testing::internal::CaptureStderr();
      Trainer t(config(dir_, 1), b, quiet(&rest));
      const bool found = t.resume("auto");
      const std::string err = testing::internal::GetCapturedStderr();
      if (log) *log = err;
      std::fputs(err.c_str(), stderr);
      if (found) {
        from = t.loaded().step;
        t.fit();
      }
    }
    broadcast(&from, 1, DType::i64, 0, world_);
    return from;
  }

  // Final parameters and optimizer state, bitwise those of the uninterrupted run.
  void expect_bitwise_final() const {
    if (world_.rank() != 0) return;
    const CheckpointData a = find_intact_checkpoint(dir_).data, b = find_intact_checkpoint(full_dir_).data;
    EXPECT_EQ(a.scalars.at("step"), kSteps);
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (std::size_t i = 0; i < a.tensors.size(); ++i) {
      const Tensor &x = a.tensors[i].second, &y = b.tensors[i].second;
      ASSERT_EQ(a.tensors[i].first, b.tensors[i].first);
      ASSERT_EQ(x.nbytes(), y.nbytes());
      EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << a.tensors[i].first << " differs";
    }
  }

  void expect_losses_follow(const std::vector<double>& rest, std::int64_t from, double rel) const {
    if (world_.rank() != 0) return;
    ASSERT_EQ(rest.size(), std::size_t(kSteps - from));
    for (std::size_t i = 0; i < rest.size(); ++i)
      EXPECT_NEAR(rest[i], full_[from + i], rel * std::abs(full_[from + i])) << "step " << from + i;
  }

  std::string shm_, dir_, full_dir_;
  std::vector<double> full_;
};

// (a) One emulated node's memory lost: its parts come from the buddies; bitwise.
TEST_F(MemorySnapshot, NodeLostResumesFromBuddyBitwise) {
  if (world_.size() < 2) GTEST_SKIP() << "a buddy needs 2 ranks";
  full_and_cut("node-lost");
  world_.barrier();
  if (world_.rank() == 0) {
    ASSERT_TRUE(fs::exists(shm_ + "/node-e1"));
    fs::remove_all(shm_ + "/node-e1");  // node 1 (rank 1) and its /dev/shm are gone
  }
  world_.barrier();
  std::vector<double> rest;
  std::string log;
  const std::int64_t from = resume(world_.size(), rest, &log);
  EXPECT_EQ(from, kCut) << "no work lost: the snapshot of the last step";
  if (world_.rank() == 0) {
    EXPECT_NE(log.find("source memory, step 12"), std::string::npos) << log;
  }
  expect_losses_follow(rest, kCut, 0);  // same layout: bitwise
  expect_bitwise_final();
}

// (b) The same loss, continued at one rank fewer: resharded from memory.
TEST_F(MemorySnapshot, NodeLostReshardsToFewerRanks) {
  if (world_.size() < 2) GTEST_SKIP() << "2 ranks, then 1";
  full_and_cut("reshard");
  world_.barrier();
  if (world_.rank() == 0) fs::remove_all(shm_ + "/node-e" + std::to_string(world_.size() - 1));
  world_.barrier();
  std::vector<double> rest;
  const std::int64_t from = resume(world_.size() - 1, rest);
  EXPECT_EQ(from, kCut);
  // Another data-parallel size sums in another order: 1e-5 relative, as mpi_elastic_resume.cpp
  // (the differences measured there are ~1e-7).
  expect_losses_follow(rest, kCut, 1e-5);
}

// (c) Both copies of part 0 at the newest step damaged: skipped by name, the previous step used.
TEST_F(MemorySnapshot, CorruptSnapshotFallsBackToThePrevious) {
  if (world_.size() < 2) GTEST_SKIP() << "a buddy needs 2 ranks";
  full_and_cut("corrupt");
  world_.barrier();
  std::vector<std::string> bad;
  if (world_.rank() == 0) {
    bad = files_of(0, kCut);
    ASSERT_EQ(bad.size(), 2u) << "part 0 is kept by its owner and its buddy";
    fs::resize_file(bad[0], fs::file_size(bad[0]) / 2);  // a partial file
    std::fstream f(bad[1], std::ios::in | std::ios::out | std::ios::binary);
    // The middle of the file: tensor data (parameters and AdamW's moments are
    // almost all of its 1.4 MB), which its CRC-32 catches.
    const std::streamoff mid = static_cast<std::streamoff>(fs::file_size(bad[1]) / 2);
    char c = 0;
    f.seekg(mid);
    f.read(&c, 1);
    f.seekp(mid);
    c = static_cast<char>(c ^ 0x5a);
    f.write(&c, 1);
  }
  world_.barrier();
  std::vector<double> rest;
  std::string log;
  const std::int64_t from = resume(world_.size(), rest, &log);
  EXPECT_EQ(from, kCut - 1) << "the previous snapshot";
  // The warnings come from the ranks that verified the files: count them over every rank.
  int named = 0;
  std::vector<char> names(2 * 512, 0);
  if (world_.rank() == 0)
    for (int k = 0; k < 2; ++k) std::snprintf(&names[512 * static_cast<std::size_t>(k)], 512, "%s", bad[k].c_str());
  broadcast(names.data(), names.size(), DType::u8, 0, world_);
  for (int k = 0; k < 2; ++k)
    named += log.find(cat("memory snapshot '", &names[512 * static_cast<std::size_t>(k)], "' skipped")) !=
             std::string::npos;
  allreduce(&named, &named, 1, DType::i32, ReduceOp::sum, world_);
  EXPECT_EQ(named, 2) << "each damaged file named in a warning";
  expect_losses_follow(rest, kCut - 1, 0);
  expect_bitwise_final();
}

// (d) Part 1 lost on its owner and its buddy: named, and the disk checkpoint (step 8) is used.
TEST_F(MemorySnapshot, PartLostTwiceFallsBackToDisk) {
  if (world_.size() < 2) GTEST_SKIP() << "a buddy needs 2 ranks";
  full_and_cut("lost-twice", 4);  // disk checkpoints at steps 4, 8 (and 12, deleted)
  world_.barrier();
  if (world_.rank() == 0) {
    const std::vector<std::string> gone = files_of(1, -1);
    EXPECT_EQ(gone.size(), 4u) << "two steps, two copies";
    for (const auto& f : gone) fs::remove(f);
  }
  world_.barrier();
  std::vector<double> rest;
  std::string log;
  const std::int64_t from = resume(world_.size(), rest, &log);
  EXPECT_EQ(from, 8) << "the newest disk checkpoint";
  if (world_.rank() == 0) {
    EXPECT_NE(log.find("memory snapshot at step 12"), std::string::npos) << log;
    EXPECT_NE(log.find("part 1 (rank 1's shard)"), std::string::npos) << log;
    EXPECT_NE(log.find("source disk"), std::string::npos) << log;
  }
  expect_losses_follow(rest, 8, 0);
  expect_bitwise_final();
}

}  // namespace
