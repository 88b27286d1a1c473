// Language-model layers: finite-difference gradient checks of the token
// embedding with its tied head (the weight gets both paths' gradients) and of
// causal attention; causality itself (a later token never changes an earlier
// output); errors for ids outside the vocabulary and for a head whose
// embedding is missing.
#include <cstring>

#include "layer_harness.hpp"
#include "ringtrain/nn/language.hpp"
#include "ringtrain/nn/transformer.hpp"
#include "support/error_of.hpp"

using namespace ringtrain;
using namespace rt_test;
using test_support::error_of;

namespace {

Tensor ids(const Shape& s, std::int64_t vocab, std::uint64_t seed) {
  Tensor t = Tensor::empty(s);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float((i * 5 + seed) % vocab);
  return t;
}

// Embedding and tied head bound to one arena, as a model's stage binds them.
struct Tied {
  ParamArena arena;
  TokenEmbedding emb{"wte", 7, 6, 5};
  LmHead head{"lm_head", "wte", 7, 5};
  Tied() {
    emb.tie_to_head();
    emb.register_params(arena, 0, "");
    head.register_params(arena, 1, "");
    arena.finalize();
    BindContext ctx{backend_for(DeviceKind::cpu), Device::cpu(), arena, 3};
    emb.bind(ctx);
    head.bind(ctx);
    for (std::size_t i = 0; i < arena.size(); ++i)
      arena.param(i).copy_from(random_tensor(arena.info(i).shape, 40 + i, 0.1, 1.0));
  }
  Tensor forward(const Tensor& x) { return head.forward(emb.forward(x, Mode::train), Mode::train); }
  void backward(const Tensor& r, bool accumulate) { emb.backward(head.backward(r, true, accumulate), false, accumulate); }
};

}  // namespace

TEST(LanguageGradCheck, EmbeddingWithTiedHead) {
  Tied m;
  const Tensor x = ids({3, 4}, 7, 1);  // 12 tokens over 7 ids: several repeat
  Tensor y = m.forward(x);
  EXPECT_EQ(y.shape(), (Shape{3, 4, 7}));
  Tensor r = random_tensor(y.shape(), 9, 0.2, 1.0);
  m.backward(r, false);
  auto loss = [&] { return dot(m.forward(x), r); };
  GradCheck gc;
  gc.eps = 3e-3;
  for (std::size_t i = 0; i < m.arena.size(); ++i)  // wte.weight: the head's x^T dy plus the rows' scatter
    gc.check(m.arena.param(i), m.arena.grad(i).clone(), loss, m.arena.info(i).name, 60 + i);
  EXPECT_EQ(m.arena.size(), 2u);  // the head adds no parameter of its own
  EXPECT_EQ(m.arena.info(0).name, "wte.weight");
  EXPECT_EQ(m.arena.info(1).name, "wte.pos_embed");
}

TEST(LanguageLayers, TiedGradientOverwritesOnceThenAccumulates) {
  Tied m;
  const Tensor x = ids({2, 6}, 7, 2);
  Tensor r = random_tensor({2, 6, 7}, 10, 0.2, 1.0);
  m.forward(x);
  m.backward(r, false);
  const Tensor once = m.arena.grad(0).clone();
  m.arena.grad(0).fill_(123.0);  // stale values: an overwriting backward must not keep them
  m.forward(x);
  m.backward(r, false);
  EXPECT_EQ(std::memcmp(once.raw(), m.arena.grad(0).raw(), once.nbytes()), 0);
  m.forward(x);
  m.backward(r, true);  // a second micro-batch adds
  for (std::int64_t i = 0; i < once.numel(); ++i)  // (h + e) + h + e vs 2 (h + e): rounding only (6e-8 seen)
    EXPECT_NEAR(m.arena.grad(0).data<float>()[i], 2 * once.data<float>()[i], 1e-6);
}

TEST(LanguageLayers, EmbeddingIsTheSumOfTheRowsAndRejectsBadIds) {
  Tied m;
  const Tensor x = ids({1, 3}, 7, 4);
  Tensor e = m.emb.forward(x, Mode::eval);
  const float *w = m.arena.param(0).data<float>(), *p = m.arena.param(1).data<float>();
  for (int t = 0; t < 3; ++t)
    for (int k = 0; k < 5; ++k)
      EXPECT_EQ(e.data<float>()[t * 5 + k], w[int(x.data<float>()[t]) * 5 + k] + p[t * 5 + k]);
  Tensor bad = ids({1, 3}, 7, 4);
  bad.data<float>()[1] = 7;
  EXPECT_NE(error_of([&] { m.emb.forward(bad, Mode::eval); }).find("TokenEmbedding 'wte': input 1 = 7 is not a "
                                                                   "token id in [0, 7)"), std::string::npos);
  EXPECT_NE(error_of([&] { m.emb.forward(ids({1, 7}, 7, 0), Mode::eval); }).find("T <= 6 positions"),
            std::string::npos);
  ParamArena lonely;
  lonely.finalize();
  LmHead h("lm_head", "wte", 7, 5);
  EXPECT_NE(error_of([&] { h.bind({backend_for(DeviceKind::cpu), Device::cpu(), lonely, 1}); })
                .find("the embedding it is tied to, 'wte', is not on this pipeline stage"), std::string::npos);
}

TEST(LanguageGradCheck, CausalAttention) {
  Harness h(multi_head_attention("attn", 8, 2, {}, true));
  h.randomize_params(70, 0.05, 0.5);
  GradCheck gc;
  gc.eps = 3e-3;
  gc.run(h, random_tensor({2, 5, 8}, 71, 0.1, 1.0));
}

TEST(LanguageLayers, CausalAttentionIgnoresLaterTokens) {
  Harness h(multi_head_attention("attn", 8, 2, {}, true)), full(multi_head_attention("attn", 8, 2, {}, false));
  h.randomize_params(72, 0.05, 0.5);
  full.randomize_params(72, 0.05, 0.5);
  Tensor x = random_tensor({1, 6, 8}, 73, 0.1, 1.0);
  const Tensor a = h.layer->forward(x, Mode::eval).clone();
  const Tensor af = full.layer->forward(x, Mode::eval).clone();
  for (int k = 0; k < 8; ++k) x.data<float>()[5 * 8 + k] += 1.0f;  // change the last token only
  const Tensor b = h.layer->forward(x, Mode::eval);
  const Tensor bf = full.layer->forward(x, Mode::eval);
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), 5 * 8 * sizeof(float)), 0);  // tokens 0..4: bit for bit
  EXPECT_NE(std::memcmp(af.raw(), bf.raw(), 5 * 8 * sizeof(float)), 0);  // without the mask they change
  // Token 0 attends only to itself: its output is proj(v_0), the same as a 1-token sequence.
  Tensor one = Tensor::empty({1, 1, 8});
  std::memcpy(one.raw(), x.raw(), 8 * sizeof(float));
  const Tensor c = h.layer->forward(one, Mode::eval);
  for (int k = 0; k < 8; ++k) EXPECT_NEAR(c.data<float>()[k], b.data<float>()[k], 1e-6);
}
