// train.precision = bf16 on the GPU (issue 31, item 3): a vit, whose layers
// all take bfloat16 activations, trains with bf16 storage on CUDA (the bf16
// weight copies and activations through cuBLAS and our kernels, fp32 masters
// and gradients); over 20 steps it follows the fp32 GPU run of the same model
// and data within the bf16 bound of the CPU test (tests/train/mpi_bf16.cpp,
// 4u over 50 steps; the CPU measured 0.0013-0.0020) and is NOT bitwise that
// run (before this, GPU bf16 kept fp32 storage and its losses equalled
// tf32's bitwise on the H100). It passed as a trial of "bf16 activation
// storage" past the GPU validation gate on an H200 on 2026-11-28, and the
// storage is on the gate's list now: the job without the trial runs it too.
#include <gtest/gtest.h>

#include <cmath>

#include "vit_trainer.hpp"

using namespace ringtrain;
using rt_gpu::vit_config;
using rt_gpu::trial_losses;
using test_fixtures::train_losses;

namespace {

constexpr int kSteps = 20;

class GpuBf16Vit : public test_fixtures::SyntheticDataTest {
 protected:
  GpuBf16Vit() : SyntheticDataTest("gpu-bf16-vit", 2048, 64) {}
};

}  // namespace

TEST_F(GpuBf16Vit, FollowsFp32AndIsNotFp32) {
  TrainConfig a = vit_config(data_, "fp32", kSteps), b = vit_config(data_, "bf16", kSteps);
  a.checkpoint.dir = data_ + "/ck32";
  b.checkpoint.dir = data_ + "/ck16";
  const std::vector<double> f32 = train_losses(a, world_), f16 = trial_losses(b, world_, {"bf16 activation storage"});
  // Without the trial: the same bf16 storage (it is on the gate's list), bitwise the run above.
  TrainConfig gated = b;
  gated.checkpoint.dir = data_ + "/ck16-gated";
  EXPECT_EQ(train_losses(gated, world_), f16) << "the job without the trial did not store bf16 as the trial did";
  ASSERT_EQ(f32.size(), static_cast<std::size_t>(kSteps));
  ASSERT_EQ(f16.size(), static_cast<std::size_t>(kSteps));
  EXPECT_NE(f16, f32) << "the bf16 GPU run is bitwise the fp32 one: no bfloat16 storage ran";
  double worst = 0;
  for (int s = 0; s < kSteps; ++s) worst = std::max(worst, std::abs(f16[s] - f32[s]) / f32[s]);
  EXPECT_LE(worst, 4 * std::ldexp(1.0, -8)) << "bf16 strays from fp32 on the GPU";
  if (world_.rank() == 0)
    std::printf("GPU bf16 vs fp32: worst relative loss difference %.4g over %d steps\n", worst, kSteps);
}
