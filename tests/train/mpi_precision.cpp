// train.precision in the trainer. fp16 (dynamic loss scaling) follows the
// fp32 run of the same model and data step by step, and the loss scaler's
// state is checkpointed and consistent with the skipped steps. tf32 and bf16
// allow a backend to convert Conv2d/Linear inputs: where it does, the run
// tracks fp32 within the format's bound (the CPU's cnn in bf16: bfloat16
// activations end to end, nn/bf16_conv); where the runs are bitwise
// equal the backend computed in fp32 (tf32 on the CPU) and the test says it
// has nothing to test instead of passing fp32 against fp32. The bf16 storage
// path is also tested in mpi_bf16 (vit) and mpi_bf16_conv (cnn, resnet), which
// fail where bf16 equals fp32.
// train.device = cuda without a GPU is an error on every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "fixtures.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/parallel/device_runtime.hpp"
#include "ringtrain/train/trainer.hpp"

using namespace ringtrain;

namespace {

constexpr int kSteps = 12;
constexpr double kBf16Lr = 0.001;

std::vector<double> run(TrainConfig c, const Communicator& world, TrainResult* result = nullptr) {
  std::vector<double> losses;
  TrainerHooks hooks;
  hooks.evaluate = false;
  hooks.report = false;
  hooks.on_step = [&](std::int64_t, double loss) { losses.push_back(loss); };
  c.train.max_steps = kSteps;
  Trainer t(c, world, hooks);
  TrainResult r = t.fit();
  if (result) *result = r;
  return losses;
}

TrainConfig base(const std::string& data, double lr = 0.01) {
  TrainConfig c = test_fixtures::small_config(data);
  c.data.batch_size = 32;
  c.optimizer.lr = lr;
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
// skipped: on the CPU (fp32 arithmetic) the fp16 run measured bitwise equal.
double loss_bound(const std::string& prec) { return 8 * std::ldexp(1.0, prec == "bf16" ? -8 : -11); }

}  // namespace

// Runs `prec` beside the fp32 reference; checks the per-step bound, learning
// and the loss scaler's checkpointed state. Returns whether the run was
// bitwise the fp32 run.
bool check_precision(const std::string& prec, const std::string& data, const std::vector<double>& ref,
                     const Communicator& world, double lr = 0.01) {
  TrainConfig c = base(data, lr);
  c.train.precision = prec;
  c.checkpoint.dir = data + "/ckpt-" + prec;
  TrainResult result;
  std::vector<double> got = run(c, world, &result);
  EXPECT_EQ(got.size(), ref.size()) << prec;
  // train.max_steps stops inside an epoch: that partial epoch is the result's last.
  EXPECT_EQ(result.last.step, kSteps) << prec << ": the result's last epoch is not the one max_steps stopped";
  if (got.size() != ref.size()) return false;
  const double tol = loss_bound(prec);
  double worst = 0;
  for (int s = 0; s < kSteps; ++s) worst = std::max(worst, std::abs(got[s] - ref[s]) / ref[s]);
  if (world.rank() == 0) std::printf("[precision] %s: worst |loss - fp32 loss| / fp32 loss over %d steps %.2e (bound %.2e)\n",
                                     prec.c_str(), kSteps, worst, tol);
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
    EXPECT_EQ(result.last.loss_scale, v[0]) << "the result's loss scale is not the checkpointed one";
  }
  EXPECT_EQ(has_amp, prec == "fp16") << prec << ": only fp16 uses loss scaling";
  return got == ref;
}

class PrecisionRuns : public test_fixtures::SyntheticDataTest {
 protected:
  PrecisionRuns() : SyntheticDataTest("precision", 1024, 64) {}
  std::vector<double> reference(double lr = 0.01) {
    std::vector<double> ref = run(base(data_, lr), world_);
    EXPECT_EQ(ref.size(), static_cast<std::size_t>(kSteps));
    EXPECT_LT(mean3(ref, kSteps - 3), 0.8 * mean3(ref, 0)) << "the fp32 reference did not learn: test setup";
    return ref;
  }
};

TEST_F(PrecisionRuns, Fp16LossScalingTracksFp32AndIsCheckpointed) {
  const std::vector<double> ref = reference();
  ASSERT_EQ(ref.size(), static_cast<std::size_t>(kSteps));
  check_precision("fp16", data_, ref, world_);
}

TEST_F(PrecisionRuns, Tf32AndBf16TrackFp32WhereTheBackendConverts) {
  const std::vector<double> ref = reference();
  ASSERT_EQ(ref.size(), static_cast<std::size_t>(kSteps));
  std::string fp32_only;
  if (check_precision("tf32", data_, ref, world_)) fp32_only = "tf32";
  // bf16 (u = 2^-8) with the calmer learning rate kBf16Lr: the cnn's early loss
  // spikes amplify bf16's roundings (worst step measured 36% off at lr 0.01,
  // 4.4% at 0.003, <= 1.3% at 0.001 against the 3.1% bound with bf16 products
  // only; with bf16 activation storage 2.35% / 0.30% / 0.42% / 0.77% at np 1-4),
  // while each kernel stays within its bound (nn/bf16_kernels, nn/bf16_conv).
  if (check_precision("bf16", data_, reference(kBf16Lr), world_, kBf16Lr))
    fp32_only += cat(fp32_only.empty() ? "" : " and ", "bf16");
  if (fp32_only == "tf32 and bf16")
    GTEST_SKIP() << fp32_only << " ran bitwise as fp32 on this backend: no reduced-precision arithmetic to test";
  if (!fp32_only.empty() && world_.rank() == 0)
    std::printf("[precision] %s ran bitwise as fp32 on this backend (nothing to compare)\n", fp32_only.c_str());
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
