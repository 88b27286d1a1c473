// Bad input to the trainer is an Error on every rank that names the thing and
// what is wrong — never a crash or a hang.
#include <gtest/gtest.h>

#include <filesystem>

#include "fixtures.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;

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
