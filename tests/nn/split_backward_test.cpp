// Split backward (zero-bubble pipelines): backward_input then backward_weight
// must give exactly the gradients of the plain backward, for layers that split
// (Linear, Conv2d incl. fused ReLU+pool, composites, transformer blocks) and those
// that do not (BatchNorm).
#include <gtest/gtest.h>

#include <cstring>

#include "ringtrain/nn/layers.hpp"
#include "ringtrain/nn/rng.hpp"
#include "ringtrain/parallel/stage.hpp"

namespace ringtrain {
namespace {

Tensor random_tensor(const Shape& s, std::uint64_t stream) {
  Tensor t = Tensor::empty(s, DType::f32);
  for (std::int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = 2.f * counter_uniform(7, stream, static_cast<std::uint64_t>(i)) - 1.f;
  return t;
}

std::vector<float> grads_of(Stage& m) {
  Tensor g = m.arena().grads_flat();
  return std::vector<float>(g.data<float>(), g.data<float>() + g.numel());
}

void check_model(const char* name, const Shape& sample, int depth = 8, std::int64_t base_width = 4) {
  ModelConfig mc;
  mc.name = name;
  mc.in_channels = sample[0];
  mc.height = sample[1];
  mc.width = sample[2];
  mc.depth = depth;
  mc.base_width = base_width;
  // The reference: each layer's whole backward in turn (the fused stage).
  Stage m(mc, Device::cpu());
  m.set_fused_backward(true);
  Shape in = {4, sample[0], sample[1], sample[2]};
  Tensor x = random_tensor(in, 1);
  Tensor logits = m.forward(0, x, Mode::train);
  Tensor dy = random_tensor(logits.shape(), 2);
  m.zero_grads();
  m.backward_input(0, dy, false);
  std::vector<float> ref = grads_of(m);

  // Again, through the halves: every B first (upstream order), then every W,
  // on each layer's own context (the stage's forward, layer by layer).
  Tensor h = x;
  for (int i = 0; i < m.num_layers(); ++i) h = m.layer(i).forward(h, Call(Mode::train, SamplePosition{}));
  m.arena().zero_grads();
  bool any_split = false;
  Tensor g = dy;
  bool blocks_split = true;  // every transformer block (ResidualStack) defers its projections' and MLP's dW
  for (int i = m.num_layers(); i-- > 0;) {
    g = m.layer(i).backward_input(g, i > 0, true);
    any_split |= m.layer(i).splits_backward();
    if (std::string(m.layer(i).type()) == "ResidualStack") blocks_split &= m.layer(i).splits_backward();
  }
  EXPECT_TRUE(blocks_split) << name;
  for (int i = m.num_layers(); i-- > 0;) m.layer(i).backward_weight();
  std::vector<float> got = grads_of(m);
  EXPECT_TRUE(any_split) << name << ": the CPU backend should split Linear/Conv2d";
  ASSERT_EQ(got.size(), ref.size());
  // Accumulating into zeroed gradients adds 0 + g: bitwise equal.
  EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * sizeof(float)), 0) << name;
}

TEST(SplitBackward, CnnHalvesEqualTheWholeBackward) { check_model("cnn", {1, 12, 12}); }
TEST(SplitBackward, ResnetHalvesEqualTheWholeBackward) { check_model("resnet", {3, 8, 8}); }
// vit's blocks: attention's qkv and proj and the MLP's fc1 and fc2 defer their
// weight gradients; each branch's sum keeps its own buffer (the deferred dy).
TEST(SplitBackward, VitHalvesEqualTheWholeBackward) { check_model("vit", {1, 8, 8}, 3, 8); }

TEST(SplitBackward, WeightHalfIsReallyDeferred) {
  LinearSpec s;
  s.in_features = 3;
  s.out_features = 2;
  Linear fc("fc", s);
  ParamArena arena;
  fc.register_params(arena, 0, "");
  arena.finalize(Device::cpu());
  fc.bind(BindContext{backend_for(Device::cpu()), Device::cpu(), arena, 1});
  fc.init(arena, 1);
  Tensor x = random_tensor({5, 3}, 3);
  fc.forward(x, Mode::train);
  arena.zero_grads();
  Tensor dx = fc.backward_input(random_tensor({5, 2}, 4), true, true);
  EXPECT_TRUE(dx.defined());
  Tensor gw = arena.grads_flat();
  for (std::int64_t i = 0; i < gw.numel(); ++i) ASSERT_EQ(gw.data<float>()[i], 0.f) << "dw written by B";
  fc.backward_weight();
  double sum = 0;
  for (std::int64_t i = 0; i < gw.numel(); ++i) sum += std::abs(gw.data<float>()[i]);
  EXPECT_GT(sum, 0.0);
}

}  // namespace
}  // namespace ringtrain
