// The CPU reduction kernels (vectorised, F16C/AVX2 paths) against the scalar
// RT_HD element math of reduce_math.hpp, bit for bit, for every dtype and op,
// at lengths that exercise the vector bodies and the tails; plus the rounding
// rules (float32 accumulation, one rounding, fused avg division).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "reference.hpp"
#include "ringtrain/comm/host_backend.hpp"

using namespace ringtrain;

namespace {

template <ReduceOp OP, typename T>
void expect_kernel_matches_scalar(DType dt, std::size_t n, int divisor) {
  auto a = rt_test::make_data(dt, n, 1, 99), b = rt_test::make_data(dt, n, 2, 99);
  std::vector<unsigned char> got(n * sizeof(T) + 1);
  CpuReducer().reduce(got.data(), a.data(), b.data(), n, dt, OP, divisor);
  const T* x = reinterpret_cast<const T*>(a.data());
  const T* y = reinterpret_cast<const T*>(b.data());
  for (std::size_t i = 0; i < n; ++i) {
    T want = divisor > 1 ? reduce_one_div<OP>(x[i], y[i], divisor) : reduce_one<OP>(x[i], y[i]);
    ASSERT_EQ(0, std::memcmp(&want, got.data() + i * sizeof(T), sizeof(T)))
        << dtype_name(dt) << " op " << static_cast<int>(OP) << " n=" << n << " element " << i;
  }
}

TEST(ReduceKernels, BitwiseEqualToScalarMath) {
  for (std::size_t n : {1, 7, 8, 9, 31, 64, 1000, 4099})
    for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32, DType::i64, DType::u8})
      dispatch_dtype(dt, [&](auto t) {
        using T = decltype(t);
        expect_kernel_matches_scalar<ReduceOp::sum, T>(dt, n, 1);
        expect_kernel_matches_scalar<ReduceOp::min, T>(dt, n, 1);
        expect_kernel_matches_scalar<ReduceOp::max, T>(dt, n, 1);
        expect_kernel_matches_scalar<ReduceOp::sum, T>(dt, n, 3);
      });
}

TEST(ReduceKernels, HalfPrecisionAccumulatesInFloatAndRoundsOnce) {
  // Float16 spacing at 2048 is 2: each combine is one float32 add, one rounding.
  std::vector<float16> a(9, to_f16(2048.0f)), b(9, to_f16(1.0f)), d(9);
  CpuReducer().reduce(d.data(), a.data(), b.data(), 9, DType::f16, ReduceOp::sum, 1);
  for (auto v : d) EXPECT_EQ(to_f32(v), 2048.0f);  // 2049 ties to even
  std::vector<float16> c(9, to_f16(3.0f));
  CpuReducer().reduce(d.data(), a.data(), c.data(), 9, DType::f16, ReduceOp::sum, 1);
  for (auto v : d) EXPECT_EQ(to_f32(v), 2052.0f);  // 2051 ties to even (2052)
  // Fused avg: (65504 + 65504) / 2 overflows float16 if rounded before dividing.
  std::vector<float16> m(9, to_f16(65504.0f));
  CpuReducer().reduce(d.data(), m.data(), m.data(), 9, DType::f16, ReduceOp::avg, 2);
  for (auto v : d) EXPECT_EQ(to_f32(v), 65504.0f);
  std::vector<bfloat16> p(17, to_bf16(1.0f)), q(17, to_bf16(0x1p-9f)), r(17);
  CpuReducer().reduce(r.data(), p.data(), q.data(), 17, DType::bf16, ReduceOp::sum, 1);
  for (auto v : r) EXPECT_EQ(to_f32(v), 1.0f);  // below half an ulp of bf16 at 1
}

TEST(ReduceKernels, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> a{inf, -inf, 1e-40f, -0.0f, 3.0f, 1e38f, 2.0f, -5.0f, 7.0f};
  std::vector<float> b{1.0f, 2.0f, 1e-40f, 0.0f, -3.0f, 1e38f, 2.0f, -5.0f, 7.0f};
  for (DType dt : {DType::f16, DType::bf16}) {
    std::vector<std::uint16_t> x(9), y(9), d(9);
    for (int i = 0; i < 9; ++i) {
      x[i] = dt == DType::f16 ? to_f16(a[i]).bits : to_bf16(a[i]).bits;
      y[i] = dt == DType::f16 ? to_f16(b[i]).bits : to_bf16(b[i]).bits;
    }
    CpuReducer().reduce(d.data(), x.data(), y.data(), 9, dt, ReduceOp::sum, 1);
    auto val = [&](int i) { return dt == DType::f16 ? to_f32(float16{d[i]}) : to_f32(bfloat16{d[i]}); };
    EXPECT_EQ(val(0), inf);
    EXPECT_EQ(val(1), -inf);
    EXPECT_EQ(val(3), 0.0f);
    EXPECT_EQ(val(4), 0.0f);
    float big = to_f32(to_bf16(1e38f));
    EXPECT_EQ(val(5), dt == DType::f16 ? inf : to_f32(to_bf16(big + big)));  // 1e38 is inf in float16
    EXPECT_EQ(val(6), 4.0f);
    EXPECT_EQ(val(7), -10.0f);
    EXPECT_EQ(val(8), 14.0f);
  }
}

TEST(ReduceKernels, DivideTruncatesIntegers) {
  std::vector<std::int32_t> v{7, -7, 8, 0, 1};
  CpuReducer().divide(v.data(), v.size(), DType::i32, 2);
  EXPECT_EQ(v, (std::vector<std::int32_t>{3, -3, 4, 0, 0}));
}

}  // namespace
