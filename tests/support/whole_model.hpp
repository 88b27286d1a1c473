#pragma once
// A whole model for tests: a Stage over every top-level layer with one
// activation slot (parallel/stage.hpp), plus its backward in one call and the
// names of its layers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ringtrain/nn/rng.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"
#include "ringtrain/parallel/stage.hpp"

namespace ringtrain::test_support {

// Both halves of the backward from the logits' gradient (no input gradient):
// the gradients accumulate into the arena (Stage::zero_grads starts a step).
inline void backward(Stage& m, const Tensor& dlogits) {
  m.backward_input(0, dlogits, false);
  m.backward_weight(0);
}

inline std::vector<std::string> layer_names(Stage& m) {
  std::vector<std::string> out;
  for (int i = 0; i < m.num_layers(); ++i) out.push_back(m.layer(i).name());
  return out;
}

// A learnable batch t of n 1x8x8 images in [-1, 1) with 4 classes (from three pixels).
inline void batch_8x8(int t, std::int64_t n, Tensor& x, Tensor& y) {
  x = Tensor::empty({n, 1, 8, 8}, DType::f32);
  y = Tensor::empty({n}, DType::i32);
  for (std::int64_t i = 0; i < x.numel(); ++i)
    x.data<float>()[i] = 2.f * counter_uniform(11, std::uint64_t(t), std::uint64_t(i)) - 1.f;
  for (std::int64_t i = 0; i < n; ++i) {
    const float* img = x.data<float>() + i * 64;
    y.data<std::int32_t>()[i] = static_cast<std::int32_t>((img[0] + img[9] > 0 ? 1 : 0) + (img[36] > 0 ? 2 : 0));
  }
}

// The largest |mine - ref| / (1 + |ref|) over every parameter element (ref: whole, or a shard like mine).
inline double param_difference(const ParamArena& mine, const ParamArena& ref) {
  double worst = 0;
  for (std::size_t i = 0; i < mine.size(); ++i) {
    Tensor r = ref.param(i);
    if (mine.info(i).shard.sharded() && !ref.info(i).shard.sharded()) r = shard_of(r, mine.info(i).shard);
    const Tensor p = mine.param(i);
    EXPECT_EQ(p.numel(), r.numel()) << mine.info(i).name;
    for (std::int64_t k = 0; k < p.numel(); ++k) {
      const double b = r.data<float>()[k];
      worst = std::max(worst, std::abs(p.data<float>()[k] - b) / (1 + std::abs(b)));
    }
  }
  return worst;
}

}  // namespace ringtrain::test_support
