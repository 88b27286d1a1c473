// Split backward (zero-bubble pipelines): backward_input then backward_weight
// must give exactly the gradients of the plain backward, for layers that split
// (Linear, Conv2d incl. fused ReLU+pool, composites) and those that do not (BatchNorm).
#include <gtest/gtest.h>

#include <cstring>

#include "ringtrain/nn/layers.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/nn/rng.hpp"

namespace ringtrain {
namespace {

Tensor random_tensor(const Shape& s, std::uint64_t stream) {
  Tensor t = Tensor::empty(s, DType::f32);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = 2.f * counter_uniform(7, stream, static_cast<std::uint64_t>(i)) - 1.f;
  return t;
}

std::vector<float> grads_of(const Model& m) {
  Tensor g = m.arena().grads_flat();
  return std::vector<float>(g.data<float>(), g.data<float>() + g.numel());
}

void check_model(const char* name, const Shape& sample) {
  ModelConfig mc;
  mc.name = name;
  mc.in_channels = sample[0];
  mc.height = sample[1];
  mc.width = sample[2];
  mc.depth = 8;
  mc.base_width = 4;
  auto m = build_model(mc);
  Shape in = {4, sample[0], sample[1], sample[2]};
  Tensor x = random_tensor(in, 1);
  Tensor logits = m->forward(x, Mode::train);
  Tensor dy = random_tensor(logits.shape(), 2);
  m->zero_grad();
  m->backward(dy);
  std::vector<float> ref = grads_of(*m);

  // Again, through the halves: every B first (upstream order), then every W.
  m->forward(x, Mode::train);
  m->arena().zero_grads();
  bool any_split = false;
  Tensor g = dy;
  for (int i = m->num_layers(); i-- > 0;) {
    g = m->layer(i).backward_input(g, i > 0, true);
    any_split |= m->layer(i).splits_backward();
  }
  for (int i = m->num_layers(); i-- > 0;) m->layer(i).backward_weight();
  std::vector<float> got = grads_of(*m);
  EXPECT_TRUE(any_split) << name << ": the CPU backend should split Linear/Conv2d";
  ASSERT_EQ(got.size(), ref.size());
  // Accumulating into zeroed gradients adds 0 + g: bitwise equal.
  EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0) << name;
}

TEST(SplitBackward, CnnHalvesEqualTheWholeBackward) { check_model("cnn", {1, 12, 12}); }
TEST(SplitBackward, ResnetHalvesEqualTheWholeBackward) { check_model("resnet", {3, 8, 8}); }

TEST(SplitBackward, WeightHalfIsReallyDeferred) {
  LinearSpec s;
  s.in_features = 3;
  s.out_features = 2;
  Model m("lin", Device::cpu());
  m.add(std::make_unique<Linear>("fc", s));
  m.finalize({3}, 1);
  Tensor x = random_tensor({5, 3}, 3);
  m.forward(x, Mode::train);
  m.arena().zero_grads();
  Tensor dx = m.layer(0).backward_input(random_tensor({5, 2}, 4), true, true);
  EXPECT_TRUE(dx.defined());
  Tensor gw = m.arena().grads_flat();
  for (std::int64_t i = 0; i < gw.numel(); ++i) ASSERT_EQ(gw.data<float>()[i], 0.f) << "dw written by B";
  m.layer(0).backward_weight();
  double sum = 0;
  for (std::int64_t i = 0; i < gw.numel(); ++i) sum += std::abs(gw.data<float>()[i]);
  EXPECT_GT(sum, 0.0);
}

}  // namespace
}  // namespace ringtrain
