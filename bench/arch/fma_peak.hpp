#pragma once
// One core's measured fp32 FMA peak in GFLOP/s (an FMA-bound loop), for the
// benchmarks' "% of peak"; 0 where it is not measured (no AVX2+FMA, or not
// x86-64: fma_peak.portable.cpp). The description says what was measured.
namespace rt_bench {

struct FmaPeak {
  double gflops = 0;
  const char* what = "not measured on this CPU";
};
FmaPeak fma_peak();

}  // namespace rt_bench
