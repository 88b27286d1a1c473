// The trainer on the GPU (train.device = cuda), at 1–4 ranks sharing the GPUs:
// the same short `cnn` run as on the CPU (same seed and data) reaches the CPU
// run's test accuracy in fp32, and in bf16 and fp16 (loss scaling) as well;
// parameters stay bitwise identical on every rank (train.verify_every), and a
// GPU checkpoint resumes on the CPU (shared state names and layouts); two
// identical GPU runs end with bitwise-identical parameters (deterministic
// cuDNN algorithms, fixed-order reductions). Layouts the GPU validation gate
// does not list are refused by name; pipeline 2 runs as a trial past the gate
// and follows the 1-rank CPU run (not yet run on a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/train/trainer.hpp"
#include "train/fixtures.hpp"

using namespace ringtrain;

namespace {

TrainResult train(TrainConfig c, const Communicator& world, std::vector<float>* params = nullptr) {
  TrainerHooks hooks;
  hooks.report = false;
  Trainer t(c, world, hooks);
  TrainResult r = t.fit();
  if (params) {
    Tensor p = t.parameters().params_flat(DType::f32).to(Device::cpu());
    params->assign(p.data<float>(), p.data<float>() + p.numel());
  }
  return r;
}

// The fixture's lr 0.05 spikes the loss of this synthetic set to 20-25 in the
// first steps on every device; on the H100, run-to-run noise then decided
// whether a bf16 run ended at 10% or 100%. A gentler start learns it as fully
// (100% on the CPU at 1 and 2 ranks, fp32 and bf16) without the spike.
TrainConfig stable_config(const std::string& data) {
  TrainConfig c = test_fixtures::small_config(data);
  c.optimizer.lr = 0.005;
  c.schedule.warmup_epochs = 0.25;
  return c;
}

}  // namespace

TEST(GpuTrainer, CnnReachesTheCpuAccuracyInEveryPrecision) {
  Communicator world = Communicator::world();
  std::string data = test_fixtures::synthetic_mnist_like(world, "gpu-trainer", 2048, 512);
  TrainConfig c = stable_config(data);
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

TEST(GpuTrainer, RepeatedRunsAreBitwiseIdentical) {
  Communicator world = Communicator::world();
  std::string data = test_fixtures::synthetic_mnist_like(world, "gpu-repeat", 1024, 256);
  TrainConfig c = stable_config(data);
  c.data.batch_size = 32;
  c.train.device = "cuda";
  c.train.precision = "bf16";
  // Static buckets: at 3+ ranks the fusion engine's timing-dependent batches
  // otherwise change the order of the ring's sums (282 of 421,642 parameters
  // differed at 3 ranks, 20,087 at 4 on the H100; 1 and 2 ranks were bitwise).
  c.comm.deterministic = true;
  std::vector<float> a, b;
  c.checkpoint.dir = data + "/ckpt-a";
  TrainResult ra = train(c, world, &a);
  c.checkpoint.dir = data + "/ckpt-b";
  TrainResult rb = train(c, world, &b);
  ASSERT_EQ(a.size(), b.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  EXPECT_EQ(differ, 0u) << "of " << a.size() << " parameters differ between two identical runs";
  EXPECT_EQ(ra.last.train_loss, rb.last.train_loss);
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(data);
}

// Layouts the GPU validation gate does not list (train/gpu_gate.hpp) are
// refused on CUDA by name, on every rank, before the trainer opens the data or
// any rank waits (LARS and the shared-memory all-reduce have not run on a GPU).
TEST(GpuTrainer, LayoutsOffTheGateAreRefusedByName) {
  Communicator world = Communicator::world();
  struct Case {
    const char* set;
    const char* names;
  };
  for (const Case k : {Case{"optimizer.name=lars", "optimizer lars (optimizer.name = lars)"},
                       Case{"comm.algorithm=shm", "device all-reduce shm (comm.algorithm = shm)"}}) {
    TrainConfig c;
    c.train.device = "cuda";
    c.data.train = c.data.test = "/nonexistent/gpu-gate";
    c.set(k.set);
    std::string msg;
    try {
      TrainerHooks hooks;
      hooks.report = false;
      Trainer t(c, world, hooks);
    } catch (const Error& e) {
      msg = e.what();
    }
    int named = msg.find(k.names) != std::string::npos && msg.find("GPU validation gate") != std::string::npos;
    allreduce(&named, &named, 1, DType::i32, ReduceOp::sum, world);
    EXPECT_EQ(named, world.size()) << k.set << " on rank " << world.rank() << ": " << msg;
  }
}

// Pipeline parallelism on the GPU (issue 19: one trainer, every layout on every
// device; stage activations staged through host memory). It passed on an H200
// on 2026-11-28 (then as a trial past the gate) and is on the gate's list now.
// At 2 and 4 ranks, pipeline 2
// (data 2 x pipeline 2 at 4) follows the 1-rank CPU run of the same global
// batch: per-step losses within 1e-3 (cuDNN/cuBLAS sum in another order than
// oneDNN), and the same test accuracy within 2 points.
TEST(GpuTrainer, PipelineTrialFollowsTheCpuRun) {
  Communicator world = Communicator::world();
  const int w = world.size();
  if (w != 2 && w != 4) GTEST_SKIP() << "pipeline 2 needs 2 or 4 ranks";
  std::string data = test_fixtures::synthetic_mnist_like(world, "gpu-grid", 1024, 256);
  TrainConfig c = stable_config(data);
  c.model.dropout = 0.2;
  c.train.epochs = 1;
  auto losses_of = [&](TrainConfig t, const Communicator& comm, double* acc, std::vector<std::string> trial) {
    TrainerHooks hooks;
    hooks.report = false;
    hooks.gpu_trial = std::move(trial);
    std::vector<double> out;
    hooks.on_step = [&](std::int64_t, double l) { out.push_back(l); };
    Trainer tr(t, comm, hooks);
    TrainResult r = tr.fit();
    if (acc) *acc = r.best_test_accuracy;
    return out;
  };
  Communicator self = world.split(world.rank(), 0, "self");
  TrainConfig cpu = c;
  cpu.train.device = "cpu";
  cpu.data.batch_size = 32;
  double ref_acc = 0;
  const std::vector<double> ref = losses_of(cpu, self, &ref_acc, {});
  TrainConfig g = c;
  g.train.device = "cuda";
  g.parallel.pipeline = 2;
  g.data.batch_size = 32 / (w / 2);
  double acc = 0;
  const std::vector<double> got = losses_of(g, world, &acc, {});
  ASSERT_EQ(got.size(), ref.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], ref[i], 1e-3 * (1 + std::abs(ref[i]))) << "pipeline 2, step " << i + 1;
  EXPECT_NEAR(acc, ref_acc, 0.02) << "pipeline 2";
  // The other schedules (ZB-H1's deferred W, interleaved's and ZB-V's two chunks
  // per rank) as trials of their gate features, against the same CPU run.
  for (const char* s : {"zb-h1", "interleaved", "zb-v"}) {
    TrainConfig z = g;
    z.parallel.schedule = s;
    const std::vector<double> zs = losses_of(z, world, nullptr, {std::string("pipeline schedule ") + s});
    ASSERT_EQ(zs.size(), ref.size()) << s;
    for (std::size_t i = 0; i < zs.size(); ++i)
      EXPECT_NEAR(zs[i], ref[i], 1e-3 * (1 + std::abs(ref[i]))) << s << ", step " << i + 1;
  }
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(data);
}
