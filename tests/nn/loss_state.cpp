// Loss (finite differences and a float64 formula), accuracy, BatchNorm
// running statistics, dropout determinism, gradient accumulation, bad input.
#include "layer_harness.hpp"
#include "ringtrain/nn/loss.hpp"

using namespace ringtrain;
using namespace rt_test;

namespace {

Tensor labels_i32(std::vector<std::int32_t> v) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(v.size())}, DType::i32);
  std::copy(v.begin(), v.end(), t.data<std::int32_t>());
  return t;
}

// Independent float64 reference: mean over rows of -sum_j t_j log softmax(z)_j.
double ref_loss(const Tensor& z, const std::vector<std::int32_t>& y, double s) {
  const std::int64_t n = z.dim(0), k = z.dim(1);
  double total = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    double m = -1e300, sum = 0;
    for (std::int64_t j = 0; j < k; ++j) m = std::max(m, double(z.data<float>()[i * k + j]));
    for (std::int64_t j = 0; j < k; ++j) sum += std::exp(double(z.data<float>()[i * k + j]) - m);
    for (std::int64_t j = 0; j < k; ++j) {
      double t = (j == y[i] ? 1 - s : 0) + s / double(k);
      total -= t * (double(z.data<float>()[i * k + j]) - m - std::log(sum));
    }
  }
  return total / double(n);
}

}  // namespace

class LossTest : public ::testing::TestWithParam<double> {};

TEST_P(LossTest, MatchesFormulaAndFiniteDifferences) {
  const double smoothing = GetParam();
  Tensor z = random_tensor({6, 5}, 41, 0.1, 3.0);
  std::vector<std::int32_t> y = {0, 4, 2, 2, 1, 3};
  Tensor lab = labels_i32(y);
  LossResult r = softmax_cross_entropy(z, lab, smoothing);
  EXPECT_NEAR(r.loss, ref_loss(z, y, smoothing), 1e-6);
  // Rows of dlogits sum to zero (softmax minus a distribution).
  for (int i = 0; i < 6; ++i) {
    double s = 0;
    for (int j = 0; j < 5; ++j) s += r.dlogits.data<float>()[i * 5 + j];
    EXPECT_NEAR(s, 0, 1e-7);
  }
  float* p = z.data<float>();
  for (std::int64_t i = 0; i < z.numel(); ++i) {
    const float o = p[i], up = o + 1e-2f, dn = o - 1e-2f;
    p[i] = up;
    double lu = softmax_cross_entropy_loss(z, lab, smoothing);
    p[i] = dn;
    double ld = softmax_cross_entropy_loss(z, lab, smoothing);
    p[i] = o;
    EXPECT_NEAR((lu - ld) / (double(up) - double(dn)), r.dlogits.data<float>()[i], 2e-5) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Smoothing, LossTest, ::testing::Values(0.0, 0.1));

TEST(Loss, Int64LabelsAndAccuracy) {
  Tensor z = Tensor::empty({3, 3});
  float v[] = {1, 5, 2, /**/ 3, 3, 0, /**/ 0, 1, 9};  // argmax 1, 0 (first of a tie), 2
  std::copy(v, v + 9, z.data<float>());
  Tensor lab = Tensor::empty({3}, DType::i64);
  std::int64_t l[] = {1, 1, 2};
  std::copy(l, l + 3, lab.data<std::int64_t>());
  EXPECT_EQ(count_correct(z, lab), 2);
  EXPECT_DOUBLE_EQ(top1_accuracy(z, lab), 2.0 / 3.0);
}

TEST(Loss, BadInputNamesTheProblem) {
  Tensor z = random_tensor({2, 3}, 1);
  try {
    softmax_cross_entropy_loss(z, labels_i32({0, 7}));
    FAIL() << "no error for an out-of-range label";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 7"), std::string::npos) << e.what();
  }
  EXPECT_THROW(softmax_cross_entropy_loss(z, labels_i32({0})), Error);
  EXPECT_THROW(softmax_cross_entropy_loss(z, labels_i32({0, 1}), 1.0), Error);
}

TEST(BatchNorm, RunningStatisticsFollowPyTorchRule) {
  BatchNormSpec s;
  s.channels = 2;
  s.momentum = 0.25;
  auto bn = std::make_unique<BatchNorm2d>("bn", s);
  BatchNorm2d* p = bn.get();
  Harness h(std::move(bn));
  Tensor x = random_tensor({3, 2, 2, 2}, 51, 0.1, 2.0);
  h.layer->forward(x, Mode::train);
  auto bufs = p->buffers();
  ASSERT_EQ(bufs.size(), 2u);
  EXPECT_EQ(bufs[0].name, "bn.running_mean");
  for (int c = 0; c < 2; ++c) {
    double m = 0, v = 0;
    std::vector<double> vals;
    for (int n = 0; n < 3; ++n)
      for (int k = 0; k < 4; ++k) vals.push_back(x.data<float>()[(n * 2 + c) * 4 + k]);
    for (double a : vals) m += a / 12;
    for (double a : vals) v += (a - m) * (a - m) / 11;  // unbiased
    EXPECT_NEAR(bufs[0].tensor.data<float>()[c], 0.25 * m, 1e-6);
    EXPECT_NEAR(bufs[1].tensor.data<float>()[c], 0.75 + 0.25 * v, 1e-5);
  }
  // Eval mode uses the running statistics: y = (x - rm) / sqrt(rv + eps) (gamma 1, beta 0).
  Tensor y = h.layer->forward(x, Mode::eval);
  for (int i = 0; i < 24; ++i) {
    int c = (i / 4) % 2;
    double rm = bufs[0].tensor.data<float>()[c], rv = bufs[1].tensor.data<float>()[c];
    EXPECT_NEAR(y.data<float>()[i], (x.data<float>()[i] - rm) / std::sqrt(rv + 1e-5), 1e-5);
  }
}

TEST(Dropout, DeterministicBySeedAndCall) {
  auto run = [](std::uint64_t seed, std::uint64_t call) {
    auto d = std::make_unique<Dropout>("drop", 0.4);
    Dropout* dp = d.get();
    Harness h(std::move(d), seed);
    dp->set_call_count(call);
    return h.layer->forward(random_tensor({8, 1000}, 3), Mode::train).clone();
  };
  Tensor a = run(5, 0), b = run(5, 0), c = run(6, 0), d = run(5, 1);
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
  EXPECT_NE(std::memcmp(a.raw(), c.raw(), a.nbytes()), 0);
  EXPECT_NE(std::memcmp(a.raw(), d.raw(), a.nbytes()), 0);
  Tensor x = random_tensor({8, 1000}, 3);
  std::int64_t zeros = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    float v = a.data<float>()[i];
    if (v == 0) ++zeros;
    else EXPECT_FLOAT_EQ(v, x.data<float>()[i] / 0.6f);
  }
  EXPECT_NEAR(double(zeros) / 8000, 0.4, 0.03);
  // Eval mode is the identity.
  Harness h(std::make_unique<Dropout>("drop", 0.4));
  Tensor e = h.layer->forward(x, Mode::eval);
  EXPECT_EQ(std::memcmp(e.raw(), x.raw(), x.nbytes()), 0);
}

TEST(Accumulate, SecondBackwardAddsParameterGradients) {
  Conv2dSpec s;
  s.in_channels = 2;
  s.out_channels = 3;
  s.pad_h = s.pad_w = 1;
  for (bool relu : {false, true}) {
    s.fuse_relu = relu;
    Harness h(std::make_unique<Conv2d>("c", s));
    h.randomize_params(3);
    Tensor x1 = random_tensor({2, 2, 4, 4}, 1), x2 = random_tensor({2, 2, 4, 4}, 2);
    Tensor r = random_tensor({2, 3, 4, 4}, 9);
    h.layer->forward(x1, Mode::train);
    h.layer->backward(r, false, false);
    Tensor g1 = h.arena.grad(0).clone(), b1 = h.arena.grad(1).clone();
    h.layer->forward(x2, Mode::train);
    h.layer->backward(r, false, false);
    Tensor g2 = h.arena.grad(0).clone(), b2 = h.arena.grad(1).clone();
    h.layer->forward(x1, Mode::train);
    h.layer->backward(r, false, true);  // accumulate onto x2's gradients
    for (std::int64_t i = 0; i < g1.numel(); ++i)
      EXPECT_NEAR(h.arena.grad(0).data<float>()[i], g1.data<float>()[i] + g2.data<float>()[i], 1e-5);
    for (std::int64_t i = 0; i < b1.numel(); ++i)
      EXPECT_NEAR(h.arena.grad(1).data<float>()[i], b1.data<float>()[i] + b2.data<float>()[i], 1e-5);
  }
}

TEST(Layers, WrongShapesNameTheLayer) {
  Harness h(std::make_unique<Linear>("fc7", LinearSpec{4, 2}));
  try {
    h.layer->forward(random_tensor({3, 5}, 1), Mode::eval);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fc7"), std::string::npos) << e.what();
  }
  Conv2dSpec spec;
  spec.in_channels = 3;
  spec.out_channels = 4;
  Harness c(std::make_unique<Conv2d>("conv9", spec));
  EXPECT_THROW(c.layer->forward(random_tensor({1, 2, 5, 5}, 1), Mode::eval), Error);
  EXPECT_THROW(c.layer->forward(random_tensor({1, 3, 2, 2}, 1), Mode::eval), Error);  // smaller than the kernel
  EXPECT_THROW(Dropout("d", 1.0), Error);
  Harness f(std::make_unique<Linear>("fc", LinearSpec{4, 2}));
  EXPECT_THROW(f.layer->backward(random_tensor({3, 2}, 1), true, false), Error);  // before forward
}

// The same layer math with two threads: equal to one thread up to float
// rounding, and bitwise repeatable at a fixed thread count.
TEST(Threads, TwoThreadsMatchOneAndRepeatBitwise) {
  Conv2dSpec s;
  s.in_channels = 8;
  s.out_channels = 16;
  s.pad_h = s.pad_w = 1;
  s.fuse_relu = true;
  s.fuse_pool = true;
  Tensor x = random_tensor({8, 8, 12, 12}, 61);
  Tensor r = random_tensor({8, 16, 6, 6}, 62);
  auto run = [&](int threads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);  // oneDNN sizes its primitives when they are created
    Harness h(std::make_unique<Conv2d>("c", s));
    h.randomize_params(63);
    Tensor y = h.layer->forward(x, Mode::train).clone();
    Tensor dx = h.layer->backward(r, true, false).clone();
    Tensor dw = h.arena.grad(0).clone();
    omp_set_num_threads(saved);
    return std::vector<Tensor>{y, dx, dw};
  };
  auto one = run(1), two = run(2), again = run(2);
  for (std::size_t k = 0; k < one.size(); ++k) {
    EXPECT_EQ(std::memcmp(two[k].raw(), again[k].raw(), two[k].nbytes()), 0) << "output " << k;
    for (std::int64_t i = 0; i < one[k].numel(); ++i)
      EXPECT_NEAR(one[k].data<float>()[i], two[k].data<float>()[i], 1e-4 * (1 + std::fabs(one[k].data<float>()[i])));
  }
}
