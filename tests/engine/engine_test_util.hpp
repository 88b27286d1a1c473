#pragma once
// Shared helpers for the engine tests: deterministic per-rank data, MPI
// references and cross-rank bitwise comparison (independent of the engine).
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>
#include <string>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/tensor.hpp"
#include "ringtrain/engine/engine.hpp"

namespace rt_test {

using namespace ringtrain;

inline int world_rank() { int r; MPI_Comm_rank(MPI_COMM_WORLD, &r); return r; }
inline int world_size() { int s; MPI_Comm_size(MPI_COMM_WORLD, &s); return s; }

// Small exact values (multiples of 1/8 up to 8): sums over <= 4 ranks are exact
// in every floating dtype, so any reduction order gives the same bits.
inline double exact_value(int tensor, int rank, std::int64_t i) {
  return static_cast<double>(((tensor * 131 + rank * 17 + i * 7) % 61) - 30) / 8.0;
}

inline void fill(Tensor& t, const std::function<double(std::int64_t)>& f) {
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.raw());
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      double v = f(i);
      if constexpr (std::is_same_v<T, float16>) p[i] = to_f16(static_cast<float>(v));
      else if constexpr (std::is_same_v<T, bfloat16>) p[i] = to_bf16(static_cast<float>(v));
      else if constexpr (std::is_integral_v<T>) p[i] = static_cast<T>(std::llround(v * 8));
      else p[i] = static_cast<T>(v);
    }
  });
}

inline double get(const Tensor& t, std::int64_t i) {
  return dispatch_dtype(t.dtype(), [&](auto tag) -> double {
    using T = decltype(tag);
    const T* p = static_cast<const T*>(t.raw());
    if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) return to_f32(p[i]);
    else return static_cast<double>(p[i]);
  });
}

inline MPI_Datatype mpi_type(DType dt) {
  switch (dt) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u8: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
  }
}

// The reference: MPI_Allreduce(SUM) where MPI has the type, else the sum of the
// gathered values in float32 (exact for the data above); avg then multiplies by
// 1/size in the tensor's precision (as documented for the engine).
inline Tensor reference_allreduce(const Tensor& in, ReduceOp op) {
  Tensor out = in.clone();
  int size = world_size();
  MPI_Datatype mt = mpi_type(in.dtype());
  MPI_Op mop = op == ReduceOp::min ? MPI_MIN : op == ReduceOp::max ? MPI_MAX : MPI_SUM;
  if (mt != MPI_DATATYPE_NULL) {
    MPI_Allreduce(in.raw(), out.raw(), static_cast<int>(in.numel()), mt, mop, MPI_COMM_WORLD);
  } else {  // f16 / bf16
    std::vector<float> mine(in.numel()), all(in.numel());
    for (std::int64_t i = 0; i < in.numel(); ++i) mine[i] = static_cast<float>(get(in, i));
    MPI_Allreduce(mine.data(), all.data(), static_cast<int>(in.numel()), MPI_FLOAT, mop, MPI_COMM_WORLD);
    fill(out, [&](std::int64_t i) { return all[i]; });
  }
  if (op == ReduceOp::avg) {
    dispatch_dtype(out.dtype(), [&](auto tag) {
      using T = decltype(tag);
      T* p = static_cast<T*>(out.raw());
      for (std::int64_t i = 0; i < out.numel(); ++i) {
        if constexpr (std::is_same_v<T, float16>) p[i] = to_f16(to_f32(p[i]) * static_cast<float>(1.0 / size));
        else if constexpr (std::is_same_v<T, bfloat16>) p[i] = to_bf16(to_f32(p[i]) * static_cast<float>(1.0 / size));
        else if constexpr (std::is_same_v<T, float>) p[i] *= static_cast<float>(1.0 / size);
        else if constexpr (std::is_same_v<T, double>) p[i] *= 1.0 / size;
        else p[i] = static_cast<T>(p[i] / size);
      }
    });
  }
  return out;
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// True on every rank iff the tensor's bytes are identical on all ranks
// (rank 0's bytes broadcast and compared; independent of the engine).
inline bool identical_across_ranks(const Tensor& t) {
  std::vector<char> root(t.nbytes());
  if (world_rank() == 0) std::memcpy(root.data(), t.raw(), t.nbytes());
  MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
  int same = std::memcmp(root.data(), t.raw(), t.nbytes()) == 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Tests use short cycles and the automatic all-reduce algorithm.
inline EngineOptions test_options() {
  EngineOptions o;
  o.cycle_time_ms = 1.0;
  return o;
}

}  // namespace rt_test
