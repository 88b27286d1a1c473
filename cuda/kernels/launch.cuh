#pragma once
// Launch-shape helpers and the dtype switch shared by our kernels (internal).
// Grid-stride loops with a capped grid: enough blocks to fill an H100/H200
// (132 SMs x 16 resident blocks of 256 threads) without per-call queries.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "ringtrain/core/dtype.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/cuda/check.hpp"

namespace ringtrain::cuda::detail {

constexpr int kThreads = 256;
inline unsigned blocks_for(std::size_t n) {
  std::size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<std::size_t>(b, 1, 132 * 16));
}

#define RT_GRID_STRIDE(i, n)                                                                   \
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)

// Calls f(T{}) for the floating storage types used in compute (f32, f16, bf16, f64).
template <typename F>
void dispatch_float(DType dt, const char* what, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); return;
    case DType::f16: f(float16{}); return;
    case DType::bf16: f(bfloat16{}); return;
    case DType::f64: f(double{}); return;
    default: RT_FAIL(what, ": dtype ", dtype_name(dt), " is not supported (need float32/float16/bfloat16/float64)");
  }
}
// Calls f(T{}, P{}) for an activation storage type T and a parameter type P:
// one type (P = T, any of dispatch_float's), or 16-bit activations (bf16,
// f16) with float32 parameters (mixed precision: Backend::bf16_activations).
template <typename F>
void dispatch_act_param(DType act, DType param, const char* what, F&& f) {
  if (act == param) return dispatch_float(act, what, [&](auto t) { f(t, t); });
  if (param == DType::f32 && act == DType::bf16) return f(bfloat16{}, float{});
  if (param == DType::f32 && act == DType::f16) return f(float16{}, float{});
  RT_FAIL(what, ": ", dtype_name(act), " activations with ", dtype_name(param),
          " parameters are not supported (one type, or 16-bit activations with float32 parameters)");
}
// The collective dtypes: f32, f64, f16, bf16, i32, i64.
template <typename F>
void dispatch_collective(DType dt, const char* what, F&& f) {
  switch (dt) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    case DType::f16: f(float16{}); return;
    case DType::bf16: f(bfloat16{}); return;
    case DType::i32: f(std::int32_t{}); return;
    case DType::i64: f(std::int64_t{}); return;
    default: RT_FAIL(what, ": dtype ", dtype_name(dt), " is not a collective dtype");
  }
}

}  // namespace ringtrain::cuda::detail
