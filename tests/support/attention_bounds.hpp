#pragma once
// Magnitudes that bound a 16-bit attention's error against float32 (the CPU
// and GPU half-precision kernel tests): the largest |v| and, over every
// sample, head and pair of tokens, the largest sum_c |q_c k_c| / sqrt(hd).
// qkv is float32 [n, t, 3 * heads * hd] (q, then k, then v per token).
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace ringtrain::test_support {

struct AttentionMagnitudes {
  double max_v = 0, max_qk = 0;
};

inline AttentionMagnitudes attention_magnitudes(const float* p, std::int64_t n, std::int64_t t, std::int64_t heads,
                                                std::int64_t hd) {
  const std::int64_t d = heads * hd;
  AttentionMagnitudes m;
  for (std::int64_t i = 0; i < n * t; ++i)
    for (std::int64_t c = 0; c < d; ++c) m.max_v = std::max(m.max_v, double(std::abs(p[i * 3 * d + 2 * d + c])));
  for (std::int64_t b = 0; b < n; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < t; ++i)
        for (std::int64_t j = 0; j < t; ++j) {
          double sum = 0;
          for (std::int64_t c = 0; c < hd; ++c)
            sum += std::abs(double(p[(b * t + i) * 3 * d + h * hd + c]) * p[(b * t + j) * 3 * d + d + h * hd + c]);
          m.max_qk = std::max(m.max_qk, sum / std::sqrt(double(hd)));
        }
  return m;
}

}  // namespace ringtrain::test_support
