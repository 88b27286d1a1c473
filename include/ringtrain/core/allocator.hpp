#pragma once
// Memory per device kind. The CPU allocator is built in; the CUDA backend
// registers its own (device memory through a caching pool, pinned host memory)
// from its registration unit. This registry is the only place that knows which
// backends exist at run time.
#include <cstddef>
#include <memory>

#include "ringtrain/core/device.hpp"

namespace ringtrain {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(std::size_t bytes, Device dev) = 0;  // 64-byte aligned at least
  virtual void deallocate(void* p, std::size_t bytes, Device dev) = 0;
  // Copies between this kind's memory and host memory (either direction) or within it.
  virtual void copy(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes) = 0;
  virtual void zero(void* p, std::size_t bytes, Device dev) = 0;
};

void register_allocator(DeviceKind kind, std::unique_ptr<Allocator> a);
bool has_allocator(DeviceKind kind);
Allocator& allocator_for(DeviceKind kind);  // throws Error naming the kind if not built in

// Bytes of host tensors alive now and at most since the last reset (the CPU
// allocator counts them; benchmarks split a rank's memory with it).
struct HostMemoryStats {
  std::size_t live = 0, peak = 0;
};
HostMemoryStats host_memory_stats();
void reset_host_memory_peak();

// Copies bytes between any two devices (staging through the host if neither is the CPU).
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes);

}  // namespace ringtrain
