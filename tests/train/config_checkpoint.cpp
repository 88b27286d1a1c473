// Configuration parsing/validation and HDF5 checkpoint round trips.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "ringtrain/core/error.hpp"
#include "ringtrain/train/checkpoint.hpp"
#include "ringtrain/train/config.hpp"
#include "support/error_of.hpp"

using namespace ringtrain;
using test_support::error_of;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& tag) {
  fs::path d = fs::temp_directory_path() / ("rt-" + tag + "-" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}


}  // namespace

TEST(Config, LoadsTomlAndOverrides) {
  auto d = temp_dir("cfg");
  std::ofstream(d / "a.toml") << "[model]\nname = \"resnet\"\ndepth = 32\n[optimizer]\nlr = 0.2\nnesterov = true\n"
                                 "[comm]\nfusion_threshold = 1024\n";
  TrainConfig c;
  c.load_toml((d / "a.toml").string());
  EXPECT_EQ(c.model.name, "resnet");
  EXPECT_EQ(c.model.depth, 32);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.2);
  EXPECT_TRUE(c.optimizer.nesterov);
  EXPECT_EQ(c.comm.fusion_threshold, 1024);
  c.set("data.batch_size=16");
  c.set("optimizer.lr=0.5");
  c.set("log.metrics=");
  EXPECT_EQ(c.data.batch_size, 16);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.5);
  EXPECT_EQ(c.log.metrics, "");
  c.validate();

  // to_toml() reproduces the same configuration.
  std::ofstream(d / "b.toml") << c.to_toml();
  TrainConfig back;
  back.load_toml((d / "b.toml").string());
  EXPECT_EQ(back.to_toml(), c.to_toml());
  fs::remove_all(d);
}

TEST(Config, ErrorsNameTheKeyAndTheFile) {
  auto d = temp_dir("cfgbad");
  std::ofstream(d / "typo.toml") << "[optimizer]\nlearning_rate = 0.1\n";
  std::string m = error_of([&] { TrainConfig c; c.load_toml((d / "typo.toml").string()); });
  EXPECT_NE(m.find("optimizer.learning_rate"), std::string::npos) << m;
  EXPECT_NE(m.find("typo.toml"), std::string::npos) << m;

  std::ofstream(d / "type.toml") << "[data]\nbatch_size = \"big\"\n";
  m = error_of([&] { TrainConfig c; c.load_toml((d / "type.toml").string()); });
  EXPECT_NE(m.find("data.batch_size"), std::string::npos) << m;
  EXPECT_NE(m.find("integer"), std::string::npos) << m;

  std::ofstream(d / "syntax.toml") << "[data\nbatch_size = 3\n";
  m = error_of([&] { TrainConfig c; c.load_toml((d / "syntax.toml").string()); });
  EXPECT_NE(m.find("syntax.toml"), std::string::npos) << m;

  m = error_of([&] { TrainConfig c; c.load_toml((d / "missing.toml").string()); });
  EXPECT_NE(m.find("missing.toml"), std::string::npos) << m;

  m = error_of([] { TrainConfig c; c.set("data.batch_size=-3"); c.validate(); });
  EXPECT_NE(m.find("data.batch_size"), std::string::npos) << m;
  m = error_of([] { TrainConfig c; c.set("model.name=vgg"); c.validate(); });
  EXPECT_NE(m.find("vgg"), std::string::npos) << m;
  m = error_of([] { TrainConfig c; c.set("train.epochs=ten"); });
  EXPECT_NE(m.find("train.epochs"), std::string::npos) << m;
  m = error_of([] { TrainConfig c; c.set("nonsense"); });
  EXPECT_NE(m.find("section.key=value"), std::string::npos) << m;
  fs::remove_all(d);
}

TEST(Checkpoint, RoundTripIsBitwiseAndKeepsTheNewest) {
  auto d = temp_dir("ckpt");
  Tensor a = Tensor::empty({5}, DType::f32);
  Tensor b = Tensor::empty({3}, DType::bf16);
  Tensor c = Tensor::empty({2}, DType::i64);
  for (int i = 0; i < 5; ++i) a.data<float>()[i] = 0.1f * i - 0.3f;
  for (int i = 0; i < 3; ++i) b.data<bfloat16>()[i] = to_bf16(1.5f * i);
  c.data<std::int64_t>()[0] = -7;
  c.data<std::int64_t>()[1] = 1LL << 40;
  CheckpointData data;
  data.tensors = {{"params.float32", a}, {"opt.momentum", b}, {"rng", c}};
  data.scalars = {{"epoch", 3}, {"step", 1234}};
  data.config_toml = "[model]\nname = \"cnn\"\n";

  CheckpointDir dir(d.string(), 2);
  for (int e = 1; e <= 4; ++e) dir.save(e, data);
  EXPECT_EQ(fs::path(dir.latest()).filename(), "ckpt-0004.h5");
  int files = 0;
  for (auto& f : fs::directory_iterator(d)) files += f.path().extension() == ".h5";
  EXPECT_EQ(files, 2);  // keep = 2

  CheckpointData back = read_checkpoint(dir.latest());
  EXPECT_EQ(back.config_toml, data.config_toml);
  EXPECT_EQ(back.scalars.at("epoch"), 3);
  EXPECT_EQ(back.scalars.at("step"), 1234);
  Tensor a2 = Tensor::zeros({5}), b2 = Tensor::zeros({3}, DType::bf16), c2 = Tensor::zeros({2}, DType::i64);
  restore_tensor(back, "params.float32", a2);
  restore_tensor(back, "opt.momentum", b2);
  restore_tensor(back, "rng", c2);
  EXPECT_EQ(std::memcmp(a.raw(), a2.raw(), a.nbytes()), 0);
  EXPECT_EQ(std::memcmp(b.raw(), b2.raw(), b.nbytes()), 0);
  EXPECT_EQ(std::memcmp(c.raw(), c2.raw(), c.nbytes()), 0);

  // Wrong size and missing names are errors naming the tensor.
  Tensor wrong = Tensor::zeros({4});
  std::string m = error_of([&] { restore_tensor(back, "params.float32", wrong); });
  EXPECT_NE(m.find("params.float32"), std::string::npos) << m;
  m = error_of([&] { restore_tensor(back, "nope", wrong); });
  EXPECT_NE(m.find("nope"), std::string::npos) << m;

  // A truncated file is reported, not crashed on.
  fs::path trunc = d / "ckpt-0009.h5";
  fs::copy_file(dir.latest(), trunc);
  fs::resize_file(trunc, fs::file_size(trunc) / 3);
  m = error_of([&] { read_checkpoint(trunc.string()); });
  EXPECT_NE(m.find("ckpt-0009.h5"), std::string::npos) << m;
  fs::remove_all(d);
}
