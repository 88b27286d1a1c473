// cpu.hpp on x86-64.
#include <immintrin.h>

#include "ringtrain/core/cpu.hpp"

namespace ringtrain {

const CpuFeatures& cpu_features() {
  static const CpuFeatures f{__builtin_cpu_supports("avx2") != 0, __builtin_cpu_supports("f16c") != 0,
                             __builtin_cpu_supports("fma") != 0, __builtin_cpu_supports("avx512f") != 0};
  return f;
}

void flush_denormals() { _mm_setcsr(_mm_getcsr() | 0x8040); }  // MXCSR FTZ (bit 15) | DAZ (bit 6)

void cpu_relax() { _mm_pause(); }

}  // namespace ringtrain
