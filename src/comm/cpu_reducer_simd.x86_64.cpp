// The AVX2+F16C reduction kernels (cpu_reducer_kernels.hpp), chosen at start-up
// when the CPU has both. float16/bfloat16 have explicit paths (hardware F16C
// conversion; bf16 conversion with integer ops) that round exactly like the
// scalar RT_HD code used for the tails, so every element of a reduction gets
// the same bits whichever path it took.
#include <immintrin.h>

#include "cpu_reducer_kernels.hpp"
#include "ringtrain/core/cpu.hpp"

namespace ringtrain {
namespace {

#define RT_AVX2 [[gnu::target("avx2,f16c")]]

template <ReduceOp OP, bool DIV>
RT_AVX2 [[gnu::always_inline]] inline __m256 combine8(__m256 a, __m256 b, __m256 div) {
  __m256 r;
  // min_ps(b, a) = b < a ? b : a and max_ps(b, a) = b > a ? b : a: exactly combine<OP>.
  if constexpr (OP == ReduceOp::min) r = _mm256_min_ps(b, a);
  else if constexpr (OP == ReduceOp::max) r = _mm256_max_ps(b, a);
  else r = _mm256_add_ps(a, b);
  if constexpr (DIV) r = _mm256_div_ps(r, div);
  return r;
}

// Round float32 bits to bfloat16 like to_bf16() (nearest even; NaN -> quiet NaN
// of the same sign), leaving the 16 result bits in the low half of each lane.
RT_AVX2 inline __m256i f32_to_bf16_bits(__m256 x) {
  __m256i u = _mm256_castps_si256(x);
  __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet, nan);
}

// 16 bfloat16 at a time: unpacking against zero puts each value in the upper
// half of a 32-bit lane (= its float32), and packus undoes the unpack's
// in-lane interleaving, so no cross-lane shuffles are needed.
template <ReduceOp OP, bool DIV>
RT_AVX2 inline void bf16x16(void* d, const void* a, const void* b, __m256 div) {
  __m256i z = _mm256_setzero_si256();
  __m256i va = _mm256_loadu_si256(static_cast<const __m256i*>(a));
  __m256i vb = _mm256_loadu_si256(static_cast<const __m256i*>(b));
  __m256 lo = combine8<OP, DIV>(_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, va)),
                                _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, vb)), div);
  __m256 hi = combine8<OP, DIV>(_mm256_castsi256_ps(_mm256_unpackhi_epi16(z, va)),
                                _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, vb)), div);
  __m256i packed = _mm256_packus_epi32(f32_to_bf16_bits(lo), f32_to_bf16_bits(hi));
  _mm256_storeu_si256(static_cast<__m256i*>(d), packed);
}

template <ReduceOp OP, typename T, bool DIV>
RT_AVX2 void kernel_avx2(void* dv, const void* av, const void* bv, std::size_t n, int div) {
  auto* d = static_cast<T*>(dv);
  auto* a = static_cast<const T*>(av);
  auto* b = static_cast<const T*>(bv);
  std::size_t i = 0;
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    __m256 vd = _mm256_set1_ps(static_cast<float>(div));
    if constexpr (std::is_same_v<T, float16>) {
      for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
        __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
        __m128i h = _mm256_cvtps_ph(combine8<OP, DIV>(x, y, vd), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
      }
    } else {
      for (; i + 16 <= n; i += 16) bf16x16<OP, DIV>(d + i, a + i, b + i, vd);
    }
  }
  // Everything else (and the tails) vectorises from the RT_HD element math.
  scalar_loop<OP, T, DIV>(d + i, a + i, b + i, n - i, div);
}

}  // namespace

ReduceKernel simd_reduce_kernel(ReduceOp op, DType dtype, bool div) {
  static const bool have = cpu_features().avx2 && cpu_features().f16c;
  if (!have) return nullptr;
  return dispatch_dtype(dtype, [&](auto t) -> ReduceKernel {
    using T = decltype(t);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg: return div ? kernel_avx2<ReduceOp::sum, T, true> : kernel_avx2<ReduceOp::sum, T, false>;
      case ReduceOp::min: return div ? kernel_avx2<ReduceOp::min, T, true> : kernel_avx2<ReduceOp::min, T, false>;
      case ReduceOp::max: return div ? kernel_avx2<ReduceOp::max, T, true> : kernel_avx2<ReduceOp::max, T, false>;
    }
    return nullptr;
  });
}

}  // namespace ringtrain
