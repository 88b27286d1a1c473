// One checkpoint format for both trainers and every layout. At 4 ranks, an
// `mlp` + AdamW run saved mid-epoch at tensor 2 x pipeline 2 (the grid path)
// loads at data 4 (the data-parallel path), tensor 1 x pipeline 4, tensor 4 and
// 1 rank, and a data-parallel checkpoint loads at tensor 2 x data 2 and tensor
// 2 x pipeline 2: the checkpoint each loaded run writes after 0 further steps
// holds every parameter and optimizer tensor bitwise equal to the saved one,
// and its next step's loss is the saved run's next loss (1e-5 relative: every
// rank's restored part enters it).
// The grid path resumes bitwise (losses and final state of an uninterrupted
// run); checkpoints of another model or another global batch are errors naming
// the tensor or key, on every rank.
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

TrainerHooks quiet(std::vector<double>* losses = nullptr) {
  TrainerHooks h;
  h.report = false;
  h.evaluate = false;
  if (losses) h.on_step = [losses](std::int64_t, double l) { losses->push_back(l); };
  return h;
}

TrainConfig mlp_config(const std::string& data) {
  TrainConfig c = test_fixtures::small_config(data);
  c.model.name = "mlp";
  c.data.batch_size = 16;
  c.train.epochs = 2;
  c.optimizer.name = "adamw";  // two moments and a step counter per parameter
  c.optimizer.lr = 1e-3;
  return c;
}

TrainConfig at(TrainConfig c, int pipeline, int tensor, int batch, const std::string& dir) {
  c.parallel.pipeline = pipeline;
  c.parallel.tensor = tensor;
  c.data.batch_size = batch;
  c.checkpoint.dir = dir;
  return c;
}

// Loads `from` into a trainer of `c` (on `comm`), writes its state at once
// (`path`: the file, on rank 0), then trains up to c.train.max_steps: returns
// the losses (every rank's restored state enters them).
std::vector<double> load_resave_train(const TrainConfig& c, const Communicator& comm, const std::string& from,
                                      std::string& path) {
  std::vector<double> losses;
  Trainer t(c, comm, quiet(&losses));
  EXPECT_TRUE(t.resume(from));
  path = t.save_checkpoint();
  t.fit();
  return losses;
}

// The losses of `c` run from scratch for c.train.max_steps steps.
std::vector<double> losses_of(const TrainConfig& c, const Communicator& comm) {
  std::vector<double> losses;
  Trainer t(c, comm, quiet(&losses));
  t.fit();
  return losses;
}

// Every param/, buffer/ and optim/ tensor of `got` is bitwise the one in `want`, and no other.
void expect_same_state(const CheckpointData& want, const CheckpointData& got, const std::string& what) {
  auto state = [](const CheckpointData& d) {
    std::map<std::string, Tensor> m;
    for (auto& [n, t] : d.tensors)
      if (n.rfind("param/", 0) == 0 || n.rfind("buffer/", 0) == 0 || n.rfind("optim/", 0) == 0) m[n] = t;
    return m;
  };
  const auto w = state(want), g = state(got);
  ASSERT_EQ(w.size(), g.size()) << what;
  int optim = 0;
  for (auto& [name, t] : w) {
    auto it = g.find(name);
    ASSERT_NE(it, g.end()) << what << ": " << name << " missing";
    ASSERT_EQ(t.dtype(), it->second.dtype()) << what << ": " << name;
    ASSERT_EQ(t.shape(), it->second.shape()) << what << ": " << name;
    EXPECT_EQ(std::memcmp(t.raw(), it->second.raw(), t.nbytes()), 0) << what << ": " << name << " differs";
    optim += name.rfind("optim/exp_avg", 0) == 0;
  }
  EXPECT_GE(optim, 6) << what << ": both AdamW moments of fc1..fc3 must be in the state";
  for (const char* k : {"epochs_done", "step", "step_in_epoch"})
    EXPECT_EQ(want.scalars.at(k), got.scalars.at(k)) << what << ": " << k;
}

CheckpointData newest(const std::string& dir) { return find_intact_checkpoint(dir).data; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class Reshard : public test_fixtures::SyntheticDataTest {
 protected:
  Reshard() : SyntheticDataTest("reshard", 256, 32) {}
};

TEST_F(Reshard, GridCheckpointLoadsBitwiseAtEveryLayoutAndBack) {
  if (world_.size() != 4) GTEST_SKIP() << "the layouts are those of 4 ranks";
  const TrainConfig c = mlp_config(data_);
  const std::string src = data_ + "/t2p2";
  TrainConfig s = at(c, 2, 2, 16, src);
  s.train.max_steps = 5;  // mid-epoch 1 (16 steps per epoch): the exact position too
  losses_of(s, world_);
  // The saved run's next step, uninterrupted: each loaded run's first step must match it.
  TrainConfig ref = at(c, 2, 2, 16, data_ + "/ref");
  ref.train.max_steps = 6;
  const double next = losses_of(ref, world_).back();
  world_.barrier();
  const CheckpointData saved = newest(src);
  EXPECT_EQ(saved.scalars.at("step"), 5);
  EXPECT_EQ(saved.scalars.at("pipeline"), 2);
  EXPECT_EQ(saved.scalars.at("tensor"), 2);
  EXPECT_EQ(saved.scalars.at("data_parallel"), 1);
  EXPECT_EQ(saved.strings.count("run_identity"), 1u);

  struct Layout {
    const char* name;
    int pipeline, tensor, batch;
  };
  // The same global batch of 16 at each.
  for (Layout l : {Layout{"data 4 (data-parallel path)", 1, 1, 4}, Layout{"tensor 1 x pipeline 4", 4, 1, 16},
                   Layout{"tensor 4", 1, 4, 16}}) {
    TrainConfig r = at(c, l.pipeline, l.tensor, l.batch,
                       data_ + "/" + std::to_string(l.pipeline) + "-" + std::to_string(l.tensor));
    r.train.max_steps = 6;
    r.train.verify_every = 1;  // data-parallel path: every rank's state bitwise identical after the step
    std::string path;
    const std::vector<double> after = load_resave_train(r, world_, src, path);
    world_.barrier();
    ASSERT_EQ(after.size(), 1u) << l.name;
    EXPECT_NEAR(after[0], next, 1e-5 * next) << l.name << ": the first step after loading";
    if (world_.rank() != 0) continue;
    const CheckpointData got = read_checkpoint(path);
    expect_same_state(saved, got, l.name);
    EXPECT_EQ(got.scalars.at("pipeline"), l.pipeline) << l.name;
    EXPECT_EQ(got.scalars.at("tensor"), l.tensor) << l.name;
    EXPECT_EQ(got.scalars.at("data_parallel"), 4 / (l.pipeline * l.tensor)) << l.name;
    EXPECT_EQ(got.scalars.at("resumes"), 1) << l.name;
    EXPECT_EQ(got.strings.at("run_id"), saved.strings.at("run_id")) << l.name << ": the same run continues";
  }
  // 1 rank (the data-parallel path alone).
  Communicator self = world_.split(world_.rank(), 0, "self");
  if (world_.rank() == 0) {
    TrainConfig r = at(c, 1, 1, 16, data_ + "/one");
    r.train.max_steps = 6;
    std::string path;
    const std::vector<double> after = load_resave_train(r, self, src, path);
    ASSERT_EQ(after.size(), 1u);
    EXPECT_NEAR(after[0], next, 1e-5 * next) << "1 rank: the first step after loading";
    expect_same_state(saved, read_checkpoint(path), "1 rank");
  }
  world_.barrier();

  // And back: a data-parallel checkpoint (data 4) loads on the grid path.
  const std::string dp = data_ + "/dp4";
  TrainConfig d = at(c, 1, 1, 4, dp);
  d.train.max_steps = 7;
  losses_of(d, world_);
  d.checkpoint.dir = data_ + "/dp4-ref";
  d.train.max_steps = 8;
  const double dp_next = losses_of(d, world_).back();
  world_.barrier();
  const CheckpointData dp_saved = newest(dp);
  EXPECT_EQ(dp_saved.scalars.at("data_parallel"), 4);
  for (Layout l : {Layout{"tensor 2 x data 2", 1, 2, 8}, Layout{"tensor 2 x pipeline 2", 2, 2, 16}}) {
    TrainConfig r = at(c, l.pipeline, l.tensor, l.batch,
                       data_ + "/back-" + std::to_string(l.pipeline) + "-" + std::to_string(l.tensor));
    r.train.max_steps = 8;
    std::string path;
    const std::vector<double> after = load_resave_train(r, world_, dp, path);
    world_.barrier();
    ASSERT_EQ(after.size(), 1u) << l.name;
    EXPECT_NEAR(after[0], dp_next, 1e-5 * dp_next) << "data 4 -> " << l.name << ": the first step after loading";
    if (world_.rank() == 0) expect_same_state(dp_saved, read_checkpoint(path), std::string("data 4 -> ") + l.name);
  }
}

// Grid path, same layout: cut mid-epoch, resumed, the losses and the final
// parameters and optimizer state are those of the uninterrupted run, bitwise.
TEST_F(Reshard, GridPathResumesBitwise) {
  if (world_.size() % 2) GTEST_SKIP() << "tensor 2 needs an even world";
  TrainConfig c = at(mlp_config(data_), world_.size() / 2, 2, 16, data_ + "/full");
  std::vector<double> full, first, rest;
  {
    Trainer t(c, world_, quiet(&full));
    t.fit();
  }
  ASSERT_EQ(full.size(), 32u);
  TrainConfig cut = c;
  cut.checkpoint.dir = data_ + "/cut";
  cut.train.max_steps = 21;  // inside epoch 2
  {
    Trainer t(cut, world_, quiet(&first));
    t.fit();
  }
  world_.barrier();
  cut.train.max_steps = 0;
  {
    Trainer t(cut, world_, quiet(&rest));
    ASSERT_TRUE(t.resume("auto")) << "--resume auto finds the same configuration's checkpoint";
    t.fit();
  }
  ASSERT_EQ(first.size() + rest.size(), full.size());
  for (std::size_t i = 0; i < first.size(); ++i) EXPECT_EQ(first[i], full[i]) << "step " << i;
  for (std::size_t i = 0; i < rest.size(); ++i) EXPECT_EQ(rest[i], full[first.size() + i]) << "resumed step " << i;
  world_.barrier();
  const CheckpointData a = newest(c.checkpoint.dir), b = newest(cut.checkpoint.dir);
  expect_same_state(a, b, "resumed vs uninterrupted");
  EXPECT_EQ(b.scalars.at("epochs_done"), 2);
}

// Another model: the first tensor missing, shaped differently or left over is
// named, on every rank, before anything is restored; another global batch is refused naming the key.
TEST_F(Reshard, IncompatibleCheckpointsAreErrorsOnEveryRank) {
  if (world_.size() % 2) GTEST_SKIP() << "tensor 2 needs an even world";
  const int half = world_.size() / 2;
  TrainConfig vit = mlp_config(data_);
  vit.model.name = "vit";
  vit.model.width = 16;
  vit.model.heads = 4;
  vit.model.depth = 2;
  vit.model.mlp_ratio = 2.0;
  vit.model.patch = 7;
  const std::string dir = data_ + "/vit";
  {
    Trainer t(at(vit, half, 2, 16, dir), world_, quiet());
    t.save_checkpoint();  // the initial state is a checkpoint too
  }
  world_.barrier();
  auto load = [&](const TrainConfig& c) {
    return error_of([&] {
      Trainer t(c, world_, quiet());
      t.resume(dir);
    });
  };
  TrainConfig wide = vit;
  wide.model.width = 32;
  std::string m = load(at(wide, half, 2, 16, data_ + "/x"));
  // The first parameter (stage 0's patch embedding) is named, shaped differently.
  EXPECT_NE(m.find("tensor 'param/patch_embed."), std::string::npos) << m;
  EXPECT_NE(m.find("is float32 [16, 49], but this model has float32 [32, 49]"), std::string::npos) << m;

  TrainConfig shallow = vit;
  shallow.model.depth = 1;
  m = load(at(shallow, 1, 2, 16 / half, data_ + "/x"));
  EXPECT_NE(m.find("holds tensor 'param/blocks.1."), std::string::npos) << m;
  EXPECT_NE(m.find("does not have"), std::string::npos) << m;

  TrainConfig cnn = test_fixtures::small_config(data_);
  cnn.data.batch_size = 16;
  m = load(at(cnn, 2, 1, 16, data_ + "/x"));
  EXPECT_NE(m.find("has no tensor 'param/conv"), std::string::npos) << m;

  // The same model at another global batch (data.batch_size x data-parallel size).
  m = load(at(vit, 1, 2, 16, data_ + "/x"));
  if (half == 1) {
    EXPECT_EQ(m, "") << "tensor 2 x data 1 at batch 16 is the saved global batch";
  } else {
    EXPECT_NE(m.find("data-parallel size 1 -> " + std::to_string(half)), std::string::npos) << m;
    EXPECT_NE(m.find("global batch 16 -> " + std::to_string(16 * half)), std::string::npos) << m;
  }
}

}  // namespace
