#pragma once
// Helpers for the GPU tests: random host data, host<->device tensors, and the
// relative error bound used throughout (max |a-b| / max(|ref|, tiny)).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "ringtrain/core/tensor.hpp"

namespace rt_gpu {

using ringtrain::Device;
using ringtrain::DType;
using ringtrain::Shape;
using ringtrain::Tensor;

inline Device gpu() { return Device::cuda(0); }

// Host f32 tensor with uniform(-a, a) entries from a fixed seed.
inline Tensor randu(const Shape& s, std::uint32_t seed, float a = 1.0f) {
  Tensor t = Tensor::empty(s, DType::f32);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-a, a);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = d(gen);
  return t;
}

inline std::vector<float> host_f32(const Tensor& t) {
  Tensor h = t.device().is_cpu() ? t : t.to(Device::cpu());
  std::vector<float> v(static_cast<std::size_t>(h.numel()));
  if (h.dtype() == DType::f32) {
    std::memcpy(v.data(), h.raw(), v.size() * 4);
  } else if (h.dtype() == DType::bf16) {
    auto* p = static_cast<const ringtrain::bfloat16*>(h.raw());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = ringtrain::to_f32(p[i]);
  } else if (h.dtype() == DType::f16) {
    auto* p = static_cast<const ringtrain::float16*>(h.raw());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = ringtrain::to_f32(p[i]);
  } else {
    ADD_FAILURE() << "host_f32: unsupported dtype " << ringtrain::dtype_name(h.dtype());
  }
  return v;
}

// f32 host tensor -> host tensor of dtype dt (round to nearest even).
inline Tensor host_cast(const Tensor& t, DType dt) {
  if (dt == DType::f32) return t.clone();
  Tensor o = Tensor::empty(t.shape(), dt);
  const float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    if (dt == DType::bf16) static_cast<ringtrain::bfloat16*>(o.raw())[i] = ringtrain::to_bf16(p[i]);
    else static_cast<ringtrain::float16*>(o.raw())[i] = ringtrain::to_f16(p[i]);
  }
  return o;
}

inline double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  EXPECT_EQ(got.size(), ref.size());
  double num = 0.0, den = 1e-30;
  for (std::size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(got[i]) - ref[i]));
    den = std::max(den, std::fabs(static_cast<double>(ref[i])));
  }
  return num / den;
}

}  // namespace rt_gpu
