#pragma once
// Explicit SIMD versions of a few element-wise CPU kernels: AVX2 in
// simd.x86_64.cpp (GCC keeps the portable loops scalar at the baseline x86-64
// ISA); simd.portable.cpp, for every other architecture, has none. The callers
// keep the portable loop and take these when cpu_simd() is not null.
#include <cstdint>

namespace ringtrain::cpu {

struct CpuSimd {
  // dst[i] = y[i] > 0 ? dy[i] : 0 for i in [b, e) (ReLU backward from the output).
  void (*relu_mask)(const float* y, const float* dy, float* dst, std::int64_t b, std::int64_t e);
  // out[i] = a[i] + c[i] for i in [b, e).
  void (*add)(const float* a, const float* c, float* out, std::int64_t b, std::int64_t e);
  // 2x2 max-pool backward of 8 lanes: gradient g to the first of p00, p01, p10, p11 equal to y
  // (conv.cpp's Lanes8::portable is the reference).
  void (*maxpool_lanes8)(const float* p00, const float* p01, const float* p10, const float* y, const float* g,
                         float* q00, float* q01, float* q10, float* q11);
};

// The kernels this CPU runs, or null (no AVX2, or not x86-64).
const CpuSimd* cpu_simd();

}  // namespace ringtrain::cpu
