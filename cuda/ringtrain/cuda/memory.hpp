#pragma once
// Device and pinned host memory.
//
// Rules kept here:
//  - CachingDeviceAllocator never returns memory to the driver during a run:
//    freed blocks go to a free list keyed by (device, size class) and are
//    reused, so after the first step a training step performs no cudaMalloc
//    (stats().device_mallocs stops growing; the GPU tests assert it).
//  - Size classes: 512-byte granularity up to 1 MiB, then 8 classes per power
//    of two (waste <= 12.5%). Requests >= 1 GiB are exact-sized.
//  - Stream semantics: blocks belong to the compute stream. Freeing a block
//    while kernels queued on that stream still use it is safe because any
//    reuse is ordered after them on the same stream. Memory used on another
//    stream (the comm stream) must be owned by the user of that stream until
//    its work completes (the device transport keeps its own buffers).
//  - On cudaMalloc failure the cache is released (after a device sync) and the
//    allocation retried once; a second failure is an Error naming the sizes.
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "ringtrain/core/allocator.hpp"

namespace ringtrain::cuda {

struct MemoryStats {
  std::uint64_t device_mallocs = 0;  // cudaMalloc calls so far
  std::uint64_t cache_hits = 0;      // allocations served from the cache
  std::size_t bytes_in_use = 0;      // handed out (rounded to the size class)
  std::size_t bytes_cached = 0;      // held in free lists
  std::size_t peak_in_use = 0;
};

// The size class a request of `bytes` is rounded to (exposed for tests).
std::size_t size_class(std::size_t bytes);

class CachingDeviceAllocator final : public Allocator {
 public:
  CachingDeviceAllocator() = default;
  ~CachingDeviceAllocator() override;  // frees everything it still holds

  void* allocate(std::size_t bytes, Device dev) override;
  void deallocate(void* p, std::size_t bytes, Device dev) override;
  void copy(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes) override;
  void zero(void* p, std::size_t bytes, Device dev) override;
  // ZeRO-2/3's full buffers: not from the cache, a reserved range (chunked_memory.hpp).
  std::shared_ptr<ChunkedMemory> allocate_chunked(std::size_t bytes, Device dev) override;

  MemoryStats stats() const;
  // Returns every cached (free) block to the driver; in-use blocks are kept.
  void release_cached();

 private:
  struct Key {
    int device;
    std::size_t cls;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const { return k.cls * 31 + static_cast<std::size_t>(k.device); }
  };
  void release_cached_locked();

  mutable std::mutex mu_;
  std::unordered_map<Key, std::vector<void*>, KeyHash> free_;
  std::unordered_map<void*, Key> live_;  // pointer -> its block, for checked frees
  MemoryStats stats_;
};

// Page-locked host memory (cudaHostAlloc, portable across devices): the
// loader's batch buffers and the staging buffers of the host-staged
// collectives, so that copies run asynchronously at full PCIe/NVLink-C2C speed.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(std::size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T> T* as() const { return static_cast<T*>(data_); }
  std::size_t bytes() const { return bytes_; }
  // Grows (never shrinks) to at least `bytes`; contents are not preserved.
  void reserve(std::size_t bytes);

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// The registered allocator for DeviceKind::cuda (throws if CUDA is not available).
CachingDeviceAllocator& device_allocator();

}  // namespace ringtrain::cuda
