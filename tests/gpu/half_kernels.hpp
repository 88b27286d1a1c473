#pragma once
// 16-bit activations on the CUDA backend (issue 31, item 3), for bfloat16
// (train.precision = bf16) and float16 (fp16): every kernel of a float32
// layer, fed 16-bit activations (float32 parameters, a Linear's 16-bit weight
// copy), against the same float32 kernel fed the same values in float32, both
// on the GPU. The inputs are numbers of the 16-bit type, so the two runs see
// equal operands and differ only by what 16-bit storage adds, bounded from
// the reduction (u the type's unit roundoff, 2^-8 for bf16 and 2^-11 for
// fp16; eta = 2^-25 half the spacing of fp16's subnormals, where rounding is
// absolute, 0 for bf16, whose subnormals lie below 1e-38; e = 2^-24 float32's):
//   - a length-K dot product: 16-bit operands multiply exactly in float32, and
//     each float32 accumulator (cuBLAS, either run; tensor cores may truncate)
//     is off by at most 2 K e sum_k |a_k b_k|, so the runs differ by at most
//     4 K e sum|ab|, plus u |y| + eta for a 16-bit output (and u sum|ab| + eta
//     more where a 16-bit product is rounded before the float32 bias is added);
//   - our kernels compute in float from the same values whatever the storage:
//     one rounding of the output, u |y| + eta, and float32 parameter gradients
//     are the same float sums (a 2^-20 relative slack allows the two template
//     instantiations to contract multiply-adds differently).
// Plus a whole vit Stage in 16-bit on the GPU against fp32 on the GPU: it
// really stores the type, its loss differs, and loss and gradients follow
// fp32 (fp16 with the loss scale applied to the float32 loss gradient before
// the stage's cast, as the trainer does).
// bf16_kernels.cpp and fp16_kernels.cpp instantiate these for their type.
// Written and compiled without a GPU; not yet run on one (docs/gpu.md).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_test_util.hpp"
#include "support/attention_bounds.hpp"
#include "ringtrain/nn/backend.hpp"
#include "ringtrain/nn/loss.hpp"
#include "ringtrain/parallel/device_runtime.hpp"
#include "ringtrain/parallel/stage.hpp"
#include "support/whole_model.hpp"
#include "support/kernel_state.hpp"

namespace half_test {

using namespace ringtrain;
using namespace rt_gpu;

struct Half {
  DType dt;
  double u, eta;
  const char* name;
};
constexpr Half kBf16{DType::bf16, 1.0 / 256, 0.0, "bf16"};               // u = 2^-8
constexpr Half kFp16{DType::f16, 1.0 / 2048, 1.0 / (1 << 25), "fp16"};  // u = 2^-11, eta = 2^-25

class Half16 : public ::testing::TestWithParam<Half> {
 protected:
  const Half& h() const { return GetParam(); }
};
inline std::string half_name(const ::testing::TestParamInfo<Half>& i) { return i.param.name; }
inline void PrintTo(const Half& h, std::ostream* os) { *os << h.name; }

const double e32 = std::ldexp(1.0, -24), slack = std::ldexp(1.0, -20);

inline Backend& be() { return backend_for(DeviceKind::cuda); }

// Host float32 values that are numbers of type dt (normal(0, scale) rounded).
inline Tensor values16(const Shape& s, std::uint32_t seed, DType dt, double scale = 1.0) {
  Tensor t = Tensor::empty(s);
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, float(scale));
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const float v = nd(g);
    t.data<float>()[i] = dt == DType::bf16 ? to_f32(to_bf16(v)) : to_f32(to_f16(v));
  }
  return t;
}
// Host float32 values (parameters stay float32).
inline Tensor f32_values(const Shape& s, std::uint32_t seed, double scale = 1.0) {
  Tensor t = Tensor::empty(s);
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, float(scale));
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = nd(g);
  return t;
}
// The same values on the GPU, as float32 and as the 16-bit type.
struct Both {
  Tensor f32, h16;
};
inline Both up(const Tensor& host, DType dt) { return {host.to(gpu()), host_cast(host, dt).to(gpu())}; }
inline Tensor dev(const Shape& s, DType dt) { return Tensor::empty(s, dt, gpu()); }

inline std::vector<double> times(const std::vector<float>& v, double f, double plus = 0) {
  std::vector<double> t(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) t[i] = f * std::abs(double(v[i])) + plus;
  return t;
}
// The largest |v|: the scale of a float32 sum whose two runs should agree.
inline double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, std::abs(double(x)));
  return m;
}

// |got - want| <= tol elementwise; prints and reports the worst ratio.
inline void expect_within(const std::vector<float>& got, const std::vector<float>& want,
                          const std::vector<double>& tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double r = std::abs(double(got[i]) - double(want[i])) / std::max(tol[i], 1e-30);
    if (r > worst) worst = r, at = i;
  }
  std::printf("%-34s worst |16-bit - fp32| = %.3f of the bound\n", what.c_str(), worst);
  EXPECT_LE(worst, 1.0) << what << ": element " << at << " is " << got[at] << " vs fp32 " << want[at] << ", bound "
                        << tol[at];
}
// Rounding once: within u |want| + eta.
inline void expect_rounded(const Half& h, const Tensor& got16, const Tensor& want32, const std::string& what) {
  EXPECT_EQ(got16.dtype(), h.dt) << what;
  const auto w = host_f32(want32);
  expect_within(host_f32(got16), w, times(w, h.u + slack, h.eta), what);
}
// The same float32 sums: equal up to the contraction slack.
inline void expect_same_sums(const Tensor& got, const Tensor& want, const std::string& what) {
  EXPECT_EQ(got.dtype(), DType::f32) << what << ": parameter gradients stay float32";
  const auto w = host_f32(want);
  expect_within(host_f32(got), w, std::vector<double>(w.size(), slack * max_abs(w) + 1e-30), what);
}

// sum_k |A[i,k] B[k,j]| of C = op(A) op(B) (row-major; A [m,k] or, transposed, [k,m]).
inline std::vector<double> abs_dot(const Tensor& a, bool ta, const Tensor& b, bool tb, std::int64_t m,
                                   std::int64_t n, std::int64_t k) {
  std::vector<double> s(std::size_t(m * n));
  const float *pa = a.data<float>(), *pb = b.data<float>();
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (std::int64_t l = 0; l < k; ++l)
        acc += std::abs(double(ta ? pa[l * m + i] : pa[i * k + l]) * double(tb ? pb[j * k + l] : pb[l * n + j]));
      s[std::size_t(i * n + j)] = acc;
    }
  return s;
}

TEST_P(Half16, BackendTakesTheseActivations) {
  EXPECT_TRUE(h().dt == DType::bf16 ? be().bf16_activations() : be().fp16_activations());
  EXPECT_FALSE(be().bf16_isa().empty());
  // The cast the stage and the Linear weight copies use: round to nearest even, bitwise the host's
  // (core/dtype.hpp), with values past the type's largest and in fp16's subnormal range.
  Tensor x = f32_values({1000}, 1, 3.0);
  const float special[] = {1e5f, -7e4f, 65504.f, 65520.f, 3e-6f, -6e-8f, 2.9e-8f, 1e-9f, 0.f, 3.4e38f};
  std::copy(std::begin(special), std::end(special), x.data<float>());
  Tensor d16 = dev({1000}, h().dt), back = dev({1000}, DType::f32);
  be().cast(x.to(gpu()), d16);
  be().cast(d16, back);
  be().synchronize();
  Tensor want = host_cast(x, h().dt);
  EXPECT_EQ(std::memcmp(d16.to(Device::cpu()).raw(), want.raw(), want.nbytes()), 0) << "f32 -> " << h().name;
  EXPECT_EQ(host_f32(back), host_f32(want)) << h().name << " -> f32 is exact";
}

TEST_P(Half16, LinearWithinTheDotProductBound) {
  const double u = h().u, eta = h().eta;
  const DType dt = h().dt;
  const std::int64_t n = 48, in = 96, out = 40;
  LinearSpec s{in, out, true, false};
  auto k = be().linear(s);
  const Tensor xh = values16({n, in}, 2, dt), wh = values16({out, in}, 3, dt, 0.1), bh = f32_values({out}, 4, 0.1),
               dyh = values16({n, out}, 5, dt);
  const Both x = up(xh, dt), w = up(wh, dt), dy = up(dyh, dt);
  const Tensor b = bh.to(gpu());
  Tensor y32 = dev({n, out}, DType::f32), dx32 = dev({n, in}, DType::f32), dw32 = dev({out, in}, DType::f32),
         db32 = dev({out}, DType::f32);
  k->forward(x.f32, w.f32, b, y32);
  k->backward(x.f32, w.f32, y32, dy.f32, dx32, dw32, db32, false);
  Tensor y16 = dev({n, out}, dt), dx16 = dev({n, in}, dt), dw = dev({out, in}, DType::f32),
         db = dev({out}, DType::f32), ylog = dev({n, out}, DType::f32);
  k->forward(x.h16, w.h16, b, y16);
  k->backward(x.h16, w.h16, y16, dy.h16, dx16, dw, db, false);
  k->forward(x.h16, w.h16, b, ylog);  // float32 output beside 16-bit inputs (logits for the loss)
  be().synchronize();
  const auto y = host_f32(y32), dx = host_f32(dx32);
  // y = rnd(rnd(x w^T) + b): the product rounded, then the sum (K = in).
  std::vector<double> t = abs_dot(xh, false, wh, true, n, out, in);
  std::vector<double> ty(t.size()), tl(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) {
    ty[i] = (u + 4 * double(in) * e32) * (1 + u) * t[i] + (u + 2 * e32) * std::abs(y[i]) + 2 * eta;
    tl[i] = 4 * double(in) * e32 * t[i] + 2 * e32 * std::abs(y[i]);
  }
  expect_within(host_f32(y16), y, ty, "Linear forward");
  expect_within(host_f32(ylog), y, tl, "Linear forward, f32 output");
  t = abs_dot(dyh, false, wh, false, n, in, out);  // dx = dy w (K = out), rounded once
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = 4 * double(out) * e32 * t[i] + u * std::abs(dx[i]) + eta;
  expect_within(host_f32(dx16), dx, t, "Linear dx");
  t = abs_dot(dyh, true, xh, false, out, in, n);  // dw = dy^T x (K = n), float32
  for (auto& v : t) v *= 4 * double(n) * e32;
  EXPECT_EQ(dw.dtype(), DType::f32);
  expect_within(host_f32(dw), host_f32(dw32), t, "Linear dw");
  std::vector<double> tb(static_cast<std::size_t>(out));  // db: column sums of dy (K = n)
  for (std::int64_t j = 0; j < out; ++j) {
    double s2 = 0;
    for (std::int64_t i = 0; i < n; ++i) s2 += std::abs(dyh.data<float>()[i * out + j]);
    tb[std::size_t(j)] = 4 * double(n) * e32 * s2;
  }
  expect_within(host_f32(db), host_f32(db32), tb, "Linear db");
  // The 16-bit type really ran: its outputs are rounded.
  EXPECT_NE(host_f32(dx16), dx) << "the " << h().name << " input gradient is bitwise the fp32 one";
  // A second accumulating backward adds the same float32 gradient: twice the
  // bound, plus the rounding of the float32 sum.
  k->backward(x.h16, w.h16, y16, dy.h16, dx16, dw, db, true);
  be().synchronize();
  auto twice = host_f32(dw32);
  for (std::size_t i = 0; i < t.size(); ++i) {
    twice[i] *= 2;
    t[i] = 2 * t[i] + 2 * e32 * std::abs(double(twice[i]));
  }
  expect_within(host_f32(dw), twice, t, "Linear dw, accumulated");
}

TEST_P(Half16, LayerNormGeluAddDropoutRoundOnce) {
  const Half& hh = h();
  const DType dt = hh.dt;
  const std::int64_t rows = 37, f = 67;  // not multiples of the warp
  const Tensor xh = values16({rows, f}, 7, dt, 2.0), dyh = values16({rows, f}, 8, dt);
  const Both x = up(xh, dt), dy = up(dyh, dt);
  const Tensor g = f32_values({f}, 9, 0.5).to(gpu()), b = f32_values({f}, 10, 0.5).to(gpu());
  LayerNormSpec ls;
  ls.features = f;
  auto ln = be().layernorm(ls);
  Tensor y32 = dev({rows, f}, DType::f32), dx32 = dev({rows, f}, DType::f32), dg32 = dev({f}, DType::f32),
         db32 = dev({f}, DType::f32);
  ln->forward(x.f32, g, b, y32, rt_test::state_of(*ln));
  ln->backward(x.f32, g, dy.f32, dx32, dg32, db32, false, rt_test::state_of(*ln));
  Tensor y16 = dev({rows, f}, dt), dx16 = dev({rows, f}, dt), dg = dev({f}, DType::f32), db = dev({f}, DType::f32);
  ln->forward(x.h16, g, b, y16, rt_test::state_of(*ln));
  ln->backward(x.h16, g, dy.h16, dx16, dg, db, false, rt_test::state_of(*ln));
  be().synchronize();
  expect_rounded(hh, y16, y32, "LayerNorm forward");
  expect_rounded(hh, dx16, dx32, "LayerNorm dx");
  expect_same_sums(dg, dg32, "LayerNorm dgamma");
  expect_same_sums(db, db32, "LayerNorm dbeta");

  auto gelu = be().eltwise(Eltwise::gelu, DType::f32);
  Tensor h32 = dev({rows, f}, DType::f32), dh32 = dev({rows, f}, DType::f32), h16 = dev({rows, f}, dt),
         dh16 = dev({rows, f}, dt);
  gelu->forward(x.f32, h32);
  gelu->backward(x.f32, h32, dy.f32, dh32);
  gelu->forward(x.h16, h16);
  gelu->backward(x.h16, h16, dy.h16, dh16);
  Tensor s32 = dev({rows, f}, DType::f32), s16 = dev({rows, f}, dt);
  be().add(x.f32, dy.f32, s32);
  be().add(x.h16, dy.h16, s16);
  Tensor m32 = dev({rows, f}, DType::u8), m16 = dev({rows, f}, DType::u8), d32 = dev({rows, f}, DType::f32),
         d16 = dev({rows, f}, dt), dd32 = dev({rows, f}, DType::f32), dd16 = dev({rows, f}, dt);
  be().dropout_forward(x.f32, 0.3, 11, 12, 5, m32, d32);
  be().dropout_forward(x.h16, 0.3, 11, 12, 5, m16, d16);
  be().dropout_backward(dy.f32, m32, 0.3, dd32);
  be().dropout_backward(dy.h16, m16, 0.3, dd16);
  be().synchronize();
  expect_rounded(hh, h16, h32, "GELU forward");
  expect_rounded(hh, dh16, dh32, "GELU backward");
  expect_rounded(hh, s16, s32, "add");
  Tensor hm32 = m32.to(Device::cpu()), hm16 = m16.to(Device::cpu());
  EXPECT_EQ(std::memcmp(hm32.raw(), hm16.raw(), hm16.nbytes()), 0) << "dropout keeps the same elements in " << hh.name;
  expect_rounded(hh, d16, d32, "dropout forward");
  expect_rounded(hh, dd16, dd32, "dropout backward");
}

TEST_P(Half16, TokenOpsAndFloat32Broadcasts) {
  const Half& hh = h();
  const DType dt = hh.dt;
  const std::int64_t n = 3, t = 16, d = 40;
  const Tensor xh = values16({n, t, d}, 20, dt), dyh = values16({n, d}, 21, dt);
  const Both x = up(xh, dt), dy = up(dyh, dt);
  const Tensor pos = f32_values({t, d}, 22, 0.02).to(gpu());  // a float32 parameter (position embedding)
  Tensor a32 = dev({n, t, d}, DType::f32), a16 = dev({n, t, d}, dt);
  be().add_broadcast(x.f32, pos, 1, a32);
  be().add_broadcast(x.h16, pos, 1, a16);
  Tensor p32 = dev({t, d}, DType::f32), p16 = dev({t, d}, DType::f32);
  be().sum_broadcast(x.f32, 1, p32, false);
  be().sum_broadcast(x.h16, 1, p16, false);  // 16-bit gradient into the float32 parameter gradient
  // Per channel (inner > 1): [n, t, d] as n images of t channels of d pixels.
  const Tensor cb = f32_values({t}, 23, 0.1).to(gpu());
  Tensor c32 = dev({n, t, d}, DType::f32), c16 = dev({n, t, d}, dt);
  be().add_broadcast(x.f32, cb, d, c32);
  be().add_broadcast(x.h16, cb, d, c16);
  Tensor g32 = dev({t}, DType::f32), g16 = dev({t}, DType::f32);
  be().sum_broadcast(x.f32, d, g32, false);
  be().sum_broadcast(x.h16, d, g16, false);
  Tensor m32 = dev({n, d}, DType::f32), m16 = dev({n, d}, dt);
  be().token_mean(x.f32, m32);
  be().token_mean(x.h16, m16);
  Tensor b32 = dev({n, t, d}, DType::f32), b16 = dev({n, t, d}, dt);
  be().token_mean_backward(dy.f32, b32);
  be().token_mean_backward(dy.h16, b16);
  // Patches (a copy: exact) of a 16-bit image.
  const Tensor img = values16({2, 3, 8, 8}, 24, dt), img16 = host_cast(img, dt).to(gpu());
  Tensor tok16 = dev({2, 4, 48}, dt), back16 = dev({2, 3, 8, 8}, dt);
  be().patchify(img16, 4, tok16);
  be().unpatchify(tok16, 4, back16);
  be().synchronize();
  expect_rounded(hh, a16, a32, "add_broadcast (f32 b)");
  expect_same_sums(p16, p32, "sum_broadcast (f32 db)");
  expect_rounded(hh, c16, c32, "add_broadcast per channel");
  expect_same_sums(g16, g32, "sum_broadcast per channel");
  expect_rounded(hh, m16, m32, "token_mean");
  expect_rounded(hh, b16, b32, "token_mean backward");
  EXPECT_EQ(host_f32(back16), host_f32(host_cast(img, dt))) << "unpatchify(patchify(x)) == x in " << hh.name;
}

// The attention core as on the CPU: S = scale Q K^T and dP in float32, P and
// dS rounded to the 16-bit type, four 16-bit products with float32
// accumulation. The bound is the CPU test's (tests/nn/bf16_kernels.cpp), its
// accumulation term doubled for truncating accumulators: |dO| <= max|V| (|dP|
// + u) + u|O| with |dP| <= 2|dS| + u, |dS| <= 2 (2u + 2 hd e) max sum|q k| /
// sqrt(hd); the backward within 8u of the largest fp32 gradient (the CPU
// measured 0.8u in bf16). fp16 adds eta per rounded P (or dS) entry, T of
// them in each sum, and eta for the output.
TEST_P(Half16, AttentionWithinTheBoundOfItsTwoProducts) {
  const double u = h().u, eta = h().eta;
  const DType dt = h().dt;
  for (auto [heads, hd, t] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{2, 8, 10}, {4, 16, 49}}) {
    const std::int64_t n = 3, d = heads * hd;
    AttentionSpec s;
    s.heads = heads;
    s.head_dim = hd;
    auto k = be().attention(s);
    const Tensor qh = values16({n, t, 3 * d}, 30 + std::uint32_t(t), dt), oh = values16({n, t, d}, 31, dt);
    const Both qkv = up(qh, dt), dout = up(oh, dt);
    Tensor o32 = dev({n, t, d}, DType::f32), dq32 = dev({n, t, 3 * d}, DType::f32);
    Tensor o16 = dev({n, t, d}, dt), dq16 = dev({n, t, 3 * d}, dt);
    k->forward(qkv.f32, o32, rt_test::state_of(*k));
    k->backward(qkv.f32, dout.f32, dq32, rt_test::state_of(*k));
    k->forward(qkv.h16, o16, rt_test::state_of(*k));
    k->backward(qkv.h16, dout.h16, dq16, rt_test::state_of(*k));
    be().synchronize();
    const auto mag = test_support::attention_magnitudes(qh.data<float>(), n, t, heads, hd);
    const double maxv = mag.max_v, maxqk = mag.max_qk;
    const double ds = 2 * (2 * u + 2 * double(hd) * e32) * maxqk, dp = 2 * ds + u;
    const auto o = host_f32(o32), dq = host_f32(dq32);
    const std::string tag = cat("attention T ", t, " heads ", heads);
    expect_within(host_f32(o16), o, times(o, u, maxv * (dp + u + double(t) * eta) + eta), tag + " forward");
    expect_within(host_f32(dq16), dq, std::vector<double>(dq.size(), 8 * (u * max_abs(dq) + double(t) * eta)),
                  tag + " backward");
    EXPECT_NE(host_f32(dq16), dq) << tag << ": " << h().name << " ran bitwise as fp32";
  }
}

// One step of a vit Stage on the GPU in fp32 and in the 16-bit type from the
// same initial parameters: the 16-bit stage stores that type, its loss
// differs, and loss and gradients follow fp32 within the CPU test's bf16
// bounds (1% of the loss, 20% of each gradient's norm; the CPU measured
// 0.003% and 0.9%), scaled by u / 2^-8 for fp16. fp16 runs as the trainer
// runs it: the float32 loss gradient multiplied by GradScaler's initial scale
// 2^16 before the stage casts it, the gradients unscaled after (exact: a
// power of two), all finite; fp32 gets the same scaling, so only the storage differs.
// (This vit on the CPU in fp32: scaled by 2^16 the activation gradients between
// its top-level layers peak at 4.0e3, far below fp16's 65504; unscaled, the
// smallest nonzero ones, 2e-8, would be below fp16's smallest subnormal 6e-8.)
TEST_P(Half16, VitStageFollowsFp32) {
  ModelConfig c;
  c.name = "vit";
  c.base_width = 32;
  c.heads = 2;
  c.depth = 2;
  c.mlp_ratio = 2;
  c.patch = 7;
  ModelConfig c16 = c;
  c16.math = h().dt == DType::bf16 ? MathMode::bf16 : MathMode::fp16;
  Stage a(c, gpu()), b(c16, gpu());
  EXPECT_EQ(a.activation_dtype(), DType::f32);
  ASSERT_EQ(b.activation_dtype(), h().dt) << "every vit layer takes " << h().name << " on the GPU";
  const double scale = h().dt == DType::f16 ? 65536.0 : 1.0, rel = h().u / std::ldexp(1.0, -8);
  DeviceRuntime& rt = device_runtime(DeviceKind::cuda);
  const std::int64_t n = 16;
  Tensor x = f32_values({n, 1, 28, 28}, 40).to(gpu()), y = Tensor::empty({n}, DType::i32);
  for (std::int64_t i = 0; i < n; ++i) y.data<std::int32_t>()[i] = std::int32_t(i % 10);
  Tensor yd = y.to(gpu());
  double loss[2];
  Stage* st[2] = {&a, &b};
  for (int k = 0; k < 2; ++k) {
    st[k]->zero_grads();
    Tensor dl = Tensor::empty(st[k]->output_shape(n), DType::f32, gpu());
    Tensor out = st[k]->forward(0, x, Mode::train);
    EXPECT_EQ(out.dtype(), DType::f32) << "the loss sees float32 logits";
    loss[k] = be().softmax_xent(out, yd, 0.0, dl);
    if (scale != 1.0) rt.scale(dl, scale);  // as the executor: before the stage's cast to 16 bits
    test_support::backward(*st[k], dl);
    EXPECT_TRUE(rt.unscale_grads(st[k]->arena(), 1.0 / scale)) << "a gradient overflowed at scale " << scale;
  }
  be().synchronize();
  EXPECT_NE(loss[0], loss[1]) << h().name << " ran bitwise as fp32";
  EXPECT_LE(std::abs(loss[1] - loss[0]), 0.01 * rel * loss[0]);
  double worst = 0;
  for (std::size_t i = 0; i < a.arena().size(); ++i) {
    ASSERT_EQ(b.arena().grad(i).dtype(), DType::f32) << "gradients stay float32";
    const auto g32 = host_f32(a.arena().grad(i)), g16 = host_f32(b.arena().grad(i));
    double num = 0, den = 0;
    for (std::size_t j = 0; j < g32.size(); ++j) {
      num += (double(g16[j]) - g32[j]) * (double(g16[j]) - g32[j]);
      den += double(g32[j]) * g32[j];
    }
    EXPECT_LE(std::sqrt(num), 0.2 * rel * std::sqrt(den) + 1e-7) << a.arena().info(i).name;
    worst = std::max(worst, std::sqrt(num / std::max(den, 1e-30)));
  }
  std::printf("vit stage on the GPU: loss %.6f (fp32) vs %.6f (%s); worst gradient difference %.4f of its norm\n",
              loss[0], loss[1], h().name, worst);
}

}  // namespace half_test
