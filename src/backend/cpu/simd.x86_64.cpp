// simd.hpp on x86-64: AVX2, taken when the CPU has it.
#include <immintrin.h>

#include "ringtrain/core/cpu.hpp"
#include "simd.hpp"

namespace ringtrain::cpu {
namespace {

__attribute__((target("avx2"))) void relu_mask_avx2(const float* y, const float* dy, float* dst, std::int64_t b,
                                                    std::int64_t e) {
  const __m256 z = _mm256_setzero_ps();
  std::int64_t i = b;
  for (; i + 8 <= e; i += 8) {
    const __m256 m = _mm256_cmp_ps(_mm256_loadu_ps(y + i), z, _CMP_GT_OQ);
    _mm256_storeu_ps(dst + i, _mm256_and_ps(m, _mm256_loadu_ps(dy + i)));
  }
  for (; i < e; ++i) dst[i] = y[i] > 0.f ? dy[i] : 0.f;
}

__attribute__((target("avx2"))) void add_avx2(const float* a, const float* c, float* out, std::int64_t b,
                                              std::int64_t e) {
  std::int64_t i = b;
  for (; i + 8 <= e; i += 8) _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(c + i)));
  for (; i < e; ++i) out[i] = a[i] + c[i];
}

__attribute__((target("avx2"))) void maxpool_lanes8_avx2(const float* p00, const float* p01, const float* p10,
                                                         const float* y, const float* g, float* q00, float* q01,
                                                         float* q10, float* q11) {
  const __m256 yv = _mm256_loadu_ps(y), gv = _mm256_loadu_ps(g);
  const __m256 m00 = _mm256_cmp_ps(_mm256_loadu_ps(p00), yv, _CMP_EQ_OQ);
  const __m256 m01 = _mm256_andnot_ps(m00, _mm256_cmp_ps(_mm256_loadu_ps(p01), yv, _CMP_EQ_OQ));
  const __m256 taken = _mm256_or_ps(m00, m01);
  const __m256 m10 = _mm256_andnot_ps(taken, _mm256_cmp_ps(_mm256_loadu_ps(p10), yv, _CMP_EQ_OQ));
  _mm256_storeu_ps(q00, _mm256_and_ps(m00, gv));
  _mm256_storeu_ps(q01, _mm256_and_ps(m01, gv));
  _mm256_storeu_ps(q10, _mm256_and_ps(m10, gv));
  _mm256_storeu_ps(q11, _mm256_andnot_ps(_mm256_or_ps(taken, m10), gv));
}

constexpr CpuSimd kAvx2{relu_mask_avx2, add_avx2, maxpool_lanes8_avx2};

}  // namespace

const CpuSimd* cpu_simd() {
  static const CpuSimd* s = cpu_features().avx2 ? &kAvx2 : nullptr;
  return s;
}

}  // namespace ringtrain::cpu
