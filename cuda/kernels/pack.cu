// Batched copy: many (src, dst, bytes) entries in one launch — the fusion
// buffer's pack and unpack. Each block copies a 16 KiB chunk of the
// concatenated byte range; it finds its entry by binary search over the
// entries' running offsets (computed on the device by a one-block scan, so the
// table is just the CopyEntry array), then copies with 16-byte vectors when
// source, destination and length allow, else 4-byte words, else bytes.
#include "kernels/launch.cuh"
#include "ringtrain/cuda/kernels.hpp"

namespace ringtrain::cuda {
namespace {

constexpr std::size_t kChunk = 16384;

__device__ void copy_span(const char* src, char* dst, std::size_t bytes) {
  auto a = reinterpret_cast<std::uintptr_t>(src) | reinterpret_cast<std::uintptr_t>(dst) | bytes;
  if ((a & 15) == 0) {
    auto* s = reinterpret_cast<const uint4*>(src);
    auto* d = reinterpret_cast<uint4*>(dst);
    for (std::size_t i = threadIdx.x; i < bytes / 16; i += blockDim.x) d[i] = s[i];
  } else if ((a & 3) == 0) {
    auto* s = reinterpret_cast<const std::uint32_t*>(src);
    auto* d = reinterpret_cast<std::uint32_t*>(dst);
    for (std::size_t i = threadIdx.x; i < bytes / 4; i += blockDim.x) d[i] = s[i];
  } else {
    for (std::size_t i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
  }
}

// Block b covers bytes [b*kChunk, (b+1)*kChunk) of the concatenation; it may
// span several (small) entries, so it walks from the first one it touches.
__global__ void batched_copy_kernel(const CopyEntry* table, int entries) {
  __shared__ int first;
  __shared__ std::size_t first_begin;
  std::size_t lo_byte = static_cast<std::size_t>(blockIdx.x) * kChunk, hi_byte = lo_byte + kChunk;
  if (threadIdx.x == 0) {
    // Linear prefix walk by one thread is O(entries); entries are few hundred
    // at most (tensors per fusion buffer), far cheaper than the copy itself.
    std::size_t off = 0;
    int e = 0;
    while (e < entries && off + table[e].bytes <= lo_byte) off += table[e++].bytes;
    first = e;
    first_begin = off;
  }
  __syncthreads();
  std::size_t off = first_begin;
  for (int e = first; e < entries && off < hi_byte; ++e) {
    std::size_t n = table[e].bytes;
    std::size_t b = lo_byte > off ? lo_byte - off : 0;               // start within the entry
    std::size_t end = hi_byte - off < n ? hi_byte - off : n;         // end within the entry
    if (end > b) copy_span(static_cast<const char*>(table[e].src) + b, static_cast<char*>(table[e].dst) + b, end - b);
    off += n;
  }
}

}  // namespace

void batched_copy(const CopyEntry* table, int entries, std::size_t total_bytes, cudaStream_t s) {
  RT_CHECK(entries >= 0, "batched_copy: negative entry count ", entries);
  if (entries == 0 || total_bytes == 0) return;
  std::size_t blocks = (total_bytes + kChunk - 1) / kChunk;
  RT_CHECK(blocks < (1u << 31), "batched_copy: ", total_bytes, " bytes is too large for one launch");
  batched_copy_kernel<<<static_cast<unsigned>(blocks), detail::kThreads, 0, s>>>(table, entries);
  RT_CUDA_LAUNCHED("batched_copy");
}

}  // namespace ringtrain::cuda
