// The CPU reduction kernels (dst = a + b, as the ring's reduce step runs them)
// next to memcpy of the same message, single process. Bytes processed = the
// message size (one operand), for both, so GB/s compare directly; a reduction
// moves 3 streams (read a, read b, write dst) to memcpy's 2.
//   bench_gb_comm_reduce [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>

#include "ringtrain/comm/host_backend.hpp"

using namespace ringtrain;

namespace {

// Page-aligned buffers: glibc's memcpy (rep movsb on this Zen 3) slows down ~10x
// for some src/dst offsets (measured: heap vectors 64 KiB + 16 B apart), which
// would measure the allocator rather than the copy.
struct Buf {
  explicit Buf(std::size_t n, unsigned char v) : p(static_cast<unsigned char*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096))) {
    std::memset(p, v, n);
  }
  ~Buf() { std::free(p); }
  unsigned char* data() { return p; }
  unsigned char& operator[](std::size_t i) { return p[i]; }
  unsigned char* p;
};

void BM_reduce_sum(benchmark::State& st, DType t) {
  std::size_t bytes = static_cast<std::size_t>(st.range(0)), n = bytes / dtype_size(t);
  Buf a(bytes, 0), b(bytes, 0), d(bytes, 0);
  for (std::size_t i = 0; i < bytes; i += 2) a[i + 1] = b[i + 1] = 0x3c;  // 1.0-ish halves, small floats
  CpuReducer r;
  for (auto _ : st) {
    r.reduce(d.data(), a.data(), b.data(), n, t, ReduceOp::sum, 1);
    benchmark::DoNotOptimize(d.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(bytes));
}

void BM_memcpy(benchmark::State& st) {
  std::size_t bytes = static_cast<std::size_t>(st.range(0));
  Buf a(bytes, 1), d(bytes, 0);
  for (auto _ : st) {
    std::memcpy(d.data(), a.data(), bytes);
    benchmark::DoNotOptimize(d.data());
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * static_cast<int64_t>(bytes));
}

// 256 KiB: a pipeline segment (cache resident); 64 MiB: from DRAM.
#define RT_SIZES ->Arg(256 << 10)->Arg(64 << 20)->Unit(benchmark::kMicrosecond)
BENCHMARK(BM_memcpy) RT_SIZES;
BENCHMARK_CAPTURE(BM_reduce_sum, float32, DType::f32) RT_SIZES;
BENCHMARK_CAPTURE(BM_reduce_sum, float16, DType::f16) RT_SIZES;
BENCHMARK_CAPTURE(BM_reduce_sum, bfloat16, DType::bf16) RT_SIZES;
BENCHMARK_CAPTURE(BM_reduce_sum, float64, DType::f64) RT_SIZES;

}  // namespace

BENCHMARK_MAIN();
