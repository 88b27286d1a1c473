#pragma once
// CPU loop helpers for the optimizers: chunked OpenMP loops over a parameter's
// elements and deterministic reductions.
//
// Rules kept here: chunks have a fixed size independent of the thread count, and
// per-chunk partial sums are added in chunk order, so norms (and hence LARS/LAMB
// updates) have the same bits for any OMP_NUM_THREADS. Small tensors run serially.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ringtrain/core/dtype.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/optim/update_math.hpp"

namespace ringtrain::optim_detail {

constexpr std::int64_t kChunk = 1 << 14;       // elements per chunk
constexpr std::int64_t kParallelMin = 1 << 16;  // below this, one thread

// f(begin, end) over [0, n) in chunks, in parallel for large n.
template <class F>
void parallel_chunks(std::int64_t n, F&& f) {
  if (n <= kChunk) {
    if (n > 0) f(std::int64_t{0}, n);
    return;
  }
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c) f(c * kChunk, std::min(n, (c + 1) * kChunk));
}

// Sum of f(begin, end) -> R over fixed chunks, combined in chunk order. R has +=.
template <class R, class F>
R chunked_reduce(std::int64_t n, F&& f) {
  if (n <= kChunk) return n > 0 ? f(std::int64_t{0}, n) : R{};
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<R> part(static_cast<std::size_t>(chunks));
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c)
    part[static_cast<std::size_t>(c)] = f(c * kChunk, std::min(n, (c + 1) * kChunk));
  R total{};
  for (const R& r : part) total += r;
  return total;
}

template <typename T>
double sum_squares(const T* x, std::int64_t b, std::int64_t e) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (std::int64_t i = b; i < e; ++i) {
    double v = static_cast<double>(optim_math::load(x[i]));
    s += v * v;
  }
  return s;
}

template <typename T>
double norm(const T* x, std::int64_t n) {
  return std::sqrt(chunked_reduce<double>(n, [&](std::int64_t b, std::int64_t e) { return sum_squares(x, b, e); }));
}

// Calls f(T{}) with the storage type of a floating dtype; other dtypes are an Error.
template <class F>
void dispatch_floating(DType dt, const char* what, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    case DType::f16: f(float16{}); return;
    case DType::bf16: f(bfloat16{}); return;
    default: RT_FAIL(what, ": parameters of dtype ", dtype_name(dt), " cannot be optimised (floating types only)");
  }
}

// The compute/state dtype for parameters of dtype dt.
inline DType state_dtype(DType dt) { return dt == DType::f64 ? DType::f64 : DType::f32; }

}  // namespace ringtrain::optim_detail
