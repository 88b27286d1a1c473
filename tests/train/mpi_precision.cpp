// train.precision in the trainer: fp16 (down-conversion allowed, dynamic loss
// scaling) and bf16 track the fp32 run step by step (on CPUs without the
// instructions oneDNN keeps fp32, and a power-of-two loss scale is exact); the
// loss scaler's state is checkpointed and consistent with the skipped steps;
// and train.device = cuda without a GPU is an error on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "fixtures.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/train/checkpoint.hpp"
#include "ringtrain/parallel/device_runtime.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;

namespace {

constexpr int kSteps = 12;

std::vector<double> run(TrainConfig c, const Communicator& world) {
  std::vector<double> losses;
  TrainerHooks hooks;
  hooks.evaluate = false;
  hooks.report = false;
  hooks.on_step = [&](std::int64_t, double loss) { losses.push_back(loss); };
  c.train.max_steps = kSteps;
  Trainer t(c, world, hooks);
  t.fit();
  return losses;
}

TrainConfig base(const std::string& data) {
  TrainConfig c = test_fixtures::small_config(data);
  c.data.batch_size = 32;
  c.optimizer.lr = 0.01;
  c.train.epochs = 4;  // enough steps for kSteps at 4 ranks (max_steps stops early)
  return c;
}

}  // namespace

TEST(Precision, Fp16AndBf16TrackFp32AndTheScalerIsCheckpointed) {
  Communicator world = Communicator::world();
  std::string data = test_fixtures::synthetic_mnist_like(world, "precision", 1024, 64);
  std::vector<double> ref = run(base(data), world);
  ASSERT_EQ(ref.size(), static_cast<std::size_t>(kSteps));
  auto mean3 = [](const double* p) { return (p[0] + p[1] + p[2]) / 3; };
  EXPECT_LT(mean3(&ref[kSteps - 3]), mean3(&ref[0])) << "the fp32 reference did not learn: test setup";

  for (const char* prec : {"bf16", "fp16"}) {
    TrainConfig c = base(data);
    c.train.precision = prec;
    c.checkpoint.dir = data + "/ckpt-" + prec;
    std::vector<double> got = run(c, world);
    ASSERT_EQ(got.size(), ref.size()) << prec;
    // bf16 keeps 8 mantissa bits: 2% per-step agreement over 12 steps is ample;
    // a skipped fp16 step repeats the previous parameters, so compare loosely there.
    for (int s = 0; s < kSteps; ++s) EXPECT_NEAR(got[s], ref[s], 0.05 * ref[s]) << prec << " step " << s;

    world.barrier();
    CheckpointData ck = read_checkpoint(CheckpointDir(c.checkpoint.dir, 1).latest());
    bool has_amp = false;
    for (auto& [name, t] : ck.tensors) {
      if (name != "amp.loss_scale") continue;
      has_amp = true;
      const double* v = t.data<double>();  // {scale, good steps, steps, skipped}
      EXPECT_EQ(v[2], kSteps);
      EXPECT_LE(v[3], kSteps);
      EXPECT_EQ(v[0], 65536.0 * std::pow(0.5, v[3])) << "scale must halve once per skipped step";
      EXPECT_LE(v[1], kSteps - v[3]) << "good steps count since the last skip";
    }
    EXPECT_EQ(has_amp, std::string(prec) == "fp16") << prec << ": only fp16 uses loss scaling";
  }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(data);
}

TEST(Precision, CudaWithoutAGpuIsAnErrorOnEveryRank) {
  if (has_device_runtime(DeviceKind::cuda)) GTEST_SKIP() << "this machine has a GPU";
  Communicator world = Communicator::world();
  std::string data = test_fixtures::synthetic_mnist_like(world, "nogpu", 256, 64);
  TrainConfig c = base(data);
  c.train.device = "cuda";
  std::string msg;
  try {
    Trainer t(c, world, {});
  } catch (const Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("train.device = cuda"), std::string::npos) << "got: " << msg;
  try {
    device_runtime(DeviceKind::cuda);
    ADD_FAILURE() << "device_runtime(cuda) without a GPU did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
  }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(data);
}
