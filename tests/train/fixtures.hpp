#pragma once
// Shared fixtures for trainer tests: a small learnable synthetic data set in
// the `cnn` input shape, written once per test binary into a temp directory.
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/data/prepare.hpp"
#include "ringtrain/train/config.hpp"
#include "ringtrain/train/trainer.hpp"

namespace ringtrain::test_fixtures {

// Collective: rank 0's pid names the directory, so every rank uses the same one.
inline std::filesystem::path shared_temp_dir(const Communicator& world, const std::string& tag) {
  long long pid = ::getpid();
  MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, world.handle());
  return std::filesystem::temp_directory_path() / ("rt-" + tag + "-" + std::to_string(pid));
}

inline std::string synthetic_mnist_like(const Communicator& world, const std::string& tag, std::int64_t train,
                                        std::int64_t test) {
  auto dir = shared_temp_dir(world, tag);
  data::SyntheticOptions o;
  o.output = dir.string();
  o.name = "synthetic";
  o.train_samples = train;
  o.test_samples = test;
  o.channels = 1;
  o.height = 28;
  o.width = 28;
  o.num_classes = 10;
  o.seed = 7;
  data::generate_synthetic(o, world);
  return dir.string();
}

// Debian's Fashion-MNIST (package dataset-fashion-mnist, installed by `make deps`),
// prepared into a temp directory. Collective.
inline std::string fashion_mnist(const Communicator& world, const std::string& tag) {
  auto dir = shared_temp_dir(world, tag);
  data::PrepareOptions o;
  o.input = "/usr/share/datasets/fashion-mnist";
  o.output = dir.string();
  o.name = "fashion-mnist";
  data::prepare_dataset(o, world);
  return dir.string();
}

// A gtest fixture with a synthetic data set (`train` + `test` samples) in a
// directory every rank shares, made before each test and removed after it.
class SyntheticDataTest : public ::testing::Test {
 protected:
  SyntheticDataTest(std::string tag, std::int64_t train, std::int64_t test)
      : tag_(std::move(tag)), train_(train), test_(test) {}
  void SetUp() override {
    world_ = Communicator::world();
    data_ = synthetic_mnist_like(world_, tag_, train_, test_);
  }
  void TearDown() override {
    world_.barrier();
    if (world_.rank() == 0) std::filesystem::remove_all(data_);
  }
  Communicator world_;
  std::string data_;

 private:
  std::string tag_;
  std::int64_t train_, test_;
};

// Hooks of a trainer under test: no evaluation, no log lines.
inline TrainerHooks quiet_hooks() {
  TrainerHooks h;
  h.evaluate = false;
  h.report = false;
  return h;
}

// Trains `c` on `comm` (from the checkpoint `resume` when not empty) and
// returns every step's loss; the run's result goes to *out when given.
inline std::vector<double> train_losses(const TrainConfig& c, const Communicator& comm, const std::string& resume = "",
                                        TrainResult* out = nullptr) {
  TrainerHooks hooks;
  hooks.report = false;
  std::vector<double> losses;
  hooks.on_step = [&](std::int64_t, double l) { losses.push_back(l); };
  Trainer t(c, comm, hooks);
  if (!resume.empty()) t.resume(resume);
  TrainResult r = t.fit();
  if (out) *out = r;
  return losses;
}

// The mean of the 5 losses from index `first` on (a learning check: early against late).
inline double mean5(const std::vector<double>& l, std::size_t first) {
  double s = 0;
  for (std::size_t i = first; i < first + 5; ++i) s += l[i];
  return s / 5;
}

inline TrainConfig small_config(const std::string& dir) {
  TrainConfig c;
  c.model.name = "cnn";
  c.data.train = dir;
  c.data.test = dir;
  c.train.threads = 1;
  c.train.epochs = 1;
  c.optimizer.name = "sgd";
  c.optimizer.lr = 0.05;
  c.optimizer.momentum = 0.9;
  c.optimizer.weight_decay = 5e-4;
  c.schedule.name = "cosine";
  c.log.format = "plain";
  c.log.interval = 1000000;
  return c;
}

// The small vit of the mixed-precision trainer tests (train/mpi_bf16.cpp and
// the GPU's mpi_bf16_vit / mpi_fp16_vit): 16 tokens of 28x28 images, AdamW at
// a constant rate, `steps` steps in `precision`.
inline TrainConfig mixed_precision_vit(const std::string& data, const std::string& precision, int steps) {
  TrainConfig c = small_config(data);
  c.model.name = "vit";
  c.model.width = 32;
  c.model.heads = 2;
  c.model.depth = 2;
  c.model.mlp_ratio = 2;
  c.model.patch = 7;  // 16 tokens of 28x28 images
  c.data.batch_size = 32;
  c.optimizer.name = "adamw";
  c.optimizer.lr = 1e-3;
  c.optimizer.momentum = 0;
  c.schedule.name = "constant";
  c.train.epochs = 8;  // more than enough steps at 4 ranks; max_steps stops
  c.train.max_steps = steps;
  c.train.precision = precision;
  return c;
}

}  // namespace ringtrain::test_fixtures
