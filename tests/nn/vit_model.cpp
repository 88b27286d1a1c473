// The `vit` model: parameter count against a formula, shapes, top-level layer
// layout, FLOPs, errors naming the configuration key, and learning a fixed batch.
#include "layer_harness.hpp"
#include "ringtrain/nn/loss.hpp"
#include "ringtrain/optim/optimizer.hpp"
#include "support/error_of.hpp"
#include "support/whole_model.hpp"

using namespace ringtrain;
using namespace rt_test;
using test_support::error_of;
using test_support::layer_names;

namespace {

ModelConfig vit(std::int64_t width, std::int64_t heads, int depth, double ratio, std::int64_t patch) {
  ModelConfig c;
  c.name = "vit";
  c.base_width = width;
  c.heads = heads;
  c.depth = depth;
  c.mlp_ratio = ratio;
  c.patch = patch;
  return c;
}

// Counted by hand: patch Linear + pos, per block 2 LN + qkv + proj + fc1 + fc2, final LN, head.
std::int64_t vit_params(std::int64_t c, std::int64_t hw, std::int64_t p, std::int64_t d, int depth, std::int64_t hid,
                        std::int64_t classes) {
  const std::int64_t t = (hw / p) * (hw / p);
  std::int64_t n = (c * p * p + 1) * d + t * d;
  n += depth * (4 * d + (d + 1) * 3 * d + (d + 1) * d + (d + 1) * hid + (hid + 1) * d);
  return n + 2 * d + (d + 1) * classes;
}

}  // namespace

TEST(VitModel, ShapesParamsAndLayout) {
  Stage m(vit(64, 4, 4, 2.0, 4), Device::cpu());
  EXPECT_EQ(m.arena().numel(), vit_params(1, 28, 4, 64, 4, 128, 10));
  EXPECT_EQ(m.arena().numel(), 138890);  // what `ringtrain train --config jobs/fashion_vit.toml` prints
  EXPECT_EQ(m.output_shape(3), (Shape{3, 10}));
  EXPECT_EQ(layer_names(m), (std::vector<std::string>{"patch_embed", "blocks.0", "blocks.1", "blocks.2", "blocks.3",
                                                      "norm", "pool", "head"}));
  EXPECT_EQ(m.forward(0, random_tensor({2, 1, 28, 28}, 1), Mode::train).shape(), (Shape{2, 10}));
  // Forward FLOPs per image: 49 tokens x (patch 16x64 + 4 x (64x192 + 64x64 + 2 x 64x128)) x 2
  // + attention 4 blocks x 2 products x 49^2 x 64 x 2; model_flops_per_sample is 3x that.
  const double fwd = 2.0 * 49 * (16 * 64 + 4 * (64 * 192 + 64 * 64 + 2 * 64 * 128)) + 4 * 2 * 2.0 * 49 * 49 * 64 +
                     2.0 * 64 * 10;
  EXPECT_DOUBLE_EQ(model_flops_per_sample(vit(64, 4, 4, 2.0, 4)), 3 * fwd);

  ModelConfig c = vit(12, 3, 1, 1.5, 4);  // CIFAR-sized, odd hidden size 18
  c.in_channels = 3;
  c.height = c.width = 32;
  EXPECT_EQ(Stage(c, Device::cpu()).arena().numel(), vit_params(3, 32, 4, 12, 1, 18, 10));
}

TEST(VitModel, ErrorsNameTheKey) {
  std::string m = error_of([] { build_model_layers(vit(64, 5, 2, 2.0, 4)); });
  EXPECT_NE(m.find("model.heads"), std::string::npos) << m;
  EXPECT_NE(m.find("model.width"), std::string::npos) << m;
  m = error_of([] { build_model_layers(vit(64, 4, 2, 2.0, 5)); });
  EXPECT_NE(m.find("model.patch"), std::string::npos) << m;
  m = error_of([] { build_model_layers(vit(64, 4, 0, 2.0, 4)); });
  EXPECT_NE(m.find("model.depth"), std::string::npos) << m;
  m = error_of([] { build_model_layers(vit(64, 4, 2, 0.0, 4)); });
  EXPECT_NE(m.find("model.mlp_ratio"), std::string::npos) << m;
  m = error_of([] { build_model_layers(vit(64, 0, 2, 2.0, 4)); });
  EXPECT_NE(m.find("model.heads"), std::string::npos) << m;
}

// AdamW on one fixed batch: the loss must fall far (the model can fit 32 images).
TEST(VitModel, LearnsAFixedBatch) {
  Stage m(vit(32, 4, 2, 2.0, 7), Device::cpu());
  Tensor x = random_tensor({32, 1, 28, 28}, 2, 0.0, 1.0);
  Tensor y = Tensor::empty({32}, DType::i32);
  for (int i = 0; i < 32; ++i) y.data<std::int32_t>()[i] = (i * 7) % 10;
  OptimizerConfig oc;
  oc.name = "adamw";
  auto opt = make_optimizer(m.arena(), oc);
  double first = 0, last = 0;
  for (int s = 0; s < 40; ++s) {
    m.zero_grads();
    LossResult r = softmax_cross_entropy(m.forward(0, x, Mode::train), y);
    test_support::backward(m, r.dlogits);
    opt->step(3e-3);
    (s == 0 ? first : last) = r.loss;
  }
  EXPECT_LT(last, 0.3 * first) << "first " << first << " last " << last;
}
