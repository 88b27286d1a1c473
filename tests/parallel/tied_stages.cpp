// A language model's tied LM head on another pipeline stage than its
// embedding (nn/language.hpp split_tied_layers): the head's stage holds a copy
// of the embedding's weight under the same name, drawn bitwise like the whole
// model's; the embedding's stage marks the weight as copied and no longer
// leaves its gradient to the head (a fused backward overwrites it each step);
// and run as two stages, the model gives the whole model's logits and, summed,
// its gradient of the tied weight (float32 rounding apart).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "ringtrain/nn/model.hpp"
#include "ringtrain/parallel/stage.hpp"

namespace ringtrain {
namespace {

// wte, blocks.0, blocks.1, norm, lm_head (no dropout).
ModelConfig small_gpt() {
  ModelConfig c;
  c.name = "gpt";
  c.classes = 11;
  c.seq_len = 6;
  c.base_width = 8;
  c.heads = 2;
  c.depth = 2;
  c.mlp_ratio = 2.0;
  return c;
}

Tensor token_ids(std::int64_t n, std::int64_t t, std::int64_t vocab) {
  Tensor x = Tensor::empty({n, t}, DType::f32);
  for (std::int64_t i = 0; i < n * t; ++i) x.data<float>()[i] = float((i * 7 + 3) % vocab);
  return x;
}

Tensor ramp(const Shape& s, double scale) {
  Tensor y = Tensor::empty(s, DType::f32);
  for (std::int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = float(scale * std::sin(0.37 * double(i)));
  return y;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(TiedStages, HeadOnALaterStageHoldsACopyDrawnLikeTheEmbedding) {
  const ModelConfig mc = small_gpt();
  Stage whole(mc, Device::cpu());
  ASSERT_EQ(whole.num_layers(), 5);
  Stage first(mc, Device::cpu(), 0, 3, 1), last(mc, Device::cpu(), 3, 5, 2);
  const ParamArena &w = whole.arena(), &f = first.arena(), &l = last.arena();
  for (const ParamInfo& p : w.infos()) EXPECT_TRUE(p.copy_of < 0 && !p.copied) << p.name << ": one stage, one copy";
  const std::size_t owner = f.index_of("wte.weight"), copy = l.index_of("wte.weight");
  EXPECT_TRUE(f.info(owner).copied);
  EXPECT_EQ(f.info(owner).copy_of, -1);
  EXPECT_EQ(l.info(copy).copy_of, static_cast<std::int64_t>(w.index_of("wte.weight")));
  EXPECT_EQ(l.info(copy).layer, 4);  // the head's parameter: ready with the head's backward
  EXPECT_EQ(l.info(copy).decay, w.info(w.index_of("wte.weight")).decay);
  EXPECT_TRUE(same_bits(l.param(copy), w.param(w.index_of("wte.weight"))));
  EXPECT_TRUE(same_bits(f.param(owner), w.param(w.index_of("wte.weight"))));
  // The stage's other parameters keep the whole model's values (model indices not shifted).
  for (const ParamInfo& p : l.infos())
    if (p.copy_of < 0) EXPECT_TRUE(same_bits(l.param(l.index_of(p.name)), w.param(w.index_of(p.name)))) << p.name;
  for (const ParamInfo& p : f.infos()) EXPECT_TRUE(same_bits(f.param(f.index_of(p.name)), w.param(w.index_of(p.name)))) << p.name;
}

TEST(TiedStages, TwoStagesGiveTheWholeModelsLogitsAndSummedGradient) {
  const ModelConfig mc = small_gpt();
  Stage whole(mc, Device::cpu());
  Stage first(mc, Device::cpu(), 0, 3, 1), last(mc, Device::cpu(), 3, 5, 1);
  for (Stage* s : {&whole, &first, &last}) s->set_fused_backward(true);
  const Tensor x = token_ids(2, 6, 11), dy = ramp({2, 6, 11}, 0.05);
  double worst = 0;
  for (int step = 0; step < 2; ++step) {  // the second step must not add to the first's gradient
    for (Stage* s : {&whole, &first, &last}) s->zero_grads();
    const Tensor yw = whole.forward(0, x, Mode::train);
    whole.backward_input(0, dy, false);
    const Tensor h = first.forward(0, x, Mode::train);
    const Tensor y = last.forward(0, h, Mode::train);
    EXPECT_TRUE(same_bits(y, yw)) << "step " << step << ": the same kernels on the same values";
    const Tensor dh = last.backward_input(0, dy, true);
    first.backward_input(0, dh, false);
    const float* gw = whole.arena().grad(whole.arena().index_of("wte.weight")).data<float>();
    const float* g1 = first.arena().grad(first.arena().index_of("wte.weight")).data<float>();
    const float* g2 = last.arena().grad(last.arena().index_of("wte.weight")).data<float>();
    double norm = 0;
    for (std::int64_t i = 0; i < 11 * 8; ++i) {
      worst = std::max(worst, std::fabs(double(g1[i]) + double(g2[i]) - double(gw[i])));
      norm = std::max(norm, std::fabs(double(gw[i])));
    }
    ASSERT_GT(norm, 1e-3) << "both parts of the tied gradient are exercised";
    // The other parameters' gradients are the whole model's, bitwise (the same order of sums).
    for (Stage* s : {&first, &last})
      for (const ParamInfo& p : s->arena().infos())
        if (p.name != "wte.weight")
          EXPECT_TRUE(same_bits(s->arena().grad(s->arena().index_of(p.name)),
                                whole.arena().grad(whole.arena().index_of(p.name))))
              << "step " << step << ": " << p.name;
  }
  // float32: the embedding's and the head's parts are added in another order (measured 1.5e-8).
  EXPECT_LT(worst, 1.5e-7);
  std::printf("[tied stages] max |first + last - whole| of the tied gradient: %.2e\n", worst);
}

}  // namespace
}  // namespace ringtrain
