// bfloat16 activations on the CPU backend (issue 31): each kernel's bf16
// forward and backward against its fp32 result on the same (bf16-representable
// after rounding) inputs, within a bound derived from the reduction:
//   a length-K dot product of bf16-rounded inputs (relative error u = 2^-8
//   each) accumulated in fp32 and rounded once to bf16 is off by at most
//   (2u + K 2^-24) sum_k |a_k b_k| + u |y|  (and the fp32 reference by K 2^-24 sum).
// Element-wise ops: one rounding of the output (u |y|; measured up to 0.97 of
// it: the bound is the definition of round-to-nearest, not a guess).
// Plus: a whole vit and gpt Stage in bf16 against fp32 (loss and every
// gradient), and the Stage really running bf16 (its activations are bfloat16
// and its loss differs).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <random>

#include "ringtrain/nn/backend.hpp"
#include "ringtrain/nn/loss.hpp"
#include "ringtrain/parallel/stage.hpp"
#include "support/attention_bounds.hpp"
#include "support/kernel_state.hpp"

using namespace ringtrain;

namespace {

const double u = std::ldexp(1.0, -8), e32 = std::ldexp(1.0, -24);

Backend& be() { return backend_for(DeviceKind::cpu); }

Tensor randn(const Shape& s, std::uint64_t seed, double scale = 1.0) {
  Tensor t = Tensor::empty(s);
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0.f, float(scale));
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = nd(g);
  return t;
}

Tensor to16(const Tensor& t) {
  Tensor o = Tensor::empty(t.shape(), DType::bf16);
  be().cast(t, o);
  return o;
}
Tensor to32(const Tensor& t) {
  Tensor o = Tensor::empty(t.shape());
  be().cast(t, o);
  return o;
}
// The bf16-rounded value of t, as float32: the fp32 reference runs on the same inputs.
Tensor rounded(const Tensor& t) { return to32(to16(t)); }

// |got - want| <= tol[i] elementwise; reports the worst ratio.
void expect_within(const Tensor& got, const Tensor& want, const std::vector<double>& tol, const char* what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  double worst = 0;
  std::int64_t at = 0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    const double d = std::abs(double(got.data<float>()[i]) - double(want.data<float>()[i]));
    const double r = d / std::max(tol[std::size_t(i)], 1e-30);
    if (r > worst) worst = r, at = i;
  }
  std::printf("%-20s worst |bf16 - fp32| = %.3f of the bound\n", what, worst);
  EXPECT_LE(worst, 1.0) << what << ": element " << at << " is " << got.data<float>()[at] << " vs fp32 "
                        << want.data<float>()[at] << ", bound " << tol[std::size_t(at)];
}

// The dot-product bound for C = A B (row-major, A [m,k] (or its transpose), B [k,n]).
std::vector<double> dot_bound(const Tensor& a, bool ta, const Tensor& b, bool tb, std::int64_t m, std::int64_t n,
                              std::int64_t k, const Tensor& c32, bool rounded_out) {
  std::vector<double> tol(std::size_t(m * n));
  const float *pa = a.data<float>(), *pb = b.data<float>();
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t l = 0; l < k; ++l)
        s += std::abs(double(ta ? pa[l * m + i] : pa[i * k + l]) * double(tb ? pb[j * k + l] : pb[l * n + j]));
      tol[std::size_t(i * n + j)] = (2 * u + 2 * double(k) * e32) * s +
                                    (rounded_out ? u * std::abs(double(c32.data<float>()[i * n + j])) : 0);
    }
  return tol;
}

}  // namespace

TEST(Bf16Kernels, LinearForwardBackwardWithinTheDotProductBound) {
  const std::int64_t n = 48, in = 96, out = 40;
  LinearSpec s{in, out, true, false};
  auto k = be().linear(s);
  Tensor x = rounded(randn({n, in}, 1)), w = rounded(randn({out, in}, 2, 0.1)), b = randn({out}, 3, 0.1),
         dy = rounded(randn({n, out}, 4));
  Tensor y32 = Tensor::empty({n, out}), dx32 = Tensor::empty({n, in}), dw32 = Tensor::empty({out, in}),
         db32 = Tensor::empty({out});
  k->forward(x, w, b, y32);
  k->backward(x, w, y32, dy, dx32, dw32, db32, false);
  Tensor y16 = Tensor::empty({n, out}, DType::bf16), dx16 = Tensor::empty({n, in}, DType::bf16),
         dw = Tensor::empty({out, in}), db = Tensor::empty({out});
  Tensor x16 = to16(x), w16 = to16(w), dy16 = to16(dy);
  k->forward(x16, w16, b, y16);
  k->backward(x16, w16, y16, dy16, dx16, dw, db, false);
  EXPECT_EQ(y16.dtype(), DType::bf16);
  // y = x w^T + b: K = in (the bias adds exactly in fp32 before the rounding).
  std::vector<double> ty = dot_bound(x, false, w, true, n, out, in, y32, true);
  expect_within(to32(y16), y32, ty, "Linear forward");
  expect_within(to32(dx16), dx32, dot_bound(dy, false, w, false, n, in, out, dx32, true), "Linear dx");
  // dw (fp32 output, K = n rows) and db (fp32 sums of bf16-exact values).
  expect_within(dw, dw32, dot_bound(dy, true, x, false, out, in, n, dw32, false), "Linear dw");
  std::vector<double> tb(static_cast<std::size_t>(out));
  for (std::int64_t j = 0; j < out; ++j) {
    double s2 = 0;
    for (std::int64_t i = 0; i < n; ++i) s2 += std::abs(dy.data<float>()[i * out + j]);
    tb[std::size_t(j)] = 2 * double(n) * e32 * s2;
  }
  expect_within(db, db32, tb, "Linear db");
  // The input gradient differs from fp32's: bf16 really ran (rounded outputs).
  EXPECT_NE(std::memcmp(to32(dx16).raw(), dx32.raw(), dx32.nbytes()), 0);
}

// train.precision = bf16 on a float32 convolution: the kernel rounds its
// inputs, weights and output gradients to bf16 and accumulates in fp32, so
// each output is off by at most (2u + 2K 2^-24) sum_k |a_k b_k| (no output
// rounding); the sums of |a b| are the same convolutions run on |x|, |w|, |dy|.
TEST(Bf16Kernels, ConvolutionInBf16MathWithinTheDotProductBound) {
  if (be().bf16_isa().rfind("emulated", 0) == 0) GTEST_SKIP() << "no bf16 instructions: convolutions stay fp32";
  for (const std::int64_t cin : {1, 16}) {  // the first layer (a plain input) and a blocked one
    Conv2dSpec s = Conv2dSpec::square(cin, 24, 3, 1, true);
    Conv2dSpec s16 = s;
    s16.math = MathMode::bf16;
    auto k32 = be().conv2d(s), k16 = be().conv2d(s16), kabs = be().conv2d(s);
    const Shape xs{4, cin, 12, 12}, ys{4, 24, 12, 12}, ws{24, cin, 3, 3};
    Tensor x = randn(xs, 10 + cin), w = randn(ws, 20 + cin, 0.2), b = randn({24}, 30, 0.1), dy = randn(ys, 40 + cin);
    auto run = [&](Conv2dKernel& k, const Tensor& xx, const Tensor& ww, const Tensor& bb, const Tensor& gg) {
      std::array<Tensor, 4> r{Tensor::empty(ys), Tensor::empty(xs), Tensor::empty(ws), Tensor::empty({24})};
      k.forward(xx, ww, bb, r[0], rt_test::state_of(k));
      k.backward(xx, ww, r[0], gg, r[1], r[2], r[3], false, rt_test::state_of(k));
      return r;
    };
    auto abs_of = [](const Tensor& t) {
      Tensor a = Tensor::empty(t.shape());
      for (std::int64_t i = 0; i < t.numel(); ++i) a.data<float>()[i] = std::abs(t.data<float>()[i]);
      return a;
    };
    const auto f32 = run(*k32, x, w, b, dy), f16 = run(*k16, x, w, b, dy);
    Tensor zero = Tensor::empty({24});
    std::fill(zero.data<float>(), zero.data<float>() + 24, 0.f);
    const auto sums = run(*kabs, abs_of(x), abs_of(w), zero, abs_of(dy));  // sum |a b| of each output
    auto bound = [&](const Tensor& sum, std::int64_t k) {
      std::vector<double> t(static_cast<std::size_t>(sum.numel()));
      for (std::int64_t i = 0; i < sum.numel(); ++i) t[std::size_t(i)] = (2 * u + 4 * double(k) * e32) * sum.data<float>()[i];
      return t;
    };
    const std::string c = cat("cin ", cin);
    expect_within(f16[0], f32[0], bound(sums[0], cin * 9), ("Conv forward, " + c).c_str());
    expect_within(f16[1], f32[1], bound(sums[1], 24 * 9), ("Conv dx, " + c).c_str());
    expect_within(f16[2], f32[2], bound(sums[2], 4 * 144), ("Conv dw, " + c).c_str());
    EXPECT_NE(std::memcmp(f16[0].raw(), f32[0].raw(), f32[0].nbytes()), 0) << c << ": bf16 did not run";
    EXPECT_NE(std::memcmp(f16[2].raw(), f32[2].raw(), f32[2].nbytes()), 0) << c << ": bf16 did not run";
  }
}

TEST(Bf16Kernels, AttentionWithinTheBoundOfItsTwoProducts) {
  const std::int64_t n = 3, t = 10, heads = 2, hd = 8, d = heads * hd;
  AttentionSpec s;
  s.heads = heads;
  s.head_dim = hd;
  auto k = be().attention(s);
  Tensor qkv = rounded(randn({n, t, 3 * d}, 5)), dout = rounded(randn({n, t, d}, 6));
  Tensor o32 = Tensor::empty({n, t, d}), dq32 = Tensor::empty({n, t, 3 * d});
  k->forward(qkv, o32, rt_test::state_of(*k));
  k->backward(qkv, dout, dq32, rt_test::state_of(*k));
  Tensor o16 = Tensor::empty({n, t, d}, DType::bf16), dq16 = Tensor::empty({n, t, 3 * d}, DType::bf16);
  Tensor qkv16 = to16(qkv), dout16 = to16(dout);
  k->forward(qkv16, o16, rt_test::state_of(*k));
  k->backward(qkv16, dout16, dq16, rt_test::state_of(*k));
  // O = P V with rows of P summing to 1: |dO| <= max|V| (|dP| + u) + u|O|, where
  // the scores S = q.k/sqrt(hd) (K = hd) are fp32 and P is rounded to bf16:
  // |dP| <= 2 |dS| + u with |dS| <= 2 (2u + hd 2^-24) max_rows sum |q k| / sqrt(hd).
  const auto mag = test_support::attention_magnitudes(qkv.data<float>(), n, t, heads, hd);
  const double maxv = mag.max_v, maxqk = mag.max_qk;
  const double ds = 2 * (2 * u + hd * e32) * maxqk, dp = 2 * ds + u;
  std::vector<double> to(std::size_t(o32.numel()));
  for (std::int64_t i = 0; i < o32.numel(); ++i) to[std::size_t(i)] = maxv * (dp + u) + u * std::abs(o32.data<float>()[i]);
  expect_within(to32(o16), o32, to, "attention forward");
  // Backward: four products of bf16-rounded operands; bound each gradient by
  // 8u of the largest fp32 gradient magnitude (measured 0.8u).
  std::vector<double> tq(std::size_t(dq32.numel()));
  double mq = 0;
  for (std::int64_t i = 0; i < dq32.numel(); ++i) mq = std::max(mq, double(std::abs(dq32.data<float>()[i])));
  for (auto& v : tq) v = 8 * u * mq;
  expect_within(to32(dq16), dq32, tq, "attention backward");
}

TEST(Bf16Kernels, LayerNormGeluAddDropoutWithinOneRoundingEach) {
  const std::int64_t rows = 20, f = 64;
  Tensor x = rounded(randn({rows, f}, 7, 2.0)), dy = rounded(randn({rows, f}, 8));
  Tensor g = randn({f}, 9, 0.5), b = randn({f}, 10, 0.5);
  LayerNormSpec ls;
  ls.features = f;
  auto ln = be().layernorm(ls);
  Tensor y32 = Tensor::empty({rows, f}), dx32 = Tensor::empty({rows, f}), dg32 = Tensor::empty({f}),
         db32 = Tensor::empty({f});
  ln->forward(x, g, b, y32, rt_test::state_of(*ln));
  ln->backward(x, g, dy, dx32, dg32, db32, false, rt_test::state_of(*ln));
  Tensor y16 = Tensor::empty({rows, f}, DType::bf16), dx16 = Tensor::empty({rows, f}, DType::bf16),
         dg = Tensor::empty({f}), db = Tensor::empty({f});
  Tensor x16 = to16(x), dy16 = to16(dy);
  ln->forward(x16, g, b, y16, rt_test::state_of(*ln));
  ln->backward(x16, g, dy16, dx16, dg, db, false, rt_test::state_of(*ln));
  // Same fp32 inputs, fp32 math per row: only the output rounding differs.
  std::vector<double> t1(std::size_t(rows * f));
  for (std::int64_t i = 0; i < rows * f; ++i) t1[std::size_t(i)] = u * std::abs(y32.data<float>()[i]);
  expect_within(to32(y16), y32, t1, "LayerNorm forward");
  for (std::int64_t i = 0; i < rows * f; ++i) t1[std::size_t(i)] = u * std::abs(dx32.data<float>()[i]);
  expect_within(to32(dx16), dx32, t1, "LayerNorm dx");
  EXPECT_EQ(std::memcmp(dg.raw(), dg32.raw(), dg.nbytes()), 0) << "LayerNorm dgamma: the same fp32 sums";
  EXPECT_EQ(std::memcmp(db.raw(), db32.raw(), db.nbytes()), 0) << "LayerNorm dbeta";

  auto gelu = be().eltwise(Eltwise::gelu, DType::f32);
  Tensor h32 = Tensor::empty({rows, f}), dh32 = Tensor::empty({rows, f}), h16 = Tensor::empty({rows, f}, DType::bf16),
         dh16 = Tensor::empty({rows, f}, DType::bf16);
  gelu->forward(x, h32);
  gelu->backward(x, h32, dy, dh32);
  gelu->forward(x16, h16);
  gelu->backward(x16, h16, dy16, dh16);
  // oneDNN's bf16 GELU may use its own polynomial: one rounding plus 2^-20 relative.
  for (std::int64_t i = 0; i < rows * f; ++i)
    t1[std::size_t(i)] = (u + 1e-6) * std::abs(h32.data<float>()[i]) + 1e-6;
  expect_within(to32(h16), h32, t1, "GELU forward");
  for (std::int64_t i = 0; i < rows * f; ++i)
    t1[std::size_t(i)] = (u + 1e-6) * std::abs(dh32.data<float>()[i]) + 1e-6;
  expect_within(to32(dh16), dh32, t1, "GELU backward");

  Tensor s16 = Tensor::empty({rows, f}, DType::bf16), s32 = Tensor::empty({rows, f});
  be().add(x16, dy16, s16);
  be().add(x, dy, s32);
  Tensor want16 = to16(s32);  // the exact fp32 sum, rounded once
  EXPECT_EQ(std::memcmp(s16.raw(), want16.raw(), s16.nbytes()), 0) << "bf16 add";

  Tensor m32 = Tensor::empty({rows, f}, DType::u8), m16 = Tensor::empty({rows, f}, DType::u8);
  be().dropout_forward(x, 0.3, 11, 12, 0, m32, s32);
  be().dropout_forward(x16, 0.3, 11, 12, 0, m16, s16);
  EXPECT_EQ(std::memcmp(m32.raw(), m16.raw(), m16.nbytes()), 0) << "dropout keeps the same elements in bf16";
  want16 = to16(s32);
  EXPECT_EQ(std::memcmp(s16.raw(), want16.raw(), s16.nbytes()), 0) << "bf16 dropout: the fp32 value rounded once";
}

namespace {

// One step of the model c in fp32 and in bf16 from the same initial
// parameters: the bf16 stage really runs bf16, and its loss and every
// gradient follow fp32's. Two blocks of bf16 rounding (vit): measured |loss
// difference| 0.003% and gradient differences at most 0.9% of each
// gradient's norm; the bounds (1%, 20%) stay loose because the difference
// grows with depth and width.
void stage_follows_fp32(const ModelConfig& c, const Tensor& x, const Tensor& y) {
  ModelConfig c16 = c;
  c16.math = MathMode::bf16;
  Stage a(c, Device::cpu()), b(c16, Device::cpu());
  EXPECT_EQ(a.activation_dtype(), DType::f32);
  ASSERT_EQ(b.activation_dtype(), DType::bf16) << "every " << c.name << " layer takes bf16 on the CPU";
  const std::int64_t n = x.dim(0);
  double loss[2];
  Stage* st[2] = {&a, &b};
  for (int k = 0; k < 2; ++k) {
    st[k]->zero_grads();
    Tensor dl = Tensor::empty(st[k]->output_shape(n));
    Tensor out = st[k]->forward(0, x, Mode::train);
    EXPECT_EQ(out.dtype(), DType::f32) << "the loss sees float32 logits";
    loss[k] = softmax_cross_entropy(out, y, 0.0, dl);
    st[k]->backward_input(0, dl, false);
    st[k]->backward_weight(0);
  }
  EXPECT_NE(loss[0], loss[1]) << "bf16 ran bitwise as fp32";
  EXPECT_LE(std::abs(loss[1] - loss[0]), 0.01 * loss[0]);
  double worst = 0;
  for (std::size_t i = 0; i < a.arena().size(); ++i) {
    Tensor g32 = a.arena().grad(i), g16 = b.arena().grad(i);
    ASSERT_EQ(g16.dtype(), DType::f32) << "gradients stay float32";
    double num = 0, den = 0;
    for (std::int64_t j = 0; j < g32.numel(); ++j) {
      const double d = double(g16.data<float>()[j]) - g32.data<float>()[j];
      num += d * d;
      den += double(g32.data<float>()[j]) * g32.data<float>()[j];
    }
    EXPECT_LE(std::sqrt(num), 0.2 * std::sqrt(den) + 1e-7) << a.arena().info(i).name;
    worst = std::max(worst, std::sqrt(num / std::max(den, 1e-30)));
  }
  std::printf("%s stage: loss %.6f (fp32) vs %.6f (bf16); worst gradient difference %.4f of its norm\n",
              c.name.c_str(), loss[0], loss[1], worst);
}

}  // namespace

TEST(Bf16Kernels, VitStageInBf16FollowsFp32) {
  ModelConfig c;
  c.name = "vit";
  c.base_width = 32;
  c.heads = 2;
  c.depth = 2;
  c.mlp_ratio = 2;
  c.patch = 7;
  const std::int64_t n = 16;
  Tensor x = randn({n, 1, 28, 28}, 13), y = Tensor::empty({n}, DType::i32);
  for (std::int64_t i = 0; i < n; ++i) y.data<std::int32_t>()[i] = std::int32_t(i % 10);
  stage_follows_fp32(c, x, y);
}

// The gpt in bf16: float32 token ids reach the embedding uncast (a vocabulary
// of 300 has ids that are no bfloat16 numbers), causal tiled attention in
// bf16, float32 logits from the tied head. Measured: loss difference 0.002%,
// gradients within 1.1% of their norm.
TEST(Bf16Kernels, GptStageInBf16FollowsFp32) {
  ModelConfig c;
  c.name = "gpt";
  c.seq_len = 24;
  c.classes = 300;
  c.base_width = 32;
  c.heads = 2;
  c.depth = 2;
  c.mlp_ratio = 2;
  const std::int64_t n = 3;
  Tensor x = Tensor::empty({n, c.seq_len}), y = Tensor::empty({n, c.seq_len}, DType::i32);
  std::mt19937_64 g(14);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    x.data<float>()[i] = float(g() % 300);
    y.data<std::int32_t>()[i] = std::int32_t(g() % 300);
  }
  stage_follows_fp32(c, x, y);
}

TEST(Bf16Kernels, IsaIsNamed) {
  const std::string isa = be().bf16_isa();
  EXPECT_TRUE(isa == "AMX" || isa == "AVX512-BF16" || isa.rfind("emulated", 0) == 0) << isa;
}

// train.precision = fp16 on the CPU keeps float32 storage (the backend takes
// no float16 activations; fp16 there is loss scaling around fp32 arithmetic):
// a vit stage, which has no convolution for oneDNN's fp16 fpmath mode, runs
// bitwise as its fp32 stage (the GPU's fp16 storage: tests/gpu/fp16_kernels.cpp).
TEST(Bf16Kernels, Fp16OnTheCpuKeepsFloat32Storage) {
  EXPECT_FALSE(be().fp16_activations());
  ModelConfig c;
  c.name = "vit";
  c.base_width = 32;
  c.heads = 2;
  c.depth = 1;
  c.mlp_ratio = 2;
  c.patch = 7;
  ModelConfig c16 = c;
  c16.math = MathMode::fp16;
  Stage a(c, Device::cpu()), b(c16, Device::cpu());
  ASSERT_EQ(b.activation_dtype(), DType::f32);
  const std::int64_t n = 8;
  Tensor x = randn({n, 1, 28, 28}, 15), y = Tensor::empty({n}, DType::i32);
  for (std::int64_t i = 0; i < n; ++i) y.data<std::int32_t>()[i] = std::int32_t(i % 10);
  Tensor out[2];
  Stage* st[2] = {&a, &b};
  for (int k = 0; k < 2; ++k) {
    st[k]->zero_grads();
    Tensor dl = Tensor::empty(st[k]->output_shape(n));
    out[k] = st[k]->forward(0, x, Mode::train).clone();
    softmax_cross_entropy(out[k], y, 0.0, dl);
    st[k]->backward_input(0, dl, false);
    st[k]->backward_weight(0);
  }
  ASSERT_EQ(out[1].dtype(), DType::f32);
  EXPECT_EQ(std::memcmp(out[0].raw(), out[1].raw(), out[0].nbytes()), 0) << "fp16 logits differ from fp32's";
  for (std::size_t i = 0; i < a.arena().size(); ++i) {
    const Tensor g32 = a.arena().grad(i), g16 = b.arena().grad(i);
    EXPECT_EQ(std::memcmp(g32.raw(), g16.raw(), g32.nbytes()), 0) << a.arena().info(i).name;
  }
}
