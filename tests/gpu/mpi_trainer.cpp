// The trainer on the GPU (train.device = cuda), at 1–4 ranks sharing the GPUs:
// the same short `cnn` run as on the CPU (same seed and data) reaches the CPU
// run's test accuracy in fp32, and in bf16 and fp16 (loss scaling) as well;
// parameters stay bitwise identical on every rank (train.verify_every), and a
// GPU checkpoint resumes on the CPU (shared state names and layouts).
#include <gtest/gtest.h>

#include <filesystem>

#include "ringtrain/core/error.hpp"
#include "ringtrain/train/checkpoint.hpp"
#include "ringtrain/train/trainer.hpp"
#include "train/fixtures.hpp"

using namespace ringtrain;

namespace {

TrainResult train(TrainConfig c, const Communicator& world) {
  TrainerHooks hooks;
  hooks.report = false;
  Trainer t(c, world, hooks);
  return t.fit();
}

}  // namespace

TEST(GpuTrainer, CnnReachesTheCpuAccuracyInEveryPrecision) {
  Communicator world = Communicator::world();
  std::string data = test_fixtures::synthetic_mnist_like(world, "gpu-trainer", 2048, 512);
  TrainConfig c = test_fixtures::small_config(data);
  c.data.batch_size = 32;
  c.train.epochs = 2;
  c.train.verify_every = 10;  // ranks must hold bitwise-identical parameters

  TrainConfig cpu = c;
  cpu.train.device = "cpu";
  const double ref = train(cpu, world).best_test_accuracy;
  ASSERT_GT(ref, 0.5) << "the CPU reference did not learn the synthetic set: test setup";

  std::int64_t fp32_steps = 0;
  for (const char* prec : {"fp32", "bf16", "fp16"}) {
    TrainConfig g = c;
    g.train.device = "cuda";
    g.train.precision = prec;
    g.checkpoint.dir = data + "/ckpt-gpu-" + prec;
    TrainResult r = train(g, world);
    if (std::string(prec) == "fp32") fp32_steps = r.steps;
    EXPECT_GE(r.best_test_accuracy, ref - 0.02) << prec << " on the GPU vs " << ref << " on the CPU";
  }

  // The fp32 GPU checkpoint continues on the CPU for one more epoch.
  TrainConfig more = cpu;
  more.train.epochs = 3;
  more.checkpoint.dir = data + "/ckpt-gpu-fp32";
  {
    TrainerHooks hooks;
    hooks.report = false;
    Trainer t(more, world, hooks);
    t.resume(more.checkpoint.dir);
    TrainResult r = t.fit();
    EXPECT_EQ(r.steps, fp32_steps / 2 * 3) << "one more epoch after the two of the GPU run";
    EXPECT_GE(r.last.test_accuracy, ref - 0.02);
  }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(data);
}
