#pragma once
// Memory per device kind. The CPU allocator is built in; the CUDA backend
// registers its own (device memory through a caching pool, pinned host memory)
// from its registration unit. This registry is the only place that knows which
// backends exist at run time.
#include <cstddef>
#include <memory>

#include "ringtrain/core/device.hpp"

namespace ringtrain {

class ChunkedMemory;  // below

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(std::size_t bytes, Device dev) = 0;  // 64-byte aligned at least
  virtual void deallocate(void* p, std::size_t bytes, Device dev) = 0;
  // Copies between this kind's memory and host memory (either direction) or within it.
  virtual void copy(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes) = 0;
  virtual void zero(void* p, std::size_t bytes, Device dev) = 0;
  // ZeRO-2/3 on a device: memory whose whole chunks a PageLedger gives back
  // and takes again (below). Null (the default): this kind has none.
  virtual std::shared_ptr<ChunkedMemory> allocate_chunked(std::size_t bytes, Device dev);
};

// --- ZeRO-2/3 on device buffers (chunked memory) ---
// A reserved address range whose physical chunks are backed only while held
// (CUDA: virtual memory management, as PyTorch's expandable segments): the
// device counterpart of host pages given back with madvise. Starts wholly
// resident and zeroed. Chunk indices count from data(), which is chunk-aligned.
class ChunkedMemory {
 public:
  virtual ~ChunkedMemory() = default;
  virtual void* data() const = 0;
  virtual std::size_t bytes() const = 0;  // a whole number of chunks
  virtual std::size_t chunk() const = 0;
  // Chunks [a, b): their memory goes back (contents lost); any use on the
  // device must have finished (implementations wait for it).
  virtual void give_back(std::size_t a, std::size_t b) = 0;
  // Chunks [a, b) resident again before use: those that were given back read
  // as zeros (as host pages after MADV_DONTNEED); resident ones keep their bytes.
  virtual void take_back(std::size_t a, std::size_t b) = 0;
  virtual std::size_t resident_bytes() const = 0;
  virtual std::size_t peak_resident_bytes() const = 0;  // since creation or reset_peak()
  virtual void reset_peak() = 0;
};
// --- end ZeRO-2/3 on device buffers ---

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
// Called on every host tensor allocation (allocated = true) and release with
// its address and counted bytes, on the allocating thread: a benchmark that
// attributes memory to the code that asked for it (bench/memory_attribution.hpp).
// Null (the default): none. The observer must not allocate host tensors.
using HostAllocObserver = void (*)(const void* p, std::size_t bytes, bool allocated);
void set_host_alloc_observer(HostAllocObserver f);

// Host memory that a PageLedger can hand back to the system piece by piece:
// zero-filled, aligned to and sized in whole `chunk`s. The chunk is the
// transparent huge page (2 MiB) for a buffer of at least half of one where the
// kernel offers them (madvise mode included), else the base page: a chunk given
// back costs one page fault to fault in again, instead of 512 of about 11 us
// each on this project's VM (ZeRO-2/3 give gradient and parameter pages back
// every step).
struct HostPages {
  void* data = nullptr;
  std::size_t bytes = 0;  // a whole number of chunks, >= what was asked
  std::size_t chunk = 0;
  std::size_t asked = 0;  // counted in host_memory_stats, as other tensors are
};
HostPages allocate_host_pages(std::size_t bytes);
void free_host_pages(const HostPages& p);
std::size_t host_base_page();       // sysconf(_SC_PAGESIZE)
std::size_t host_huge_page();       // 0 when transparent huge pages are off ("never")

// Copies bytes between any two devices (staging through the host if neither is the CPU).
void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes);

}  // namespace ringtrain
