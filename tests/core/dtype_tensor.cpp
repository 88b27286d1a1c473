// Core types: fp16/bf16 conversion against exhaustive/independent references,
// and tensor views.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "ringtrain/core/dtype.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/core/tensor.hpp"

using namespace ringtrain;

TEST(DType, Float16RoundTripsEveryFiniteHalf) {
  // Every finite binary16 value converts to float exactly and back to the same bits.
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    float16 h{static_cast<std::uint16_t>(b)};
    std::uint32_t e = (b >> 10) & 0x1f;
    float f = to_f32(h);
    if (e == 0x1f) {
      if (b & 0x3ff) EXPECT_TRUE(std::isnan(f));
      else EXPECT_TRUE(std::isinf(f));
      continue;
    }
    ASSERT_EQ(to_f16(f).bits, b) << "bits " << b << " value " << f;
  }
}

TEST(DType, Float16ValuesMatchLdexp) {
  EXPECT_EQ(to_f32(float16{0x3c00}), 1.0f);
  EXPECT_EQ(to_f32(float16{0xc000}), -2.0f);
  EXPECT_EQ(to_f32(float16{0x7bff}), 65504.0f);
  EXPECT_EQ(to_f32(float16{0x0001}), std::ldexp(1.0f, -24));
  EXPECT_EQ(to_f32(float16{0x0400}), std::ldexp(1.0f, -14));
  // Round to nearest even at the halfway point between 1 and 1 + 2^-10.
  EXPECT_EQ(to_f16(1.0f + std::ldexp(1.0f, -11)).bits, 0x3c00);
  EXPECT_EQ(to_f16(1.0f + 3 * std::ldexp(1.0f, -11)).bits, 0x3c02);
  EXPECT_EQ(to_f16(65520.0f).bits, 0x7c00);  // overflows to inf
  EXPECT_EQ(to_f16(std::ldexp(1.0f, -25)).bits, 0x0000);  // halfway to the smallest subnormal: even
  EXPECT_EQ(to_f16(std::ldexp(1.5f, -25)).bits, 0x0001);
}

TEST(DType, BFloat16RoundsToNearestEven) {
  for (std::uint32_t hi = 0; hi < 0x10000u; hi += 7) {
    std::uint32_t u = hi << 16;
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    EXPECT_EQ(to_bf16(f).bits, hi);
  }
  EXPECT_EQ(to_bf16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);  // tie -> even
  EXPECT_EQ(to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
  EXPECT_TRUE(std::isnan(to_f32(to_bf16(std::nanf("")))));
}

TEST(DType, ParseNamesAndRejectsUnknown) {
  EXPECT_EQ(parse_dtype("fp16"), DType::f16);
  EXPECT_EQ(parse_dtype("BF16"), DType::bf16);
  try {
    parse_dtype("float8");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("float8"), std::string::npos);
  }
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::zeros({4, 3});
  Tensor rows = t.slice_rows(1, 3);
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  rows.fill_(2.0);
  const float* p = t.data<float>();
  for (int i = 0; i < 12; ++i) EXPECT_EQ(p[i], (i >= 3 && i < 9) ? 2.0f : 0.0f);
  Tensor c = t.clone();
  c.fill_(1.0);
  EXPECT_EQ(t.data<float>()[0], 0.0f);
  EXPECT_THROW(t.reshape({5, 3}), Error);
  EXPECT_THROW(t.data<double>(), Error);
  EXPECT_THROW(t.slice_rows(2, 5), Error);
}

// data<T>() is the host accessor: a tensor on a device is refused naming its
// shape and device (the guard against host loops over device memory), while
// device_data<T>() hands the pointer to kernels. A host buffer labelled cuda:1
// stands in for device memory, so this runs without a GPU (nothing dereferences it).
TEST(Tensor, DataRefusesADeviceTensorAndDeviceDataDoesNot) {
  float buf[6] = {};
  Tensor d = Tensor::wrap(buf, {2, 3}, DType::f32, Device::cuda(1));
  try {
    (void)d.data<float>();
    ADD_FAILURE() << "data<float>() of a cuda:1 tensor did not throw";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cuda:1"), std::string::npos) << m;
    EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  }
  EXPECT_EQ(d.device_data<float>(), buf);
  EXPECT_THROW((void)d.device_data<double>(), Error) << "device_data still checks the dtype";
  EXPECT_THROW((void)d.flat_view(2, 2).data<float>(), Error) << "a view of device memory is on the device too";
  Tensor h = Tensor::wrap(buf, {6}, DType::f32);
  EXPECT_EQ(h.data<float>(), buf);
  EXPECT_EQ(h.device_data<float>(), buf);
  EXPECT_THROW((void)h.data<std::int32_t>(), Error);
}
