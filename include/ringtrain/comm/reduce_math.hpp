#pragma once
// Element-wise reduction math, written once for the CPU kernels and the CUDA
// kernels (RT_HD), so both backends round identically.
// Rules:
//  - float16/bfloat16 combine in float32 and round once per combine (one
//    rounding per ring/tree step); avg's division is fused into the final
//    combine (one rounding for sum-and-divide).
//  - avg is sum followed by one division by the rank count at the end; for
//    integers that is C++ integer division (truncation toward zero).
//  - min/max use `<`/`>` selects (vectorise; NaN handling follows the select).
#include <cstdint>

#include "ringtrain/core/dtype.hpp"
#include "ringtrain/core/hd.hpp"

namespace ringtrain {

enum class ReduceOp { sum, avg, min, max };

// The type a dtype accumulates in (float16/bfloat16 -> float).
template <typename T> struct acc_of { using type = T; };
template <> struct acc_of<float16> { using type = float; };
template <> struct acc_of<bfloat16> { using type = float; };
template <typename T> using acc_t = typename acc_of<T>::type;

template <typename T> RT_HD acc_t<T> to_acc(T v) { return v; }
RT_HD float to_acc(float16 v) { return to_f32(v); }
RT_HD float to_acc(bfloat16 v) { return to_f32(v); }

template <typename T> RT_HD T from_acc(acc_t<T> v) { return v; }
template <> RT_HD float16 from_acc<float16>(float v) { return to_f16(v); }
template <> RT_HD bfloat16 from_acc<bfloat16>(float v) { return to_bf16(v); }

// One combine of two accumulated values; avg combines as sum.
template <ReduceOp OP, typename A> RT_HD A combine(A a, A b) {
  if constexpr (OP == ReduceOp::min) return b < a ? b : a;
  else if constexpr (OP == ReduceOp::max) return a < b ? b : a;
  else return a + b;
}

// The division avg applies once, in the accumulation type (integers truncate).
template <typename A> RT_HD A divide_by(A v, int d) { return v / static_cast<A>(d); }
RT_HD std::uint8_t divide_by(std::uint8_t v, int d) { return static_cast<std::uint8_t>(v / d); }

// dst = op(a, b) element-wise, rounded once to T; with divisor > 1 the result is
// divided before the rounding (avg's last step).
template <ReduceOp OP, typename T> RT_HD T reduce_one(T a, T b) {
  return from_acc<T>(combine<OP>(to_acc(a), to_acc(b)));
}
template <ReduceOp OP, typename T> RT_HD T reduce_one_div(T a, T b, int divisor) {
  return from_acc<T>(divide_by(combine<OP>(to_acc(a), to_acc(b)), divisor));
}

}  // namespace ringtrain
