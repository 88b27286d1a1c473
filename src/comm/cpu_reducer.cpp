// CPU reduction kernels: reduce_math.hpp's element math in loops the compiler
// vectorises, or the explicit SIMD kernels of the build's architecture
// (cpu_reducer_simd.<arch>.cpp) where the CPU has them (its features are read
// once). Both round alike: every element of a reduction gets the same bits
// whichever path it took.
#include <cstring>

#include "cpu_reducer_kernels.hpp"
#include "ringtrain/comm/host_backend.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain {
namespace {

template <ReduceOp OP, typename T, bool DIV>
void kernel_base(void* d, const void* a, const void* b, std::size_t n, int div) {
  scalar_loop<OP, T, DIV>(static_cast<T*>(d), static_cast<const T*>(a), static_cast<const T*>(b), n, div);
}

template <typename T>
ReduceKernel pick(ReduceOp op, DType dtype, bool div) {
  if (ReduceKernel k = simd_reduce_kernel(op, dtype, div)) return k;
#define RT_K(OP) (div ? kernel_base<OP, T, true> : kernel_base<OP, T, false>)
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return RT_K(ReduceOp::sum);
    case ReduceOp::min: return RT_K(ReduceOp::min);
    case ReduceOp::max: return RT_K(ReduceOp::max);
  }
#undef RT_K
  RT_FAIL("reduce: unknown op ", static_cast<int>(op));
}

template <typename T>
void divide_loop(T* p, std::size_t n, int d) {
#pragma omp simd
  for (std::size_t i = 0; i < n; ++i) p[i] = from_acc<T>(divide_by(to_acc(p[i]), d));
}

}  // namespace

void CpuReducer::reduce(void* dst, const void* a, const void* b, std::size_t n, DType dtype, ReduceOp op,
                        int divisor) {
  if (n == 0) return;
  bool div = divisor > 1;
  ReduceKernel k = dispatch_dtype(dtype, [&](auto t) { return pick<decltype(t)>(op, dtype, div); });
  k(dst, a, b, n, divisor);
}

void CpuReducer::copy(void* dst, const void* src, std::size_t bytes) {
  if (dst != src && bytes) std::memcpy(dst, src, bytes);
}

void CpuReducer::divide(void* buf, std::size_t n, DType dtype, int divisor) {
  if (n == 0 || divisor == 1) return;
  dispatch_dtype(dtype, [&](auto t) { divide_loop(static_cast<decltype(t)*>(buf), n, divisor); });
}

}  // namespace ringtrain
