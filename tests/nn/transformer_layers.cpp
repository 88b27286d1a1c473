// Transformer layers: finite-difference gradient checks (layer_harness.hpp),
// forward values against naive float64 references, and the softmax's
// behaviour on huge logits.
#include <cmath>

#include "layer_harness.hpp"
#include "ringtrain/nn/transformer.hpp"
#include "support/kernel_state.hpp"

using namespace ringtrain;
using namespace rt_test;

namespace {

const float* f(const Tensor& t) { return t.data<float>(); }

// Naive float64 attention core: qkv [N, T, 3*H*hd] -> [N, T, H*hd].
std::vector<double> naive_attention(const Tensor& qkv, std::int64_t H, std::int64_t hd) {
  const std::int64_t n = qkv.dim(0), t = qkv.dim(1), d = H * hd;
  std::vector<double> out(static_cast<std::size_t>(n * t * d));
  const float* x = f(qkv);
  for (std::int64_t b = 0; b < n; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < t; ++i) {
        std::vector<double> s(static_cast<std::size_t>(t));
        double m = -1e300;
        for (std::int64_t j = 0; j < t; ++j) {
          double acc = 0;
          for (std::int64_t k = 0; k < hd; ++k)
            acc += double(x[(b * t + i) * 3 * d + h * hd + k]) * double(x[(b * t + j) * 3 * d + d + h * hd + k]);
          s[size_t(j)] = acc / std::sqrt(double(hd));
          m = std::max(m, s[size_t(j)]);
        }
        double z = 0;
        for (auto& v : s) z += (v = std::exp(v - m));
        for (std::int64_t k = 0; k < hd; ++k) {
          double acc = 0;
          for (std::int64_t j = 0; j < t; ++j) acc += s[size_t(j)] / z * double(x[(b * t + j) * 3 * d + 2 * d + h * hd + k]);
          out[size_t((b * t + i) * d + h * hd + k)] = acc;
        }
      }
  return out;
}

}  // namespace

TEST(TransformerGradCheck, LinearOnTokens) {
  Harness h(std::make_unique<Linear>("fc", LinearSpec{6, 4, true, false}));
  h.randomize_params(50);
  Tensor x = random_tensor({2, 3, 6}, 51);
  GradCheck{}.run(h, x);
  EXPECT_EQ(h.layer->output_shape(x.shape()), (Shape{2, 3, 4}));
  EXPECT_DOUBLE_EQ(h.layer->forward_flops(x.shape()), 2.0 * 6 * 6 * 4);
}

TEST(TransformerGradCheck, LayerNorm) {
  Harness h(std::make_unique<LayerNorm>("ln", 8));
  h.randomize_params(52, 0.5, 1.5);
  GradCheck gc;
  gc.eps = 3e-3;
  gc.rtol = 2e-2;
  gc.run(h, random_tensor({2, 3, 8}, 53, 0.1, 2.0));
}

TEST(TransformerLayers, LayerNormMatchesDefinition) {
  Harness h(std::make_unique<LayerNorm>("ln", 5));
  h.randomize_params(54, 0.5, 1.5);
  Tensor x = random_tensor({3, 5}, 55, 0.1, 3.0);
  Tensor y = h.layer->forward(x, Mode::train);
  const float *g = f(h.arena.param(0)), *b = f(h.arena.param(1));
  for (int r = 0; r < 3; ++r) {
    double m = 0, v = 0;
    for (int j = 0; j < 5; ++j) m += f(x)[r * 5 + j] / 5.0;
    for (int j = 0; j < 5; ++j) v += (f(x)[r * 5 + j] - m) * (f(x)[r * 5 + j] - m) / 5.0;  // biased
    for (int j = 0; j < 5; ++j)
      EXPECT_NEAR(f(y)[r * 5 + j], (f(x)[r * 5 + j] - m) / std::sqrt(v + 1e-5) * g[j] + b[j], 2e-6);
  }
  EXPECT_EQ(h.arena.info(0).name, "ln.weight");
  EXPECT_FALSE(h.arena.info(0).decay);
}

TEST(TransformerGradCheck, MultiHeadSelfAttention) {
  Harness h(multi_head_attention("attn", 8, 2));
  h.randomize_params(56, 0.1, 0.6);
  GradCheck gc;
  gc.eps = 3e-3;
  gc.rtol = 2e-2;
  gc.run(h, random_tensor({2, 5, 8}, 57));
  ASSERT_EQ(h.arena.size(), 4u);
  EXPECT_EQ(h.arena.info(0).name, "attn.qkv.weight");
  EXPECT_EQ(h.arena.info(2).name, "attn.proj.weight");
}

TEST(TransformerLayers, AttentionCoreMatchesNaiveFloat64) {
  for (auto [H, hd, T] : {std::tuple<int, int, int>{1, 4, 3}, {3, 5, 7}, {4, 16, 17}}) {
    auto k = backend_for(DeviceKind::cpu).attention(AttentionSpec{H, hd});
    Tensor qkv = random_tensor({3, T, 3 * H * hd}, 58 + T);
    Tensor out = Tensor::empty({3, T, H * hd});
    k->forward(qkv, out, rt_test::state_of(*k));
    auto ref = naive_attention(qkv, H, hd);
    for (std::size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(f(out)[i], ref[i], 2e-6) << "H " << H << " i " << i;
  }
}

// Logits of +-1e4 overflow exp() unless the row maximum is subtracted first.
TEST(TransformerLayers, SoftmaxIsSafeForHugeLogits) {
  const int H = 2, hd = 4, T = 6;
  Tensor qkv = random_tensor({2, T, 3 * H * hd}, 60);
  for (std::int64_t i = 0; i < qkv.numel(); ++i)
    if ((i % (3 * H * hd)) < 2 * H * hd) qkv.data<float>()[i] *= 100.f;  // q and k: logits ~ +-1e4
  auto k = backend_for(DeviceKind::cpu).attention(AttentionSpec{H, hd});
  Tensor out = Tensor::empty({2, T, H * hd}), dq = Tensor::empty(qkv.shape());
  k->forward(qkv, out, rt_test::state_of(*k));
  auto ref = naive_attention(qkv, H, hd);
  for (std::size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(std::isfinite(f(out)[i]));
    EXPECT_NEAR(f(out)[i], ref[i], 1e-5);
  }
  k->backward(qkv, random_tensor(out.shape(), 61), dq, rt_test::state_of(*k));
  for (std::int64_t i = 0; i < dq.numel(); ++i) ASSERT_TRUE(std::isfinite(f(dq)[i])) << i;
}

TEST(TransformerGradCheck, PatchEmbed) {
  Harness h(std::make_unique<PatchEmbed>("pe", 2, 4, 6, 2, 5));
  h.randomize_params(62);
  Tensor x = random_tensor({2, 2, 4, 6}, 63);
  GradCheck{}.run(h, x);
  EXPECT_EQ(h.layer->output_shape(x.shape()), (Shape{2, 6, 5}));
  EXPECT_EQ(h.arena.info(2).name, "pe.pos_embed");
}

// PatchEmbed is a Conv2d(C, D, p, stride p) with the same weights, plus pos_embed.
TEST(TransformerLayers, PatchEmbedEqualsStridedConv) {
  Harness pe(std::make_unique<PatchEmbed>("pe", 3, 6, 4, 2, 7));
  pe.randomize_params(64);
  Conv2dSpec s;
  s.in_channels = 3;
  s.out_channels = 7;
  s.kernel_h = s.kernel_w = s.stride_h = s.stride_w = 2;
  Harness conv(std::make_unique<Conv2d>("c", s));
  conv.arena.param(0).copy_from(pe.arena.param(0).reshape({7, 3, 2, 2}));
  conv.arena.param(1).copy_from(pe.arena.param(1));
  Tensor x = random_tensor({2, 3, 6, 4}, 65);
  Tensor y = pe.layer->forward(x, Mode::eval), yc = conv.layer->forward(x, Mode::eval);  // [2,7,3,2]
  const float* pos = f(pe.arena.param(2));
  for (int n = 0; n < 2; ++n)
    for (int t = 0; t < 6; ++t)
      for (int d = 0; d < 7; ++d)
        EXPECT_NEAR(f(y)[(n * 6 + t) * 7 + d], f(yc)[(n * 7 + d) * 6 + t] + pos[t * 7 + d], 1e-5);
}

TEST(TransformerGradCheck, TokenMean) {
  Harness h(std::make_unique<TokenMean>("pool"));
  Tensor x = random_tensor({3, 4, 5}, 66);
  GradCheck{}.run(h, x);
  Tensor y = h.layer->forward(x, Mode::eval);
  EXPECT_NEAR(f(y)[6], (f(x)[21] + f(x)[26] + f(x)[31] + f(x)[36]) / 4, 1e-6);  // n 1, d 1
}

TEST(TransformerGradCheck, TransformerBlock) {
  TransformerBlockSpec s;
  s.dim = 8;
  s.heads = 2;
  s.mlp_ratio = 1.5;
  Harness h(transformer_block("blk", s));
  h.randomize_params(67, 0.1, 0.5);
  GradCheck gc;
  gc.eps = 3e-3;
  gc.rtol = 3e-2;
  gc.atol_frac = 5e-3;
  gc.run(h, random_tensor({2, 4, 8}, 68));
  std::vector<std::string> names;
  for (auto& i : h.arena.infos()) names.push_back(i.name);
  EXPECT_EQ(names, (std::vector<std::string>{"blk.norm1.weight", "blk.norm1.bias", "blk.attn.qkv.weight",
                                             "blk.attn.qkv.bias", "blk.attn.proj.weight", "blk.attn.proj.bias",
                                             "blk.norm2.weight", "blk.norm2.bias", "blk.fc1.weight", "blk.fc1.bias",
                                             "blk.fc2.weight", "blk.fc2.bias"}));
  EXPECT_EQ(h.arena.info(8).shape, (Shape{12, 8}));  // hidden = 8 * 1.5
}

TEST(TransformerGradCheck, TransformerBlockWithDropout) {
  TransformerBlockSpec s;
  s.dim = 6;
  s.heads = 3;
  s.mlp_ratio = 2;
  s.dropout = 0.25;
  Harness h(transformer_block("blk", s));
  h.randomize_params(69, 0.1, 0.5);
  auto& stack = dynamic_cast<ResidualStack&>(*h.layer);
  (void)stack;
  GradCheck gc;
  gc.eps = 3e-3;
  gc.rtol = 3e-2;
  gc.atol_frac = 5e-3;
  gc.mode = Mode::eval;  // dropout is the identity in eval: the math of the block without it
  gc.run(h, random_tensor({2, 3, 6}, 70));
}

TEST(TransformerLayers, ShapeErrorsNameTheLayer) {
  Harness h(multi_head_attention("attn", 8, 2));
  try {
    h.layer->forward(random_tensor({2, 5, 6}, 71), Mode::eval);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("attn"), std::string::npos) << e.what();
  }
  EXPECT_THROW(multi_head_attention("attn", 10, 3), Error);
  EXPECT_THROW(PatchEmbed("pe", 1, 28, 28, 5, 16), Error);
}

// Two threads split attention by (sample, head) and LayerNorm by rows: the
// same results as one thread (attention bitwise: each head is computed alone).
TEST(TransformerLayers, TwoThreadsMatchOne) {
  const int H = 4, hd = 16, T = 17;
  Tensor qkv = random_tensor({3, T, 3 * H * hd}, 72), dout = random_tensor({3, T, H * hd}, 73);
  // 16 x 17 x 64 elements: above the size where LayerNorm starts using threads.
  Tensor x = random_tensor({16, T, 64}, 74, 0.1, 2.0), g = random_tensor({64}, 75), b = random_tensor({64}, 76);
  Tensor dy = random_tensor(x.shape(), 77);
  auto run = [&](int threads) {
    omp_set_num_threads(threads);
    auto k = backend_for(DeviceKind::cpu).attention(AttentionSpec{H, hd});
    auto ln = backend_for(DeviceKind::cpu).layernorm(LayerNormSpec{64});
    std::vector<Tensor> r = {Tensor::empty({3, T, H * hd}), Tensor::empty(qkv.shape()), Tensor::empty(x.shape()),
                             Tensor::empty(x.shape()), Tensor::empty({64}), Tensor::empty({64})};
    k->forward(qkv, r[0], rt_test::state_of(*k));
    k->backward(qkv, dout, r[1], rt_test::state_of(*k));
    ln->forward(x, g, b, r[2], rt_test::state_of(*ln));
    ln->backward(x, g, dy, r[3], r[4], r[5], false, rt_test::state_of(*ln));
    omp_set_num_threads(1);
    return r;
  };
  auto one = run(1), two = run(2);
  for (std::size_t t = 0; t < one.size(); ++t)
    for (std::int64_t i = 0; i < one[t].numel(); ++i) {
      if (t < 2) ASSERT_EQ(f(one[t])[i], f(two[t])[i]) << "tensor " << t << " [" << i << "]";
      else ASSERT_NEAR(f(one[t])[i], f(two[t])[i], 1e-5 * (1 + std::fabs(f(one[t])[i]))) << "tensor " << t;
    }
}
