#include <cuda_runtime.h>

#include <algorithm>
#include <bit>

#include "ringtrain/cuda/check.hpp"
#include "ringtrain/cuda/chunked_memory.hpp"
#include "ringtrain/cuda/memory.hpp"

namespace ringtrain::cuda {

std::size_t size_class(std::size_t bytes) {
  constexpr std::size_t kSmall = 1u << 20, kGrain = 512, kHuge = std::size_t{1} << 30;
  if (bytes == 0) return kGrain;
  if (bytes <= kSmall) return (bytes + kGrain - 1) / kGrain * kGrain;
  if (bytes >= kHuge) return (bytes + kGrain - 1) / kGrain * kGrain;
  // 8 classes per power of two: step = 2^(floor(log2(bytes)) - 3).
  std::size_t top = std::bit_floor(bytes);
  std::size_t step = top / 8;
  return (bytes + step - 1) / step * step;
}

CachingDeviceAllocator::~CachingDeviceAllocator() {
  // Runs at exit: the driver may already be shutting down, so errors are ignored.
  std::lock_guard lk(mu_);
  for (auto& [key, list] : free_)
    for (void* p : list) cudaFree(p);
  free_.clear();
}

void* CachingDeviceAllocator::allocate(std::size_t bytes, Device dev) {
  if (bytes == 0) return nullptr;
  RT_CHECK(dev.is_cuda(), "CachingDeviceAllocator asked for memory on ", dev.str());
  Key key{dev.index, size_class(bytes)};
  std::lock_guard lk(mu_);
  auto it = free_.find(key);
  void* p = nullptr;
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    stats_.bytes_cached -= key.cls;
    ++stats_.cache_hits;
  } else {
    int prev = 0;
    RT_CUDA(cudaGetDevice(&prev));
    if (prev != dev.index) RT_CUDA(cudaSetDevice(dev.index));
    cudaError_t e = cudaMalloc(&p, key.cls);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached_locked();
      e = cudaMalloc(&p, key.cls);
    }
    if (prev != dev.index) cudaSetDevice(prev);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      RT_FAIL("cudaMalloc of ", key.cls, " bytes (request ", bytes, ") on ", dev.str(), " failed: ",
              cudaGetErrorString(e), "; in use ", stats_.bytes_in_use, " bytes (HINT: lower the batch size)");
    }
    ++stats_.device_mallocs;
  }
  live_.emplace(p, key);
  stats_.bytes_in_use += key.cls;
  stats_.peak_in_use = std::max(stats_.peak_in_use, stats_.bytes_in_use);
  return p;
}

void CachingDeviceAllocator::deallocate(void* p, std::size_t, Device) {
  if (!p) return;
  std::lock_guard lk(mu_);
  auto it = live_.find(p);
  RT_CHECK(it != live_.end(), "CachingDeviceAllocator: freeing pointer ", p, " that it did not allocate");
  Key key = it->second;
  live_.erase(it);
  free_[key].push_back(p);
  stats_.bytes_in_use -= key.cls;
  stats_.bytes_cached += key.cls;
}

void CachingDeviceAllocator::release_cached_locked() {
  if (stats_.bytes_cached == 0) return;
  cudaDeviceSynchronize();  // cached blocks may still be read by queued kernels
  for (auto& [key, list] : free_) {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(key.device);
    for (void* p : list) cudaFree(p);
    cudaSetDevice(prev);
    list.clear();
  }
  stats_.bytes_cached = 0;
}

void CachingDeviceAllocator::release_cached() {
  std::lock_guard lk(mu_);
  release_cached_locked();
}

MemoryStats CachingDeviceAllocator::stats() const {
  std::lock_guard lk(mu_);
  return stats_;
}

// Synchronous with respect to the host, and (legacy default stream) ordered
// after all work on ringtrain's blocking streams: Tensor::to(cpu) after a
// step sees the step's results. Inside a step the contexts' streams are used.
void CachingDeviceAllocator::copy(void* dst, Device, const void* src, Device, std::size_t bytes) {
  if (bytes) RT_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
}

void CachingDeviceAllocator::zero(void* p, std::size_t bytes, Device dev) {
  if (!bytes) return;
  int prev = 0;
  RT_CUDA(cudaGetDevice(&prev));
  if (prev != dev.index) RT_CUDA(cudaSetDevice(dev.index));
  RT_CUDA(cudaMemset(p, 0, bytes));
  if (prev != dev.index) RT_CUDA(cudaSetDevice(prev));
}

std::shared_ptr<ChunkedMemory> CachingDeviceAllocator::allocate_chunked(std::size_t bytes, Device dev) {
  RT_CHECK(dev.is_cuda(), "CachingDeviceAllocator asked for chunked memory on ", dev.str());
  return make_chunked_memory(bytes, dev.index);
}

// ---- pinned host memory -----------------------------------------------------

PinnedBuffer::PinnedBuffer(std::size_t bytes) { reserve(bytes); }

PinnedBuffer::~PinnedBuffer() {
  if (data_) cudaFreeHost(data_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept : data_(o.data_), bytes_(o.bytes_) {
  o.data_ = nullptr;
  o.bytes_ = 0;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (data_) cudaFreeHost(data_);
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void PinnedBuffer::reserve(std::size_t bytes) {
  if (bytes <= bytes_) return;
  if (data_) RT_CUDA(cudaFreeHost(data_));
  data_ = nullptr;
  bytes_ = 0;
  cudaError_t e = cudaHostAlloc(&data_, bytes, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    data_ = nullptr;
    RT_FAIL("cudaHostAlloc of ", bytes, " pinned bytes failed: ", cudaGetErrorString(e),
            " (HINT: check `ulimit -l` and the host's free memory)");
  }
  bytes_ = bytes;
}

}  // namespace ringtrain::cuda
