#include <immintrin.h>
#include <time.h>

#include <algorithm>
#include <cstdio>

#include "fma_peak.hpp"
#include "ringtrain/core/cpu.hpp"

namespace rt_bench {
namespace {

// Process CPU time: other processes holding the core do not count.
double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// 12 independent 8-wide FMA chains (enough to cover latency x throughput on 2
// FMA pipes). Returns GFLOP/s of one thread.
__attribute__((target("avx2,fma"))) double fma_peak_avx2() {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(0.001f * float(i));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  const long reps = 2'000'000;
  double s = 1e9;
  for (int trial = 0; trial < 20; ++trial) {  // best of 20: other processes only ever slow it down
    double t0 = cpu_now();
    for (long r = 0; r < reps; ++r)
      for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    s = std::min(s, cpu_now() - t0);
  }
  float sink = 0;
  for (int i = 0; i < 12; ++i) sink += _mm256_cvtss_f32(acc[i]);
  if (sink == 12345.f) std::puts("");
  return double(reps) * 12 * 8 * 2 / s / 1e9;
}

}  // namespace

FmaPeak fma_peak() {
  const auto& f = ringtrain::cpu_features();
  if (!f.avx2 || !f.fma) return {};
  return {fma_peak_avx2(), f.avx512f ? "AVX2 8-wide fp32 FMA, 2 FLOP each (AVX-512 present: oneDNN may exceed this)"
                                     : "AVX2 8-wide fp32 FMA, 2 FLOP each"};
}

}  // namespace rt_bench
