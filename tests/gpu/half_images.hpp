#pragma once
// 16-bit storage of convolutions on the CUDA backend (issue 45, item 2;
// cuda/nn/conv.cpp, bn_pool.cpp): Conv2d, BatchNorm2d and Pool2d kernels of
// float32 layers fed bf16/fp16 activations, against the same float32 kernel
// fed the same values (numbers of the 16-bit type), both on the GPU, within
// the bounds of half_kernels.hpp (u, eta, e32 there), and for bf16 against
// the CPU backend's bf16 path on the same inputs (both within the bound of
// float32, so within twice it of each other; the CPU has no fp16 images).
//   - Conv2d: output k of length K = Cin kh kw (dx: Cout kh kw; dw: N OH OW)
//     is a dot product as Linear's; the sums of |products| come from the CPU
//     backend's float32 convolution of |x|, |w|, |dy|. The 16-bit weight
//     gradient is rounded once to the 16-bit type (cuDNN writes the data's
//     type) before it is cast into the float32 gradient: u |dw| + eta more.
//   - BatchNorm2d: cuDNN normalises in float, from equal values; the two data
//     types may sum the statistics (K = N H W values per channel) in another
//     order: 16 K e32 max|y| on top of the output's rounding (an estimate).
//   - Pooling: max pooling and its backward move values (exact: bitwise
//     equal); average pooling rounds its float mean once.
// Included by bf16_kernels.cpp and fp16_kernels.cpp (the Half16 suite there).
// Written and compiled without a GPU (cuDNN has no emulator); not yet run on one.
#include "half_kernels.hpp"

namespace half_test {

inline Tensor host_abs(const Tensor& t) {
  Tensor a = t.clone();
  for (std::int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = std::abs(a.data<float>()[i]);
  return a;
}

// The CPU backend's float32 convolution of |x|, |w| (and its backward with
// |dy|): per output the sum of |products| of its reduction.
struct AbsConv {
  std::vector<float> y, dx, dw;
};
inline AbsConv abs_conv(Conv2dSpec s, const Tensor& x, const Tensor& w, const Tensor& dy) {
  s.bias = s.fuse_relu = s.fuse_pool = false;
  auto k = backend_for(DeviceKind::cpu).conv2d(s);
  Tensor y = Tensor::empty(dy.shape()), dx = Tensor::empty(x.shape()), dw = Tensor::empty(w.shape()), db;
  const Tensor ax = host_abs(x), aw = host_abs(w), ady = host_abs(dy);
  k->forward(ax, aw, Tensor(), y, rt_test::state_of(*k));
  k->backward(ax, aw, y, ady, dx, dw, db, false, rt_test::state_of(*k));
  return {host_f32(y), host_f32(dx), host_f32(dw)};
}

TEST_P(Half16, ConvWithinTheDotProductBound) {
  EXPECT_TRUE(be().bf16_images());
  const double u = h().u, eta = h().eta;
  const DType dt = h().dt;
  const std::int64_t n = 4, cin = 5, cout = 6, hw = 9;
  const Conv2dSpec s = Conv2dSpec::square(cin, cout, 3, 1, true);
  auto k = be().conv2d(s);
  const Tensor xh = values16({n, cin, hw, hw}, 21, dt), wh = values16({cout, cin, 3, 3}, 22, dt, 0.2),
               bh = f32_values({cout}, 23, 0.1), dyh = values16({n, cout, hw, hw}, 24, dt);
  const Both x = up(xh, dt), w = up(wh, dt), dy = up(dyh, dt);
  const Tensor b = bh.to(gpu());
  const Shape ys{n, cout, hw, hw};
  Tensor y32 = dev(ys, DType::f32), dx32 = dev(xh.shape(), DType::f32), dw32 = dev(wh.shape(), DType::f32),
         db32 = dev({cout}, DType::f32);
  k->forward(x.f32, w.f32, b, y32, rt_test::state_of(*k));
  k->backward(x.f32, w.f32, y32, dy.f32, dx32, dw32, db32, false, rt_test::state_of(*k));
  Tensor y16 = dev(ys, dt), dx16 = dev(xh.shape(), dt), dw = dev(wh.shape(), DType::f32), db = dev({cout}, DType::f32);
  k->forward(x.h16, w.h16, b, y16, rt_test::state_of(*k));
  k->backward(x.h16, w.h16, y16, dy.h16, dx16, dw, db, false, rt_test::state_of(*k));
  be().synchronize();
  const AbsConv t = abs_conv(s, xh, wh, dyh);
  const auto y = host_f32(y32), dx = host_f32(dx32), dwf = host_f32(dw32);
  const double Ky = double(cin * 9), Kx = double(cout * 9), Kw = double(n * hw * hw);
  std::vector<double> ty(y.size()), tx(dx.size()), tw(dwf.size());
  for (std::size_t i = 0; i < y.size(); ++i)  // the product rounded, then the float32 bias added and rounded
    ty[i] = (u + 4 * Ky * e32) * (1 + u) * t.y[i] + (u + 2 * e32) * std::abs(y[i]) + 2 * eta;
  for (std::size_t i = 0; i < dx.size(); ++i) tx[i] = 4 * Kx * e32 * t.dx[i] + u * std::abs(dx[i]) + eta;
  for (std::size_t i = 0; i < dwf.size(); ++i) tw[i] = 4 * Kw * e32 * t.dw[i] + u * std::abs(dwf[i]) + eta;
  EXPECT_EQ(y16.dtype(), dt);
  expect_within(host_f32(y16), y, ty, "Conv2d forward");
  expect_within(host_f32(dx16), dx, tx, "Conv2d dx");
  EXPECT_EQ(dw.dtype(), DType::f32);
  expect_within(host_f32(dw), dwf, tw, "Conv2d dw");
  expect_same_sums(db, db32, "Conv2d db");
  EXPECT_NE(host_f32(dx16), dx) << "the " << h().name << " input gradient is bitwise the fp32 one";
  // Accumulating: the 16-bit gradient cast and added into the float32 one.
  k->backward(x.h16, w.h16, y16, dy.h16, dx16, dw, db, true, rt_test::state_of(*k));
  be().synchronize();
  auto twice = dwf;
  std::vector<double> t2(tw.size());
  for (std::size_t i = 0; i < tw.size(); ++i) {
    twice[i] *= 2;
    t2[i] = 2 * tw[i] + 2 * e32 * std::abs(double(twice[i]));
  }
  expect_within(host_f32(dw), twice, t2, "Conv2d dw, accumulated");

  // The fused ReLU (forward; ReLU is 1-Lipschitz: the same bound).
  Conv2dSpec sr = s;
  sr.fuse_relu = true;
  auto kr = be().conv2d(sr);
  Tensor r32 = dev(ys, DType::f32), r16 = dev(ys, dt);
  kr->forward(x.f32, w.f32, b, r32, rt_test::state_of(*kr));
  kr->forward(x.h16, w.h16, b, r16, rt_test::state_of(*kr));
  be().synchronize();
  expect_within(host_f32(r16), host_f32(r32), ty, "Conv2d+ReLU forward");

  if (dt != DType::bf16) return;
  // The CPU backend's bf16 path on the same inputs (its bf16 weight copy, float32 gradients).
  auto kc = backend_for(DeviceKind::cpu).conv2d(s);
  Tensor cy = Tensor::empty(ys, dt), cdx = Tensor::empty(xh.shape(), dt), cdw = Tensor::empty(wh.shape()),
         cdb = Tensor::empty({cout});
  const Tensor cx = host_cast(xh, dt), cw = host_cast(wh, dt), cdy = host_cast(dyh, dt);
  kc->forward(cx, cw, bh, cy, rt_test::state_of(*kc));
  kc->backward(cx, cw, cy, cdy, cdx, cdw, cdb, false, rt_test::state_of(*kc));
  for (auto* v : {&ty, &tx, &tw})
    for (double& e : *v) e *= 2;
  k->backward(x.h16, w.h16, y16, dy.h16, dx16, dw, db, false, rt_test::state_of(*k));
  be().synchronize();
  expect_within(host_f32(y16), host_f32(cy), ty, "Conv2d forward vs CPU bf16");
  expect_within(host_f32(dx16), host_f32(cdx), tx, "Conv2d dx vs CPU bf16");
  expect_within(host_f32(dw), host_f32(cdw), tw, "Conv2d dw vs CPU bf16");
}

TEST_P(Half16, BatchNormAndPoolingRoundOnce) {
  const Half& hh = h();
  const DType dt = hh.dt;
  const std::int64_t n = 4, c = 3, hw = 8, K = n * hw * hw;
  const Shape xs{n, c, hw, hw};
  const Tensor xh = values16(xs, 31, dt, 2.0), dyh = values16(xs, 32, dt);
  const Both x = up(xh, dt), dy = up(dyh, dt);
  const Tensor g = f32_values({c}, 33, 0.5).to(gpu()), bt = f32_values({c}, 34, 0.5).to(gpu());
  BatchNormSpec bs;
  bs.channels = c;
  auto bn = be().batchnorm(bs);
  Tensor rm32 = Tensor::zeros({c}, DType::f32, gpu()), rv32 = Tensor::zeros({c}, DType::f32, gpu());
  Tensor rm16 = Tensor::zeros({c}, DType::f32, gpu()), rv16 = Tensor::zeros({c}, DType::f32, gpu());
  Tensor y32 = dev(xs, DType::f32), dx32 = dev(xs, DType::f32), dg32 = dev({c}, DType::f32), db32 = dev({c}, DType::f32);
  bn->forward(x.f32, g, bt, rm32, rv32, true, y32, rt_test::state_of(*bn));
  bn->backward(x.f32, g, dy.f32, dx32, dg32, db32, false, rt_test::state_of(*bn));
  Tensor y16 = dev(xs, dt), dx16 = dev(xs, dt), dg = dev({c}, DType::f32), db = dev({c}, DType::f32);
  bn->forward(x.h16, g, bt, rm16, rv16, true, y16, rt_test::state_of(*bn));
  bn->backward(x.h16, g, dy.h16, dx16, dg, db, false, rt_test::state_of(*bn));
  be().synchronize();
  // Output rounding plus a statistics term (see the header); parameter gradients and statistics: float sums.
  auto near = [&](const Tensor& want, double k_terms) {
    const auto w = host_f32(want);
    return times(w, hh.u + slack, hh.eta + 16 * k_terms * e32 * max_abs(w));
  };
  const std::vector<double> tby = near(y32, double(K)), tbx = near(dx32, double(K));
  EXPECT_EQ(y16.dtype(), dt);
  expect_within(host_f32(y16), host_f32(y32), tby, "BatchNorm2d forward");
  expect_within(host_f32(dx16), host_f32(dx32), tbx, "BatchNorm2d dx");
  auto sums = [&](const Tensor& want) {
    const auto w = host_f32(want);
    return std::vector<double>(w.size(), 16 * double(K) * e32 * (max_abs(w) + 1));
  };
  EXPECT_EQ(dg.dtype(), DType::f32);
  expect_within(host_f32(dg), host_f32(dg32), sums(dg32), "BatchNorm2d dgamma");
  expect_within(host_f32(db), host_f32(db32), sums(db32), "BatchNorm2d dbeta");
  expect_within(host_f32(rm16), host_f32(rm32), sums(rm32), "BatchNorm2d running mean");
  expect_within(host_f32(rv16), host_f32(rv32), sums(rv32), "BatchNorm2d running var");
  if (dt == DType::bf16) {  // the CPU backend's bf16 path on the same inputs
    auto bc = backend_for(DeviceKind::cpu).batchnorm(bs);
    Tensor rm = Tensor::zeros({c}), rv = Tensor::zeros({c}), cy = Tensor::empty(xs, dt), cdx = Tensor::empty(xs, dt),
           cdg = Tensor::empty({c}), cdb = Tensor::empty({c});
    const Tensor cx = host_cast(xh, dt), cdy = host_cast(dyh, dt), gh = g.to(Device::cpu()), bh = bt.to(Device::cpu());
    bc->forward(cx, gh, bh, rm, rv, true, cy, rt_test::state_of(*bc));
    bc->backward(cx, gh, cdy, cdx, cdg, cdb, false, rt_test::state_of(*bc));
    auto twice = [](std::vector<double> v) {
      for (double& e : v) e *= 2;
      return v;
    };
    expect_within(host_f32(y16), host_f32(cy), twice(tby), "BatchNorm2d forward vs CPU bf16");
    expect_within(host_f32(dx16), host_f32(cdx), twice(tbx), "BatchNorm2d dx vs CPU bf16");
    expect_within(host_f32(dg), host_f32(cdg), twice(sums(dg32)), "BatchNorm2d dgamma vs CPU bf16");
  }

  // Pooling 2x2 / 2 on distinct values (i % 97 - 48) / 16, exact in both 16-bit types: no ties.
  Tensor ph = Tensor::empty(xs);
  for (std::int64_t i = 0; i < ph.numel(); ++i) ph.data<float>()[i] = float(i % 97 - 48) / 16;
  const Both p = up(ph, dt);
  const Shape ps{n, c, hw / 2, hw / 2};
  const Tensor pdyh = values16(ps, 35, dt);
  const Both pdy = up(pdyh, dt);
  for (PoolKind kind : {PoolKind::max, PoolKind::avg}) {
    Pool2dSpec ss;
    ss.kind = kind;
    auto pk = be().pool2d(ss);
    Tensor q32 = dev(ps, DType::f32), q16 = dev(ps, dt), e32t = dev(xs, DType::f32), e16 = dev(xs, dt);
    pk->forward(p.f32, q32, true, rt_test::state_of(*pk));
    pk->backward(p.f32, q32, pdy.f32, e32t, rt_test::state_of(*pk));
    pk->forward(p.h16, q16, true, rt_test::state_of(*pk));
    pk->backward(p.h16, q16, pdy.h16, e16, rt_test::state_of(*pk));
    be().synchronize();
    const std::string what = kind == PoolKind::max ? "MaxPool2d" : "AvgPool2d";
    EXPECT_EQ(q16.dtype(), dt);
    if (kind == PoolKind::max) {  // values moved, not computed
      EXPECT_EQ(host_f32(q16), host_f32(q32)) << what << " forward";
      EXPECT_EQ(host_f32(e16), host_f32(e32t)) << what << " dx";
    } else {
      expect_rounded(hh, q16, q32, what + " forward");
      expect_rounded(hh, e16, e32t, what + " dx");
    }
  }
}

}  // namespace half_test
