#pragma once
// Test helpers for the collectives: rank-dependent data that makes float sums
// non-trivial, MPI references, tolerance checks, and a cross-rank bitwise check.
// Every helper is collective-safe: failures are EXPECTs, never early returns, so
// all ranks keep issuing the same sequence of MPI calls.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/error.hpp"

namespace rt_test {
using namespace ringtrain;

// A typed buffer of `count` elements of `dtype`, filled with rank-dependent values.
inline std::vector<unsigned char> make_data(DType dtype, std::size_t count, int rank, unsigned salt) {
  std::vector<unsigned char> buf(count * dtype_size(dtype) + 1);  // +1: never a null data() for count 0
  // splitmix64: cheap enough for the 1M-element cases.
  std::uint64_t state = 1234u + 7919u * static_cast<std::uint64_t>(rank) + (static_cast<std::uint64_t>(salt) << 32);
  auto next = [&] {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  auto real = [&] { return static_cast<double>(next() >> 11) * 0x1p-53 * 16.0 - 8.0; };  // [-8, 8)
  auto small = [&] { return static_cast<int>(next() % 2001) - 1000; };                  // [-1000, 1000]
  dispatch_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    T* p = reinterpret_cast<T*>(buf.data());
    for (std::size_t i = 0; i < count; ++i) {
      double x = real();
      if constexpr (std::is_same_v<T, float16>) p[i] = to_f16(static_cast<float>(x));
      else if constexpr (std::is_same_v<T, bfloat16>) p[i] = to_bf16(static_cast<float>(x));
      else if constexpr (std::is_floating_point_v<T>) p[i] = static_cast<T>(x);
      else if constexpr (std::is_same_v<T, std::int64_t>) p[i] = static_cast<T>(small()) * 3000000007LL;
      else p[i] = static_cast<T>(small());
    }
  });
  return buf;
}

inline double as_double(DType t, const unsigned char* p, std::size_t i) {
  return dispatch_dtype(t, [&](auto v) -> double {
    using T = decltype(v);
    T x;
    std::memcpy(&x, p + i * sizeof(T), sizeof(T));
    if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) return to_f32(x);
    else return static_cast<double>(x);
  });
}

inline MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    default: return MPI_UINT16_T;
  }
}

// 64-bit FNV-1a of the bytes; equal on every rank iff (overwhelmingly likely) the bytes are.
inline void expect_bitwise_equal_across(const void* p, std::size_t bytes, MPI_Comm comm, const char* what) {
  std::uint64_t h = 1469598103934665603ull;
  auto* c = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ c[i]) * 1099511628211ull;
  std::uint64_t lo = h, hi = h;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, comm);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, comm);
  EXPECT_EQ(lo, hi) << what << ": result bytes differ between ranks";
}

// The expected all-reduce of `in` over `comm` in double precision (floats) or
// exactly via MPI (integers), plus sum |x| for the float error bound.
struct Expected {
  std::vector<double> value;    // floats: exact-ish reference in double
  std::vector<double> abs_sum;  // floats: sum over ranks of |x_i|
  std::vector<unsigned char> exact;  // integers: MPI_Allreduce's bytes (avg divided)
};

inline Expected reference_allreduce(const unsigned char* in, std::size_t count, DType dtype, ReduceOp op,
                                    MPI_Comm comm) {
  Expected e;
  int p = 1;
  MPI_Comm_size(comm, &p);
  if (dtype == DType::u8) {
    // Reduce in int32 and wrap: Open MPI 4.1's MPI_SUM on MPI_UINT8_T saturates.
    std::vector<std::int32_t> w(count + 1);
    for (std::size_t i = 0; i < count; ++i) w[i] = in[i];
    MPI_Op mop = op == ReduceOp::min ? MPI_MIN : op == ReduceOp::max ? MPI_MAX : MPI_SUM;
    MPI_Allreduce(MPI_IN_PLACE, w.data(), static_cast<int>(count), MPI_INT32_T, mop, comm);
    e.exact.assign(count + 1, 0);
    for (std::size_t i = 0; i < count; ++i) {
      auto v = static_cast<std::uint8_t>(w[i]);
      e.exact[i] = op == ReduceOp::avg ? static_cast<std::uint8_t>(v / p) : v;
    }
    return e;
  }
  if (!is_floating(dtype)) {
    e.exact.assign(count * dtype_size(dtype) + 1, 0);
    MPI_Op mop = op == ReduceOp::min ? MPI_MIN : op == ReduceOp::max ? MPI_MAX : MPI_SUM;
    MPI_Allreduce(in, e.exact.data(), static_cast<int>(count), mpi_type(dtype), mop, comm);
    if (op == ReduceOp::avg)
      dispatch_dtype(dtype, [&](auto t) {
        using T = decltype(t);
        if constexpr (std::is_integral_v<T>) {
          T* q = reinterpret_cast<T*>(e.exact.data());
          for (std::size_t i = 0; i < count; ++i) q[i] = static_cast<T>(q[i] / p);
        }
      });
    return e;
  }
  e.value.resize(count);
  e.abs_sum.resize(count);
  for (std::size_t i = 0; i < count; ++i) {
    e.value[i] = as_double(dtype, in, i);
    e.abs_sum[i] = std::fabs(e.value[i]);
  }
  MPI_Op mop = op == ReduceOp::min ? MPI_MIN : op == ReduceOp::max ? MPI_MAX : MPI_SUM;
  MPI_Allreduce(MPI_IN_PLACE, e.value.data(), static_cast<int>(count), MPI_DOUBLE, mop, comm);
  MPI_Allreduce(MPI_IN_PLACE, e.abs_sum.data(), static_cast<int>(count), MPI_DOUBLE, MPI_SUM, comm);
  if (op == ReduceOp::avg)
    for (std::size_t i = 0; i < count; ++i) {
      e.value[i] /= p;
      e.abs_sum[i] /= p;
    }
  return e;
}

// Checks `out` against the reference: integers and min/max exactly; sums within
// the rounding a p-term sum may accumulate (p * eps * sum|x|, plus one rounding of
// the result for the 16-bit types).
inline void expect_matches(const unsigned char* out, const Expected& e, std::size_t count, DType dtype, ReduceOp op,
                           int p, const char* what) {
  if (!is_floating(dtype)) {
    EXPECT_EQ(0, std::memcmp(out, e.exact.data(), count * dtype_size(dtype))) << what << ": integer result differs";
    return;
  }
  double eps = dtype == DType::f64 ? 0x1p-52 : dtype == DType::f32 ? 0x1p-23 : dtype == DType::f16 ? 0x1p-10 : 0x1p-7;
  bool exact = op == ReduceOp::min || op == ReduceOp::max;
  int bad = 0;
  for (std::size_t i = 0; i < count && bad < 5; ++i) {
    double got = as_double(dtype, out, i), want = e.value[i];
    double tol = exact ? 0.0 : p * eps * e.abs_sum[i] + eps * std::fabs(want);
    if (!(std::fabs(got - want) <= tol)) {
      ++bad;
      ADD_FAILURE() << what << ": element " << i << " of " << count << " is " << got << ", expected " << want
                    << " (tolerance " << tol << ")";
    }
  }
}

}  // namespace rt_test
