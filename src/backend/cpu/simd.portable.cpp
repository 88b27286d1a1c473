// simd.hpp off x86-64: no explicit kernels; the portable loops serve.
#include "simd.hpp"

namespace ringtrain::cpu {

const CpuSimd* cpu_simd() { return nullptr; }

}  // namespace ringtrain::cpu
