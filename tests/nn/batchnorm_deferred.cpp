// BatchNorm2d's deferred running statistics (pipeline micro-batches,
// torchgpipe's DeferredBatchNorm): m micro-batch forwards + one commit end with
// the running statistics of ONE normal-mode forward over the whole batch, and
// of a float64 formula; the micro-batch outputs and gradients are those of the
// normal layer on that micro-batch.
#include "layer_harness.hpp"

namespace ringtrain {
namespace {

using rt_test::Harness;
using rt_test::random_tensor;

constexpr std::int64_t kC = 3, kN = 16, kH = 5, kW = 4;

BatchNorm2d& bn(Harness& h) { return static_cast<BatchNorm2d&>(*h.layer); }

LayerPtr make_bn(double momentum = 0.1) {
  BatchNormSpec s;
  s.channels = kC;
  s.momentum = momentum;
  return std::make_unique<BatchNorm2d>("bn", s);
}

// [kN, kC, kH, kW] with a different offset and scale per channel (a mean far
// from zero: the variance merge must not cancel).
Tensor batch(std::uint64_t seed) {
  Tensor x = random_tensor({kN, kC, kH, kW}, seed, 0.0, 1.0);
  float* p = x.data<float>();
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    const std::int64_t c = (i / (kH * kW)) % kC;
    p[i] = static_cast<float>(p[i] * (0.5 + c) + 3.0 * (c - 1) + 0.25);
  }
  return x;
}

void expect_close(const Tensor& got, const Tensor& want, double rtol, const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel());
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.data<float>()[i], w = want.data<float>()[i];
    EXPECT_NEAR(g, w, rtol * std::max(1.0, std::abs(w))) << what << "[" << i << "]";
  }
}

// The buffers of a BatchNorm: [0] running_mean, [1] running_var.
Tensor buf(Harness& h, int k) { return h.layer->buffers().at(static_cast<std::size_t>(k)).tensor; }

// m micro-batch forwards of `x` in deferred mode, then the commit.
void deferred_step(Harness& h, const Tensor& x, int m) {
  const std::int64_t mb = kN / m;
  for (int i = 0; i < m; ++i) h.layer->forward(x.slice_rows(i * mb, (i * mb) + mb), Mode::train);
  bn(h).commit_deferred_stats();
}

class DeferredBatchNorm : public testing::TestWithParam<int> {};

TEST_P(DeferredBatchNorm, MicroBatchesEqualOneWholeBatchForward) {
  const int m = GetParam();
  Harness whole(make_bn()), def(make_bn());
  bn(def).set_deferred_stats(true);
  ASSERT_TRUE(bn(def).deferred_stats());
  for (int step = 0; step < 3; ++step) {  // three steps: the momentum composes as three whole-batch updates
    const Tensor x = batch(100 + static_cast<std::uint64_t>(step));
    whole.layer->forward(x, Mode::train);
    deferred_step(def, x, m);
    const std::string what = cat("m=", m, " step ", step, " ");
    expect_close(buf(def, 0), buf(whole, 0), 1e-6, what + "running_mean");
    expect_close(buf(def, 1), buf(whole, 1), 1e-6, what + "running_var");
  }
}

TEST_P(DeferredBatchNorm, MatchesAFloat64Formula) {
  const int m = GetParam();
  const double mom = 0.3;
  Harness def(make_bn(mom));
  bn(def).set_deferred_stats(true);
  const Tensor x = batch(7);
  deferred_step(def, x, m);
  const std::int64_t hw = kH * kW, cnt = kN * hw;
  for (std::int64_t c = 0; c < kC; ++c) {
    double s = 0, ss = 0;
    for (std::int64_t n = 0; n < kN; ++n)
      for (std::int64_t k = 0; k < hw; ++k) s += x.data<float>()[(n * kC + c) * hw + k];
    const double mean = s / double(cnt);
    for (std::int64_t n = 0; n < kN; ++n)
      for (std::int64_t k = 0; k < hw; ++k) {
        const double d = x.data<float>()[(n * kC + c) * hw + k] - mean;
        ss += d * d;
      }
    const double var = ss / double(cnt - 1);  // unbiased, as PyTorch's running_var
    EXPECT_NEAR(buf(def, 0).data<float>()[c], mom * mean, 1e-6 * std::max(1.0, std::abs(mom * mean))) << c;
    EXPECT_NEAR(buf(def, 1).data<float>()[c], (1 - mom) + mom * var, 1e-6 * ((1 - mom) + mom * var)) << c;
  }
}

INSTANTIATE_TEST_SUITE_P(MicroBatches, DeferredBatchNorm, testing::Values(1, 2, 4, 8));

// The forward still normalises with the micro-batch's own statistics and the
// backward goes through them: outputs and gradients equal the normal layer's
// on that micro-batch; only the running statistics wait for the commit.
TEST(DeferredBatchNormLayer, OutputsAndGradientsAreTheNormalLayers) {
  Harness normal(make_bn()), def(make_bn());
  normal.randomize_params(3);
  def.randomize_params(3);
  bn(def).set_deferred_stats(true);
  const Tensor x = batch(11).slice_rows(0, 4), dy = random_tensor({4, kC, kH, kW}, 12);
  const Tensor rm0 = buf(def, 0).to(Device::cpu()), rv0 = buf(def, 1).to(Device::cpu());
  Tensor y1 = normal.layer->forward(x, Mode::train).to(Device::cpu());
  Tensor y2 = def.layer->forward(x, Mode::train).to(Device::cpu());
  expect_close(y2, y1, 0, "y");
  expect_close(buf(def, 0), rm0, 0, "running_mean before the commit");
  expect_close(buf(def, 1), rv0, 0, "running_var before the commit");
  Tensor dx1 = normal.layer->backward(dy, true, false).to(Device::cpu());
  Tensor dx2 = def.layer->backward(dy, true, false).to(Device::cpu());
  expect_close(dx2, dx1, 0, "dx");
  for (std::size_t i = 0; i < normal.arena.size(); ++i)
    expect_close(def.arena.grad(i), normal.arena.grad(i), 0, normal.arena.info(i).name + " grad");
  // Eval mode uses the running statistics, deferred or not.
  bn(def).commit_deferred_stats();
  Tensor e1 = normal.layer->forward(x, Mode::eval).to(Device::cpu());
  Tensor e2 = def.layer->forward(x, Mode::eval).to(Device::cpu());
  expect_close(e2, e1, 1e-6, "eval y");
}

TEST(DeferredBatchNormLayer, CommitWithoutForwardsAndTurningOffChangeNothing) {
  Harness def(make_bn());
  const Tensor rm0 = buf(def, 0).to(Device::cpu()), rv0 = buf(def, 1).to(Device::cpu());
  bn(def).commit_deferred_stats();  // not deferred: no-op
  bn(def).set_deferred_stats(true);
  bn(def).commit_deferred_stats();  // nothing accumulated: no-op
  expect_close(buf(def, 0), rm0, 0, "running_mean");
  expect_close(buf(def, 1), rv0, 0, "running_var");
  def.layer->forward(batch(5).slice_rows(0, 4), Mode::train);
  bn(def).set_deferred_stats(false);  // drops the uncommitted statistics
  bn(def).commit_deferred_stats();
  expect_close(buf(def, 0), rm0, 0, "running_mean after turning off");
  // Back to normal mode: the next forward updates the running statistics itself.
  Harness normal(make_bn());
  const Tensor x = batch(6).slice_rows(0, 4);
  def.layer->forward(x, Mode::train);
  normal.layer->forward(x, Mode::train);
  expect_close(buf(def, 0), buf(normal, 0), 0, "normal-mode running_mean");
  expect_close(buf(def, 1), buf(normal, 1), 0, "normal-mode running_var");
}

}  // namespace
}  // namespace ringtrain
