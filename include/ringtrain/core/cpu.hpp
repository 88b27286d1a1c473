#pragma once
// The CPU-architecture-specific operations, implemented once per architecture:
// src/core/cpu.x86_64.cpp on x86-64, src/core/cpu.portable.cpp elsewhere (CMake
// picks one, RINGTRAIN_ARCH). Intrinsics and CPU feature checks appear only in
// *.x86_64.cpp files, so the build is not x86-only (tests/core/arch_isolated).
namespace ringtrain {

// What the explicit SIMD kernels need; all false off x86-64.
struct CpuFeatures {
  bool avx2 = false, f16c = false, fma = false, avx512f = false;
};
const CpuFeatures& cpu_features();

// Flush denormals to zero (FTZ+DAZ) on the calling (compute) thread, as DL
// frameworks do: tiny gradients late in training otherwise cost ~100 cycles
// per operation in microcode assists (measured ~15% of a `cnn` step on x86).
// Portable: nothing (the default IEEE mode; slower, same results up to denormals).
void flush_denormals();

// Spin-wait hint in a busy loop (x86 PAUSE; portable: a compiler barrier).
void cpu_relax();

}  // namespace ringtrain
