// Model zoo: shapes, parameter counts (against independent formulas), the
// gradient-ready hook, save/load, determinism, accumulation, a training sanity.
#include <cstring>
#include <filesystem>
#include <sstream>

#include "layer_harness.hpp"
#include "ringtrain/nn/loss.hpp"
#include "ringtrain/nn/model.hpp"

using namespace ringtrain;
using namespace rt_test;

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

TEST(Models, ShapesAndParameterCounts) {
  auto cnn = build_model(cfg("cnn"));
  EXPECT_EQ(cnn->num_params(), 421642);
  EXPECT_EQ(cnn->output_shape(64), (Shape{64, 10}));
  EXPECT_EQ(cnn->layer_names(), (std::vector<std::string>{"conv1", "conv2", "flatten", "fc1", "fc2"}));
  EXPECT_EQ(cnn->forward(random_tensor({3, 1, 28, 28}, 1), Mode::eval).shape(), (Shape{3, 10}));

  auto mlp = build_model(cfg("mlp"));
  EXPECT_EQ(mlp->num_params(), 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
  EXPECT_EQ(mlp->forward(random_tensor({2, 1, 28, 28}, 2), Mode::eval).shape(), (Shape{2, 10}));

  auto r20 = build_model(cfg("resnet", 3, 32));
  EXPECT_EQ(r20->num_params(), resnet_params(20, 16, 3, 10));
  EXPECT_NEAR(double(r20->num_params()), 0.27e6, 0.01e6);
  EXPECT_EQ(r20->forward(random_tensor({2, 3, 32, 32}, 3), Mode::train).shape(), (Shape{2, 10}));
  EXPECT_EQ(r20->buffers().size(), 2u * (1 + 9 * 2 + 2));  // stem BN, 2 per block, 2 projection BNs

  ModelConfig c = cfg("resnet", 1, 28);
  c.depth = 32;
  c.base_width = 8;
  c.classes = 7;
  auto r32 = build_model(c);
  EXPECT_EQ(r32->num_params(), resnet_params(32, 8, 1, 7));
  EXPECT_EQ(r32->forward(random_tensor({2, 1, 28, 28}, 4), Mode::train).shape(), (Shape{2, 7}));
}

TEST(Models, BadConfigsAreErrors) {
  EXPECT_THROW(build_model(cfg("vgg")), Error);
  ModelConfig c = cfg("resnet");
  c.depth = 21;
  EXPECT_THROW(build_model(c), Error);
  auto cnn = build_model(cfg("cnn"));
  EXPECT_THROW(cnn->forward(random_tensor({2, 3, 28, 28}, 1), Mode::eval), Error);
  EXPECT_THROW(cnn->forward(random_tensor({2, 1, 32, 32}, 1), Mode::eval), Error);
}

TEST(Models, GradReadyHookIsReverseOrderAndRightAfterEachLayer) {
  auto m = build_model(cfg("resnet", 1, 28));
  Tensor x = random_tensor({4, 1, 28, 28}, 5);
  Tensor y = labels(4, 10, 1);
  m->zero_grad();
  LossResult r = softmax_cross_entropy(m->forward(x, Mode::train), y);
  std::vector<int> order;
  std::vector<std::size_t> seen;
  auto nonzero = [&](std::size_t p) {
    Tensor g = m->arena().grad(p);
    for (std::int64_t i = 0; i < g.numel(); ++i)
      if (g.data<float>()[i] != 0) return true;
    return false;
  };
  m->backward(r.dlogits, [&](int layer, std::span<const std::size_t> ps) {
    order.push_back(layer);
    EXPECT_EQ(std::vector<std::size_t>(ps.begin(), ps.end()), m->layer(layer).params());
    for (std::size_t p : ps) {
      EXPECT_EQ(m->arena().info(p).layer, layer);
      EXPECT_TRUE(nonzero(p)) << m->arena().info(p).name << " not ready when reported";
      seen.push_back(p);
    }
    // Parameters of earlier layers are not computed yet.
    for (std::size_t p = 0; p < m->arena().size(); ++p)
      if (m->arena().info(p).layer < layer) { EXPECT_FALSE(nonzero(p)) << m->arena().info(p).name; }
  });
  ASSERT_FALSE(order.empty());
  for (std::size_t i = 1; i < order.size(); ++i) EXPECT_GT(order[i - 1], order[i]);
  EXPECT_EQ(order.front(), m->num_layers() - 1);
  EXPECT_EQ(order.back(), 0);
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen.size(), m->arena().size());  // every parameter exactly once
  EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end());
}

TEST(Models, SaveLoadIsBitwise) {
  ModelConfig c = cfg("resnet", 1, 28);
  c.depth = 8;
  auto a = build_model(c);
  Tensor x = random_tensor({4, 1, 28, 28}, 6);
  a->forward(x, Mode::train);  // moves the BN running statistics off their initial values
  std::stringstream ss;
  a->save(ss);
  c.seed = 99;
  auto b = build_model(c);
  EXPECT_FALSE(same_bytes(a->arena().params_flat(), b->arena().params_flat()));
  b->load(ss);
  EXPECT_TRUE(same_bytes(a->arena().params_flat(), b->arena().params_flat()));
  auto ba = a->buffers(), bb = b->buffers();
  ASSERT_EQ(ba.size(), bb.size());
  for (std::size_t i = 0; i < ba.size(); ++i) EXPECT_TRUE(same_bytes(ba[i].tensor, bb[i].tensor)) << ba[i].name;
  EXPECT_TRUE(same_bytes(a->forward(x, Mode::eval), b->forward(x, Mode::eval)));

  // A file round trip, and a file of another model is refused with a message.
  auto path = std::filesystem::temp_directory_path() / "rt_nn_models_params.bin";
  a->save(path.string());
  auto cnn = build_model(cfg("cnn"));
  EXPECT_THROW(cnn->load(path.string()), Error);
  b->load(path.string());
  EXPECT_TRUE(same_bytes(a->arena().params_flat(), b->arena().params_flat()));
  std::filesystem::remove(path);
  std::stringstream junk("not a checkpoint");
  EXPECT_THROW(b->load(junk), Error);
}

TEST(Models, InitIsDeterministicAndScaled) {
  auto a = build_model(cfg("cnn")), b = build_model(cfg("cnn"));
  EXPECT_TRUE(same_bytes(a->arena().params_flat(), b->arena().params_flat()));
  ModelConfig c = cfg("cnn");
  c.seed = 43;
  EXPECT_FALSE(same_bytes(a->arena().params_flat(), build_model(c)->arena().params_flat()));
  // Kaiming normal on fc1: variance 2 / fan_in; biases zero.
  Tensor w = a->arena().param(a->arena().index_of("fc1.weight"));
  double s2 = 0;
  for (std::int64_t i = 0; i < w.numel(); ++i) s2 += double(w.data<float>()[i]) * w.data<float>()[i];
  EXPECT_NEAR(s2 / double(w.numel()), 2.0 / 3136, 0.05 * 2.0 / 3136);
  Tensor bias = a->arena().param(a->arena().index_of("fc1.bias"));
  for (std::int64_t i = 0; i < bias.numel(); ++i) EXPECT_EQ(bias.data<float>()[i], 0.f);
}

TEST(Models, BackwardAccumulatesUnlessZeroed) {
  auto m = build_model(cfg("cnn"));
  Tensor x = random_tensor({4, 1, 28, 28}, 7);
  Tensor y = labels(4, 10, 2);
  auto step = [&] {
    LossResult r = softmax_cross_entropy(m->forward(x, Mode::train), y);
    m->backward(r.dlogits);
  };
  m->zero_grad();
  step();
  Tensor g1 = m->arena().grads_flat().clone();
  step();
  Tensor g2 = m->arena().grads_flat();
  for (std::int64_t i = 0; i < g1.numel(); i += 97)
    EXPECT_NEAR(g2.data<float>()[i], 2 * g1.data<float>()[i], 1e-6 + 1e-5 * std::fabs(g1.data<float>()[i]));
  m->zero_grad();
  step();
  EXPECT_TRUE(same_bytes(m->arena().grads_flat(), g1));  // same inputs, same bits
}

TEST(Models, SgdStepsReduceTheLoss) {
  for (const char* name : {"mlp", "cnn", "resnet"}) {
    ModelConfig c = cfg(name);
    c.depth = 8;
    auto m = build_model(c);
    Tensor x = random_tensor({16, 1, 28, 28}, 8);
    Tensor y = labels(16, 10, 3);
    Backend& be = backend_for(DeviceKind::cpu);
    double first = 0, last = 0;
    for (int it = 0; it < 8; ++it) {
      m->zero_grad();
      LossResult r = softmax_cross_entropy(m->forward(x, Mode::train), y);
      (it == 0 ? first : last) = r.loss;
      m->backward(r.dlogits);
      Tensor p = m->arena().params_flat();
      be.axpy(-0.05, m->arena().grads_flat(), p);
    }
    EXPECT_LT(last, 0.8 * first) << name << ": " << first << " -> " << last;
  }
}
