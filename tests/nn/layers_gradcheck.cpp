// Finite-difference gradient checks for every layer: input and parameter
// gradients of L = sum(y * r) with random non-zero x, parameters and r.
#include "layer_harness.hpp"

using namespace ringtrain;
using namespace rt_test;

namespace {

Conv2dSpec conv_spec(std::int64_t ci, std::int64_t co, std::int64_t k, std::int64_t stride, std::int64_t pad,
                     std::int64_t dil, bool bias, bool relu) {
  Conv2dSpec s;
  s.in_channels = ci;
  s.out_channels = co;
  s.kernel_h = s.kernel_w = k;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  s.dilation_h = s.dilation_w = dil;
  s.bias = bias;
  s.fuse_relu = relu;
  return s;
}

}  // namespace

TEST(GradCheck, Linear) {
  LinearSpec s{7, 5, true, false};
  Harness h(std::make_unique<Linear>("fc", s));
  h.randomize_params(3);
  GradCheck{}.run(h, random_tensor({4, 7}, 11));
}

TEST(GradCheck, LinearFusedRelu) {
  LinearSpec s{9, 6, true, true};
  Harness h(std::make_unique<Linear>("fc", s));
  h.randomize_params(4);
  GradCheck gc;
  gc.eps = 1e-3;  // stay on one side of ReLU's kink
  gc.run(h, random_tensor({5, 9}, 12));
}

TEST(GradCheck, Conv2dPaddedBias) {
  Harness h(std::make_unique<Conv2d>("conv", conv_spec(3, 4, 3, 1, 1, 1, true, false)));
  h.randomize_params(5);
  GradCheck{}.run(h, random_tensor({2, 3, 6, 5}, 13));
}

TEST(GradCheck, Conv2dStrideDilationNoBias) {
  Harness h(std::make_unique<Conv2d>("conv", conv_spec(2, 3, 3, 2, 2, 2, false, false)));
  h.randomize_params(6);
  Tensor x = random_tensor({2, 2, 9, 8}, 14);
  GradCheck{}.run(h, x);
  // PyTorch's output size rule: (9 + 4 - 2*2 - 1) / 2 + 1 = 5, (8 + 4 - 5) / 2 + 1 = 4.
  EXPECT_EQ(h.layer->output_shape(x.shape()), (Shape{2, 3, 5, 4}));
}

TEST(GradCheck, Conv2dFusedRelu) {
  Harness h(std::make_unique<Conv2d>("conv", conv_spec(2, 4, 3, 1, 1, 1, true, true)));
  h.randomize_params(7);
  GradCheck gc;
  gc.eps = 1e-3;
  gc.run(h, random_tensor({2, 2, 5, 5}, 15));
}

TEST(GradCheck, Conv2dOneByOneStride2) {
  Harness h(std::make_unique<Conv2d>("conv", conv_spec(4, 8, 1, 2, 0, 1, false, false)));
  h.randomize_params(8);
  GradCheck{}.run(h, random_tensor({3, 4, 6, 6}, 16));
}

TEST(GradCheck, BatchNormTrain) {
  BatchNormSpec s;
  s.channels = 3;
  Harness h(std::make_unique<BatchNorm2d>("bn", s));
  h.randomize_params(9, 0.5, 1.5);
  GradCheck gc;
  gc.eps = 3e-3;
  gc.rtol = 2e-2;
  gc.run(h, random_tensor({4, 3, 3, 3}, 17, 0.1, 2.0));
}

TEST(GradCheck, BatchNormTrainBlockedChannels) {  // C % 8 == 0: oneDNN runs in nChw8c/16c
  BatchNormSpec s;
  s.channels = 16;
  Harness h(std::make_unique<BatchNorm2d>("bn", s));
  h.randomize_params(11, 0.5, 1.5);
  GradCheck gc;
  gc.eps = 3e-3;
  gc.rtol = 2e-2;
  gc.run(h, random_tensor({3, 16, 2, 3}, 19, 0.1, 2.0));
}

TEST(GradCheck, BatchNormEval) {
  BatchNormSpec s;
  s.channels = 3;
  Harness h(std::make_unique<BatchNorm2d>("bn", s));
  h.randomize_params(10, 0.5, 1.5);
  // Non-trivial running statistics from a few train-mode batches.
  for (int i = 0; i < 3; ++i) h.layer->forward(random_tensor({4, 3, 3, 3}, 30 + i, 0.1, 3.0), Mode::train);
  GradCheck gc;
  gc.mode = Mode::eval;
  gc.run(h, random_tensor({2, 3, 4, 3}, 18));
}

TEST(GradCheck, ReLU) {
  Harness h(std::make_unique<Activation>("relu", Eltwise::relu));
  GradCheck gc;
  gc.eps = 1e-3;
  gc.run(h, distinct_tensor({2, 3, 4, 5}, 19));
}

TEST(GradCheck, GELU) {
  Harness h(std::make_unique<Activation>("gelu", Eltwise::gelu));
  GradCheck gc;
  gc.eps = 1e-2;
  gc.run(h, random_tensor({2, 3, 4, 5}, 20, 0.05, 3.0));
}

// GPT-2's tanh approximation: the forward against the formula in double, the backward by finite differences;
// it differs from the erf form by up to ~5e-4 (at |x| ~ 2), so the test would see the wrong one.
TEST(GradCheck, GELUTanh) {
  Harness h(std::make_unique<Activation>("gelu", Eltwise::gelu_tanh));
  const Tensor x = random_tensor({2, 3, 4, 5}, 20, 0.05, 3.0);
  const Tensor y = h.layer->forward(x, Mode::train);
  double max_err = 0, max_gap = 0;
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.data<float>()[i];
    const double tanh_form = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    const double erf_form = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    max_err = std::max(max_err, std::abs(y.data<float>()[i] - tanh_form));
    max_gap = std::max(max_gap, std::abs(tanh_form - erf_form));
  }
  EXPECT_LT(max_err, 1e-6);
  EXPECT_GT(max_gap, 1e-4);
  GradCheck gc;
  gc.eps = 1e-2;
  gc.run(h, x);
}

TEST(GradCheck, MaxPool3x3Stride2Pad1) {
  Pool2dSpec s{PoolKind::max, 3, 3, 2, 2, 1, 1};
  Harness h(std::make_unique<Pool2d>("pool", s));
  Tensor x = distinct_tensor({2, 3, 7, 6}, 21);
  GradCheck gc;
  gc.eps = 2e-3;  // below half the spacing of distinct values
  gc.run(h, x);
  EXPECT_EQ(h.layer->output_shape(x.shape()), (Shape{2, 3, 4, 3}));
}

TEST(GradCheck, MaxPool2x2) {
  Harness h(std::make_unique<Pool2d>("pool", Pool2dSpec{}));
  GradCheck gc;
  gc.eps = 2e-3;
  gc.run(h, distinct_tensor({2, 2, 5, 6}, 22));  // odd height: last row dropped (floor)
}

TEST(GradCheck, AvgPoolPadded) {
  Pool2dSpec s{PoolKind::avg, 3, 3, 2, 2, 1, 1};
  Harness h(std::make_unique<Pool2d>("pool", s));
  GradCheck{}.run(h, random_tensor({2, 3, 6, 7}, 23));
}

TEST(GradCheck, GlobalAvgPool) {
  Harness h(std::make_unique<Pool2d>("gap", Pool2dSpec{}, true));
  Tensor x = random_tensor({3, 4, 5, 6}, 24);
  GradCheck{}.run(h, x);
  // Each output is the mean of its plane.
  Tensor y = h.layer->forward(x, Mode::eval);
  double s = 0;
  for (int i = 0; i < 30; ++i) s += x.data<float>()[i];
  EXPECT_NEAR(y.data<float>()[0], s / 30, 1e-6);
}

TEST(GradCheck, DropoutTrain) {
  auto d = std::make_unique<Dropout>("drop", 0.3);
  Dropout* dp = d.get();
  Harness h(std::move(d));
  GradCheck gc;
  gc.before_forward = [dp] { dp->set_call_count(0); };  // same mask for every evaluation
  gc.run(h, random_tensor({4, 50}, 25));
}

TEST(GradCheck, Flatten) {
  Harness h(std::make_unique<Flatten>("flat"));
  Tensor x = random_tensor({2, 3, 2, 2}, 26);
  GradCheck{}.run(h, x);
  EXPECT_EQ(h.layer->forward(x, Mode::eval).shape(), (Shape{2, 12}));
}

TEST(GradCheck, ResidualBlockWithProjection) {
  Harness h(basic_block("block", 2, 4, 2));
  h.randomize_params(27, 0.3, 1.0);
  GradCheck gc;
  gc.eps = 1e-3;
  gc.rtol = 3e-2;
  gc.atol_frac = 5e-3;
  gc.run(h, random_tensor({4, 2, 6, 6}, 28));
  EXPECT_EQ(h.arena.size(), 9u);  // conv1, bn1 (2), conv2, bn2 (2), shortcut.conv, shortcut.bn (2)
  EXPECT_EQ(h.arena.info(6).name, "block.shortcut.conv.weight");
}

TEST(GradCheck, ResidualBlockIdentity) {
  Harness h(basic_block("block", 3, 3, 1));
  h.randomize_params(29, 0.3, 1.0);
  GradCheck gc;
  gc.eps = 1e-3;
  gc.rtol = 3e-2;
  gc.atol_frac = 5e-3;
  gc.run(h, random_tensor({4, 3, 5, 5}, 30));
  EXPECT_EQ(h.arena.size(), 6u);  // conv1.weight, bn1.{weight,bias}, conv2.weight, bn2.{weight,bias}
}

TEST(GradCheck, SequentialOfLayers) {
  std::vector<LayerPtr> ls;
  ls.push_back(std::make_unique<Conv2d>("c", conv_spec(2, 3, 3, 1, 1, 1, true, false)));
  ls.push_back(std::make_unique<Activation>("g", Eltwise::gelu));
  ls.push_back(std::make_unique<Pool2d>("p", Pool2dSpec{PoolKind::avg}));
  ls.push_back(std::make_unique<Flatten>("f"));
  ls.push_back(std::make_unique<Linear>("l", LinearSpec{18, 4, true, false}));
  Harness h(std::make_unique<Sequential>("seq", std::move(ls)));
  h.randomize_params(31);
  GradCheck gc;
  gc.rtol = 2e-2;
  gc.run(h, random_tensor({2, 2, 4, 6}, 32));
  EXPECT_EQ(h.arena.info(0).name, "seq.c.weight");
}

TEST(GradCheck, Conv2dFusedReluMaxPool) {
  // Small, so that no weight perturbation moves a pooled maximum or a ReLU
  // input across a kink (FusedConv.MatchesSeparateLayers covers big shapes).
  Conv2dSpec s = conv_spec(3, 4, 3, 1, 1, 1, true, true);
  s.fuse_pool = true;  // default pool: max 2x2 stride 2
  Harness h(std::make_unique<Conv2d>("conv", s));
  h.randomize_params(33);
  GradCheck gc;
  gc.eps = 1e-3;
  Tensor x = random_tensor({1, 3, 4, 5}, 34);
  gc.run(h, x);
  EXPECT_EQ(h.layer->output_shape(x.shape()), (Shape{1, 4, 2, 2}));
  EXPECT_STREQ(h.layer->type(), "Conv2d+ReLU+MaxPool2d");
}

TEST(GradCheck, Conv2dFusedAvgPoolNoRelu) {
  Conv2dSpec s = conv_spec(2, 4, 3, 1, 0, 1, false, false);
  s.fuse_pool = true;
  s.pool = Pool2dSpec{PoolKind::avg, 3, 3, 2, 2, 1, 1};
  Harness h(std::make_unique<Conv2d>("conv", s));
  h.randomize_params(35);
  GradCheck{}.run(h, random_tensor({2, 2, 8, 8}, 36));
}

// The fused layer computes exactly what the separate layers compute.
class FusedConv : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(FusedConv, MatchesSeparateLayers) {
  auto [cout, h, w] = GetParam();
  Conv2dSpec s = conv_spec(3, cout, 3, 1, 1, 1, true, true);
  Harness sep(std::make_unique<Conv2d>("c", s));
  s.fuse_pool = true;
  Harness fused(std::make_unique<Conv2d>("c", s));
  sep.randomize_params(37);
  fused.randomize_params(37);
  Harness pool(std::make_unique<Pool2d>("p", Pool2dSpec{}));
  Tensor x = random_tensor({4, 3, h, w}, 38);
  Tensor y1 = pool.layer->forward(sep.layer->forward(x, Mode::train), Mode::train);
  Tensor y2 = fused.layer->forward(x, Mode::train);
  ASSERT_EQ(y1.shape(), y2.shape());
  for (std::int64_t i = 0; i < y1.numel(); ++i) EXPECT_NEAR(y1.data<float>()[i], y2.data<float>()[i], 1e-5);
  Tensor r = random_tensor(y1.shape(), 39);
  Tensor dx1 = sep.layer->backward(pool.layer->backward(r, true, false), true, false);
  Tensor dx2 = fused.layer->backward(r, true, false);
  for (std::int64_t i = 0; i < dx1.numel(); ++i) EXPECT_NEAR(dx1.data<float>()[i], dx2.data<float>()[i], 1e-5);
  for (std::size_t p = 0; p < 2; ++p)
    for (std::int64_t i = 0; i < sep.arena.grad(p).numel(); ++i)
      EXPECT_NEAR(sep.arena.grad(p).data<float>()[i], fused.arena.grad(p).data<float>()[i], 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Shapes, FusedConv,
                         ::testing::Values(std::make_tuple(16, 10, 10), std::make_tuple(8, 6, 7),
                                           std::make_tuple(8, 7, 7), std::make_tuple(5, 6, 6)));

TEST(GradCheck, Conv2dFusedReluAvgPool) {
  Conv2dSpec s = conv_spec(2, 3, 3, 1, 1, 1, true, true);
  s.fuse_pool = true;
  s.pool = Pool2dSpec{PoolKind::avg, 2, 2, 2, 2, 0, 0};
  Harness h(std::make_unique<Conv2d>("conv", s));
  h.randomize_params(40);
  GradCheck gc;
  gc.eps = 1e-3;
  gc.run(h, random_tensor({1, 2, 4, 6}, 41));
  EXPECT_STREQ(h.layer->type(), "Conv2d+ReLU+AvgPool2d");
}
