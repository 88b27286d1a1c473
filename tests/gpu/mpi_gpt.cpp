// `model = gpt` on the GPU (issue 45): the token embedding, causal attention
// (the tiled kernel, kernels/attention.cu), LayerNorm, GELU, dropout, the tied
// LM head and the per-token cross-entropy all on CUDA. It passed on an H200 on
// 2026-11-28 (first as a trial past the gate) and is on the gate's list. At 1,
// 2 and 4 ranks (data parallel over the global batch of 4), in fp32, tf32 and
// bf16 (bfloat16 activation storage), 20 AdamW steps on the byte-level corpus
// of the CPU gpt tests, with sequences of 40 tokens (two attention tiles, the
// second partial) and dropout on, follow the 1-rank CPU run of the same data
// in fp32, within about 10x what the H200 measured at 1 and 2 ranks
// (docs/data/gpu/11-h200-gpt/):
//  - fp32: 1.5e-6 relative (measured 1.3e-7: cuBLAS and our kernels sum in
//    another order than oneDNN);
//  - tf32: 2.5e-4 (measured 2.2e-5);
//  - bf16: 1e-3 (measured 9.3e-5, as the CPU's own bf16 run of this flow:
//    docs/data/gpt_cpu_bf16_vs_fp32.txt).
// Each run learns (the mean of the last 5 losses below the first 5's).
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
    const std::vector<double> got = trial_losses(g, world, {});
    ASSERT_EQ(got.size(), ref.size()) << precision;
    const std::string p = precision;
    const double bound = p == "fp32" ? 1.5e-6 : p == "tf32" ? 2.5e-4 : 1e-3;  // relative (the header says why)
    double worst = 0;
    for (int s = 0; s < kSteps; ++s) {
      EXPECT_NEAR(got[s], ref[s], bound * std::abs(ref[s])) << precision << " at " << w << " ranks, step " << s + 1;
      worst = std::max(worst, std::abs(got[s] - ref[s]) / std::abs(ref[s]));
    }
    EXPECT_LT(test_fixtures::mean5(got, kSteps - 5), test_fixtures::mean5(got, 0)) << precision << ": no learning";
    if (world.rank() == 0)
      std::printf("[gpu gpt] %s, %d rank(s): worst relative loss difference to the 1-rank CPU fp32 run %.3g "
                  "over %d steps, bound %.1e (first %.4f, last %.4f)\n",
                  precision, w, worst, kSteps, bound, got.front(), got.back());
  }

}
