#pragma once
// Element types. float16/bfloat16 are storage types: arithmetic converts to
// float32 (reductions accumulate in float32).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "ringtrain/core/hd.hpp"

namespace ringtrain {

enum class DType : std::uint8_t { f32, f64, f16, bf16, i32, i64, u8 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}
const char* dtype_name(DType t);        // "float32", "float16", ...
DType parse_dtype(std::string_view s);  // accepts "float32"/"f32"/"fp32", ...; throws Error
constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

// IEEE 754 binary16, stored as bits.
struct float16 {
  std::uint16_t bits = 0;
};
// bfloat16: the upper half of a float32, stored as bits.
struct bfloat16 {
  std::uint16_t bits = 0;
};

RT_HD std::uint32_t f32_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
RT_HD float bits_f32(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
RT_HD bfloat16 to_bf16(float f) {
  std::uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bfloat16{static_cast<std::uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bfloat16{static_cast<std::uint16_t>(u >> 16)};
}
RT_HD float to_f32(bfloat16 h) { return bits_f32(static_cast<std::uint32_t>(h.bits) << 16); }

// float32 -> binary16, round to nearest even, overflow to inf, subnormals kept.
RT_HD float16 to_f16(float f) {
  if (std::uint16_t hw = 0; hw_to_f16(f, hw)) return float16{hw};
  std::uint32_t x = f32_bits(f);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return float16{static_cast<std::uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u))};
  if (ax >= 0x477ff000u) return float16{static_cast<std::uint16_t>(sign | 0x7c00u)};  // rounds to inf
  if (ax < 0x38800000u) {  // subnormal half (or zero)
    if (ax < 0x33000000u) return float16{static_cast<std::uint16_t>(sign)};
    std::uint32_t e = ax >> 23;
    std::uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    std::uint32_t shift = 126u - e;  // value * 2^24 = m >> shift, shift in [14, 24]
    std::uint32_t rem = m & ((1u << shift) - 1u);
    std::uint32_t halfway = 1u << (shift - 1u);
    std::uint32_t q = m >> shift;
    if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
    return float16{static_cast<std::uint16_t>(sign | q)};
  }
  std::uint32_t e = ((ax >> 23) - 112u) << 10;
  std::uint32_t m = (ax >> 13) & 0x3ffu;
  std::uint32_t h = e | m;
  std::uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return float16{static_cast<std::uint16_t>(sign | h)};
}
RT_HD float to_f32(float16 h) {
  if (float hw = 0; hw_from_f16(h.bits, hw)) return hw;
  std::uint32_t sign = (static_cast<std::uint32_t>(h.bits) & 0x8000u) << 16;
  std::uint32_t e = (h.bits >> 10) & 0x1fu;
  std::uint32_t m = h.bits & 0x3ffu;
  if (e == 0x1fu) return bits_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return bits_f32(sign);
    // subnormal: value = m * 2^-24
    float v = static_cast<float>(m) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<float16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<bfloat16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<std::uint8_t> { static constexpr DType value = DType::u8; };

// Calls f(T{}) with T the C++ type of `t`: one switch instead of many.
template <typename F>
decltype(auto) dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::f16: return f(float16{});
    case DType::bf16: return f(bfloat16{});
    case DType::i32: return f(std::int32_t{});
    case DType::i64: return f(std::int64_t{});
    case DType::u8: return f(std::uint8_t{});
  }
  return f(float{});
}

}  // namespace ringtrain
