#pragma once
// Test helpers: a single layer bound to its own arena on the CPU, random
// non-zero tensors, and a central-difference gradient checker in float64
// arithmetic around float32 layers (the perturbation actually applied after
// rounding to float32 is used as the step).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "ringtrain/nn/layers.hpp"

namespace rt_test {

using namespace ringtrain;

// One thread unless OMP_NUM_THREADS says otherwise: on a shared 2-core CI
// machine OpenMP's spinning threads make these small kernels ~10x slower.
// Multi-threaded kernels are exercised on purpose in Threads.* (loss_state).
inline const bool single_threaded_by_default = [] {
  if (!std::getenv("OMP_NUM_THREADS")) omp_set_num_threads(1);
  return true;
}();

// Uniform in +-[lo, hi]: never zero, random sign.
inline Tensor random_tensor(const Shape& s, std::uint64_t seed, double lo = 0.1, double hi = 1.0) {
  Tensor t = Tensor::empty(s);
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>((g() & 1 ? 1 : -1) * u(g));
  return t;
}

// Distinct values (a shuffled grid with spacing `step`), so max pooling and
// ReLU have no ties or values near a kink.
inline Tensor distinct_tensor(const Shape& s, std::uint64_t seed, double step = 0.01) {
  Tensor t = Tensor::empty(s);
  std::vector<float> v(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>((double(i) - double(v.size()) / 2 + 0.5) * step);
  std::mt19937_64 g(seed);
  std::shuffle(v.begin(), v.end(), g);
  std::copy(v.begin(), v.end(), t.data<float>());
  return t;
}

inline double dot(const Tensor& a, const Tensor& b) {
  double s = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) s += double(a.data<float>()[i]) * double(b.data<float>()[i]);
  return s;
}

struct Harness {
  ParamArena arena;
  LayerPtr layer;
  explicit Harness(LayerPtr l, std::uint64_t seed = 7) : layer(std::move(l)) {
    layer->register_params(arena, 0, "");
    arena.finalize();
    layer->bind(BindContext{backend_for(DeviceKind::cpu), Device::cpu(), arena, seed});
    layer->init(arena, seed);
  }
  // Replace every parameter by random non-zero values (biases included).
  void randomize_params(std::uint64_t seed, double lo = 0.1, double hi = 1.0) {
    for (std::size_t i = 0; i < arena.size(); ++i) arena.param(i).copy_from(random_tensor(arena.info(i).shape, seed + i, lo, hi));
  }
};

// Checks d/dx and d/dparams of L = sum(forward(x) * r) by central differences
// on up to `samples` coordinates per tensor. `before_forward` runs before
// every forward (e.g. to reset a dropout call counter).
struct GradCheck {
  double eps = 1e-2;
  double rtol = 1e-2;
  double atol_frac = 2e-3;  // of the largest analytic gradient of the tensor
  int samples = 48;
  Mode mode = Mode::train;
  std::function<void()> before_forward = [] {};

  void run(Harness& h, Tensor x, std::uint64_t seed = 1) {
    before_forward();
    Tensor y = h.layer->forward(x, mode);
    Tensor r = random_tensor(y.shape(), seed + 100, 0.2, 1.0);
    Tensor dx = h.layer->backward(r, true, false).clone();
    ASSERT_TRUE(dx.defined());
    auto loss = [&] {
      before_forward();
      return dot(h.layer->forward(x, mode), r);
    };
    check(x, dx, loss, "input", seed);
    for (std::size_t i = 0; i < h.arena.size(); ++i)
      check(h.arena.param(i), h.arena.grad(i).clone(), loss, h.arena.info(i).name, seed + i);
  }

  void check(Tensor v, Tensor analytic, const std::function<double()>& loss, const std::string& what,
             std::uint64_t seed) {
    float* p = v.data<float>();
    const float* a = analytic.data<float>();
    double amax = 0;
    for (std::int64_t i = 0; i < analytic.numel(); ++i) amax = std::max(amax, std::fabs(double(a[i])));
    ASSERT_GT(amax, 0) << what << ": analytic gradient is all zeros";
    std::mt19937_64 g(seed);
    const std::int64_t n = v.numel();
    const int m = static_cast<int>(std::min<std::int64_t>(n, samples));
    for (int s = 0; s < m; ++s) {
      std::int64_t i = n <= samples ? s : static_cast<std::int64_t>(g() % static_cast<std::uint64_t>(n));
      const float orig = p[i];
      const float up = static_cast<float>(orig + eps), dn = static_cast<float>(orig - eps);
      p[i] = up;
      double lu = loss();
      p[i] = dn;
      double ld = loss();
      p[i] = orig;
      double num = (lu - ld) / (double(up) - double(dn));
      EXPECT_NEAR(num, a[i], atol_frac * amax + rtol * std::fabs(a[i])) << what << "[" << i << "]";
    }
  }
};

}  // namespace rt_test
