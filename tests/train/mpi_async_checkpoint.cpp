// checkpoint.async: a checkpoint is a host snapshot taken at a step boundary
// and written by a background thread while training goes on. Checked here:
//  - steps run while a write is in flight (and do not with checkpoint.async = false);
//  - the files hold the state of the step they are named after, byte for byte
//    the synchronous run's, although training changed the live state meanwhile;
//  - a write that fails in the background is an Error on every rank and leaves
//    the previous checkpoint intact, which --resume auto then finds;
//  - a stop signal returns only once its checkpoint is durable.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <thread>

#include "fixtures.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
namespace fs = std::filesystem;

namespace {

TrainConfig config(const std::string& data, const std::string& dir) {
  TrainConfig c = test_fixtures::small_config(data);
  c.data.batch_size = 16;
  c.optimizer.name = "adamw";  // optimizer moments change every step too
  c.optimizer.lr = 1e-3;
  c.comm.deterministic = true;
  c.checkpoint.dir = dir;
  c.checkpoint.every_steps = 2;
  c.checkpoint.keep = 1000;
  c.train.max_steps = 8;
  return c;
}

TrainerHooks quiet() { return test_fixtures::quiet_hooks(); }

// The checkpoint number (1, 2, ...) a write-hook call belongs to: the first
// tensor's name comes back at the start of each file.
struct WriteCounter {
  std::string first;
  int files = 0;
  int on(const std::string& tensor) {
    if (first.empty()) first = tensor;
    if (tensor == first) ++files;
    return files;
  }
};

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Runs config(c) with the first checkpoint's write held until training has
// reached step 4 (or `hold_s` passed). Returns whether the steps went on.
bool run_with_held_write(TrainConfig c, double hold_s) {
  Communicator world = Communicator::world();
  std::atomic<std::int64_t> step{0};
  std::atomic<bool> overlapped{false};
  WriteCounter count;
  TrainerHooks h = quiet();
  h.on_step = [&](std::int64_t s, double) { step = s; };
  h.checkpoint_write_hook = [&](const std::string& tensor) {
    if (count.on(tensor) != 1 || tensor != count.first) return;
    const auto t0 = std::chrono::steady_clock::now();
    while (step < 4 && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < hold_s)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    overlapped = step >= 4;
  };
  Trainer t(c, world, h);
  TrainResult r = t.fit();
  EXPECT_EQ(r.steps, 8);
  int o = overlapped ? 1 : 0;
  world.barrier();
  return o;
}

}  // namespace

TEST(AsyncCheckpoint, TrainingGoesOnWhileTheSnapshotIsWrittenAndTheFilesMatchTheSynchronousOnes) {
  Communicator world = Communicator::world();
  std::string data = test_fixtures::synthetic_mnist_like(world, "async", 1024, 64);
  const std::string async_dir = data + "/async", sync_dir = data + "/sync";
  TrainConfig c = config(data, async_dir);
  c.checkpoint.async = true;
  const bool async_overlaps = run_with_held_write(c, 30.0);
  c.checkpoint.dir = sync_dir;
  c.checkpoint.async = false;
  const bool sync_overlaps = run_with_held_write(c, 0.5);  // the step waits for the write: never reaches 4
  if (world.rank() == 0) {
    EXPECT_TRUE(async_overlaps) << "steps 3 and 4 did not run while the step-2 checkpoint was being written";
    EXPECT_FALSE(sync_overlaps) << "checkpoint.async = false let training run during the write";
    auto a = CheckpointDir(async_dir, 1).list(), s = CheckpointDir(sync_dir, 1).list();
    ASSERT_EQ(a.size(), 4u) << "steps 2, 4, 6, 8";
    ASSERT_EQ(s.size(), 4u);
    for (const auto& name : files_in(async_dir)) EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
    // Same step, same bytes: the snapshot is the state at its step boundary.
    std::sort(a.begin(), a.end(), [](auto& x, auto& y) { return x.step < y.step; });
    std::sort(s.begin(), s.end(), [](auto& x, auto& y) { return x.step < y.step; });
    for (std::size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].step, static_cast<std::int64_t>(2 * (i + 1)));
      CheckpointData x = read_checkpoint(a[i].path), y = read_checkpoint(s[i].path);
      EXPECT_EQ(x.scalars.at("step"), a[i].step);
      ASSERT_EQ(x.tensors.size(), y.tensors.size());
      for (std::size_t k = 0; k < x.tensors.size(); ++k) {
        ASSERT_EQ(x.tensors[k].first, y.tensors[k].first);
        ASSERT_EQ(x.tensors[k].second.nbytes(), y.tensors[k].second.nbytes());
        EXPECT_EQ(std::memcmp(x.tensors[k].second.raw(), y.tensors[k].second.raw(), x.tensors[k].second.nbytes()), 0)
            << "step " << a[i].step << ": tensor " << x.tensors[k].first << " differs from the synchronous write";
      }
    }
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(data);
}

TEST(AsyncCheckpoint, AFailedBackgroundWriteIsAnErrorOnEveryRankAndKeepsThePreviousCheckpoint) {
  Communicator world = Communicator::world();
  std::string data = test_fixtures::synthetic_mnist_like(world, "asyncfail", 1024, 64);
  TrainConfig c = config(data, data + "/ckpt");
  WriteCounter count;
  TrainerHooks h = quiet();
  h.checkpoint_write_hook = [&](const std::string& tensor) {
    if (count.on(tensor) == 2) RT_FAIL("injected write error (disk full) in ", tensor);
  };
  try {
    Trainer t(c, world, h);
    t.fit();
    ADD_FAILURE() << "rank " << world.rank() << ": fit() returned although the step-4 write failed";
  } catch (const Error& e) {
    if (world.rank() == 0) {
      EXPECT_NE(std::string(e.what()).find("injected write error"), std::string::npos) << e.what();
    }
  }
  world.barrier();
  if (world.rank() == 0) {
    for (auto& n : files_in(c.checkpoint.dir))
      EXPECT_EQ(n.find(".tmp."), std::string::npos) << "a failed write left " << n;
    auto ckpts = CheckpointDir(c.checkpoint.dir, 1).list();  // whole files, or committed parallel checkpoints
    ASSERT_EQ(ckpts.size(), 1u) << "only the step-2 checkpoint was written";
    EXPECT_EQ(ckpts[0].step, 2) << ckpts[0].path;
  }
  // A new process (a requeued job) continues from step 2 and finishes the run.
  {
    Trainer t(c, world, quiet());
    ASSERT_TRUE(t.resume("auto"));
    TrainResult r = t.fit();
    EXPECT_EQ(r.steps, 8);
  }
  world.barrier();
  if (world.rank() == 0) {
    FoundCheckpoint f = find_intact_checkpoint(c.checkpoint.dir);
    EXPECT_EQ(f.data.scalars.at("step"), 8);
    EXPECT_EQ(f.data.scalars.at("resumes"), 1);
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(data);
}

TEST(AsyncCheckpoint, AStopReturnsOnlyOnceItsCheckpointIsDurable) {
  Communicator world = Communicator::world();
  std::string data = test_fixtures::synthetic_mnist_like(world, "asyncstop", 1024, 64);
  TrainConfig c = config(data, data + "/ckpt");
  c.checkpoint.every_steps = 0;
  c.train.max_steps = 0;
  std::atomic<std::int64_t> step{0};
  TrainerHooks h = quiet();
  h.on_step = [&](std::int64_t s, double) { step = s; };
  h.stop_signal = [&] { return step >= 3 ? SIGTERM : 0; };
  // A slow disk: the stop's write takes at least half a second.
  h.checkpoint_write_hook = [](const std::string&) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  TrainResult r;
  {
    Trainer t(c, world, h);
    r = t.fit();
    EXPECT_EQ(r.stopped_by_signal, SIGTERM);
    EXPECT_EQ(r.steps, 4);  // the signal seen during step 4 stops after it
    // Checked before the trainer (and its writer thread) is destroyed.
    if (world.rank() == 0) {
      ASSERT_FALSE(r.checkpoint.empty());
      ASSERT_TRUE(fs::exists(r.checkpoint)) << r.checkpoint << " is not on disk when fit() returned";
      CheckpointData d = read_checkpoint(r.checkpoint);
      EXPECT_EQ(d.scalars.at("step"), r.steps);
    }
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(data);
}
