// Bad input to the trainer is an Error on every rank that names the thing and
// what is wrong — never a crash or a hang.
#include <gtest/gtest.h>

#include <hdf5.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <filesystem>
#include <functional>

#include "fixtures.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;
namespace fs = std::filesystem;

namespace {

std::string trainer_error(const TrainConfig& c, const Communicator& world) {
  TrainerHooks hooks;
  hooks.evaluate = false;
  hooks.report = false;
  try {
    Trainer t(c, world, hooks);
    t.fit();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(TrainerErrors, MissingDataBatchTooLargeAndBadKeysFailEverywhere) {
  Communicator world = Communicator::world();
  std::string dir = test_fixtures::synthetic_mnist_like(world, "errors", 512, 64);

  TrainConfig c = test_fixtures::small_config(dir);
  c.data.batch_size = 16;
  c.data.train = dir + "/does-not-exist";
  std::string m = trainer_error(c, world);
  EXPECT_NE(m.find("does-not-exist"), std::string::npos) << m;

  c = test_fixtures::small_config(dir);
  c.data.batch_size = 100000;  // more than the data set holds
  m = trainer_error(c, world);
  EXPECT_FALSE(m.empty());
  EXPECT_NE(m.find("100000"), std::string::npos) << m;

  c = test_fixtures::small_config(dir);
  c.data.batch_size = 16;
  c.optimizer.name = "rmsprop";
  m = trainer_error(c, world);
  EXPECT_NE(m.find("optimizer.name"), std::string::npos) << m;

  c = test_fixtures::small_config(dir);
  c.data.batch_size = 16;
  c.model.name = "resnet";
  c.model.depth = 21;
  m = trainer_error(c, world);
  EXPECT_NE(m.find("model.depth"), std::string::npos) << m;

  // A checkpoint made by another model does not load into this one.
  c = test_fixtures::small_config(dir);
  c.data.batch_size = 16;
  c.checkpoint.dir = dir + "/ckpt-mlp";
  c.model.name = "mlp";
  c.train.max_steps = 1;
  EXPECT_EQ(trainer_error(c, world), "");
  world.barrier();
  c.model.name = "cnn";
  TrainerHooks hooks;
  hooks.report = false;
  TrainConfig cnn = test_fixtures::small_config(dir);
  cnn.data.batch_size = 16;
  Trainer t(cnn, world, hooks);
  try {
    t.resume(dir + "/ckpt-mlp");
    FAIL() << "an mlp checkpoint loaded into a cnn";
  } catch (const Error& e) {
    // The first name the cnn needs that the mlp checkpoint lacks or shapes differently.
    EXPECT_NE(std::string(e.what()).find("param/"), std::string::npos) << e.what();
  }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

namespace {

// Sets a float64 [C] root attribute of an HDF5 file (rank 0 only).
void set_attr(const std::string& file, const char* name, double value) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  hid_t space = H5Aget_space(a);
  std::vector<double> v(static_cast<std::size_t>(H5Sget_simple_extent_npoints(space)), value);
  H5Awrite(a, H5T_NATIVE_DOUBLE, v.data());
  H5Sclose(space);
  H5Aclose(a);
  H5Fclose(f);
}

std::string trainer_error_with(const TrainConfig& c, const Communicator& world, bool evaluate,
                               const std::function<void(Trainer&)>& before_fit = {}) {
  TrainerHooks hooks;
  hooks.evaluate = evaluate;
  hooks.report = false;
  try {
    Trainer t(c, world, hooks);
    if (before_fit) before_fit(t);
    t.fit();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// The test split is checked against the model when the run starts (shape,
// classes, readable, finite normalisation), errors naming data.test and the
// file; a problem found only at evaluation does not cost the epoch, whose
// checkpoint is written first.
TEST(TrainerErrors, DataFilesAreCheckedAtStartAndCheckpointPrecedesEvaluation) {
  Communicator world = Communicator::world();
  std::string dir = test_fixtures::synthetic_mnist_like(world, "dataerr", 256, 64);
  auto other = test_fixtures::shared_temp_dir(world, "dataerr3c");
  {
    data::SyntheticOptions o;
    o.output = other.string();
    o.train_samples = 64;
    o.test_samples = 32;
    o.channels = 3;  // the model is built for 1 channel
    o.height = 28;
    o.width = 28;
    o.num_classes = 10;
    data::generate_synthetic(o, world);
  }
  TrainConfig c = test_fixtures::small_config(dir);
  c.data.batch_size = 16;
  c.data.test = other.string();
  std::string m = trainer_error_with(c, world, true, [](Trainer&) { FAIL() << "constructed with a wrong test split"; });
  EXPECT_NE(m.find("data.test"), std::string::npos) << m;
  EXPECT_NE(m.find("synthetic-test.h5"), std::string::npos) << m;
  EXPECT_NE(m.find("3x28x28"), std::string::npos) << m;
  // The same check on the model-parallel grid (pipeline 2, tensor 2).
  if (world.size() % 2 == 0)
    for (auto [pp, tp] : {std::pair{2, 1}, std::pair{1, 2}}) {
      TrainConfig g = c;
      g.parallel.pipeline = pp;
      g.parallel.tensor = tp;
      m = trainer_error_with(g, world, true, [](Trainer&) { FAIL() << "the grid was built with a wrong test split"; });
      EXPECT_NE(m.find("data.test"), std::string::npos) << "pipeline " << pp << " tensor " << tp << ": " << m;
      EXPECT_NE(m.find("3x28x28"), std::string::npos) << m;
    }
  c.data.test = dir + "/nothing-here";
  m = trainer_error_with(c, world, true);
  EXPECT_NE(m.find("data.test"), std::string::npos) << m;
  EXPECT_NE(m.find("nothing-here"), std::string::npos) << m;

  // Non-finite normalisation attributes would train at chance without a word.
  const auto nan_dir = test_fixtures::shared_temp_dir(world, "dataerrnan");
  if (world.rank() == 0) {
    fs::create_directories(nan_dir);
    fs::copy_file(dir + "/synthetic-train.h5", nan_dir / "synthetic-train.h5");
    fs::copy_file(dir + "/synthetic-test.h5", nan_dir / "synthetic-test.h5");
    set_attr((nan_dir / "synthetic-train.h5").string(), "std", std::nan(""));
  }
  world.barrier();
  c = test_fixtures::small_config(nan_dir.string());
  c.data.batch_size = 16;
  m = trainer_error_with(c, world, false);
  EXPECT_NE(m.find("data.train"), std::string::npos) << m;
  EXPECT_NE(m.find("synthetic-train.h5"), std::string::npos) << m;
  EXPECT_NE(m.find("nan"), std::string::npos) << m;

  // The test file disappears after the start: evaluation fails, the epoch's checkpoint exists.
  const auto gone = test_fixtures::shared_temp_dir(world, "dataerrgone");
  if (world.rank() == 0) {
    fs::create_directories(gone);
    fs::copy_file(dir + "/synthetic-test.h5", gone / "synthetic-test.h5");
  }
  world.barrier();
  c = test_fixtures::small_config(dir);
  c.data.batch_size = 16;
  c.data.test = gone.string();
  c.checkpoint.dir = dir + "/ckpt-before-eval";
  m = trainer_error_with(c, world, true, [&](Trainer&) {
    world.barrier();
    if (world.rank() == 0) fs::remove(gone / "synthetic-test.h5");
    world.barrier();
  });
  EXPECT_NE(m.find("data.test"), std::string::npos) << m;
  if (world.rank() == 0) {
    CheckpointData ck = find_intact_checkpoint(c.checkpoint.dir).data;
    EXPECT_EQ(ck.scalars.at("epochs_done"), 1) << "the epoch was saved before its evaluation failed";
  }
  world.barrier();
  if (world.rank() == 0) {
    fs::remove_all(other);
    fs::remove_all(nan_dir);
    fs::remove_all(gone);
    fs::remove_all(dir);
  }
}

// Resuming with another batch size would silently change the data order and
// schedule: refused, naming the key. An uncreatable checkpoint.dir is one
// error (raised on every rank together), naming the key.
TEST(TrainerErrors, IncompatibleResumeAndUncreatableCheckpointDir) {
  Communicator world = Communicator::world();
  std::string dir = test_fixtures::synthetic_mnist_like(world, "resumeerr", 256, 64);
  TrainConfig c = test_fixtures::small_config(dir);
  c.data.batch_size = 16;
  c.train.max_steps = 2;
  c.checkpoint.dir = dir + "/ckpt";
  EXPECT_EQ(trainer_error_with(c, world, false), "");
  world.barrier();
  TrainConfig d = c;
  d.data.batch_size = 8;
  d.train.max_steps = 0;
  std::string m = trainer_error_with(d, world, false, [&](Trainer& t) { t.resume(c.checkpoint.dir); });
  EXPECT_NE(m.find("data.batch_size 16 -> 8"), std::string::npos) << m;

  d = c;
  d.checkpoint.dir = "/proc/self/rt-cannot-create/ckpt";
  TrainerHooks hooks;
  hooks.report = false;
  try {
    Trainer t(d, world, hooks);
    FAIL() << "an uncreatable checkpoint.dir was accepted";
  } catch (const Error& e) {
    // One message for the job: raised on every rank together (the CLI prints it once).
    if (world.size() > 1) {
      EXPECT_NE(dynamic_cast<const CollectiveError*>(&e), nullptr) << e.what();
    }
    EXPECT_NE(std::string(e.what()).find("checkpoint.dir"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rt-cannot-create"), std::string::npos) << e.what();
  }
  world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
}

// Every layout runs every feature: each feature alone and every pair of them
// trains two steps to a finite loss at data parallelism, pipeline 2, tensor 2
// and pipeline 2 x tensor 2 (as the rank count allows), or is refused on every
// rank by a message naming both keys. The pairs refused today are the ZeRO
// ones listed in `refused`.
TEST(TrainerErrors, EveryCombinationTrainsOrIsRefusedByName) {
  Communicator world = Communicator::world();
  std::string dir = test_fixtures::synthetic_mnist_like(world, "combos", 256, 64);
  struct Feature {
    const char* key;
    std::function<void(TrainConfig&)> set;
  };
  const std::vector<Feature> features = {
      {"train.precision", [](TrainConfig& c) { c.train.precision = "fp16"; }},
      {"train.accumulation", [](TrainConfig& c) { c.train.accumulation = 2; }},
      {"parallel.zero = 1", [](TrainConfig& c) { c.parallel.zero = 1; }},
      {"parallel.zero = 2", [](TrainConfig& c) { c.parallel.zero = 2; }},
      {"parallel.zero = 3", [](TrainConfig& c) { c.parallel.zero = 3; }},
      {"comm.deterministic", [](TrainConfig& c) { c.comm.deterministic = true; }},
      {"model.dropout", [](TrainConfig& c) { c.model.dropout = 0.2; }},
      {"optimizer.clip_norm", [](TrainConfig& c) { c.optimizer.clip_norm = 0.5; }},
      {"train.verify_every", [](TrainConfig& c) { c.train.verify_every = 1; }},
      {"comm.fp16_allreduce", [](TrainConfig& c) { c.comm.fp16_allreduce = true; }},
  };
  const std::set<std::pair<std::string, std::string>> refused = {
      {"parallel.zero = 1", "comm.deterministic"}, {"parallel.zero = 1", "comm.fp16_allreduce"},
      {"parallel.zero = 2", "comm.deterministic"}, {"parallel.zero = 2", "comm.fp16_allreduce"},
      {"parallel.zero = 3", "comm.deterministic"}, {"parallel.zero = 3", "comm.fp16_allreduce"}};
  std::vector<std::pair<int, int>> layouts = {{1, 1}};  // (pipeline, tensor)
  if (world.size() % 2 == 0) layouts.insert(layouts.end(), {{2, 1}, {1, 2}});
  if (world.size() == 4) layouts.push_back({2, 2});
  int trained = 0, refusals = 0;
  std::set<std::pair<std::string, std::string>> refused_seen;
  auto zero_key = [](const std::string& k) { return k.rfind("parallel.zero", 0) == 0; };
  for (auto [pp, tp] : layouts)
    for (std::size_t i = 0; i < features.size(); ++i)
      for (std::size_t j = i; j < features.size(); ++j) {
        // Two ZeRO stages: the second set wins, the pair is the stage alone. ZeRO-1 is ZeRO-2's
        // slicing and optimizer without the bucket reduce-scatters: its pairs run at data
        // parallelism only, so the test stays within the watchdog's 240 s at 4 ranks.
        const std::string ki = features[i].key, kj = features[j].key;
        if (i != j && zero_key(ki) && zero_key(kj)) continue;
        if ((ki == "parallel.zero = 1" || kj == "parallel.zero = 1") && (pp != 1 || tp != 1)) continue;
        TrainConfig c = test_fixtures::small_config(dir);
        c.model.name = "cnn";
        c.parallel.pipeline = pp;
        c.parallel.tensor = tp;
        c.data.batch_size = 16;
        c.train.max_steps = 2;
        c.optimizer.lr = 0.01;
        features[i].set(c);
        features[j].set(c);
        const std::string what = cat("pipeline ", pp, " tensor ", tp, ": ", features[i].key, " + ", features[j].key);
        const bool refuse = refused.count({features[i].key, features[j].key}) > 0;
        double last = NAN;
        std::string m;
        try {
          TrainerHooks hooks;
          hooks.report = false;
          hooks.evaluate = false;
          hooks.on_step = [&](std::int64_t, double loss) { last = loss; };
          Trainer t(c, world, hooks);
          t.fit();
        } catch (const Error& e) {
          m = e.what();
        }
        if (refuse) {
          ++refusals;
          refused_seen.insert({features[i].key, features[j].key});
          EXPECT_NE(m.find(features[i].key), std::string::npos) << what << ": " << m;
          EXPECT_NE(m.find(features[j].key), std::string::npos) << what << ": " << m;
        } else {
          ++trained;
          EXPECT_EQ(m, "") << what;
          EXPECT_TRUE(std::isfinite(last)) << what << ": loss " << last;
        }
      }
  EXPECT_EQ(refused_seen, refused) << "every pair listed as refused was tried";
  EXPECT_GE(refusals, static_cast<int>(refused.size()));
  if (world.rank() == 0) std::printf("%d combinations trained, %d refused by name\n", trained, refusals);
  world.barrier();
  if (world.rank() == 0) fs::remove_all(dir);
}
