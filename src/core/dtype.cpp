#include "ringtrain/core/dtype.hpp"

#include <algorithm>
#include <cctype>

#include "ringtrain/core/error.hpp"

namespace ringtrain {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::u8: return "uint8";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  std::string v(s);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "float32" || v == "f32" || v == "fp32" || v == "float") return DType::f32;
  if (v == "float64" || v == "f64" || v == "fp64" || v == "double") return DType::f64;
  if (v == "float16" || v == "f16" || v == "fp16" || v == "half") return DType::f16;
  if (v == "bfloat16" || v == "bf16") return DType::bf16;
  if (v == "int32" || v == "i32") return DType::i32;
  if (v == "int64" || v == "i64") return DType::i64;
  if (v == "uint8" || v == "u8") return DType::u8;
  RT_FAIL("unknown dtype '", s, "' (expected float32, float64, float16, bfloat16, int32, int64 or uint8)");
}

}  // namespace ringtrain
