// `model = gpt` on the GPU (issue 45): the token embedding, causal attention
// (the tiled kernel, kernels/attention.cu), LayerNorm, GELU, dropout, the tied
// LM head and the per-token cross-entropy all on CUDA. gpt is not on the GPU
// validation gate's list yet, so the trainer runs it as a trial
// (TrainerHooks::gpu_trial = {"model gpt"}: exactly the gate's name for it,
// src/train/gpu_gate.cpp). At 1, 2 and 4 ranks (data parallel over the global
// batch of 4), in fp32, tf32 and bf16 (float32 storage while the gate does not
// list bf16 activation storage, bfloat16 storage once it does),
// 20 AdamW steps on the byte-level corpus of the CPU gpt tests, with
// sequences of 40 tokens (two attention tiles, the second partial) and
// dropout on, follow the 1-rank CPU run of the same data in fp32:
//  - fp32: every step's loss within 5e-4 relative (cuBLAS and our kernels sum
//    in another order than oneDNN; the CPU's layouts differ by 2e-8);
//  - tf32 and bf16 (16-bit products, float32 sums): within 2e-3
//    relative, 20x what this test's flow measures on the CPU for bf16 (bf16
//    storage) against fp32 at 1-4 ranks (9.3e-5: docs/data/gpt_cpu_bf16_vs_fp32.txt),
//    far inside the bf16 vit tests' 4u = 1.6e-2.
//  Both bounds are estimates until a GPU has run the test: it prints the
//  worst difference, to set them at 10x it.
// Each run learns (the mean of the last 5 losses below the first 5's), and
// without the trial the same job is refused by the gate, naming "model gpt"
// (skipped once the gate lists it).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/train/gpu_gate.hpp"
#include "train/gpt_fixtures.hpp"
#include "vit_trainer.hpp"

using namespace ringtrain;
using rt_gpu::trial_losses;

namespace {

constexpr int kSteps = 20;

TrainConfig gpt_config(const std::string& data) {
  TrainConfig c = test_fixtures::gpt_test_config(data);
  c.model.width = 32;
  c.model.heads = 2;  // head width 16
  c.data.seq_len = 40;
  c.train.max_steps = kSteps;
  c.train.verify_every = 5;  // ranks hold bitwise-identical parameters
  return c;
}

}  // namespace

TEST(GpuGpt, TrialFollowsTheCpuRun) {
  Communicator world = Communicator::world();
  const int w = world.size();
  if (4 % w != 0) GTEST_SKIP() << "the global batch of 4 splits over 1, 2 or 4 ranks";
  const std::string data = test_fixtures::gpt_text_corpus(world, "gpu-gpt");
  const test_fixtures::GptCleanup cleanup{world, std::filesystem::path(data).parent_path()};
  Communicator self = world.split(world.rank(), 0, "self");
  TrainConfig cpu = gpt_config(data);
  cpu.train.device = "cpu";
  const std::vector<double> ref = test_fixtures::train_losses(cpu, self);
  ASSERT_EQ(ref.size(), std::size_t(kSteps));
  ASSERT_LT(test_fixtures::mean5(ref, kSteps - 5), test_fixtures::mean5(ref, 0)) << "the CPU run does not learn";

  for (const char* precision : {"fp32", "tf32", "bf16"}) {
    TrainConfig g = gpt_config(data);
    g.train.device = "cuda";
    g.train.precision = precision;
    g.data.batch_size = 4 / w;
    const std::vector<double> got = trial_losses(g, world, {"model gpt"});
    ASSERT_EQ(got.size(), ref.size()) << precision;
    const std::string p = precision;
    const double bound = p == "fp32" ? 5e-4 : 2e-3;  // relative (the header says why)
    double worst = 0;
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(got[s], ref[s], bound * std::abs(ref[s])) << precision << " at " << w << " ranks, step " << s + 1;
      worst = std::max(worst, std::abs(got[s] - ref[s]) / std::abs(ref[s]));
    }
    EXPECT_LT(test_fixtures::mean5(got, kSteps - 5), test_fixtures::mean5(got, 0)) << precision << ": no learning";
    if (world.rank() == 0)
      std::printf("[gpu gpt] %s, %d rank(s): worst relative loss difference to the 1-rank CPU fp32 run %.3g "
                  "over %d steps, bound %.0e (first %.4f, last %.4f)\n",
                  precision, w, worst, kSteps, bound, got.front(), got.back());
  }

  // Without the trial the gate refuses it by name on every rank (until a GPU run lists it).
  if (gpu_is_verified("model gpt")) return;
  TrainConfig g = gpt_config(data);
  g.train.device = "cuda";
  g.data.batch_size = 4 / w;
  std::string msg;
  try {
    TrainerHooks hooks;
    hooks.report = false;
    Trainer t(g, world, hooks);
  } catch (const Error& e) {
    msg = e.what();
  }
  int named = msg.find("model gpt (model.name = gpt)") != std::string::npos ? 1 : 0;
  allreduce(&named, &named, 1, DType::i32, ReduceOp::sum, world);
  EXPECT_EQ(named, w) << "rank " << world.rank() << ": " << msg;
}
