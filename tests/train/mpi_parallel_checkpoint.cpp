// checkpoint.parallel: every rank writes its share of the state to its own
// part file, and rank 0 commits them with a manifest. Checked here, at every
// layout the rank count allows (data, pipeline 2, tensor 2, pipeline 2 x
// tensor 2, with and without ZeRO-1), synchronous and asynchronous:
//  - the parts assemble to the bytes of the one file that rank 0 writes with
//    checkpoint.parallel = false in a run of the same settings (the reference),
//    every element written by exactly one rank, and no rank writes the whole
//    state (data parallelism: each an equal share);
//  - with checkpoint.async the manifest is committed a few steps after the
//    snapshot, long before the next checkpoint: lost work stays bounded by
//    the interval;
//  - a missing, foreign or corrupt part makes its checkpoint unusable with an
//    error naming the file, and --resume auto falls back to the previous one;
//    a part file alone is refused, naming its manifest;
//  - a rank whose part write fails ends the run on every rank naming it and
//    leaves no manifest; the next run removes the orphaned parts and resumes
//    from the previous checkpoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "fixtures.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
namespace fs = std::filesystem;

namespace {

struct Layout {
  int pipeline, tensor;
  int zero;  // parallel.zero
};

std::vector<Layout> layouts(int w) {
  std::vector<Layout> v = {{1, 1, 0}};
  if (w > 1)
    for (Layout l : {Layout{1, 1, 1}, Layout{1, 1, 2}, Layout{1, 1, 3}}) v.push_back(l);
  if (w % 2 == 0)
    for (Layout l : {Layout{2, 1, 0}, Layout{1, 2, 0}}) v.push_back(l);
  if (w == 4)
    for (Layout l : {Layout{2, 1, 1}, Layout{1, 2, 2}, Layout{2, 1, 3}, Layout{2, 2, 0}}) v.push_back(l);
  return v;
}

std::string name_of(const Layout& l, int w) {
  return cat("data ", w / (l.pipeline * l.tensor), " x pipeline ", l.pipeline, " x tensor ", l.tensor,
             l.zero ? cat(" with ZeRO-", l.zero) : "");
}

TrainConfig config(const std::string& data, const std::string& dir, const Layout& l) {
  TrainConfig c = test_fixtures::small_config(data);
  c.data.global_batch = 24;
  c.optimizer.name = "adamw";  // two moments per parameter: ZeRO-1 slices them
  c.optimizer.lr = 1e-3;
  c.parallel.pipeline = l.pipeline;
  c.parallel.tensor = l.tensor;
  c.parallel.zero = l.zero;
  c.comm.deterministic = !l.zero;  // two runs, the same bytes (ZeRO's own collectives run in a fixed order)
  c.checkpoint.dir = dir;
  c.checkpoint.every_steps = 3;
  c.checkpoint.keep = 100;
  c.train.max_steps = 6;
  return c;
}

TrainerHooks quiet() { return test_fixtures::quiet_hooks(); }

std::map<std::string, Tensor> by_name(const CheckpointData& d) {
  std::map<std::string, Tensor> m;
  for (const auto& [n, t] : d.tensors) m.emplace(n, t);
  return m;
}

std::vector<std::string> names_in(const std::string& dir, const std::string& needle) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(needle) != std::string::npos) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<CheckpointDir::Entry> by_step(const std::string& dir) {
  auto v = CheckpointDir(dir, 1).list();
  std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.step < b.step; });
  return v;
}

}  // namespace

TEST(ParallelCheckpoint, PartsAssembleToTheOneFileOfRankZeroAtEveryLayout) {
  Communicator world = Communicator::world();
  const int w = world.size();
  if (w == 1) GTEST_SKIP() << "one rank writes one file either way: there are no parts to compare with it";
  std::string data = test_fixtures::synthetic_mnist_like(world, "pckpt", 512, 64);
  for (const Layout& l : layouts(w)) {
    for (bool async : {false, true}) {
      SCOPED_TRACE(cat(name_of(l, w), async ? ", async" : ", sync"));
      const std::string pdir = data + "/parts", odir = data + "/one";
      TrainConfig c = config(data, pdir, l);
      c.checkpoint.async = async;
      { Trainer(c, world, quiet()).fit(); }
      c.checkpoint.dir = odir;
      c.checkpoint.parallel = false;
      { Trainer(c, world, quiet()).fit(); }
      if (world.rank() == 0) {
        auto parts = by_step(pdir), one = by_step(odir);
        ASSERT_EQ(parts.size(), 2u) << "steps 3 and 6";
        ASSERT_EQ(one.size(), 2u);
        EXPECT_EQ(names_in(odir, ".part-").size(), 0u) << "checkpoint.parallel = false wrote parts";
        EXPECT_EQ(names_in(pdir, ".tmp.").size(), 0u);
        for (std::size_t i = 0; i < parts.size(); ++i) {
          const CheckpointData m = read_checkpoint_file(parts[i].path);
          ASSERT_EQ(m.parts.size(), static_cast<std::size_t>(w)) << parts[i].path;
          // Every rank's part: its pieces, none of them the whole state.
          std::size_t piece_bytes = 0, largest = 0, smallest = SIZE_MAX;
          for (const auto& p : m.parts) {
            const CheckpointData d = read_checkpoint_file(pdir + "/" + p);
            std::size_t b = 0;
            for (const auto& [n, t] : d.tensors) b += t.nbytes();
            piece_bytes += b;
            largest = std::max(largest, b);
            smallest = std::min(smallest, b);
          }
          const CheckpointData a = read_checkpoint(parts[i].path), r = read_checkpoint(one[i].path);
          EXPECT_EQ(a.scalars, r.scalars);
          EXPECT_EQ(a.strings.at("run_identity"), r.strings.at("run_identity"));  // run ids and dirs differ
          auto am = by_name(a), rm = by_name(r);
          ASSERT_EQ(am.size(), rm.size());
          std::size_t whole_bytes = 0, differ = 0;
          for (const auto& [n, t] : rm) {
            auto it = am.find(n);
            ASSERT_NE(it, am.end()) << "the parts lack " << n;
            ASSERT_EQ(it->second.dtype(), t.dtype()) << n;
            ASSERT_EQ(it->second.shape(), t.shape()) << n;
            whole_bytes += t.nbytes();
            if (std::memcmp(it->second.raw(), t.raw(), t.nbytes()) != 0) {
              ++differ;
              ADD_FAILURE() << "step " << parts[i].step << ": " << n << " differs from rank 0's one file";
            }
          }
          EXPECT_EQ(differ, 0u);
          EXPECT_EQ(piece_bytes, whole_bytes) << "every element is written once";
          EXPECT_LT(largest, whole_bytes) << "one rank wrote the whole state";
          if (l.pipeline == 1 && l.tensor == 1) {  // data parallelism: equal shares, up to ZeRO-1's 64-byte slice edges
            EXPECT_LE(largest - smallest, whole_bytes / 50 + 1024) << "largest " << largest << ", smallest " << smallest;
          }
        }
      }
      world.barrier();
      if (world.rank() == 0) {
        fs::remove_all(pdir);
        fs::remove_all(odir);
      }
      world.barrier();
    }
  }
  if (world.rank() == 0) fs::remove_all(data);
}

TEST(ParallelCheckpoint, TheManifestFollowsTheSnapshotWithinAFewSteps) {
  Communicator world = Communicator::world();
  if (world.size() == 1) GTEST_SKIP() << "one rank writes one file";
  std::string data = test_fixtures::synthetic_mnist_like(world, "pckpt-commit", 512, 64);
  TrainConfig c = config(data, data + "/ckpt", {1, 1, false});
  c.checkpoint.every_steps = 4;
  c.train.max_steps = 12;
  c.checkpoint.async = true;
  // Step 4's checkpoint: its manifest must be on disk by step 7 (its parts are small: the
  // commit rides the step after the last part is durable), before step 8's checkpoint.
  std::int64_t committed_by = -1;
  TrainerHooks h = quiet();
  // Steps of 100 ms, as a real model's: the small parts' writes end within one.
  h.in_step = [](std::int64_t) { std::this_thread::sleep_for(std::chrono::milliseconds(100)); };
  h.on_step = [&](std::int64_t s, double) {
    if (committed_by < 0 && s > 4 && world.rank() == 0 && !CheckpointDir(c.checkpoint.dir, 1).list().empty())
      committed_by = s;
  };
  { Trainer(c, world, h).fit(); }
  if (world.rank() == 0) {
    EXPECT_GE(committed_by, 5);
    EXPECT_LE(committed_by, 7) << "the manifest of step 4 was not committed before step 8";
    EXPECT_EQ(by_step(c.checkpoint.dir).size(), 3u);
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(data);
}

TEST(ParallelCheckpoint, AMissingForeignOrCorruptPartIsNamedAndTheNewestIntactOneIsUsed) {
  Communicator world = Communicator::world();
  if (world.size() == 1) GTEST_SKIP() << "one rank writes one file";
  std::string data = test_fixtures::synthetic_mnist_like(world, "pckpt-bad", 512, 64);
  TrainConfig c = config(data, data + "/ckpt", {1, 1, false});
  { Trainer(c, world, quiet()).fit(); }
  if (world.rank() == 0) {
    auto e = by_step(c.checkpoint.dir);
    ASSERT_EQ(e.size(), 2u);
    const CheckpointData m3 = read_checkpoint_file(e[0].path), m6 = read_checkpoint_file(e[1].path);
    const std::string dir = c.checkpoint.dir + "/";
    auto error_of = [](const std::string& p) {
      try {
        read_checkpoint(p);
      } catch (const Error& err) {
        return std::string(err.what());
      }
      return std::string("no error");
    };
    // A part alone.
    std::string msg = error_of(dir + m6.parts[1]);
    EXPECT_NE(msg.find("part of the parallel checkpoint"), std::string::npos) << msg;
    EXPECT_NE(msg.find(fs::path(e[1].path).filename().string()), std::string::npos) << msg;
    // Step 3's part 1 under step 6's name: another checkpoint's.
    fs::copy_file(dir + m6.parts[1], dir + "keep.h5");
    fs::copy_file(dir + m3.parts[1], dir + m6.parts[1], fs::copy_options::overwrite_existing);
    msg = error_of(e[1].path);
    EXPECT_NE(msg.find("belongs to"), std::string::npos) << msg;
    EXPECT_NE(msg.find(m6.parts[1]), std::string::npos) << msg;
    // A flipped byte in the largest piece's data: its checksum.
    fs::copy_file(dir + "keep.h5", dir + m6.parts[1], fs::copy_options::overwrite_existing);
    const CheckpointData p1 = read_checkpoint_file(dir + m6.parts[1]);
    ASSERT_FALSE(p1.tensors.empty());
    {
      const Tensor& t = std::max_element(p1.tensors.begin(), p1.tensors.end(), [](auto& a, auto& b) {
                          return a.second.nbytes() < b.second.nbytes();
                        })->second;
      ASSERT_GE(t.nbytes(), 1024u);
      std::ifstream in(dir + m6.parts[1], std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(in)), {});
      auto at = bytes.find(std::string(static_cast<const char*>(t.raw()) + t.nbytes() / 2, 64));
      ASSERT_NE(at, std::string::npos);
      bytes[at] ^= 0x5a;
      std::ofstream(dir + m6.parts[1], std::ios::binary) << bytes;
    }
    msg = error_of(e[1].path);
    EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
    // Missing.
    fs::remove(dir + m6.parts[1]);
    msg = error_of(e[1].path);
    EXPECT_NE(msg.find("is missing"), std::string::npos) << msg;
    EXPECT_NE(msg.find(m6.parts[1]), std::string::npos) << msg;
    FoundCheckpoint f = find_intact_checkpoint(c.checkpoint.dir);
    EXPECT_EQ(f.data.scalars.at("step"), 3);
    ASSERT_EQ(f.skipped.size(), 1u);
    EXPECT_NE(f.skipped[0].find(m6.parts[1]), std::string::npos) << f.skipped[0];
    fs::remove(dir + "keep.h5");
  }
  // --resume auto continues at step 3 on every rank.
  {
    Trainer t(c, world, quiet());
    ASSERT_TRUE(t.resume("auto"));
    EXPECT_EQ(t.fit().steps, 6);
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(data);
}

TEST(ParallelCheckpoint, AFailedPartEndsTheRunOnEveryRankWithoutAManifest) {
  Communicator world = Communicator::world();
  if (world.size() == 1) GTEST_SKIP() << "one rank writes one file";
  std::string data = test_fixtures::synthetic_mnist_like(world, "pckpt-fail", 512, 64);
  const int failing = world.size() - 1;
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    TrainConfig c = config(data, data + "/ckpt", {1, 1, false});
    c.checkpoint.async = async;
    int parts_written = 0;
    TrainerHooks h = quiet();
    std::string first;
    h.checkpoint_write_hook = [&](const std::string& tensor) {
      if (first.empty()) first = tensor;
      if (tensor == first) ++parts_written;
      if (parts_written == 2 && world.rank() == failing) RT_FAIL("injected write error (disk full) in ", tensor);
    };
    try {
      Trainer(c, world, h).fit();
      ADD_FAILURE() << "rank " << world.rank() << ": fit() returned although rank " << failing << "'s part failed";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("injected write error"), std::string::npos) << msg;
      EXPECT_NE(msg.find(cat("rank ", failing)), std::string::npos) << msg;
    }
    world.barrier();
    if (world.rank() == 0) {
      auto e = by_step(c.checkpoint.dir);
      ASSERT_EQ(e.size(), 1u) << "only step 3 was committed";
      EXPECT_EQ(e[0].step, 3);
      EXPECT_GE(names_in(c.checkpoint.dir, "-s000000006.part-").size(), 1u) << "the other ranks' parts of step 6";
    }
    world.barrier();
    {
      // Resumed to step 5: the orphaned parts of step 6 went at its start.
      TrainConfig r = c;
      r.train.max_steps = 5;
      Trainer t(r, world, quiet());
      ASSERT_TRUE(t.resume("auto"));
      EXPECT_EQ(t.fit().steps, 5);
    }
    world.barrier();
    if (world.rank() == 0) {
      auto e = by_step(c.checkpoint.dir);
      ASSERT_EQ(e.size(), 2u);
      EXPECT_EQ(e[1].step, 5);
      EXPECT_EQ(names_in(c.checkpoint.dir, "-s000000006.part-").size(), 0u) << "orphaned parts of step 6 are left";
      EXPECT_EQ(names_in(c.checkpoint.dir, "-s000000005.part-").size(), static_cast<std::size_t>(world.size()));
      EXPECT_EQ(read_checkpoint(e[1].path).scalars.at("resumes"), 1);
      fs::remove_all(c.checkpoint.dir);
    }
    world.barrier();
  }
  if (world.rank() == 0) fs::remove_all(data);
}
