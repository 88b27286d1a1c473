#pragma once
// The CPU reducer's kernels: reduce_math.hpp's element math in loops the
// compiler vectorises (cpu_reducer.cpp), and explicit SIMD versions for the
// build's architecture (cpu_reducer_simd.<arch>.cpp; none off x86-64).
#include <cstddef>

#include "ringtrain/comm/reduce_math.hpp"
#include "ringtrain/core/dtype.hpp"

namespace ringtrain {

// d = a (op) b over n elements; with div, the result divided by `div` (avg's last combine).
using ReduceKernel = void (*)(void* d, const void* a, const void* b, std::size_t n, int div);

template <ReduceOp OP, typename T, bool DIV>
[[gnu::always_inline]] inline void scalar_loop(T* d, const T* a, const T* b, std::size_t n, int div) {
#pragma omp simd
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (DIV) d[i] = reduce_one_div<OP>(a[i], b[i], div);
    else d[i] = reduce_one<OP>(a[i], b[i]);
  }
}

// The explicit SIMD kernel for (op, dtype, div), or null when this CPU (or build) has none.
ReduceKernel simd_reduce_kernel(ReduceOp op, DType dtype, bool div);

}  // namespace ringtrain
