// A minimal SIMT emulator for tests/gpu/emulate/run.sh (not part of the build):
// just what cuda/kernels/attention.cu's and vocab_parallel.cu's kernels use.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>
#include <functional>
#include <algorithm>
#include <atomic>
#define __global__
#define __host__
struct alignas(16) float4 {  // CUDA's: a misaligned load shows under -fsanitize=alignment (run.sh)
  float x, y, z, w;
};
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
namespace emu {
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
inline thread_local Dim3 threadIdx, blockIdx;
struct Block {
  std::barrier<>* block;
  std::barrier<>* warps[4];
  float shfl[4][32];
  float* smem;
};
inline thread_local Block* ctx;
inline void __syncthreads() { ctx->block->arrive_and_wait(); }
inline void __syncwarp() { ctx->warps[threadIdx.x / 32]->arrive_and_wait(); }
inline float __shfl_xor_sync(unsigned, float v, int o) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  ctx->shfl[w][l] = v;
  __syncwarp();
  const float r = ctx->shfl[w][l ^ o];
  __syncwarp();
  return r;
}
template <class A, class B> auto min(A a, B b) { return a < b ? a : b; }
inline unsigned long long atomicMin(unsigned long long* p, unsigned long long v) {
  std::atomic_ref<unsigned long long> a(*p);
  unsigned long long old = a.load();
  while (v < old && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}
// Runs f on every block of grid (gx, gy), 128 threads each, blocks one after another.
inline void launch(unsigned gx, unsigned gy, std::size_t smem_bytes, const std::function<void()>& f) {
  std::vector<float> smem(smem_bytes / 4 + 1);
  for (unsigned by = 0; by < gy; ++by)
    for (unsigned bx = 0; bx < gx; ++bx) {
      std::fill(smem.begin(), smem.end(), std::nanf(""));  // uninitialised shared memory
      std::barrier<> b(128), w0(32), w1(32), w2(32), w3(32);
      Block blk{&b, {&w0, &w1, &w2, &w3}, {}, smem.data()};
      std::vector<std::thread> th;
      for (unsigned t = 0; t < 128; ++t)
        th.emplace_back([&, t] {
          threadIdx = {t, 0, 0};
          blockIdx = {bx, by, 0};
          ctx = &blk;
          f();
        });
      for (auto& x : th) x.join();
    }
}
}  // namespace emu
