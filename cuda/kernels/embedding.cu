// The token embedding (Backend::embedding_forward/backward): the lookup, one
// thread per output element, and its adjoint without atomics, so every run
// and the CPU sum in the same order: position gradients one thread per
// (position, feature) over the samples in order; weight gradients by a stable
// radix sort of the tokens by row (token order kept within a row), then one
// thread per (row, feature) over its tokens in order.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/launch.cuh"
#include "ringtrain/cuda/element_math.hpp"
#include "ringtrain/cuda/kernels.hpp"

namespace ringtrain::cuda {
namespace {

__global__ void rows_kernel(const float* ids, std::int32_t* rows, unsigned long long* bad, std::size_t n,
                            std::int64_t vocab, std::int64_t first, std::int64_t local) {
  RT_GRID_STRIDE(i, n) {
    const float v = ids[i];
    const bool ok = v >= 0.f && v < static_cast<float>(vocab) && v == floorf(v);
    if (!ok) atomicMin(bad, static_cast<unsigned long long>(i));
    const std::int64_t r = ok ? static_cast<std::int64_t>(v) - first : -1;
    rows[i] = r >= 0 && r < local ? static_cast<std::int32_t>(r) : -1;
  }
}

template <typename T>
__global__ void lookup_kernel(const std::int32_t* rows, const float* w, const float* pos, T* y, std::int64_t t,
                              std::int64_t d, std::size_t total) {
  RT_GRID_STRIDE(i, total) {
    const std::int64_t tok = static_cast<std::int64_t>(i) / d, k = static_cast<std::int64_t>(i) % d;
    const std::int32_t r = rows[tok];
    const float* pr = pos ? pos + (tok % t) * d + k : nullptr;
    // One term is copied, not added to a zero (as on the CPU: -0 stays -0).
    const float v = r >= 0 ? (pr ? w[std::int64_t(r) * d + k] + *pr : w[std::int64_t(r) * d + k]) : (pr ? *pr : 0.f);
    y[i] = from_acc<T>(static_cast<acc_t<T>>(v));
  }
}

template <typename T>
__global__ void dpos_kernel(const T* dy, float* dpos, std::int64_t samples, std::int64_t t, std::int64_t d) {
  RT_GRID_STRIDE(i, static_cast<std::size_t>(t * d)) {  // i = position * d + feature
    const std::int64_t p = static_cast<std::int64_t>(i) / d, k = static_cast<std::int64_t>(i) % d;
    float acc = dpos[i];
    for (std::int64_t s = 0; s < samples; ++s) acc += static_cast<float>(to_acc(dy[(s * t + p) * d + k]));
    dpos[i] = acc;
  }
}

// keys: rows sorted (stable), order: their token indices. A thread whose
// position starts a run of one row sums that run for its feature.
template <typename T>
__global__ void dweight_kernel(const T* dy, const std::int32_t* keys, const std::int32_t* order, float* dw,
                               std::size_t n, std::int64_t d) {
  RT_GRID_STRIDE(i, n * static_cast<std::size_t>(d)) {
    const std::size_t j = i / static_cast<std::size_t>(d);
    const std::int64_t k = static_cast<std::int64_t>(i % static_cast<std::size_t>(d));
    const std::int32_t r = keys[j];
    if (r < 0 || (j > 0 && keys[j - 1] == r)) continue;
    float acc = dw[std::int64_t(r) * d + k];
    for (std::size_t e = j; e < n && keys[e] == r; ++e) acc += static_cast<float>(to_acc(dy[std::int64_t(order[e]) * d + k]));
    dw[std::int64_t(r) * d + k] = acc;
  }
}

__global__ void iota_kernel(std::int32_t* v, std::size_t n) {
  RT_GRID_STRIDE(i, n) v[i] = static_cast<std::int32_t>(i);
}

std::size_t align256(std::size_t b) { return (b + 255) / 256 * 256; }

std::size_t sort_bytes(std::size_t n) {
  std::size_t temp = 0;
  RT_CUDA(cub::DeviceRadixSort::SortPairs(nullptr, temp, static_cast<const std::int32_t*>(nullptr),
                                          static_cast<std::int32_t*>(nullptr), static_cast<const std::int32_t*>(nullptr),
                                          static_cast<std::int32_t*>(nullptr), static_cast<int>(n)));
  return temp;
}

}  // namespace

void embedding_rows(const float* ids, std::int32_t* rows, unsigned long long* bad, std::size_t n, std::int64_t vocab,
                    std::int64_t first, std::int64_t local, cudaStream_t s) {
  if (n == 0) return;
  rows_kernel<<<detail::blocks_for(n), detail::kThreads, 0, s>>>(ids, rows, bad, n, vocab, first, local);
  RT_CUDA_LAUNCHED("embedding_rows");
}

void embedding_lookup(const std::int32_t* rows, const float* w, const float* pos, void* y, std::size_t tokens,
                      std::int64_t t, std::int64_t d, DType dt, cudaStream_t s) {
  const std::size_t total = tokens * static_cast<std::size_t>(d);
  if (total == 0) return;
  detail::dispatch_float(dt, "cuda::embedding_lookup", [&](auto tag) {
    using T = decltype(tag);
    lookup_kernel<T><<<detail::blocks_for(total), detail::kThreads, 0, s>>>(rows, w, pos, static_cast<T*>(y), t, d,
                                                                           total);
  });
  RT_CUDA_LAUNCHED("embedding_lookup");
}

std::size_t embedding_backward_scratch_bytes(std::size_t tokens) {
  return 3 * align256(tokens * sizeof(std::int32_t)) + align256(sort_bytes(tokens));
}

void embedding_backward(const void* dy, DType dt, const std::int32_t* rows, float* dweight, float* dpos,
                        std::size_t tokens, std::int64_t t, std::int64_t d, void* scratch, std::size_t scratch_bytes,
                        cudaStream_t s) {
  RT_CHECK(t > 0 && tokens % static_cast<std::size_t>(t) == 0, "embedding_backward: ", tokens,
           " tokens are not whole samples of ", t);
  RT_CHECK(tokens < (std::size_t{1} << 31), "embedding_backward: ", tokens, " tokens exceed int32 indices");
  if (tokens == 0) return;
  const std::size_t ib = align256(tokens * sizeof(std::int32_t)), temp = sort_bytes(tokens);
  RT_CHECK(scratch_bytes >= 3 * ib + temp, "embedding_backward: scratch of ", scratch_bytes, " bytes, needs ",
           3 * ib + temp);
  char* base = static_cast<char*>(scratch);
  auto* keys = reinterpret_cast<std::int32_t*>(base);
  auto* idx = reinterpret_cast<std::int32_t*>(base + ib);
  auto* order = reinterpret_cast<std::int32_t*>(base + 2 * ib);
  detail::dispatch_float(dt, "cuda::embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    const T* g = static_cast<const T*>(dy);
    if (dpos) {
      const std::size_t pd = static_cast<std::size_t>(t * d);
      dpos_kernel<T><<<detail::blocks_for(pd), detail::kThreads, 0, s>>>(g, dpos, static_cast<std::int64_t>(tokens) / t,
                                                                        t, d);
    }
    iota_kernel<<<detail::blocks_for(tokens), detail::kThreads, 0, s>>>(idx, tokens);
    std::size_t tb = temp;
    RT_CUDA(cub::DeviceRadixSort::SortPairs(base + 3 * ib, tb, rows, keys, idx, order, static_cast<int>(tokens), 0,
                                            32, s));
    const std::size_t work = tokens * static_cast<std::size_t>(d);
    dweight_kernel<T><<<detail::blocks_for(work), detail::kThreads, 0, s>>>(g, keys, order, dweight, tokens, d);
  });
  RT_CUDA_LAUNCHED("embedding_backward");
}

}  // namespace ringtrain::cuda
