// float16 activations on the CUDA backend (issue 31, item 3; train.precision =
// fp16): the kernels of float32 layers fed fp16 activations against the same
// kernels in float32 within bounds from their reduction lengths, and a vit
// Stage in fp16 (loss-scaled) against fp32 (half_kernels.hpp). Here also the
// loss scaling's overflow path: a scale too large for fp16 turns the stage's
// cast of the loss gradient into inf, which must reach the float32 parameter
// gradients, be found by unscale_grads and skip the step.
// Written and compiled without a GPU; not yet run on one (docs/gpu.md).
#include "half_kernels.hpp"
#include "half_images.hpp"  // Conv2d, BatchNorm2d, pooling (16-bit storage of convolutions)
#include "ringtrain/optim/loss_scale.hpp"

namespace half_test {
INSTANTIATE_TEST_SUITE_P(GpuFp16, Half16, ::testing::Values(kFp16), half_name);

// dlogits of 16 samples reach (1 - p) / 16; times 2^30 that is above fp16's
// largest finite 65504 for any p < 0.999, so the cast gives inf. The fp32
// stage, same scale, stays finite (2^30 is far from float32's range): the
// overflow is fp16 storage's, and the loss scaler answers it by skipping the
// step and halving its scale (GradScaler's rule).
TEST(GpuFp16, LossGradientOverflowIsFoundAndTheStepSkipped) {
  ModelConfig c;
  c.name = "vit";
  c.base_width = 32;
  c.heads = 2;
  c.depth = 1;
  c.mlp_ratio = 2;
  c.patch = 7;
  ModelConfig c16 = c;
  c16.math = MathMode::fp16;
  Stage a(c, gpu()), b(c16, gpu());
  ASSERT_EQ(b.activation_dtype(), DType::f16);
  DeviceRuntime& rt = device_runtime(DeviceKind::cuda);
  const std::int64_t n = 16;
  const double scale = std::ldexp(1.0, 30);
  Tensor x = f32_values({n, 1, 28, 28}, 50).to(gpu()), y = Tensor::empty({n}, DType::i32);
  for (std::int64_t i = 0; i < n; ++i) y.data<std::int32_t>()[i] = std::int32_t(i % 10);
  Tensor yd = y.to(gpu());
  bool finite[2];
  Stage* st[2] = {&a, &b};
  for (int k = 0; k < 2; ++k) {
    st[k]->zero_grads();
    Tensor dl = Tensor::empty(st[k]->output_shape(n), DType::f32, gpu());
    be().softmax_xent(st[k]->forward(0, x, Mode::train), yd, 0.0, dl);
    rt.scale(dl, scale);
    test_support::backward(*st[k], dl);
    finite[k] = rt.unscale_grads(st[k]->arena(), 1.0 / scale);
  }
  EXPECT_TRUE(finite[0]) << "fp32 overflowed at 2^30: the test no longer isolates fp16's range";
  EXPECT_FALSE(finite[1]) << "the fp16 loss gradient overflowed to inf but the float32 gradients look finite";
  LossScaler sc;
  const float before = sc.scale();
  EXPECT_FALSE(sc.update(finite[1])) << "the step must be skipped";
  EXPECT_EQ(sc.scale(), before * 0.5f);
  EXPECT_EQ(sc.state().skipped, 1);
}
}  // namespace half_test
