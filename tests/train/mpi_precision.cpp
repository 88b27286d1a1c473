// train.precision in the trainer: tf32, bf16 and fp16 (down-conversion
// allowed, fp16 with dynamic loss scaling) follow the fp32 run of the same
// model and data step by step within a bound set by the format's precision,
// and every run learns; the loss scaler's state is checkpointed and
// consistent with the skipped steps; and train.device = cuda without a GPU is
// an error on every rank.
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

// Mean of three consecutive steps' losses: a single batch's loss is noisy.
double mean3(const std::vector<double>& l, std::size_t first) { return (l[first] + l[first + 1] + l[first + 2]) / 3; }

// The per-step bound: a conforming backend rounds conv/linear inputs to the
// named format (unit roundoff u = 2^-8 for bf16's 8 significant bits, 2^-11
// for fp16's and tf32's 11) and accumulates in fp32, so a step's loss moves by
// O(u) relative; 8u leaves room for the drift of 12 calm steps (lr 0.01).
// A power-of-two loss scale is exact, so fp16 adds nothing while no step is
// skipped. On this CPU (oneDNN 2.6 keeps f32 convolutions strict, OpenBLAS
// Linear is fp32) the runs measured bitwise equal, difference 0.
double loss_bound(const std::string& prec) { return 8 * std::ldexp(1.0, prec == "bf16" ? -8 : -11); }

}  // namespace

TEST(Precision, Tf32Bf16AndFp16TrackFp32AndTheScalerIsCheckpointed) {
  Communicator world = Communicator::world();
  std::string data = test_fixtures::synthetic_mnist_like(world, "precision", 1024, 64);
  std::vector<double> ref = run(base(data), world);
  ASSERT_EQ(ref.size(), static_cast<std::size_t>(kSteps));
  EXPECT_LT(mean3(ref, kSteps - 3), 0.8 * mean3(ref, 0)) << "the fp32 reference did not learn: test setup";

  for (const char* prec : {"tf32", "bf16", "fp16"}) {
    TrainConfig c = base(data);
    c.train.precision = prec;
    c.checkpoint.dir = data + "/ckpt-" + prec;
    std::vector<double> got = run(c, world);
    ASSERT_EQ(got.size(), ref.size()) << prec;
    const double tol = loss_bound(prec);
    for (int s = 0; s < kSteps; ++s)
      EXPECT_LE(std::abs(got[s] - ref[s]), tol * ref[s]) << prec << " step " << s << ": " << got[s] << " vs fp32 "
                                                         << ref[s] << " (bound " << tol << " relative)";
    EXPECT_LT(mean3(got, kSteps - 3), 0.8 * mean3(got, 0)) << prec << " did not learn";

    world.barrier();
    CheckpointData ck = read_checkpoint(CheckpointDir(c.checkpoint.dir, 1).latest());
    bool has_amp = false;
    for (auto& [name, t] : ck.tensors) {
      if (name != "amp.loss_scale") continue;
      has_amp = true;
      const double* v = t.data<double>();  // {scale, good steps, steps, skipped}
      EXPECT_EQ(v[2], kSteps);
      // The bound above assumes no skipped step: with fp32 accumulation these gradients
      // times 2^16 are far from overflowing, so a skip here is a scaler bug.
      EXPECT_EQ(v[3], 0) << "skipped steps";
      EXPECT_EQ(v[0], 65536.0 * std::pow(0.5, v[3])) << "scale must halve once per skipped step";
      EXPECT_EQ(v[1], kSteps - v[3]) << "good steps count since the last skip (growth after 2000)";
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
