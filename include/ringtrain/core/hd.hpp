#pragma once
// RT_HD marks functions compiled for both host and device, so element-wise math
// (reductions, casts, optimizer updates) is written once for both backends.
#include <cstdint>
#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define RT_HD __host__ __device__ __forceinline__
#else
#define RT_HD inline
#endif

namespace ringtrain {

// float32 <-> binary16 in one instruction where the code runs on a GPU
// (cvt.rn.f16.f32 rounds to nearest even with subnormals and overflow to inf,
// exactly as dtype.hpp's portable code; NaN stays with that code, whose quiet
// NaN bits differ from the instruction's). Returns false on the host.
RT_HD bool hw_to_f16(float f, std::uint16_t& out) {
#if defined(__CUDA_ARCH__)
  if (f != f) return false;
  out = __half_as_ushort(__float2half_rn(f));
  return true;
#else
  (void)f;
  (void)out;
  return false;
#endif
}
RT_HD bool hw_from_f16(std::uint16_t bits, float& out) {
#if defined(__CUDA_ARCH__)
  if ((bits & 0x7c00u) == 0x7c00u && (bits & 0x3ffu) != 0) return false;  // NaN: keep its payload
  out = __half2float(__ushort_as_half(bits));
  return true;
#else
  (void)bits;
  (void)out;
  return false;
#endif
}

}  // namespace ringtrain
