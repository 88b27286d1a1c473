// Model zoo: shapes, parameter counts (against independent formulas), the
// gradient-ready hook, determinism, accumulation, a training sanity. Each
// model runs whole, as one pipeline stage with one slot.
#include <cstring>

#include "layer_harness.hpp"
#include "ringtrain/nn/loss.hpp"
#include "support/whole_model.hpp"

using namespace ringtrain;
using namespace rt_test;
using test_support::backward;
using test_support::layer_names;

namespace {

ModelConfig cfg(const std::string& name, std::int64_t c = 1, std::int64_t hw = 28) {
  ModelConfig m;
  m.name = name;
  m.in_channels = c;
  m.height = m.width = hw;
  return m;
}

Tensor labels(std::int64_t n, std::int64_t k, std::uint64_t seed) {
  Tensor t = Tensor::empty({n}, DType::i32);
  for (std::int64_t i = 0; i < n; ++i) t.data<std::int32_t>()[i] = static_cast<std::int32_t>((i * 7 + seed) % k);
  return t;
}

// ResNet (6n+2) with 1x1-conv projection shortcuts, counted by hand.
std::int64_t resnet_params(int depth, std::int64_t w, std::int64_t cin, std::int64_t classes) {
  const int n = (depth - 2) / 6;
  std::int64_t p = cin * w * 9 + 2 * w, in = w;
  for (int s = 0; s < 3; ++s) {
    std::int64_t out = w << s;
    for (int b = 0; b < n; ++b) {
      p += in * out * 9 + 2 * out + out * out * 9 + 2 * out;
      if (in != out) p += in * out + 2 * out;
      in = out;
    }
  }
  return p + in * classes + classes;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

}  // namespace

Stage model(const ModelConfig& c) { return Stage(c, Device::cpu()); }

TEST(Models, ShapesAndParameterCounts) {
  Stage cnn = model(cfg("cnn"));
  EXPECT_EQ(cnn.arena().numel(), 421642);
  EXPECT_EQ(cnn.output_shape(64), (Shape{64, 10}));
  EXPECT_EQ(layer_names(cnn), (std::vector<std::string>{"conv1", "conv2", "flatten", "fc1", "fc2"}));
  EXPECT_EQ(cnn.forward(0, random_tensor({3, 1, 28, 28}, 1), Mode::eval).shape(), (Shape{3, 10}));

  Stage mlp = model(cfg("mlp"));
  EXPECT_EQ(mlp.arena().numel(), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  EXPECT_EQ(mlp.forward(0, random_tensor({2, 1, 28, 28}, 2), Mode::eval).shape(), (Shape{2, 10}));

  Stage r20 = model(cfg("resnet", 3, 32));
  EXPECT_EQ(r20.arena().numel(), resnet_params(20, 16, 3, 10));
  EXPECT_NEAR(double(r20.arena().numel()), 0.27e6, 0.01e6);
  EXPECT_EQ(r20.forward(0, random_tensor({2, 3, 32, 32}, 3), Mode::train).shape(), (Shape{2, 10}));
  EXPECT_EQ(r20.buffers().size(), 2u * (1 + 9 * 2 + 2));  // stem BN, 2 per block, 2 projection BNs

  ModelConfig c = cfg("resnet", 1, 28);
  c.depth = 32;
  c.base_width = 8;
  c.classes = 7;
  Stage r32 = model(c);
  EXPECT_EQ(r32.arena().numel(), resnet_params(32, 8, 1, 7));
  EXPECT_EQ(r32.forward(0, random_tensor({2, 1, 28, 28}, 4), Mode::train).shape(), (Shape{2, 7}));
}

TEST(Models, BadConfigsAreErrors) {
  EXPECT_THROW(model(cfg("vgg")), Error);
  ModelConfig c = cfg("resnet");
  c.depth = 21;
  EXPECT_THROW(model(c), Error);
  Stage cnn = model(cfg("cnn"));
  EXPECT_THROW(cnn.forward(0, random_tensor({2, 3, 28, 28}, 1), Mode::eval), Error);
  EXPECT_THROW(cnn.forward(0, random_tensor({2, 1, 32, 32}, 1), Mode::eval), Error);
}

// The fused backward (each layer's whole backward in turn) reports every
// layer right after its gradients are complete.
TEST(Models, GradReadyHookIsReverseOrderAndRightAfterEachLayer) {
  Stage m = model(cfg("resnet", 1, 28));
  m.set_fused_backward(true);
  Tensor x = random_tensor({4, 1, 28, 28}, 5);
  Tensor y = labels(4, 10, 1);
  m.arena().zero_grads();
  m.zero_grads();
  LossResult r = softmax_cross_entropy(m.forward(0, x, Mode::train), y);
  std::vector<int> order;
  std::vector<std::size_t> seen;
  auto nonzero = [&](std::size_t p) {
    Tensor g = m.arena().grad(p);
    for (std::int64_t i = 0; i < g.numel(); ++i)
      if (g.data<float>()[i] != 0) return true;
    return false;
  };
  m.backward_input(0, r.dlogits, false, [&](int layer) {
    order.push_back(layer);
    for (std::size_t p : m.layer(layer).params()) {
      EXPECT_EQ(m.arena().info(p).layer, layer);
      EXPECT_TRUE(nonzero(p)) << m.arena().info(p).name << " not ready when reported";
      seen.push_back(p);
    }
    // Parameters of earlier layers are not computed yet.
    for (std::size_t p = 0; p < m.arena().size(); ++p)
      if (m.arena().info(p).layer < layer) { EXPECT_FALSE(nonzero(p)) << m.arena().info(p).name; }
  });
  ASSERT_FALSE(order.empty());
  for (std::size_t i = 1; i < order.size(); ++i) EXPECT_GT(order[i - 1], order[i]);
  EXPECT_EQ(order.front(), m.num_layers() - 1);
  EXPECT_EQ(order.back(), 0);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen.size(), m.arena().size());  // every parameter exactly once
  EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end());
}

TEST(Models, InitIsDeterministicAndScaled) {
  Stage a = model(cfg("cnn")), b = model(cfg("cnn"));
  EXPECT_TRUE(same_bytes(a.arena().params_flat(), b.arena().params_flat()));
  ModelConfig c = cfg("cnn");
  c.seed = 43;
  EXPECT_FALSE(same_bytes(a.arena().params_flat(), model(c).arena().params_flat()));
  // Kaiming normal on fc1: variance 2 / fan_in; biases zero.
  Tensor w = a.arena().param(a.arena().index_of("fc1.weight"));
  double s2 = 0;
  for (std::int64_t i = 0; i < w.numel(); ++i) s2 += double(w.data<float>()[i]) * w.data<float>()[i];
  EXPECT_NEAR(s2 / double(w.numel()), 2.0 / 3136, 0.05 * 2.0 / 3136);
  Tensor bias = a.arena().param(a.arena().index_of("fc1.bias"));
  for (std::int64_t i = 0; i < bias.numel(); ++i) EXPECT_EQ(bias.data<float>()[i], 0.f);
}

// Both backward paths: split halves (accumulating into zeroed gradients) and
// fused (the first backward after zero_grads overwrites).
TEST(Models, BackwardAccumulatesUnlessZeroed) {
  for (bool fused : {false, true}) {
    Stage m = model(cfg("cnn"));
    m.set_fused_backward(fused);
    Tensor x = random_tensor({4, 1, 28, 28}, 7);
    Tensor y = labels(4, 10, 2);
    auto step = [&] {
      LossResult r = softmax_cross_entropy(m.forward(0, x, Mode::train), y);
      backward(m, r.dlogits);
    };
    m.zero_grads();
    step();
    Tensor g1 = m.arena().grads_flat().clone();
    step();
    Tensor g2 = m.arena().grads_flat();
    for (std::int64_t i = 0; i < g1.numel(); i += 97)
      EXPECT_NEAR(g2.data<float>()[i], 2 * g1.data<float>()[i], 1e-6 + 1e-5 * std::fabs(g1.data<float>()[i]))
          << "fused " << fused;
    m.zero_grads();
    step();
    EXPECT_TRUE(same_bytes(m.arena().grads_flat(), g1)) << "fused " << fused;  // same inputs, same bits
  }
}

TEST(Models, SgdStepsReduceTheLoss) {
  for (const char* name : {"mlp", "cnn", "resnet"}) {
    ModelConfig c = cfg(name);
    c.depth = 8;
    Stage m = model(c);
    Tensor x = random_tensor({16, 1, 28, 28}, 8);
    Tensor y = labels(16, 10, 3);
    Backend& be = backend_for(DeviceKind::cpu);
    double first = 0, last = 0;
    for (int it = 0; it < 8; ++it) {
      m.zero_grads();
      LossResult r = softmax_cross_entropy(m.forward(0, x, Mode::train), y);
      (it == 0 ? first : last) = r.loss;
      backward(m, r.dlogits);
      Tensor p = m.arena().params_flat();
      be.axpy(-0.05, m.arena().grads_flat(), p);
    }
    EXPECT_LT(last, 0.8 * first) << name << ": " << first << " -> " << last;
  }
}
